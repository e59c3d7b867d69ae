//! The maps taken out of the loaded object: a handle to each map tracerd
//! reads or writes, the memory mappings of those it reads in place, and
//! `EXP_TABLE` filled.
use std::os::fd::AsFd as _;

use aya::{
    Ebpf,
    maps::{Map, MapData, PerCpuArray, RingBuf},
};
use tracer_common::{
    AllocInfo, AllocKey, Inflight, MAP_COUNTERS, MAP_EVENTS, MAP_EXP_TABLE, MAP_INFLIGHT,
    MAP_INFLIGHT_SLOTS, MAP_LIVE_ALLOCS, MAP_LIVE_KEYS, MAP_LIVE_VALUES, MAP_PROC_SLOTS, MAP_PROCS,
    MAP_SCOPE_TGIDS, MAP_STACK_TOTALS, MAP_STACKS, MAP_STACKS_HELD, MAP_SWITCHES, ProcTotals,
    StackTotals, StackTotalsKey,
};

use super::super::events::RingPositions;
use super::super::live_table::LiveTable;
use super::super::object::exponential_table;
use super::super::own_spill::OwnSpill;
use super::super::proc_slots::ProcSlots;
use super::super::stacks::StacksHeld;
use super::super::unwind::maps::UnwindMaps;
use super::super::{CaptureConfig, CaptureError};
use super::sizes::Sizes;
use super::{second_map_fd, take_array, take_map};

/// The maps of a loaded object, taken out of it.
pub(super) struct Taken {
    /// `SWITCHES`.
    pub(super) switches: aya::maps::Array<MapData, u64>,
    /// `SCOPE_TGIDS`.
    pub(super) scope_tgids: aya::maps::HashMap<MapData, u32, u32>,
    /// `EXP_TABLE`, filled: held so that it lives as long as the loading.
    pub(super) exp_table: aya::maps::Array<MapData, u32>,
    /// `LIVE_ALLOCS`.
    pub(super) live: aya::maps::HashMap<MapData, AllocKey, AllocInfo>,
    /// The per-image spill maps.
    pub(super) own: std::sync::Arc<OwnSpill>,
    /// `LIVE_KEYS` and `LIVE_VALUES`.
    pub(super) live_keys: MapData,
    pub(super) live_values: MapData,
    /// Their mapping; None with the table off (0 buckets).
    pub(super) live_table: Option<LiveTable>,
    /// `STACKS`.
    pub(super) stacks: MapData,
    /// `STACKS_HELD`'s mapping (which keeps the map).
    pub(super) stacks_held: StacksHeld,
    /// `PROCS`, and a second descriptor of it.
    pub(super) procs: aya::maps::HashMap<MapData, u32, ProcTotals>,
    pub(super) procs_fd: std::os::fd::OwnedFd,
    /// `STACK_TOTALS`.
    pub(super) stack_totals: aya::maps::HashMap<MapData, StackTotalsKey, StackTotals>,
    /// `PROC_SLOTS`, and its mapping.
    pub(super) proc_slots_map: MapData,
    pub(super) proc_slots: ProcSlots,
    /// `COUNTERS`.
    pub(super) counters: PerCpuArray<MapData, u64>,
    /// `INFLIGHT` and `INFLIGHT_SLOTS`.
    pub(super) inflight: aya::maps::HashMap<MapData, u64, Inflight>,
    pub(super) inflight_slots_map: MapData,
    /// `EVENTS`, and the mapping of its positions (None: not mapped).
    pub(super) events: RingBuf<MapData>,
    pub(super) events_positions: Option<RingPositions>,
    /// The unwinder's maps (none with it off).
    pub(super) unwind_maps: UnwindMaps,
}

impl Taken {
    /// Takes the maps out of `ebpf`, loaded with `config` and `sizes`.
    ///
    /// # Errors
    /// [`CaptureError::Map`] naming the map missing, of another type, or
    /// that could not be mapped or filled.
    pub(super) fn take(
        ebpf: &mut Ebpf,
        config: &CaptureConfig,
        sizes: &Sizes,
    ) -> Result<Self, CaptureError> {
        let switches = take_map(ebpf, MAP_SWITCHES)?;
        let scope_tgids = take_map(ebpf, MAP_SCOPE_TGIDS)?;
        let exp_table = take_exp_table(ebpf)?;
        let live = take_map(ebpf, MAP_LIVE_ALLOCS)?;
        let own = std::sync::Arc::new(OwnSpill::take(ebpf, u64::from(config.max_live_blocks))?);
        let live_keys = take_array(ebpf, MAP_LIVE_KEYS)?;
        let live_values = take_array(ebpf, MAP_LIVE_VALUES)?;
        let live_table = match sizes.live_buckets {
            0 => None,
            buckets => Some(
                LiveTable::map(live_keys.fd().as_fd(), live_values.fd().as_fd(), buckets).map_err(
                    |e| CaptureError::Map {
                        map: MAP_LIVE_KEYS,
                        reason: format!("cannot map the fast live-block table: {e}"),
                    },
                )?,
            ),
        };
        let stacks = match ebpf.take_map(MAP_STACKS) {
            Some(Map::HashMap(data)) => data,
            _ => {
                return Err(CaptureError::Map {
                    map: MAP_STACKS,
                    reason: "missing or not a hash map".into(),
                });
            }
        };
        let stacks_held_map = take_array(ebpf, MAP_STACKS_HELD)?;
        let stacks_held =
            StacksHeld::map(stacks_held_map.fd().as_fd()).map_err(|e| CaptureError::Map {
                map: MAP_STACKS_HELD,
                reason: format!("cannot map the count of stacks: {e}"),
            })?;
        let procs: aya::maps::HashMap<MapData, u32, ProcTotals> = take_map(ebpf, MAP_PROCS)?;
        let procs_fd = second_map_fd(aya::maps::IterableMap::map(&procs), MAP_PROCS)?;
        let stack_totals = take_map(ebpf, MAP_STACK_TOTALS)?;
        let proc_slots_map = take_array(ebpf, MAP_PROC_SLOTS)?;
        let proc_slots =
            ProcSlots::map(proc_slots_map.fd().as_fd()).map_err(|e| CaptureError::Map {
                map: MAP_PROC_SLOTS,
                reason: format!("cannot map the process slots: {e}"),
            })?;
        let counters = take_map(ebpf, MAP_COUNTERS)?;
        let inflight = take_map(ebpf, MAP_INFLIGHT)?;
        let inflight_slots_map = take_array(ebpf, MAP_INFLIGHT_SLOTS)?;
        let events: RingBuf<MapData> = take_map(ebpf, MAP_EVENTS)?;
        let events_positions = RingPositions::map(events.as_fd(), sizes.page_size);
        if events_positions.is_none() {
            tracing::warn!(
                map = MAP_EVENTS,
                "cannot map the ring buffer's positions: its use reads 0"
            );
        }
        let unwind_maps = match sizes.unwind_rows {
            0 => UnwindMaps::none(),
            _ => UnwindMaps::take(ebpf, sizes.rows_entries)?,
        };
        Ok(Self {
            switches,
            scope_tgids,
            exp_table,
            live,
            own,
            live_keys,
            live_values,
            live_table,
            stacks,
            stacks_held,
            procs,
            procs_fd,
            stack_totals,
            proc_slots_map,
            proc_slots,
            counters,
            inflight,
            inflight_slots_map,
            events,
            events_positions,
            unwind_maps,
        })
    }
}

/// `EXP_TABLE`, taken out of `ebpf` and filled with exponential variates
/// of mean 1 for the kernel's sampling countdown.
///
/// # Errors
/// [`CaptureError::Map`] when it is missing or refuses a value.
fn take_exp_table(ebpf: &mut Ebpf) -> Result<aya::maps::Array<MapData, u32>, CaptureError> {
    let mut exp_table: aya::maps::Array<MapData, u32> = take_map(ebpf, MAP_EXP_TABLE)?;
    for (i, value) in exponential_table().into_iter().enumerate() {
        exp_table
            .set(i as u32, value, 0)
            .map_err(|e| CaptureError::Map {
                map: MAP_EXP_TABLE,
                reason: e.to_string(),
            })?;
    }
    Ok(exp_table)
}
