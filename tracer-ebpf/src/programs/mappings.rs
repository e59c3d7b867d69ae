//! The anonymous-mapping tracepoints (`tracer_common::MMAP_TRACEPOINTS`):
//! two programs at the exits of `mmap`, `munmap` and `mremap`, which hand
//! the system call's number and result to [`crate::mmap`]. Each tail-calls
//! the other where one call both unmaps and maps (see `MMAP_PROGRAMS`):
//! the record, and so the call's number and result, are the same there.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};

use crate::{maps::MMAP_PROGRAMS, mmap};

/// Offsets of `__syscall_nr` (an `int`) and `ret` (a `long`) in the
/// sys_exit_* records
/// (/sys/kernel/tracing/events/syscalls/sys_exit_mmap/format).
const NR_OFFSET: usize = 8;
const RET_OFFSET: usize = 16;

/// The system call's number (-1 when it cannot be read).
#[inline(always)]
fn nr(ctx: &TracePointContext) -> i32 {
    // SAFETY: the offset is within the record (see the format file).
    unsafe { ctx.read_at(NR_OFFSET) }.unwrap_or(-1)
}

/// The system call's result (an errno when it cannot be read); also the
/// mapping tracepoint's (`programs::lifecycle`), at `mmap`'s exit.
#[inline(always)]
pub(super) fn ret(ctx: &TracePointContext) -> i64 {
    // SAFETY: the offset is within the record (see the format file).
    unsafe { ctx.read_at(RET_OFFSET) }.unwrap_or(-1)
}

/// Tail-calls slot `slot` of `MMAP_PROGRAMS`; returns only when the call
/// failed (a slot tracerd did not fill), which loses the change: counted.
#[inline(always)]
fn chain(ctx: &TracePointContext, slot: u32) {
    // SAFETY: `ctx` is the program's own context.
    let _ = unsafe { MMAP_PROGRAMS.tail_call(ctx, slot) };
    mmap::chain_failed();
}

/// At `mmap`'s exit, and tail-called by [`sys_exit_unmap`] after an
/// `mremap` moved a block: records the new mapping.
#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    if mmap::mapped(nr(&ctx), ret(&ctx)) == mmap::Then::Unmap {
        chain(&ctx, tracer_common::MMAP_TAIL_UNMAP);
    }
    0
}

/// At the exits of `munmap` and `mremap`, and tail-called by
/// [`sys_exit_mmap`] for a `MAP_FIXED` mapping: takes out what the call
/// unmapped.
#[tracepoint]
pub fn sys_exit_unmap(ctx: TracePointContext) -> u32 {
    // The call's number read again: a value the verifier knows nothing
    // of, so that it checks the unmap once for the three calls rather than
    // once for each number that reaches it.
    if mmap::unmapped(nr(&ctx), ret(&ctx)) != 0 && mmap::is_mremap(nr(&ctx)) {
        chain(&ctx, tracer_common::MMAP_TAIL_ADD);
    }
    0
}
