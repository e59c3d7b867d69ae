//! Capture: tracer's eBPF programs in the kernel, and the maps they keep.
//!
//! [`Capture`] loads the programs ([`load`]), attaches them to the glibc
//! allocator's probe points ([`probes`], [`attach`]) and the scheduler's
//! lifecycle tracepoints, and reads what they keep: live blocks
//! ([`live`], with the fast table of [`live_table`]), per-process totals
//! ([`procs`], with the slots of [`proc_slots`]), stacks ([`stacks`]),
//! calls in flight ([`inflight`]), process events ([`events`]) and
//! counters ([`usage`]). [`KernelMaps`] is the trait through which every
//! later stage uses it, so that lifecycle and the service are tested
//! without a kernel.
//!
//! Everything here talks to the kernel (needs root, or CAP_BPF +
//! CAP_PERFMON); nothing here interprets what it reads: that is the job of
//! [`crate::lifecycle`] and [`crate::snapshot`].
use std::{collections::HashMap, path::PathBuf};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
};
use tracer_common::{AllocInfo, AllocKey, ProcTotals, StackTotals, StackTotalsKey};

use crate::config::Config;

pub mod attach;
pub mod events;
#[cfg(test)]
pub mod fake;
pub mod inflight;
pub mod kernel;
pub mod live;
pub mod live_table;
pub mod load;
mod multi;
pub mod object;
pub mod own_spill;
pub mod probes;
pub mod proc_slots;
pub mod procs;
pub mod stack_totals;
pub mod stacks;
pub mod stopping;
pub mod unwind;
pub mod usage;

pub use attach::{Detached, OwnedLinks, ProbeLinks};
pub use kernel::{
    BlockMaps, ImageId, KernelMaps, ProbeMaps, ScopeMaps, StackMaps, Stopping, TotalsMaps,
    UnwindMaps, UsageMaps,
};
pub use probes::{AttachedLibrary, ProbePoint};
pub use procs::{ProcTotalsMaps, ProcTotalsSource};
pub use usage::{KernelStats, KernelStatsSource};

use live_table::LiveTable;
use load::Programs;

/// Errors of loading, attaching and reading the eBPF side.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// This binary was built with `AYA_BUILD_SKIP=1` and holds no eBPF object.
    #[error(
        "this tracerd was built without its eBPF programs (AYA_BUILD_SKIP); rebuild without it"
    )]
    NotBuilt,
    /// The eBPF object could not be prepared or loaded.
    #[error("loading the eBPF object: {0}")]
    Load(String),
    /// A program could not be loaded into the kernel (verifier, permissions).
    #[error("loading program {program}: {source}")]
    Program {
        /// The program's name.
        program: String,
        /// What aya said (boxed: it is large, and errors are rare).
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A program could not be attached to its target.
    #[error("attaching {program} to {target}: {source}")]
    Attach {
        /// The program's name.
        program: String,
        /// Where: a library path and symbol, or a tracepoint.
        target: String,
        /// What aya or the kernel said (boxed, as above).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// tracerd is stopping: nothing is attached any more.
    #[error("tracerd is stopping: no probe is attached any more")]
    Stopping,
    /// No glibc was found to attach to.
    #[error("no glibc found (looked at {looked}); pass --libc PATH")]
    NoLibc {
        /// The places looked at.
        looked: String,
    },
    /// glibc could not be read or lacks a symbol tracer needs.
    #[error("reading {path}: {reason}")]
    Libc {
        /// The library.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A kernel map is missing from the object or of the wrong type.
    #[error("map {map}: {reason}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// What went wrong.
        reason: String,
    },
}

/// Capacities and limits of the kernel side, set at load time (from
/// tracerd's settings: [`CaptureConfig::from`]).
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Frames kept per stack, 1..=64 ([`MAX_NFRAME`]): the kernel's walk
    /// stops there, and the stack map's value size is `nframe * 8` bytes.
    pub nframe: u32,
    /// Frames the kernel walks per stack: nframe plus the leading
    /// allocator frames tracerd drops, clamped to nframe..=96
    /// ([`MAX_WALK_FRAMES`](tracer_common::MAX_WALK_FRAMES)) at load; the
    /// stack map's value size is `(1 + walk_frames) * 8` bytes.
    pub walk_frames: u32,
    /// Rows of `UNWIND_ROWS` (8 bytes each); 0: the unwinder is off and
    /// every stack is walked with frame pointers.
    pub unwind_table_rows: u32,
    /// Entries of `UNWIND_PAGES`.
    pub unwind_table_pages: u32,
    /// Entries of `PROC_MAPS` (processes with mappings for the unwinder).
    pub unwind_processes: u32,
    /// Capacity of `LIVE_ALLOCS` in live blocks, all processes together.
    pub max_live_blocks: u32,
    /// Block slots of the fast table (`LIVE_KEYS`, `LIVE_VALUES`), rounded
    /// up to [`LIVE_WAYS`](tracer_common::LIVE_WAYS) times a power of two
    /// (at least 2) at load; 0: no table, every block in `LIVE_ALLOCS`.
    pub live_table_blocks: u32,
    /// The share of the live-block maps (`LIVE_ALLOCS` and the fast table
    /// together) one process may hold, in percent; 100 (or 0): no limit.
    pub process_share: u32,
    /// Attach `MMAP_TRACEPOINTS`: traced processes' own anonymous mappings
    /// become blocks of source `mmap`.
    pub trace_mmap: bool,
    /// Capacity of `STACKS` in distinct stacks.
    pub max_stacks: u32,
    /// Capacity of `PROCS` in processes.
    pub max_procs: u32,
    /// Capacity of `INFLIGHT` (the spill of calls in progress whose slot is
    /// taken) in calls.
    pub max_inflight: u32,
    /// Slots of `INFLIGHT_SLOTS` (calls in progress, one per thread id
    /// modulo this), a power of two up to 4194304: a value that is not is
    /// rounded up to one at load.
    pub inflight_slots: u32,
    /// Size of the `EVENTS` ring buffer in bytes, a power of two multiple
    /// of the page size: a value that is not is rounded up to one at load
    /// (as aya and libbpf do).
    pub events_ring_bytes: u32,
    /// The glibc files to probe from the start; empty: found as the
    /// dynamic loader finds them.
    pub libc: Vec<PathBuf>,
    /// Mean sampling interval in bytes (byte-weighted Poisson sampling);
    /// 0 records every allocation (exact).
    pub sample_interval: u64,
    /// Attach the probes for every process at load; false attaches none
    /// until [`Capture::attach`] (a scoped tracerd, so no process outside
    /// its scope is traced even while it starts).
    pub system_wide: bool,
}

impl From<&Config> for CaptureConfig {
    /// The kernel side's settings of tracerd's (sections `capture`,
    /// `unwind`, `maps`, the `libc` of `allocators` and the scope of
    /// `processes`): system-wide when no scope is chosen, no unwind table
    /// rows when `unwind` is off.
    fn from(config: &Config) -> Self {
        let (capture, unwind, maps) = (&config.capture, &config.unwind, &config.maps);
        CaptureConfig {
            nframe: capture.nframe,
            walk_frames: capture.nframe + capture.allocator_frames_depth,
            unwind_table_rows: if unwind.unwind {
                unwind.unwind_table_rows
            } else {
                0
            },
            unwind_table_pages: unwind.unwind_table_pages,
            unwind_processes: unwind.unwind_processes,
            max_live_blocks: maps.max_live_blocks,
            live_table_blocks: maps.live_table_blocks,
            process_share: maps.process_share,
            trace_mmap: capture.trace_mmap,
            max_stacks: maps.max_stacks,
            max_procs: maps.max_procs,
            max_inflight: maps.max_inflight,
            inflight_slots: maps.inflight_slots,
            events_ring_bytes: maps.events_ring_bytes,
            libc: config.allocators.libc.clone(),
            sample_interval: capture.sample_interval,
            system_wide: config.processes.traces_every_process(),
        }
    }
}

impl CaptureConfig {
    /// The live blocks one process may hold: `process_share` percent of
    /// the live-block maps' blocks (`max_live_blocks` plus
    /// `live_table_blocks`), at least 1; 0 (no limit) for a share of 100 or
    /// more, or 0. The kernel drops a process's blocks past it
    /// (`GLOBAL_PROCESS_MAX_BLOCKS`).
    pub fn process_max_blocks(&self) -> u64 {
        let share = self.process_share;
        if share == 0 || share >= 100 {
            return 0;
        }
        let capacity = u64::from(self.max_live_blocks) + u64::from(self.live_table_blocks);
        (capacity * u64::from(share) / 100).max(1)
    }

    /// The stacks one process may have in `STACKS`: `process_share`
    /// percent of `max_stacks`, at least 1; 0 (no limit) as for
    /// [`CaptureConfig::process_max_blocks`]. Past it, a block whose stack
    /// is new keeps its frame 0 (`GLOBAL_PROCESS_MAX_STACKS`).
    pub fn process_max_stacks(&self) -> u64 {
        let share = self.process_share;
        if share == 0 || share >= 100 {
            return 0;
        }
        (u64::from(self.max_stacks) * u64::from(share) / 100).max(1)
    }

    /// The reserve of `STACKS` for the processes with few stacks: the
    /// stacks in the map from which on a process stores a new one only
    /// while it holds less than a quarter of the room left (three
    /// quarters of `max_stacks`); 0, no reserve, when a process may hold
    /// the whole map ([`CaptureConfig::process_max_stacks`] 0). A compiler
    /// or two that fill the map to the reserve leave each program started
    /// beside them its tracebacks (`GLOBAL_STACKS_RESERVE_FROM`).
    pub fn stacks_reserve_from(&self) -> u64 {
        if self.process_max_stacks() == 0 {
            return 0;
        }
        let capacity = u64::from(self.max_stacks);
        capacity - capacity / 4
    }

    /// Whether a process holding `held` stacks, with `stored` in `STACKS`,
    /// may store no new one: past its share, or in the reserve
    /// ([`CaptureConfig::stacks_reserve_from`]) with a quarter of the room
    /// left or more: what the programs decide
    /// ([`tracer_common::stack_share_refuses`]).
    pub fn past_stack_share(&self, held: u64, stored: u64) -> bool {
        tracer_common::stack_share_refuses(
            held,
            stored,
            self.process_max_stacks(),
            self.stacks_reserve_from(),
            u64::from(self.max_stacks),
        )
    }

    /// Entries of `STACK_TOTALS`: twice `max_stacks`, for an image keeps
    /// the entries of stacks collected since (at 0 blocks) until it ends.
    pub fn stack_totals_entries(&self) -> u32 {
        self.max_stacks.saturating_mul(2).max(1)
    }
}

/// The loaded eBPF programs, their links, and handles to their maps.
///
/// Dropping it detaches every probe and frees every map.
pub struct Capture {
    /// Holds programs and links: dropping it detaches them.
    ebpf: Ebpf,
    live: BpfHashMap<MapData, AllocKey, AllocInfo>,
    /// The per-image spill maps beside `live` (`OWN_LIVE`, `OWN_LEVELS`).
    own: std::sync::Arc<own_spill::OwnSpill>,
    /// The fast table in front of `live`, mapped; None when it is off.
    live_table: Option<std::sync::Arc<LiveTable>>,
    /// LIVE_KEYS and LIVE_VALUES, kept open with their mapping.
    _live_table_maps: (MapData, MapData),
    /// STACKS: its value size depends on nframe, so it is read with raw
    /// map syscalls rather than a typed aya map.
    stacks: MapData,
    /// `STACKS_HELD`, mapped: lowered for each stack collected.
    stacks_held: stacks::StacksHeld,
    procs: BpfHashMap<MapData, u32, ProcTotals>,
    /// `STACK_TOTALS`: live blocks and bytes per (image, stack).
    stack_totals: BpfHashMap<MapData, StackTotalsKey, StackTotals>,
    /// `STACK_TOTALS` and `STACKS` again, through descriptors of their own,
    /// for statistics read without the kernel lock.
    totals_reader: std::sync::Arc<stack_totals::TotalsReader>,
    /// `PROC_SLOTS`, mapped, and `PROCS` again, shared with the readers
    /// of [`TotalsMaps::totals`] (no lock needed); the slots' map itself
    /// is kept open beside it.
    totals: std::sync::Arc<procs::ProcTotalsMaps>,
    _proc_slots_map: MapData,
    /// The counters, program statistics, map use and unwind tables' use,
    /// read through descriptors of its own and shared with the readers of
    /// [`UsageMaps::stats`] (no lock needed; it owns `COUNTERS`, the
    /// positions of `EVENTS`, and copies of `INFLIGHT` and `INFLIGHT_SLOTS`,
    /// which nothing else of tracerd reads).
    stats: std::sync::Arc<usage::KernelStats>,
    switches: aya::maps::Array<MapData, u64>,
    /// `SCOPE_TGIDS`: the processes recorded while the scope filter is on.
    scope_tgids: BpfHashMap<MapData, u32, u32>,
    events: Option<RingBuf<MapData>>,
    libraries: Vec<AttachedLibrary>,
    /// Each probed object with its probe points.
    targets: Vec<probes::Target>,
    programs: Programs,
    /// The uprobe programs loaded for uprobe_multi links; None where the
    /// kernel has none (aya's programs are loaded instead, and each probe
    /// is a perf event of its own).
    multi: Option<multi::MultiPrograms>,
    /// Attached uprobe links: None for system-wide, Some(pid) per process.
    links: HashMap<Option<u32>, Vec<attach::Link>>,
    /// The links themselves (uprobes and tracepoints), owned apart from
    /// the programs behind a lock of their own; closed once taken out.
    owned_links: attach::ProbeLinks,
    config: CaptureConfig,
    /// tracerd's stop: long reads end early once it is raised, and
    /// nothing is attached after it.
    stopping: kernel::Stopping,
    /// The unwind tables' bookkeeping; written through `unwind_maps`.
    unwind: unwind::tables::TableStore,
    /// The maps the unwind tables live in.
    unwind_maps: unwind::maps::UnwindMaps,
}

impl Drop for Capture {
    /// Detaches every probe still attached (see [`Capture::take_probes`])
    /// before the programs and maps go.
    fn drop(&mut self) {
        self.take_probes().finish();
    }
}

impl Capture {
    /// The libraries probed and the probe points on each.
    pub fn libraries(&self) -> &[AttachedLibrary] {
        &self.libraries
    }

    /// The configuration in force (nframe clamped to 1..=64, the in-flight
    /// slots and the ring buffer's size rounded as the kernel has them).
    pub fn config(&self) -> &CaptureConfig {
        &self.config
    }

    /// The ring buffer of process events; taken once by the event loop.
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }
}
