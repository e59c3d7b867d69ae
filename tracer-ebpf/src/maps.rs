//! Every map of the object, in one place: what each holds (key → value),
//! who writes it and who reads it. Names are the map names tracerd opens
//! (`tracer_common::MAP_*`); capacities are the compiled defaults, which
//! tracerd replaces at load time from its configuration.
//!
//! The modules that own a map's protocol: [`crate::live`] (LIVE_*),
//! [`crate::inflight`] (INFLIGHT*), [`crate::stack`] (STACK*, UNWIND_*, PROC_MAPS,
//! NO_MAPPINGS), [`crate::vma`] (FILE_TABLES),
//! [`crate::procs`] (PROC*, GENERATION, EVENTS), [`crate::mmap`] (MMAP_*), [`crate::sample`]
//! (EXP_TABLE, SAMPLE_LEFT), [`crate::counters`] (COUNTERS),
//! [`crate::globals`] (SWITCHES, SCOPE_TGIDS).

use crate::stack::Walk;
use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    btf_maps,
    macros::{btf_map, map},
    maps::{Array, HashMap, PerCpuArray, ProgramArray, RingBuf},
};
use tracer_common::{
    AllocInfo, AllocKey, COUNTER_SLOTS, EVENTS_RING_BYTES, EXP_TABLE_LEN, FILE_TABLES_ENTRIES,
    FileTableKey, INFLIGHT_SLOT_COUNT, Inflight, InflightSlot, LIVE_BUCKET_COUNT, LIVE_WAYS,
    LiveBucket, MMAP_PAGE_ENTRIES, MmapPageKey, MmapRegions, OWN_FIRST_BLOCKS, OWN_LEVELS_ENTRIES,
    OWN_LIVE_ENTRIES, OwnLevelMaps, PROC_SLOT_COUNT, ProcSlot, ProcTotals, STACK_TOTALS_ENTRIES,
    STACK_WORDS, StackTotals, StackTotalsKey,
    unwind::{self, ProcMappings, UnwindPage, UnwindPageKey, UnwindRow},
};

/// The errno a map insert with `BPF_NOEXIST` returns (negated) when the key
/// is there already.
pub(crate) const EEXIST: i32 = 17;

/// Sampling: entry → an exponential variate (16.16 fixed point). Filled by
/// tracerd at start-up; read by `sample`.
#[map]
pub(crate) static EXP_TABLE: Array<u32> = Array::with_max_entries(EXP_TABLE_LEN, 0);

/// Sampling, per CPU, slot 0 → bytes left until the next sampled
/// allocation (below 0 while the task that sampled refills it). Changed by
/// `sample` only, by atomic adds and exchanges (tasks on one CPU preempt
/// each other).
#[map]
pub(crate) static SAMPLE_LEFT: PerCpuArray<i64> = PerCpuArray::with_max_entries(1, 0);

// Capacities here are defaults; tracerd sets them at load time from its config.

/// Live blocks, the spill of the fast table: (tgid, address) → size, stack,
/// frame 0, generation. Written by the programs (`live`); read and cleaned
/// (ended images) by tracerd.
#[map]
pub(crate) static LIVE_ALLOCS: HashMap<AllocKey, AllocInfo> =
    HashMap::with_max_entries(1 << 22, BPF_F_NO_PREALLOC);

/// An image's own spill map of one level: address → block. Created by
/// tracerd with its level's capacity (`tracer_common::own_level_blocks`);
/// this definition is the template the kernel checks them against.
pub(crate) type OwnSpill = btf_maps::HashMap<
    u64,
    AllocInfo,
    { OWN_FIRST_BLOCKS as usize },
    { BPF_F_NO_PREALLOC as usize },
>;

/// The spill maps of every image, and those tracerd keeps ahead: map id →
/// map (`tracer_common::own_spill`); OWN_LEVELS names an image's. Written
/// by tracerd; read by `live`.
#[btf_map]
pub(crate) static OWN_LIVE: btf_maps::HashOfMaps<u32, OwnSpill, { OWN_LIVE_ENTRIES as usize }> =
    btf_maps::HashOfMaps::new();

/// Levels of each image's own spill: `own_image_key` → their maps' ids in
/// OWN_LIVE and their count. Written whole by tracerd after it put the
/// level's map in OWN_LIVE; read by `live`.
#[map]
pub(crate) static OWN_LEVELS: HashMap<u64, OwnLevelMaps> =
    HashMap::with_max_entries(OWN_LEVELS_ENTRIES, BPF_F_NO_PREALLOC);

/// Live blocks, fast table keys: bucket → LIVE_WAYS packed (tgid, address)
/// keys and the bucket's spill count. Claimed by compare-and-swap by the
/// programs (`live`); read and cleaned by tracerd through its mapping.
#[map]
pub(crate) static LIVE_KEYS: Array<LiveBucket> =
    Array::with_max_entries(LIVE_BUCKET_COUNT, BPF_F_MMAPABLE);

/// Live blocks, fast table values: bucket * LIVE_WAYS + way → the block of
/// that key slot. Written by the program holding the slot (`live`); read by
/// tracerd through its mapping.
#[map]
pub(crate) static LIVE_VALUES: Array<AllocInfo> =
    Array::with_max_entries(LIVE_BUCKET_COUNT * LIVE_WAYS, BPF_F_MMAPABLE);

/// Calls in progress whose slot was taken: thread id → the call. Written at
/// entry, consumed at return (`inflight`); tracerd only counts its entries.
#[map]
pub(crate) static INFLIGHT: HashMap<u64, Inflight> = HashMap::with_max_entries(1 << 16, 0);

/// Calls in progress: `tid & INFLIGHT_SLOT_MASK` → owner thread and its
/// call. Owned by one thread at a time (`inflight`); tracerd counts the
/// slots in use.
#[map]
pub(crate) static INFLIGHT_SLOTS: Array<InflightSlot> =
    Array::with_max_entries(INFLIGHT_SLOT_COUNT, 0);

/// Slot 0: threads whose call is in INFLIGHT (the spill), not a slot.
#[map]
pub(crate) static INFLIGHT_SPILL: Array<u64> = Array::with_max_entries(1, 0);

/// User stacks: stack id → check hash, then the frames. Written once per
/// stack by the programs (`stack`); read and collected by tracerd.
#[map]
pub(crate) static STACKS: HashMap<u64, [u64; STACK_WORDS]> =
    HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// Slot 0: the stacks in STACKS, raised by `stack` for each it stores and
/// lowered by tracerd, through its mapping, for each it collects. Read
/// against `STACKS_RESERVE_FROM`.
#[map]
pub(crate) static STACKS_HELD: Array<u64> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Totals per (image, stack): key → live blocks and bytes, kept in step
/// with the live maps by `live` (never deleted by a program); read by
/// tracerd for statistics of a live image, and cleaned (ended images).
#[map]
pub(crate) static STACK_TOTALS: HashMap<StackTotalsKey, StackTotals> =
    HashMap::with_max_entries(STACK_TOTALS_ENTRIES, BPF_F_NO_PREALLOC);

/// Slot 0: a zero [`StackTotals`], the value a new STACK_TOTALS key is
/// put in with (so that the programs need no stack space for one). Never
/// written.
#[map]
pub(crate) static STACK_TOTALS_ZERO: Array<StackTotals> = Array::with_max_entries(1, 0);

/// Per CPU, slot 0 → the stack being walked (same layout as a STACKS
/// value). Used by `stack` only.
#[map]
pub(crate) static STACK_SCRATCH: PerCpuArray<[u64; STACK_WORDS]> =
    PerCpuArray::with_max_entries(1, 0);

/// Unwind rows of every file (`tracer_common::unwind`): index → row.
/// Written by tracerd through its mapping when it loads a file's table;
/// read by `stack`.
#[map]
pub(crate) static UNWIND_ROWS: Array<UnwindRow> =
    Array::with_max_entries(unwind::UNWIND_ROWS, BPF_F_MMAPABLE);

/// The pages of every file's table: (file, page of file offsets) → its run
/// of UNWIND_ROWS. Written by tracerd; read by `stack`.
#[map]
pub(crate) static UNWIND_PAGES: HashMap<UnwindPageKey, UnwindPage> =
    HashMap::with_max_entries(unwind::UNWIND_PAGES, 0);

/// Executable mappings of each process: tgid → its mappings, sorted, with
/// each file's table id. Written by tracerd when it learns of a process
/// image and when its mappings change; read by `stack`.
#[map]
pub(crate) static PROC_MAPS: HashMap<u32, ProcMappings> =
    HashMap::with_max_entries(unwind::PROC_MAPS_ENTRIES, BPF_F_NO_PREALLOC);

/// Slot 0: a [`ProcMappings`] with no mapping, never written: what a walk
/// of an image that has no PROC_MAPS entry yet starts from (every address
/// is then looked up in the kernel's VMAs, `crate::vma`).
#[map]
pub(crate) static NO_MAPPINGS: Array<ProcMappings> = Array::with_max_entries(1, 0);

/// Table ids by file, as the kernel names a mapped file: (device, inode) →
/// its table id. Written by tracerd for every table it loads (removed
/// before it drops one); read by `vma` for an address PROC_MAPS lacks.
#[map]
pub(crate) static FILE_TABLES: HashMap<FileTableKey, u32> =
    HashMap::with_max_entries(FILE_TABLES_ENTRIES, BPF_F_NO_PREALLOC);

/// Per CPU, slot 0 → the state of the table-driven walk in progress
/// (registers, frames, counts). Used by `stack` only.
#[map]
pub(crate) static WALK_SCRATCH: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// Totals of processes that do not own their PROC_SLOTS slot: tgid →
/// totals and generation. Written by the programs (`procs`); read by
/// tracerd.
#[map]
pub(crate) static PROCS: HashMap<u32, ProcTotals> = HashMap::with_max_entries(1 << 16, 0);

/// Per-process totals, direct-mapped: `tgid & (PROC_SLOT_COUNT - 1)` →
/// slot word (owner, spill count, generation) and the owner's totals.
/// Written by the programs (`procs`); read by tracerd through its mapping.
#[map]
pub(crate) static PROC_SLOTS: Array<ProcSlot> =
    Array::with_max_entries(PROC_SLOT_COUNT, BPF_F_MMAPABLE);

/// Anonymous mappings held as blocks: (tgid, page of address space) → the
/// start of each (`tracer_common::MmapRegions`). Written by `mmap` at each
/// traced mapping and unmapping; removed by `procs` when the image ends
/// (the pages its totals name).
#[map]
pub(crate) static MMAP_REGIONS: HashMap<MmapPageKey, MmapRegions> =
    HashMap::with_max_entries(MMAP_PAGE_ENTRIES, BPF_F_NO_PREALLOC);
/// Slot 0: an all-zero `MmapRegions`, never written: the value a new
/// MMAP_REGIONS entry is copied from (too large for a program's stack).
#[map]
pub(crate) static MMAP_EMPTY: Array<MmapRegions> = Array::with_max_entries(1, 0);
/// Per CPU, `Counter` → how often it happened. Added to atomically by
/// `counters`; summed by tracerd.
#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// Slot 0: the last generation handed out. Raised atomically by `procs`
/// for every new process image.
#[map]
pub(crate) static GENERATION: Array<u64> = Array::with_max_entries(1, 0);

/// Runtime switches: slot → value (slot 0 the `SWITCH_*` bits, slot
/// `SWITCH_STACK_EPOCH` the stack epoch). Written by tracerd; read by
/// `globals`.
#[map]
pub(crate) static SWITCHES: Array<u64> = Array::with_max_entries(tracer_common::SWITCH_SLOTS, 0);

/// tgid → 1: the processes in scope while `SWITCH_SCOPE_FILTER` is set
/// (`tracer_common::MAP_SCOPE_TGIDS`). Read by `globals`; written by
/// tracerd and by the fork and exit tracepoints.
#[map]
pub(crate) static SCOPE_TGIDS: HashMap<u32, u32> =
    HashMap::with_max_entries(tracer_common::SCOPE_TGIDS_ENTRIES, BPF_F_NO_PREALLOC);

/// Per CPU, the last stack this CPU found or put in STACKS: (id, check
/// hash, stack epoch + 1). A hit skips the STACKS lookup; an epoch raised by
/// tracerd (it removed stacks) makes every entry a miss.
#[map]
pub(crate) static STACK_CACHE: PerCpuArray<[u64; 3]> = PerCpuArray::with_max_entries(1, 0);

/// Process events (first allocation of an image, exec, exit; in scoped
/// mode every exec and fork): ring buffer of `ProcEvent`. Written by
/// `procs`; read by tracerd.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Never filled: one empty slot that every allocator program tail-calls
/// (the call fails and the program goes on). A program that can tail-call
/// gets no private stack from the verifier (Linux 6.14 and later give a
/// kprobe-type program with a frame of 64 bytes or more a per-CPU one,
/// which another task preempting it on the same CPU would overwrite): so
/// every frame is on the task's own kernel stack. See
/// `crate::programs::on_task_stack`.
#[map]
pub(crate) static NO_PRIVATE_STACK: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// [`NO_PRIVATE_STACK`] of the uprobe session program: the kernel keeps
/// a prog array to the programs of the first attach type that uses it
/// (a session's run context is not a uprobe_multi's), and refuses the
/// others' load.
#[map]
pub(crate) static NO_PRIV_SESSION: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The anonymous-mapping programs, by `tracer_common::MMAP_TAIL_UNMAP` and
/// `MMAP_TAIL_ADD`, filled by tracerd before it attaches them: the `mmap`
/// exit tail-calls the unmap program for a `MAP_FIXED` mapping (which
/// replaces what it covers), and the unmap program tail-calls the `mmap`
/// exit after an `mremap` moved a block (which becomes the new mapping).
/// Two programs, each verified once, rather than the unmap's loops and the
/// stack walk verified again in every program that needs them.
#[map]
pub(crate) static MMAP_PROGRAMS: ProgramArray =
    ProgramArray::with_max_entries(tracer_common::MMAP_TAIL_SLOTS, 0);
