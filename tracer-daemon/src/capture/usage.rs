//! What the kernel side costs and counts: the programs' per-CPU counters,
//! their run-time statistics, and every map's entries and capacity.
use std::os::fd::AsFd as _;

use tracer_common::{
    AllocInfo, AllocKey, COUNTER_SLOTS, Counter, MAP_COUNTERS, MAP_EVENTS, MAP_INFLIGHT,
    MAP_INFLIGHT_SLOTS, MAP_LIVE_ALLOCS, MAP_LIVE_KEYS, MAP_PROC_SLOTS, MAP_PROCS,
    MAP_STACK_TOTALS, MAP_STACKS, PROC_SLOT_COUNT, StackTotalsKey,
};

use super::Capture;
use super::events::RingPositions;
use super::live_table::LiveTable;
use crate::sys::bpf as bpf_sys;
use tracer_common::unwind::{MAP_PROC_MAPS, MAP_UNWIND_PAGES, MAP_UNWIND_ROWS};

impl Capture {
    /// The per-CPU counters summed over CPUs, by name, in slot order.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        Counter::ALL
            .iter()
            .map(|(counter, name)| {
                let total = self
                    .counters
                    .get(&(*counter as u32), 0)
                    .map(|values| values.iter().copied().fold(0u64, u64::wrapping_add))
                    .unwrap_or(0);
                (*name, total)
            })
            .collect()
    }

    /// Run statistics the kernel keeps for each loaded program while
    /// `BPF_ENABLE_STATS` is on (zero otherwise): (program name, total run
    /// time, run count), from `bpf_prog_info`, and for the uprobe programs
    /// loaded for uprobe_multi links (aya's copies are then not loaded)
    /// from their fdinfo. Read-only.
    pub fn program_stats(&self) -> Vec<(String, std::time::Duration, u64)> {
        let multi = self
            .multi
            .iter()
            .flat_map(super::multi::MultiPrograms::stats);
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some((name.to_string(), info.run_time(), info.run_count()))
            })
            .chain(multi)
            .collect()
    }

    /// Entries now in each kernel map: (map name, entries, capacity), the
    /// capacities as configured. Counting walks the hash maps' keys (one
    /// syscall per key); `INFLIGHT_SLOTS` counts the slots in use (a batch
    /// read of the array, 32 bytes a slot); `EVENTS` is in bytes: those
    /// written and not yet read, of the ring's size. Once tracerd is
    /// stopping, the count of `LIVE_ALLOCS` ends early (a lower bound).
    pub fn map_usage(&self) -> Vec<(&'static str, u64, u64)> {
        let mut live_entries = 0u64;
        let mut count = |_: &AllocKey, _: &AllocInfo| {
            if self.stopping.is_raised() {
                return std::ops::ControlFlow::Break(());
            }
            live_entries += 1;
            std::ops::ControlFlow::Continue(())
        };
        if bpf_sys::lookup_batch(
            aya::maps::IterableMap::map(&self.live).fd().as_fd(),
            &mut count,
        )
        .is_err()
        {
            live_entries = self.live.keys().count() as u64;
        }
        let unwind = self.unwind_usage();
        vec![
            (
                MAP_LIVE_ALLOCS,
                live_entries,
                u64::from(self.config.max_live_blocks),
            ),
            (
                MAP_LIVE_KEYS,
                self.live_table.as_ref().map_or(0, LiveTable::len),
                u64::from(self.config.live_table_blocks),
            ),
            (
                MAP_STACKS,
                bpf_sys::count_keys::<u64>(self.stacks.fd().as_fd()),
                u64::from(self.config.max_stacks),
            ),
            (
                MAP_STACK_TOTALS,
                bpf_sys::count_keys::<StackTotalsKey>(
                    aya::maps::IterableMap::map(&self.stack_totals).fd().as_fd(),
                ),
                u64::from(self.config.stack_totals_entries()),
            ),
            (
                MAP_PROC_SLOTS,
                self.totals.slots.len(),
                u64::from(PROC_SLOT_COUNT),
            ),
            (
                MAP_PROCS,
                self.procs.keys().count() as u64,
                u64::from(self.config.max_procs),
            ),
            (
                MAP_INFLIGHT,
                self.inflight.keys().count() as u64,
                u64::from(self.config.max_inflight),
            ),
            (
                MAP_INFLIGHT_SLOTS,
                self.inflight_slots_in_use(),
                u64::from(self.config.inflight_slots),
            ),
            (
                MAP_EVENTS,
                self.events_positions
                    .as_ref()
                    .map_or(0, RingPositions::pending),
                u64::from(self.config.events_ring_bytes),
            ),
            (
                MAP_COUNTERS,
                u64::from(COUNTER_SLOTS),
                u64::from(COUNTER_SLOTS),
            ),
            (MAP_UNWIND_ROWS, unwind.rows, unwind.rows_capacity),
            (MAP_UNWIND_PAGES, unwind.pages, unwind.pages_capacity),
            (
                MAP_PROC_MAPS,
                unwind.processes,
                if unwind.rows_capacity == 0 {
                    0
                } else {
                    u64::from(self.config.unwind_processes)
                },
            ),
        ]
    }
}
