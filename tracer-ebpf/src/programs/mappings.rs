//! The anonymous-mapping tracepoints (`tracer_common::MMAP_TRACEPOINTS`):
//! the exits of `mmap`, `munmap` and `mremap`, whose result each hands to
//! [`crate::mmap`].

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};

use crate::mmap;

/// Offset of `ret` in the sys_exit_* records
/// (/sys/kernel/tracing/events/syscalls/sys_exit_mmap/format).
const RET_OFFSET: usize = 16;

/// The system call's result (an errno when it cannot be read).
#[inline(always)]
fn ret(ctx: &TracePointContext) -> i64 {
    // SAFETY: the offset is within the record (see the format file).
    unsafe { ctx.read_at(RET_OFFSET) }.unwrap_or(-1)
}

#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    mmap::mapped(ret(&ctx));
    0
}

#[tracepoint]
pub fn sys_exit_munmap(ctx: TracePointContext) -> u32 {
    mmap::unmapped(ret(&ctx));
    0
}

#[tracepoint]
pub fn sys_exit_mremap(ctx: TracePointContext) -> u32 {
    mmap::remapped(ret(&ctx));
    0
}
