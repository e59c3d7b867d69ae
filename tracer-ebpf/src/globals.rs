//! What tracerd tells the programs: the load-time globals (set once, in the
//! object, before it is loaded) and the runtime switches (`SWITCHES`,
//! written while the programs run).
//!
//! Every global is read here, volatile, so that the compiler never folds the
//! value the object was compiled with; the rest of the crate reads them only
//! through these functions. The globals keep their symbol names
//! (`#[unsafe(no_mangle)]`): tracerd sets them by the `GLOBAL_*` names of
//! `tracer-common`.

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use tracer_common::{INFLIGHT_SLOT_COUNT, LIVE_BUCKET_COUNT};

use crate::maps::{SCOPE_TGIDS, SWITCHES};

/// The daemon's own tgid: its allocations are never traced. Set at load time.
#[unsafe(no_mangle)]
static TRACERD_TGID: u32 = 0;

/// Page size in bytes, for `pvalloc`. Set at load time.
#[unsafe(no_mangle)]
static PAGE_SIZE: u64 = 4096;

/// Frames walked per stack (tracemalloc's nframe), 1..=64. Set at load time.
#[unsafe(no_mangle)]
static NFRAME: u32 = 16;

/// Mean sampling interval in bytes; 0 records every allocation. Set at load.
#[unsafe(no_mangle)]
static SAMPLE_MEAN: u64 = 0;

/// Slots of INFLIGHT_SLOTS minus 1 (their number is a power of two). Set at
/// load time, with the array's size.
#[unsafe(no_mangle)]
static INFLIGHT_SLOT_MASK: u32 = INFLIGHT_SLOT_COUNT - 1;

/// Buckets of LIVE_KEYS minus 1 (a power of two, at least 2), or 0: the
/// fast table is off. Set at load time, with the arrays' sizes.
#[unsafe(no_mangle)]
static LIVE_BUCKET_MASK: u32 = LIVE_BUCKET_COUNT - 1;

/// Live blocks one process may hold (its share of the live-block maps);
/// 0: no limit. Set at load time.
#[unsafe(no_mangle)]
static PROCESS_MAX_BLOCKS: u64 = 0;

/// Live blocks one process may hold; 0: no limit.
#[inline(always)]
pub(crate) fn process_max_blocks() -> u64 {
    // SAFETY: a global set once at load time (see tracerd_tgid).
    unsafe { core::ptr::read_volatile(&PROCESS_MAX_BLOCKS) }
}

/// Stacks one process may have in STACKS (its share); 0: no limit. Set at
/// load time.
#[unsafe(no_mangle)]
static PROCESS_MAX_STACKS: u64 = 0;

/// Stacks one process may have in STACKS; 0: no limit.
#[inline(always)]
pub(crate) fn process_max_stacks() -> u64 {
    // SAFETY: a global set once at load time (see tracerd_tgid).
    unsafe { core::ptr::read_volatile(&PROCESS_MAX_STACKS) }
}

/// Stacks in STACKS (`STACKS_HELD`) from which on a process stores a new
/// one only while it holds less than a quarter of the room left; 0: no
/// reserve. Set at load time.
#[unsafe(no_mangle)]
static STACKS_RESERVE_FROM: u64 = 0;

/// Capacity of STACKS in stacks (`max_stacks`). Set at load time.
#[unsafe(no_mangle)]
static STACKS_CAPACITY: u64 = 0;

/// (`STACKS_RESERVE_FROM`, `STACKS_CAPACITY`): the stacks in STACKS from
/// which on the reserve is kept (0: none), and the map's capacity.
#[inline(always)]
pub(crate) fn stacks_reserve() -> (u64, u64) {
    // SAFETY: globals set once at load time (see tracerd_tgid).
    unsafe {
        (
            core::ptr::read_volatile(&STACKS_RESERVE_FROM),
            core::ptr::read_volatile(&STACKS_CAPACITY),
        )
    }
}

#[inline(always)]
fn tracerd_tgid() -> u32 {
    // SAFETY: a global set once at load time; volatile so the compiler does
    // not fold the 0 it was compiled with.
    unsafe { core::ptr::read_volatile(&TRACERD_TGID) }
}

/// [`current_in_scope`] at an allocator's entry (a uprobe's trap): a call
/// of tracerd's own is counted (`tracerd_calls`), for it paid the trap for
/// nothing. tracerd allocates through its own allocator, never probed, so
/// this stays near 0.
#[inline(always)]
pub(crate) fn entry_caller() -> Option<(u64, u32)> {
    let found = current_in_scope();
    if found.is_none() && (bpf_get_current_pid_tgid() >> 32) as u32 == tracerd_tgid() {
        crate::counters::count(tracer_common::Counter::TracerdCalls);
    }
    found
}

/// The calling thread's id and its process's tgid, or None for tracerd itself.
#[inline(always)]
pub(crate) fn current() -> Option<(u64, u32)> {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    if tgid == tracerd_tgid() {
        None
    } else {
        Some((id, tgid))
    }
}

/// The page size in bytes ([`PAGE_SIZE`]).
#[inline(always)]
pub(crate) fn page_size() -> u64 {
    // SAFETY: a global set once at load time.
    unsafe { core::ptr::read_volatile(&PAGE_SIZE) }
}

/// Frames to walk per stack ([`NFRAME`]), as tracerd set it (the stack walk
/// bounds it again).
#[inline(always)]
pub(crate) fn nframe() -> u32 {
    // SAFETY: a global set once at load time.
    unsafe { core::ptr::read_volatile(&NFRAME) }
}

/// The mean sampling interval in bytes ([`SAMPLE_MEAN`]); 0: no sampling.
#[inline(always)]
pub(crate) fn sample_mean() -> u64 {
    // SAFETY: a global set once at load time.
    unsafe { core::ptr::read_volatile(&SAMPLE_MEAN) }
}

/// The slot index mask of INFLIGHT_SLOTS ([`INFLIGHT_SLOT_MASK`]).
#[inline(always)]
pub(crate) fn inflight_slot_mask() -> u32 {
    // SAFETY: a global set once at load time (volatile: not the compiled value).
    unsafe { core::ptr::read_volatile(&INFLIGHT_SLOT_MASK) }
}

/// The bucket mask of LIVE_KEYS ([`LIVE_BUCKET_MASK`]); 0: the fast table
/// is off.
#[inline(always)]
pub(crate) fn live_bucket_mask() -> u32 {
    // SAFETY: a global set once at load time (volatile: not the compiled value).
    unsafe { core::ptr::read_volatile(&LIVE_BUCKET_MASK) }
}

/// Slot `slot` of SWITCHES, as tracerd last wrote it (0 if out of range).
#[inline(always)]
pub(crate) fn switch(slot: u32) -> u64 {
    match SWITCHES.get_ptr(slot) {
        // SAFETY: an array value written by tracerd.
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    }
}

/// Tracing is scoped ([`tracer_common::SWITCH_SCOPED`]): every exec and fork
/// on the host is reported.
#[inline(always)]
pub(crate) fn scoped() -> bool {
    switch(0) & tracer_common::SWITCH_SCOPED != 0
}

/// Only the processes of SCOPE_TGIDS are recorded
/// ([`tracer_common::SWITCH_SCOPE_FILTER`]).
#[inline(always)]
pub(crate) fn filtered() -> bool {
    switch(0) & tracer_common::SWITCH_SCOPE_FILTER != 0
}

/// Whether a process the current one starts (its fork's child, or its own
/// new program at an exec) gets an image at once, traced from its start
/// whether it allocates or not: with the default scope (every process),
/// and with the scope filter when the current process is in scope (its
/// child is, from the fork tracepoint on). A scope of pids alone traces
/// only those pids (their probes are theirs): nothing new starts there.
#[inline(always)]
pub(crate) fn starts_images() -> bool {
    if !scoped() {
        return current().is_some();
    }
    filtered() && current_in_scope().is_some()
}

/// [`current`] when the calling process is recorded: not tracerd, and in
/// SCOPE_TGIDS while the scope filter is on. What an allocator call's
/// entry and the mmap source start with (a return always completes what
/// its entry recorded).
#[inline(always)]
pub(crate) fn current_in_scope() -> Option<(u64, u32)> {
    let (id, tgid) = current()?;
    // SAFETY: a map lookup; the value is not read.
    if filtered() && unsafe { SCOPE_TGIDS.get(&tgid) }.is_none() {
        return None;
    }
    Some((id, tgid))
}
