//! The loader's globals and map sizes, from the configuration: each clamped
//! to what the programs allow, and the object loaded with them.
use aya::{Ebpf, EbpfLoader};
use tracer_common::{
    GLOBAL_INFLIGHT_SLOT_MASK, GLOBAL_LIVE_BUCKET_MASK, GLOBAL_NFRAME, GLOBAL_PAGE_SIZE,
    GLOBAL_PROCESS_MAX_BLOCKS, GLOBAL_PROCESS_MAX_STACKS, GLOBAL_SAMPLE_MEAN,
    GLOBAL_STACKS_CAPACITY, GLOBAL_STACKS_RESERVE_FROM, GLOBAL_TRACERD_TGID, GLOBAL_VMA_OFFSETS,
    LIVE_WAYS, MAP_EVENTS, MAP_INFLIGHT, MAP_INFLIGHT_SLOTS, MAP_LIVE_ALLOCS, MAP_LIVE_KEYS,
    MAP_LIVE_VALUES, MAP_PROCS, MAP_STACK_TOTALS, MAP_STACKS, MAX_NFRAME, MAX_WALK_FRAMES,
    VmaOffsets,
    unwind::{MAP_PROC_MAPS, MAP_UNWIND_PAGES, MAP_UNWIND_ROWS},
};

use super::super::events::ring_size;
use super::super::inflight::MAX_INFLIGHT_SLOTS;
use super::super::live_table;
use super::super::{CaptureConfig, CaptureError};

/// The sizes the object is loaded with, from a [`CaptureConfig`].
pub(super) struct Sizes {
    /// Frames a stack keeps.
    pub(super) nframe: u32,
    /// Frames the walk steps at most (at least `nframe`).
    pub(super) walk_frames: u32,
    /// Entries of `UNWIND_ROWS`, `UNWIND_PAGES` and `PROC_MAPS`: 1 each
    /// with the unwinder off (the walk finds no process's mappings and
    /// follows frame pointers).
    pub(super) rows_entries: u32,
    pub(super) pages_entries: u32,
    pub(super) procs_entries: u32,
    /// The unwinder's rows as configured (0: off).
    pub(super) unwind_rows: u32,
    /// This host's page size, in bytes.
    pub(super) page_size: u64,
    /// Slots of `INFLIGHT_SLOTS`: a power of two.
    pub(super) inflight_slots: u32,
    /// The ring buffer's size in bytes (a power of two of pages).
    pub(super) events_ring_bytes: u32,
    /// Buckets of the fast live-block table (0: none).
    pub(super) live_buckets: u32,
}

impl Sizes {
    /// The sizes `config` asks for, clamped.
    pub(super) fn of(config: &CaptureConfig) -> Self {
        let nframe = config.nframe.clamp(1, MAX_NFRAME);
        let walk_frames = config.walk_frames.clamp(nframe, MAX_WALK_FRAMES);
        // The unwinder off: the smallest maps (the walk finds no process's
        // mappings and follows frame pointers).
        let unwind_rows = config.unwind_table_rows;
        let (rows_entries, pages_entries, procs_entries) = match unwind_rows {
            0 => (1, 1, 1),
            rows => (
                rows,
                config.unwind_table_pages.max(1),
                config.unwind_processes.max(1),
            ),
        };
        let page_size = crate::sys::procfs::page_size();
        let inflight_slots = config
            .inflight_slots
            .clamp(1, MAX_INFLIGHT_SLOTS)
            .next_power_of_two();
        Self {
            nframe,
            walk_frames,
            rows_entries,
            pages_entries,
            procs_entries,
            unwind_rows,
            page_size,
            inflight_slots,
            events_ring_bytes: ring_size(config.events_ring_bytes, page_size),
            live_buckets: live_table::buckets_for(config.live_table_blocks),
        }
    }

    /// `config` as loaded: its sizes as clamped here, and the unwinder's
    /// rows 0 without its maps (`unwinder_on` false).
    pub(super) fn applied(&self, config: CaptureConfig, unwinder_on: bool) -> CaptureConfig {
        CaptureConfig {
            nframe: self.nframe,
            walk_frames: self.walk_frames,
            unwind_table_rows: if unwinder_on { self.rows_entries } else { 0 },
            inflight_slots: self.inflight_slots,
            events_ring_bytes: self.events_ring_bytes,
            live_table_blocks: self.live_buckets * LIVE_WAYS,
            ..config
        }
    }
}

/// Loads `object` into the kernel with its globals and map sizes from
/// `config` and `sizes`.
///
/// # Errors
/// [`CaptureError::Load`] with what aya said.
pub(super) fn load_object(
    object: &[u8],
    config: &CaptureConfig,
    sizes: &Sizes,
) -> Result<Ebpf, CaptureError> {
    let tgid = std::process::id();
    let page_size = sizes.page_size;
    let walk_frames = sizes.walk_frames;
    let slot_mask = sizes.inflight_slots - 1;
    let live_buckets = sizes.live_buckets;
    let live_bucket_mask = live_buckets.saturating_sub(1);
    let process_max_blocks = CaptureConfig {
        live_table_blocks: live_buckets * LIVE_WAYS,
        ..config.clone()
    }
    .process_max_blocks();
    let (reserve_from, stacks_capacity) =
        (config.stacks_reserve_from(), u64::from(config.max_stacks));
    // The walk asks the kernel for a mapping PROC_MAPS lacks only with
    // the unwinder on (off, every stack is a frame-pointer walk).
    let vma_offsets = match sizes.unwind_rows {
        0 => VmaOffsets::default(),
        _ => crate::sys::btf::vma_offsets().unwrap_or_else(|err| {
            tracing::warn!(%err, "the unwinder cannot read the kernel's mappings: a process is walked with frame pointers until tracerd has written its mappings (counted in unwind_no_proc_maps)");
            VmaOffsets::default()
        }),
    };
    EbpfLoader::new()
        .override_global(GLOBAL_TRACERD_TGID, &tgid, true)
        .override_global(GLOBAL_VMA_OFFSETS, &vma_offsets, true)
        .override_global(GLOBAL_PAGE_SIZE, &page_size, true)
        .override_global(GLOBAL_NFRAME, &walk_frames, true)
        .override_global(GLOBAL_SAMPLE_MEAN, &config.sample_interval, true)
        .override_global(GLOBAL_INFLIGHT_SLOT_MASK, &slot_mask, true)
        .override_global(GLOBAL_LIVE_BUCKET_MASK, &live_bucket_mask, true)
        .override_global(GLOBAL_PROCESS_MAX_BLOCKS, &process_max_blocks, true)
        .override_global(
            GLOBAL_PROCESS_MAX_STACKS,
            &config.process_max_stacks(),
            true,
        )
        .override_global(GLOBAL_STACKS_RESERVE_FROM, &reserve_from, true)
        .override_global(GLOBAL_STACKS_CAPACITY, &stacks_capacity, true)
        .map_max_entries(MAP_LIVE_ALLOCS, config.max_live_blocks)
        .map_max_entries(MAP_LIVE_KEYS, live_buckets.max(1))
        .map_max_entries(MAP_LIVE_VALUES, live_buckets.max(1) * LIVE_WAYS)
        .map_max_entries(MAP_STACKS, config.max_stacks)
        .map_max_entries(MAP_STACK_TOTALS, config.stack_totals_entries())
        .map_max_entries(MAP_PROCS, config.max_procs)
        .map_max_entries(MAP_INFLIGHT, config.max_inflight)
        .map_max_entries(MAP_INFLIGHT_SLOTS, sizes.inflight_slots)
        .map_max_entries(MAP_EVENTS, sizes.events_ring_bytes)
        .map_max_entries(MAP_UNWIND_ROWS, sizes.rows_entries)
        .map_max_entries(MAP_UNWIND_PAGES, sizes.pages_entries)
        .map_max_entries(MAP_PROC_MAPS, sizes.procs_entries)
        .load(object)
        .map_err(|e| CaptureError::Load(e.to_string()))
}
