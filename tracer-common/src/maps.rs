//! The name of every map and load-time global in the eBPF object, each a
//! `pub const` that the kernel side declares and tracerd opens by, so that no
//! string literal names a map twice; with the layout and capacity of the maps
//! that hold plain integers (stacks, sampling, switches, events).
//!
//! A map whose value is a structure of this crate has its structure's
//! constants (capacity included) in that structure's module: the live table
//! in [`live_table`](crate::live_table), process slots in
//! [`procs`](crate::procs), in-flight slots in [`inflight`](crate::inflight),
//! counters in [`counter`](crate::counter). A capacity "as compiled" is the
//! one of the object; tracerd sets the real one at load time from its
//! configuration.

#[cfg(doc)]
use crate::{
    AllocInfo, AllocKey, Counter, INFLIGHT_SLOT_COUNT, Inflight, InflightSlot, LIVE_WAYS,
    LiveBucket, PROC_SLOT_COUNT, ProcEvent, ProcEventKind, ProcSlot, ProcStats, ProcTotals,
    StackTotals, StackTotalsKey, live_key, proc_slot_index,
};

/// Live blocks: [`AllocKey`] → [`AllocInfo`]. One entry per live block of
/// every traced process.
pub const MAP_LIVE_ALLOCS: &str = "LIVE_ALLOCS";
/// Live blocks, fast path: a preallocated table of [`LIVE_WAYS`]-way
/// buckets ([`LiveBucket`], one 64-byte cache line each), whose values are
/// in [`MAP_LIVE_VALUES`]. A block whose bucket is full, or whose key cannot
/// be packed ([`live_key`]), goes to [`MAP_LIVE_ALLOCS`] instead (the
/// spill). An array slot is claimed with one compare-and-swap, where a hash
/// map insert and delete cost about 500 ns per block here. Both arrays are
/// `BPF_F_MMAPABLE`: tracerd reads and removes blocks through the mapping.
pub const MAP_LIVE_KEYS: &str = "LIVE_KEYS";
/// Values of the fast table: [`AllocInfo`] of way `w` of bucket `b` at index
/// `b * LIVE_WAYS + w`.
pub const MAP_LIVE_VALUES: &str = "LIVE_VALUES";

/// Calls in progress: thread id (`bpf_get_current_pid_tgid()`) → [`Inflight`],
/// written at an allocator's entry and consumed at its return.
pub const MAP_INFLIGHT: &str = "INFLIGHT";
/// Calls in progress, fast path: a power of two of slots (tracerd's
/// `inflight_slots`, [`INFLIGHT_SLOT_COUNT`] as compiled) indexed by
/// `tid & (slots - 1)` ([`GLOBAL_INFLIGHT_SLOT_MASK`]), each claimed by one
/// thread at a time ([`InflightSlot::owner`]). A thread whose slot is taken
/// by another uses [`MAP_INFLIGHT`] instead. An array lookup is a few ns; a
/// hash insert, lookup and delete cost about 400 ns per call here.
pub const MAP_INFLIGHT_SLOTS: &str = "INFLIGHT_SLOTS";
/// Threads whose call is in [`MAP_INFLIGHT`] rather than a slot: while it is
/// 0 (almost always) no entry needs to look there. Array of one u64.
pub const MAP_INFLIGHT_SPILL: &str = "INFLIGHT_SPILL";

/// User stacks: stack id (a 64-bit hash of the frames) → [`STACK_WORDS`]
/// u64s: a second, independent 64-bit hash of the frames, then the return
/// addresses, frame 0 first, 0 after the last. A plain hash map rather than
/// `BPF_MAP_TYPE_STACK_TRACE`: that one drops every stack whose bucket is
/// taken (3.6% of stacks at 8% occupancy, measured here).
pub const MAP_STACKS: &str = "STACKS";
/// Name of the one-slot `BPF_F_MMAPABLE` array counting the stacks in
/// [`MAP_STACKS`]: raised by the programs for each stack they store,
/// lowered by tracerd (atomically, through its mapping) for each it
/// collects. Compared with [`GLOBAL_STACKS_RESERVE_FROM`].
pub const MAP_STACKS_HELD: &str = "STACKS_HELD";
/// Per-CPU scratch buffer of one stack value ([`STACK_WORDS`] u64s).
pub const MAP_STACK_SCRATCH: &str = "STACK_SCRATCH";
/// u64 words of a [`MAP_STACKS`] value as compiled: the check hash (with
/// `STACK_CUT`) and up to [`MAX_WALK_FRAMES`] frames. tracerd shrinks the
/// value to `1 + frames walked` words at load time, which also bounds the
/// kernel's stack walk.
pub const STACK_WORDS: usize = 1 + MAX_WALK_FRAMES as usize;
/// Largest traceback tracer keeps (tracemalloc's nframe).
pub const MAX_NFRAME: u32 = 64;
/// Most frames the kernel walks: nframe plus the allocator's own frames
/// (`operator new`, `alloc::raw_vec`, `g_malloc`, ...) that tracerd drops
/// before it counts frames against nframe.
pub const MAX_WALK_FRAMES: u32 = 96;

/// Totals per (process image, stack): [`StackTotalsKey`] → [`StackTotals`],
/// kept by the programs in step with the live maps (see
/// [`stack_totals`](crate::stack_totals)).
pub const MAP_STACK_TOTALS: &str = "STACK_TOTALS";

/// Per-process totals: tgid → [`ProcTotals`].
pub const MAP_PROCS: &str = "PROCS";
/// Direct-mapped per-process totals in front of [`MAP_PROCS`]: an array of
/// [`PROC_SLOT_COUNT`] [`ProcSlot`]s, the process `tgid` in slot
/// [`proc_slot_index`]`(tgid)` when it is free at the process's first
/// allocation, else in `PROCS` (counted in the slot's spill count, so that a
/// lookup goes to the hash only while some process of the slot is there).
/// An array lookup is inlined by the verifier; a hash lookup costs about 150
/// kernel instructions here, and every allocation and free needs one.
/// `BPF_F_MMAPABLE`: tracerd reads it through a shared mapping.
pub const MAP_PROC_SLOTS: &str = "PROC_SLOTS";

/// Anonymous mappings held as blocks, per process and page of address
/// space: [`crate::MmapPageKey`] → [`crate::MmapRegions`].
pub const MAP_MMAP_REGIONS: &str = "MMAP_REGIONS";
/// Entries of [`MAP_MMAP_REGIONS`]: pages of 256 mappings held at once by
/// all processes (2,056 bytes each, allocated as a process makes the first
/// mapping of a page).
pub const MMAP_PAGE_ENTRIES: u32 = 1 << 15;

/// Per-CPU counters indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Ring buffer of [`ProcEvent`]s: a process first seen, exec'd or exited.
/// Its size in bytes (a power of two multiple of the page size) is
/// tracerd's `events_ring_bytes`, [`EVENTS_RING_BYTES`] as compiled.
pub const MAP_EVENTS: &str = "EVENTS";
/// Size of [`MAP_EVENTS`] in bytes as compiled; tracerd sets the real size
/// at load time.
pub const EVENTS_RING_BYTES: u32 = 1 << 18;

/// The name of the global in the eBPF object holding the daemon's own tgid,
/// whose allocations are never traced.
pub const GLOBAL_TRACERD_TGID: &str = "TRACERD_TGID";
/// The name of the global holding the page size in bytes (for `pvalloc`).
pub const GLOBAL_PAGE_SIZE: &str = "PAGE_SIZE";
/// The name of the global holding the frames walked per stack: nframe plus
/// the allocator frames to drop, at most [`MAX_WALK_FRAMES`].
pub const GLOBAL_NFRAME: &str = "NFRAME";
/// The name of the global holding the mean sampling interval in bytes
/// (0: every allocation is recorded).
pub const GLOBAL_SAMPLE_MEAN: &str = "SAMPLE_MEAN";
/// The name of the global holding the bucket mask of [`MAP_LIVE_KEYS`]:
/// its number of buckets (a power of two, at least 2) minus 1, or 0 when
/// the fast table is off.
pub const GLOBAL_LIVE_BUCKET_MASK: &str = "LIVE_BUCKET_MASK";
/// The name of the global holding the live blocks one process may hold
/// (its share of [`MAP_LIVE_ALLOCS`] and the fast table together); 0: no
/// limit. A block past it is dropped and counted in the process's `drops`.
pub const GLOBAL_PROCESS_MAX_BLOCKS: &str = "PROCESS_MAX_BLOCKS";
/// The name of the global holding the stacks one process may have in
/// [`MAP_STACKS`] (its share); 0: no limit. A block whose new stack would
/// pass it keeps its frame 0 only.
pub const GLOBAL_PROCESS_MAX_STACKS: &str = "PROCESS_MAX_STACKS";
/// The name of the global holding the stacks in [`MAP_STACKS`]
/// ([`MAP_STACKS_HELD`]) from which on the rest of the map is a reserve:
/// a process stores a new stack there only while it holds less than a
/// quarter of the room left; 0: no reserve. A block whose new stack is
/// refused keeps its frame 0 only, as past its share: a compiler or two
/// that fill the map cannot cut every other process's tracebacks.
pub const GLOBAL_STACKS_RESERVE_FROM: &str = "STACKS_RESERVE_FROM";
/// The name of the global holding the capacity of [`MAP_STACKS`] in
/// stacks, for its reserve ([`GLOBAL_STACKS_RESERVE_FROM`]).
pub const GLOBAL_STACKS_CAPACITY: &str = "STACKS_CAPACITY";

/// Whether a process holding `held` stacks in [`MAP_STACKS`], which holds
/// `stored` ([`MAP_STACKS_HELD`]), may store no new one: it holds its
/// share `max` ([`GLOBAL_PROCESS_MAX_STACKS`]; 0: none), or the map is
/// into its reserve (`stored` at least `reserve_from`,
/// [`GLOBAL_STACKS_RESERVE_FROM`]; 0: none) and the process holds a
/// quarter of the room left in the map of `capacity` stacks or more. The
/// fuller the map, the fewer stacks a process may hold to store one, so
/// that its last entries go to the processes with the fewest. The programs
/// decide with it, and tracerd says why with it.
#[inline(always)]
#[must_use]
pub const fn stack_share_refuses(
    held: u64,
    stored: u64,
    max: u64,
    reserve_from: u64,
    capacity: u64,
) -> bool {
    (max != 0 && held >= max)
        || (reserve_from != 0
            && stored >= reserve_from
            && held.saturating_mul(4) >= capacity.saturating_sub(stored))
}
/// The name of the global holding the slot index mask of
/// [`MAP_INFLIGHT_SLOTS`]: its number of slots (a power of two) minus 1.
pub const GLOBAL_INFLIGHT_SLOT_MASK: &str = "INFLIGHT_SLOT_MASK";

/// Exponential variates for sampling: [`EXP_TABLE_LEN`] u32 entries,
/// entry i = -ln((i + 0.5) / EXP_TABLE_LEN) in 16.16 fixed point, filled by
/// tracerd (BPF has no floating point).
pub const MAP_EXP_TABLE: &str = "EXP_TABLE";
/// Entries of [`MAP_EXP_TABLE`] (a power of two).
pub const EXP_TABLE_LEN: u32 = 1024;
/// Per-CPU bytes left until the next sampled allocation (an i64).
pub const MAP_SAMPLE_LEFT: &str = "SAMPLE_LEFT";

/// Runtime switches of the eBPF programs, written by tracerd: an array of
/// [`SWITCH_SLOTS`] u64s, slot 0 the `SWITCH_*` bits, slot
/// [`SWITCH_STACK_EPOCH`] the stack epoch.
pub const MAP_SWITCHES: &str = "SWITCHES";
/// Slots of [`MAP_SWITCHES`].
pub const SWITCH_SLOTS: u32 = 2;
/// Slot of [`MAP_SWITCHES`] counting the collections of `STACKS`: tracerd
/// raises it after it removes stacks, which empties every CPU's cache of
/// the last stack stored (so no new block names a removed stack).
pub const SWITCH_STACK_EPOCH: u32 = 1;
/// Tracing is scoped to some processes: report every exec and fork on the
/// host ([`ProcEventKind::ExecAny`], [`ProcEventKind::Fork`]) so that
/// tracerd can attach to the processes that match.
pub const SWITCH_SCOPED: u64 = 1;
/// Only the processes in [`MAP_SCOPE_TGIDS`] are recorded: the probes are
/// attached for every process, and the allocator entries (and the mmap
/// source) of any other return at once. Set for a scope of executables or
/// cgroups, whose processes start all the time (one process's own probes
/// take about a second of the kernel's time to detach).
pub const SWITCH_SCOPE_FILTER: u64 = 2;
/// The processes in scope while [`SWITCH_SCOPE_FILTER`] is set, each a
/// tgid with the value 1. Written by tracerd (the scope's pass over `/proc`, each exec held
/// or seen); a process forked by one in scope is added by the fork
/// tracepoint, and an exiting thread or process is removed by the exit
/// tracepoint.
pub const MAP_SCOPE_TGIDS: &str = "SCOPE_TGIDS";
/// Entries of [`MAP_SCOPE_TGIDS`].
pub const SCOPE_TGIDS_ENTRIES: u32 = 65_536;
