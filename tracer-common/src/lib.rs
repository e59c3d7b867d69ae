//! Types and names shared by tracer's eBPF programs (`tracer-ebpf`) and the
//! daemon (`tracerd`).
//!
//! Every type here is `#[repr(C)]`, `Copy`, integers only, with explicit
//! padding, and its size is pinned by a `const` assertion so that the kernel
//! and user side can never disagree on a layout. Every map and program name is
//! a `pub const` used by both sides: no string literal names a map twice.
#![cfg_attr(not(test), no_std)]

use core::mem::size_of;

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
/// Ways (key slots) per [`LiveBucket`].
pub const LIVE_WAYS: u32 = 7;
/// Buckets of [`MAP_LIVE_KEYS`] as compiled (a power of two, at least 2);
/// tracerd sets the real number at load time, with
/// [`GLOBAL_LIVE_BUCKET_MASK`].
pub const LIVE_BUCKET_COUNT: u32 = 1 << 16;
/// A key slot that holds no block.
pub const LIVE_EMPTY: u64 = 0;
/// A key slot claimed by a program that is writing its value: no block
/// matches it, and readers pass it over. [`live_key`] never returns it.
pub const LIVE_BUSY: u64 = u64::MAX;
/// End of the user address space on x86-64 with 4-level page tables
/// (`TASK_SIZE`): every packed address is below it.
pub const LIVE_ADDR_END: u64 = 0x7fff_ffff_f000;
/// Largest tgid + 1 that packs: the kernel's `PID_MAX_LIMIT` on 64-bit.
pub const LIVE_TGID_END: u32 = 1 << 22;

/// A bucket of [`MAP_LIVE_KEYS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveBucket {
    /// Blocks of this bucket's keys that are in [`MAP_LIVE_ALLOCS`] (the
    /// bucket was full when they came): while 0, a key not found in the
    /// ways is not live at all, and no hash lookup is needed.
    pub spilled: u64,
    /// [`live_key`]s of the blocks, [`LIVE_EMPTY`] or [`LIVE_BUSY`].
    pub keys: [u64; LIVE_WAYS as usize],
}
const _: () = assert!(size_of::<LiveBucket>() == 64);

/// The fast table's key of block `addr` of process `tgid`, with its bucket
/// among `mask + 1` buckets; None when the block cannot be packed (then it
/// lives in [`MAP_LIVE_ALLOCS`]) or the table is off (`mask` 0).
///
/// Packing is exact, so that one 64-bit compare-and-swap claims a block:
/// glibc's blocks are 16-byte aligned and below [`LIVE_ADDR_END`] (43 bits
/// of `addr >> 4`), tgids are below [`LIVE_TGID_END`] (22 bits); the key
/// keeps 21 bits of the tgid, and the 22nd flips the lowest bit of the
/// bucket the key hashes to, so [`live_unpack`] gives both back (and one
/// process's blocks spread over every bucket). A key is never [`LIVE_EMPTY`] (the
/// address is at least 16) nor [`LIVE_BUSY`].
#[inline(always)]
pub fn live_key(tgid: u32, addr: u64, mask: u32) -> Option<(u32, u64)> {
    if mask == 0 || addr & 15 != 0 || !(16..LIVE_ADDR_END).contains(&addr) || tgid >= LIVE_TGID_END
    {
        return None;
    }
    let key = (u64::from(tgid >> 1) << 43) | (addr >> 4);
    Some(((live_hash(key) & mask) ^ (tgid & 1), key))
}

/// Fibonacci hashing: the high half of the product mixes every key bit.
#[inline(always)]
fn live_hash(key: u64) -> u32 {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// The (tgid, address) of `key` found in `bucket` of `mask + 1` buckets:
/// the inverse of [`live_key`].
#[inline(always)]
pub fn live_unpack(bucket: u32, key: u64, mask: u32) -> (u32, u64) {
    let low = (bucket ^ live_hash(key) & mask) & 1;
    let tgid = (((key >> 43) as u32) << 1) | low;
    (tgid, (key & ((1 << 43) - 1)) << 4)
}

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
/// Number of slots of [`MAP_INFLIGHT_SLOTS`] as compiled (a power of two);
/// tracerd sets the real number at load time.
pub const INFLIGHT_SLOT_COUNT: u32 = 1 << 16;
/// Threads whose call is in [`MAP_INFLIGHT`] rather than a slot: while it is
/// 0 (almost always) no entry needs to look there. Array of one u64.
pub const MAP_INFLIGHT_SPILL: &str = "INFLIGHT_SPILL";

/// User stacks: stack id (a 64-bit hash of the frames) → [`STACK_WORDS`]
/// u64s: a second, independent 64-bit hash of the frames, then the return
/// addresses, frame 0 first, 0 after the last. A plain hash map rather than
/// `BPF_MAP_TYPE_STACK_TRACE`: that one drops every stack whose bucket is
/// taken (3.6% of stacks at 8% occupancy, measured here).
pub const MAP_STACKS: &str = "STACKS";
/// Per-CPU scratch buffer of one stack value ([`STACK_WORDS`] u64s).
pub const MAP_STACK_SCRATCH: &str = "STACK_SCRATCH";
/// u64 words of a [`MAP_STACKS`] value as compiled: the check hash and up to
/// [`MAX_NFRAME`] frames. tracerd shrinks the value to `1 + nframe` words at
/// load time, which also bounds the kernel's stack walk.
pub const STACK_WORDS: usize = 1 + MAX_NFRAME as usize;
/// Per-process totals: tgid → [`ProcStats`].
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
/// Slots of [`MAP_PROC_SLOTS`] (a power of two).
pub const PROC_SLOT_COUNT: u32 = 1 << 12;
/// Bits of a slot word that hold the owner's tgid (0: free). A tgid is below
/// `PID_MAX_LIMIT` (2^22 on 64-bit Linux).
pub const PROC_SLOT_OWNER_MASK: u64 = (1 << 22) - 1;
/// Shift of a slot word's spill count: processes of this slot in `PROCS`.
pub const PROC_SLOT_SPILL_SHIFT: u32 = 22;
/// Largest spill count (10 bits); a process that would exceed it is dropped.
pub const PROC_SLOT_SPILL_MAX: u64 = (1 << 10) - 1;
/// Shift of a slot word's generation (the owner's, 32 bits).
pub const PROC_SLOT_GEN_SHIFT: u32 = 32;

/// One slot of [`MAP_PROC_SLOTS`]: a word that packs owner tgid (bits
/// 0..22), spill count (22..32) and the owner's generation (32..64), changed
/// only atomically, and the owner's totals (zero while the slot is free;
/// `stats.gen_` is not kept: the word's generation is the one).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcSlot {
    /// Owner, spill count and generation (see [`ProcSlot`]).
    pub word: u64,
    /// The owner's totals.
    pub stats: ProcStats,
}
const _: () = assert!(size_of::<ProcSlot>() == 72);

/// The slot of [`MAP_PROC_SLOTS`] for `tgid`.
pub const fn proc_slot_index(tgid: u32) -> u32 {
    tgid & (PROC_SLOT_COUNT - 1)
}

/// The owner tgid of a slot word (0: free).
pub const fn proc_slot_owner(word: u64) -> u32 {
    (word & PROC_SLOT_OWNER_MASK) as u32
}

/// The spill count of a slot word.
pub const fn proc_slot_spill(word: u64) -> u64 {
    (word >> PROC_SLOT_SPILL_SHIFT) & PROC_SLOT_SPILL_MAX
}

/// The owner's generation of a slot word.
pub const fn proc_slot_gen(word: u64) -> u32 {
    (word >> PROC_SLOT_GEN_SHIFT) as u32
}

/// Per-CPU counters indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Ring buffer of [`ProcEvent`]s: a process first seen, exec'd or exited.
/// Its size in bytes (a power of two multiple of the page size) is
/// tracerd's `events_ring_bytes`, [`EVENTS_RING_BYTES`] as compiled.
pub const MAP_EVENTS: &str = "EVENTS";
/// Size of [`MAP_EVENTS`] in bytes as compiled; tracerd sets the real size
/// at load time.
pub const EVENTS_RING_BYTES: u32 = 1 << 18;

/// Largest traceback tracer walks. The kernel's verifier explores the walk
/// and the hash of its frames once per frame: at 100 frames the largest
/// program passes its limit of 1,000,000 instructions, at 64 it loads.
pub const MAX_NFRAME: u32 = 64;

/// The name of the global in the eBPF object holding the daemon's own tgid,
/// whose allocations are never traced.
pub const GLOBAL_TRACERD_TGID: &str = "TRACERD_TGID";
/// The name of the global holding the page size in bytes (for `pvalloc`).
pub const GLOBAL_PAGE_SIZE: &str = "PAGE_SIZE";
/// The name of the global holding `nframe`, the frames walked per stack.
pub const GLOBAL_NFRAME: &str = "NFRAME";
/// The name of the global holding the mean sampling interval in bytes
/// (0: every allocation is recorded).
pub const GLOBAL_SAMPLE_MEAN: &str = "SAMPLE_MEAN";
/// The name of the global holding the bucket mask of [`MAP_LIVE_KEYS`]:
/// its number of buckets (a power of two, at least 2) minus 1, or 0 when
/// the fast table is off.
pub const GLOBAL_LIVE_BUCKET_MASK: &str = "LIVE_BUCKET_MASK";
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

/// `stack_id` of an [`AllocInfo`] whose stack could not be stored.
pub const STACK_ID_NONE: u64 = u64::MAX;

/// The allocator functions tracer probes, with the names of their programs.
///
/// `entry` is the uprobe on the function's first instruction; `exit`, where
/// present, the uretprobe that sees the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The glibc symbol.
    pub symbol: &'static str,
    /// The uprobe program run at entry.
    pub entry: &'static str,
    /// The uretprobe program run at return, if the result is needed.
    pub exit: Option<&'static str>,
}

/// Every probe tracer attaches, in attach order. Exits are attached before
/// entries so that no entry is ever recorded without its return being seen.
pub const PROBES: [ProbeSpec; 10] = [
    ProbeSpec {
        symbol: "malloc",
        entry: "malloc_enter",
        exit: Some("malloc_exit"),
    },
    ProbeSpec {
        symbol: "calloc",
        entry: "calloc_enter",
        exit: Some("calloc_exit"),
    },
    ProbeSpec {
        symbol: "realloc",
        entry: "realloc_enter",
        exit: Some("realloc_exit"),
    },
    ProbeSpec {
        symbol: "reallocarray",
        entry: "reallocarray_enter",
        exit: Some("reallocarray_exit"),
    },
    ProbeSpec {
        symbol: "free",
        entry: "free_enter",
        exit: None,
    },
    ProbeSpec {
        symbol: "posix_memalign",
        entry: "posix_memalign_enter",
        exit: Some("posix_memalign_exit"),
    },
    ProbeSpec {
        symbol: "aligned_alloc",
        entry: "aligned_alloc_enter",
        exit: Some("aligned_alloc_exit"),
    },
    ProbeSpec {
        symbol: "memalign",
        entry: "memalign_enter",
        exit: Some("memalign_exit"),
    },
    ProbeSpec {
        symbol: "valloc",
        entry: "valloc_enter",
        exit: Some("valloc_exit"),
    },
    ProbeSpec {
        symbol: "pvalloc",
        entry: "pvalloc_enter",
        exit: Some("pvalloc_exit"),
    },
];

/// Empty uprobe and uretprobe programs, attached in place of every entry and
/// exit program to measure the physical floor of the probes themselves.
pub const FLOOR_PROGRAMS: (&str, &str) = ("floor_enter", "floor_exit");

/// The tracepoint programs for process lifecycle: (program, category, name).
pub const TRACEPOINTS: [(&str, &str, &str); 3] = [
    ("sched_process_exec", "sched", "sched_process_exec"),
    ("sched_process_exit", "sched", "sched_process_exit"),
    ("sched_process_fork", "sched", "sched_process_fork"),
];

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

/// Key of [`MAP_LIVE_ALLOCS`]: one block of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocKey {
    /// The process (thread group id).
    pub tgid: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// The block's address in the process.
    pub addr: u64,
}
const _: () = assert!(size_of::<AllocKey>() == 16);

/// Value of [`MAP_LIVE_ALLOCS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocInfo {
    /// Requested size in bytes (for `pvalloc`, rounded up to the page size).
    pub size: u64,
    /// Id in [`MAP_STACKS`], or [`STACK_ID_NONE`] when the stack was not stored.
    pub stack_id: u64,
    /// The return address into the allocator's caller (frame 0), kept with
    /// every block: when the stack could not be stored, statistics by
    /// `lineno` and `filename` are still exact.
    pub frame0: u64,
    /// The process generation ([`ProcStats::gen_`]) the block belongs to: an
    /// exec or a reused pid starts a new generation, so stale blocks of an
    /// earlier image are never mixed with the new one.
    pub gen_: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<AllocInfo>() == 32);

/// Value of [`MAP_INFLIGHT`]: an allocator call between entry and return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inflight {
    /// Size in bytes the call would allocate, overflow-checked.
    pub size: u64,
    /// `realloc`/`reallocarray`: the old block; `posix_memalign`: the
    /// `memptr` out-pointer. 0 otherwise.
    pub ptr: u64,
    /// Nested calls of probed functions inside this one (glibc's `realloc`
    /// calls `malloc` itself); they are not separate allocations.
    pub depth: u32,
    /// [`INFLIGHT_OVERFLOW`] when `n * m` overflowed (`calloc`,
    /// `reallocarray`: the call fails), [`INFLIGHT_UNSAMPLED`] when sampling
    /// passed this call over.
    pub overflow: u32,
}

/// [`Inflight::overflow`] bit: `n * m` overflowed.
pub const INFLIGHT_OVERFLOW: u32 = 1;
/// [`Inflight::overflow`] bit: not sampled (its block is not recorded).
pub const INFLIGHT_UNSAMPLED: u32 = 2;
const _: () = assert!(size_of::<Inflight>() == 24);

/// Value of [`MAP_INFLIGHT_SLOTS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InflightSlot {
    /// `bpf_get_current_pid_tgid()` of the thread using the slot; 0 when free.
    pub owner: u64,
    /// Its call.
    pub call: Inflight,
}
const _: () = assert!(size_of::<InflightSlot>() == 32);

/// Value of [`MAP_PROCS`]: totals of one traced process, in bytes and counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcStats {
    /// Generation: unique per process image, from a global counter.
    pub gen_: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// Bytes in live blocks now (`get_traced_memory()[0]`).
    pub current: u64,
    /// Highest `current` since tracing began or the last reset (`[1]`).
    pub peak: u64,
    /// Live blocks now.
    pub blocks: u64,
    /// Allocations recorded since tracing of this image began.
    pub allocs: u64,
    /// Frees of known blocks since tracing of this image began.
    pub frees: u64,
    /// Frees of pointers that were not live blocks (allocated before tracing
    /// began, or lost).
    pub unknown_frees: u64,
    /// Events lost for this process (map full, stack not stored).
    pub drops: u64,
}
const _: () = assert!(size_of::<ProcStats>() == 64);

/// What a [`ProcEvent`] reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcEventKind {
    /// First allocation seen from a process image: read its maps now.
    New = 1,
    /// The image was replaced by exec: its blocks are gone.
    Exec = 2,
    /// The last thread exited: its blocks are gone.
    Exit = 3,
    /// Scoped mode: a process (traced or not) called exec.
    ExecAny = 4,
    /// Scoped mode: a task was created; `tgid` is the child's id (a thread
    /// or a process: userspace tells them apart).
    Fork = 5,
}

/// Ring buffer record of [`MAP_EVENTS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEvent {
    /// A [`ProcEventKind`] as u32.
    pub kind: u32,
    /// The process.
    pub tgid: u32,
    /// The generation the event is about (for Exec/Exit: the one that ended).
    pub gen_: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` at the event, ns since boot (CLOCK_MONOTONIC).
    pub ktime_ns: u64,
    /// For Exec/Exit: the final totals of the generation that ended.
    pub stats: ProcStats,
    /// `comm` of the thread that caused the event (`bpf_get_current_comm`),
    /// NUL-padded: the name of a process gone before `/proc` could be read.
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<ProcEvent>() == 104);

/// Slots of the per-CPU [`MAP_COUNTERS`] array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Allocations recorded.
    Allocs = 0,
    /// Frees of known blocks.
    Frees = 1,
    /// Frees of pointers not in the live map.
    UnknownFrees = 2,
    /// `free(NULL)` calls.
    NullFrees = 3,
    /// Allocator calls that returned failure.
    FailedAllocs = 4,
    /// Probed calls nested in another probed call (not counted twice).
    Nested = 5,
    /// A return seen without its entry (attached mid-call).
    ExitWithoutEntry = 6,
    /// Drop: [`MAP_LIVE_ALLOCS`] full, the block is not traced.
    DropLiveFull = 7,
    /// Drop: the call's slot in [`MAP_INFLIGHT_SLOTS`] was taken and
    /// [`MAP_INFLIGHT`] was full: the call is not traced (a `realloc`'s old
    /// block leaves the live set at once, so no phantom leak remains).
    DropInflightFull = 8,
    /// Drop: [`MAP_PROCS`] full, the process is not traced.
    DropProcsFull = 9,
    /// The stack could not be walked or stored (stack map full, or another
    /// stack with the same id): the block is traced with no traceback.
    DropStack = 10,
    /// Drop: the ring buffer was full, an event was lost.
    DropEvents = 11,
    /// A block overwrote a live block of the same address (its free was missed).
    Overwrites = 12,
    /// Process events sent.
    ProcEvents = 13,
    /// Allocations passed over by sampling.
    Unsampled = 14,
}

/// Number of slots in [`MAP_COUNTERS`].
pub const COUNTER_SLOTS: u32 = 15;

impl Counter {
    /// Every counter with its name, in slot order.
    pub const ALL: [(Counter, &'static str); COUNTER_SLOTS as usize] = [
        (Counter::Allocs, "allocs"),
        (Counter::Frees, "frees"),
        (Counter::UnknownFrees, "unknown_frees"),
        (Counter::NullFrees, "null_frees"),
        (Counter::FailedAllocs, "failed_allocs"),
        (Counter::Nested, "nested"),
        (Counter::ExitWithoutEntry, "exit_without_entry"),
        (Counter::DropLiveFull, "drop_live_full"),
        (Counter::DropInflightFull, "drop_inflight_full"),
        (Counter::DropProcsFull, "drop_procs_full"),
        (Counter::DropStack, "drop_stack"),
        (Counter::DropEvents, "drop_events"),
        (Counter::Overwrites, "overwrites"),
        (Counter::ProcEvents, "proc_events"),
        (Counter::Unsampled, "unsampled"),
    ];
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: each type is #[repr(C)], Copy, made only of integers with
    // explicit padding, so every bit pattern is valid.
    unsafe impl aya::Pod for super::AllocKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AllocInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Inflight {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LiveBucket {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcEvent {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_keys_unpack_to_their_block_at_every_edge() {
        let mask = (1 << 16) - 1;
        for tgid in [0, 1, 2, 12_345, LIVE_TGID_END - 2, LIVE_TGID_END - 1] {
            for addr in [16, 0x5555_5555_a2b0, LIVE_ADDR_END - 16] {
                let (bucket, key) = live_key(tgid, addr, mask).expect("packs");
                assert!(bucket <= mask);
                assert_ne!(key, LIVE_EMPTY);
                assert_ne!(key, LIVE_BUSY);
                assert_eq!(
                    live_unpack(bucket, key, mask),
                    (tgid, addr),
                    "{tgid} {addr:#x}"
                );
            }
        }
    }

    #[test]
    fn blocks_that_cannot_be_packed_are_refused() {
        let mask = 1023;
        assert_eq!(live_key(7, 0x1008, mask), None, "not 16-byte aligned");
        assert_eq!(live_key(7, 0, mask), None, "null");
        assert_eq!(live_key(7, LIVE_ADDR_END, mask), None, "kernel half");
        assert_eq!(
            live_key(LIVE_TGID_END, 0x1000, mask),
            None,
            "tgid too large"
        );
        assert_eq!(live_key(7, 0x1000, 0), None, "table off");
    }

    #[test]
    fn two_processes_with_one_address_have_distinct_keys_or_buckets() {
        let mask = 255;
        let a = live_key(1000, 0x4000_0000, mask).expect("packs");
        let b = live_key(1001, 0x4000_0000, mask).expect("packs");
        assert_eq!(a.1, b.1);
        assert_eq!(a.0 ^ b.0, 1);
        assert_ne!(live_key(1002, 0x4000_0000, mask), Some(a));
    }

    #[test]
    fn one_process_uses_every_bucket() {
        let mask = 7;
        let mut seen = [false; 8];
        for i in 0..64u64 {
            let (bucket, _) = live_key(1001, 0x1000 + i * 16, mask).expect("packs");
            seen[bucket as usize] = true;
        }
        assert_eq!(seen, [true; 8]);
    }
}
