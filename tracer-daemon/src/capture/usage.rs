//! What the kernel side costs and counts: the programs' per-CPU counters,
//! their run-time statistics, every map's entries and capacity, and the
//! unwind tables' use.
//!
//! They are read through [`KernelStats`], shared (an [`Arc`]) between
//! [`Capture`] and whoever holds [`UsageMaps::stats`](super::UsageMaps::stats):
//! it reads through descriptors and mappings of its own, so `/metrics` and
//! `/kernel-maps` take no lock of tracerd's and never wait behind a long
//! pass over the live blocks under the kernel side's lock.
use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aya::maps::{MapData, PerCpuArray};
use tracer_common::{
    AllocInfo, AllocKey, COUNTER_SLOTS, Counter, MAP_COUNTERS, MAP_EVENTS, MAP_INFLIGHT,
    MAP_INFLIGHT_SLOTS, MAP_LIVE_ALLOCS, MAP_LIVE_KEYS, MAP_OWN_LIVE, MAP_PROC_SLOTS, MAP_PROCS,
    MAP_STACK_TOTALS, MAP_STACKS, PROC_SLOT_COUNT, StackTotalsKey,
};

use super::events::RingPositions;
use super::live_table::LiveTable;
use super::procs::ProcTotalsMaps;
use super::stopping::Stopping;
use super::unwind::tables::UnwindUsage;
use super::{Capture, CaptureConfig};
use crate::sys::bpf as bpf_sys;
use tracer_common::unwind::{MAP_PROC_MAPS, MAP_UNWIND_PAGES, MAP_UNWIND_ROWS};

/// What the per-image spill maps hold now, for `/maps` and the metrics:
/// each level map (a descriptor of its own, to count its entries) and
/// their capacity in blocks together.
#[derive(Clone, Debug, Default)]
pub struct OwnUsage {
    /// Every level map of every image.
    pub maps: Vec<Arc<OwnedFd>>,
    /// Their capacities together, in blocks.
    pub capacity: u64,
}

/// A reading of every kernel map's use: (map name, entries, capacity).
pub type MapUsage = Vec<(&'static str, u64, u64)>;

/// The kernel side's counters, program statistics, map use and unwind
/// tables' use, as a reader without the kernel side's lock sees them: each
/// read is the kernel's value at that moment (the unwind tables' use is
/// tracerd's bookkeeping, published by [`Capture`] after each change).
pub trait KernelStatsSource: Send + Sync {
    /// The per-CPU counters (`COUNTERS`) summed over CPUs, by name, in
    /// slot order.
    fn counters(&self) -> Vec<(&'static str, u64)>;

    /// (program name, total run time, run count) of each loaded program
    /// while `BPF_ENABLE_STATS` is on (zeros otherwise), from each
    /// program's fdinfo.
    fn program_stats(&self) -> Vec<(String, Duration, u64)>;

    /// Entries now in each kernel map: (map name, entries, capacity). See
    /// [`KernelStats::map_usage`].
    fn map_usage(&self) -> MapUsage;

    /// What the unwind tables hold and cost (`UNWIND_ROWS`, `UNWIND_PAGES`,
    /// `PROC_MAPS`), as of tracerd's last change of them.
    fn unwind_usage(&self) -> UnwindUsage;
}

/// The descriptors and mappings [`KernelStatsSource`] reads, each a
/// duplicate of (or shared with) those [`Capture`] writes through, and the
/// capacities as loaded.
pub struct KernelStats {
    /// `COUNTERS`, a descriptor of its own.
    counters: PerCpuArray<MapData, u64>,
    /// Each loaded program by name: a descriptor of its own (aya's programs,
    /// or those loaded for uprobe_multi links).
    programs: Vec<(String, OwnedFd)>,
    /// `LIVE_ALLOCS`, `STACKS`, `STACK_TOTALS`, `PROCS`, `INFLIGHT` and
    /// `INFLIGHT_SLOTS`, descriptors of their own.
    live: OwnedFd,
    stacks: OwnedFd,
    stack_totals: OwnedFd,
    procs: OwnedFd,
    inflight: OwnedFd,
    inflight_slots: OwnedFd,
    /// The fast table, mapped (shared with [`Capture`]); None when off.
    live_table: Option<Arc<LiveTable>>,
    /// `PROC_SLOTS` (shared with [`Capture`]).
    totals: Arc<ProcTotalsMaps>,
    /// The positions of `EVENTS`; None if they could not be mapped.
    events_positions: Option<RingPositions>,
    /// The unwind tables' use, published by [`Capture`] after each change.
    unwind: Mutex<UnwindUsage>,
    /// The per-image spill maps, published by [`Capture`] after each change.
    own: Mutex<OwnUsage>,
    /// The configuration in force (capacities).
    config: CaptureConfig,
    /// tracerd's stop: the count of `LIVE_ALLOCS` ends early once raised
    /// (the service's, set by [`Capture`]'s `stop_with`).
    stopping: Mutex<Stopping>,
}

/// What [`KernelStats::new`] reads from: the maps and programs as
/// [`Capture`] has them.
pub(super) struct StatsParts<'a> {
    pub counters: PerCpuArray<MapData, u64>,
    pub programs: Vec<(String, OwnedFd)>,
    pub live: &'a MapData,
    pub stacks: &'a MapData,
    pub stack_totals: &'a MapData,
    pub procs: &'a MapData,
    pub inflight: &'a MapData,
    pub inflight_slots: &'a MapData,
    pub live_table: Option<Arc<LiveTable>>,
    pub totals: Arc<ProcTotalsMaps>,
    pub events_positions: Option<RingPositions>,
    pub config: CaptureConfig,
    pub stopping: Stopping,
}

impl KernelStats {
    /// The reader over `parts`, with descriptors of its own.
    ///
    /// # Errors
    /// The `dup` of a descriptor failed (out of descriptors).
    pub(super) fn new(parts: StatsParts<'_>) -> std::io::Result<Self> {
        let dup = |map: &MapData| map.fd().as_fd().try_clone_to_owned();
        Ok(Self {
            counters: parts.counters,
            programs: parts.programs,
            live: dup(parts.live)?,
            stacks: dup(parts.stacks)?,
            stack_totals: dup(parts.stack_totals)?,
            procs: dup(parts.procs)?,
            inflight: dup(parts.inflight)?,
            inflight_slots: dup(parts.inflight_slots)?,
            live_table: parts.live_table,
            totals: parts.totals,
            events_positions: parts.events_positions,
            unwind: Mutex::new(UnwindUsage::default()),
            own: Mutex::new(OwnUsage::default()),
            config: parts.config,
            stopping: Mutex::new(parts.stopping),
        })
    }

    /// Ends the count of `LIVE_ALLOCS` early once `stopping` is raised.
    pub(super) fn stop_with(&self, stopping: Stopping) {
        *self.stopping.lock().unwrap_or_else(PoisonError::into_inner) = stopping;
    }

    /// Publishes the unwind tables' use after a change of them.
    pub(super) fn publish_unwind(&self, usage: UnwindUsage) {
        *self.unwind.lock().unwrap_or_else(PoisonError::into_inner) = usage;
    }

    /// Publishes the per-image spill maps after a change of them.
    pub(super) fn publish_own(&self, usage: OwnUsage) {
        *self.own.lock().unwrap_or_else(PoisonError::into_inner) = usage;
    }

    /// Blocks in the per-image spill maps, and their capacity.
    fn own_entries(&self) -> (u64, u64) {
        let usage = self
            .own
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let entries = usage
            .maps
            .iter()
            .map(|map| {
                let mut n = 0u64;
                let mut count = |_: &u64, _: &AllocInfo| {
                    n += 1;
                    std::ops::ControlFlow::Continue(())
                };
                if bpf_sys::lookup_batch(map.as_fd(), &mut count).is_err() {
                    n = bpf_sys::count_keys::<u64>(map.as_fd());
                }
                n
            })
            .sum();
        (entries, usage.capacity)
    }

    /// Blocks in `LIVE_ALLOCS`: a batch walk (one lookup per key where the
    /// kernel has none), ended early (a lower bound) once tracerd stops.
    fn live_entries(&self) -> u64 {
        let stopping = self
            .stopping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut entries = 0u64;
        let mut count = |_: &AllocKey, _: &AllocInfo| {
            if stopping.is_raised() {
                return std::ops::ControlFlow::Break(());
            }
            entries += 1;
            std::ops::ControlFlow::Continue(())
        };
        if bpf_sys::lookup_batch(self.live.as_fd(), &mut count).is_err() {
            entries = bpf_sys::count_keys::<AllocKey>(self.live.as_fd());
        }
        entries
    }
}

impl KernelStatsSource for KernelStats {
    fn counters(&self) -> Vec<(&'static str, u64)> {
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

    fn program_stats(&self) -> Vec<(String, Duration, u64)> {
        self.programs
            .iter()
            .map(|(name, fd)| {
                let (ns, runs) = crate::sys::uprobe_multi::run_stats(fd.as_fd());
                (name.clone(), Duration::from_nanos(ns), runs)
            })
            .collect()
    }

    /// Entries now in each kernel map: (map name, entries, capacity), the
    /// capacities as configured. Counting walks the hash maps' keys (one
    /// syscall per key, or batches for `LIVE_ALLOCS`); `INFLIGHT_SLOTS`
    /// counts the slots in use (a batch read of the array, 32 bytes a
    /// slot); `EVENTS` is in bytes: those written and not yet read, of the
    /// ring's size. Once tracerd is stopping, the count of `LIVE_ALLOCS`
    /// ends early (a lower bound).
    fn map_usage(&self) -> MapUsage {
        let unwind = self.unwind_usage();
        let config = &self.config;
        vec![
            (
                MAP_LIVE_ALLOCS,
                self.live_entries(),
                u64::from(config.max_live_blocks),
            ),
            {
                let (entries, capacity) = self.own_entries();
                (MAP_OWN_LIVE, entries, capacity)
            },
            (
                MAP_LIVE_KEYS,
                self.live_table.as_deref().map_or(0, LiveTable::len),
                u64::from(config.live_table_blocks),
            ),
            (
                MAP_STACKS,
                bpf_sys::count_keys::<u64>(self.stacks.as_fd()),
                u64::from(config.max_stacks),
            ),
            (
                MAP_STACK_TOTALS,
                bpf_sys::count_keys::<StackTotalsKey>(self.stack_totals.as_fd()),
                u64::from(config.stack_totals_entries()),
            ),
            (
                MAP_PROC_SLOTS,
                self.totals.slots.len(),
                u64::from(PROC_SLOT_COUNT),
            ),
            (
                MAP_PROCS,
                bpf_sys::count_keys::<u32>(self.procs.as_fd()),
                u64::from(config.max_procs),
            ),
            (
                MAP_INFLIGHT,
                bpf_sys::count_keys::<u64>(self.inflight.as_fd()),
                u64::from(config.max_inflight),
            ),
            (
                MAP_INFLIGHT_SLOTS,
                super::inflight::slots_in_use(self.inflight_slots.as_fd()),
                u64::from(config.inflight_slots),
            ),
            (
                MAP_EVENTS,
                self.events_positions
                    .as_ref()
                    .map_or(0, RingPositions::pending),
                u64::from(config.events_ring_bytes),
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
                    u64::from(config.unwind_processes)
                },
            ),
        ]
    }

    fn unwind_usage(&self) -> UnwindUsage {
        *self.unwind.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Capture {
    /// The reader of the counters, program statistics, map use and unwind
    /// tables' use, shared.
    pub fn stats(&self) -> Arc<KernelStats> {
        self.stats.clone()
    }

    /// The per-CPU counters summed over CPUs, by name, in slot order.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.stats.counters()
    }

    /// Run statistics the kernel keeps for each loaded program while
    /// `BPF_ENABLE_STATS` is on (zero otherwise): (program name, total run
    /// time, run count), from each program's fdinfo.
    pub fn program_stats(&self) -> Vec<(String, Duration, u64)> {
        self.stats.program_stats()
    }

    /// Entries now in each kernel map: see [`KernelStats::map_usage`].
    pub fn map_usage(&self) -> MapUsage {
        self.stats.map_usage()
    }
}
