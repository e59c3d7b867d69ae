//! The allocator's uprobes (at each function's entry) and uretprobes (at
//! its return), by the names of `tracer_common::PROBES`: an entry per
//! shape of arguments, one exit (`malloc_exit`) for every call, which the
//! entry told what its result is. Each reads the call's arguments or
//! result and hands them to [`crate::calls`].

use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};

use super::on_task_stack;
use crate::{
    calls::{self, alloc_entry, memptr_entry, mul, page_round, realloc_entry},
    globals::{entry_caller, page_size},
};

/// The user stack pointer at the probed call's entry (the address of its
/// return address).
#[inline(always)]
pub(super) fn sp(ctx: &ProbeContext) -> u64 {
    // SAFETY: regs points at the probe's saved registers for its duration.
    unsafe { (*ctx.regs).rsp }
}

/// Argument `n` of the probed call (0 if it cannot be read).
#[inline(always)]
pub(super) fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let _ = alloc_entry(arg(&ctx, 0), false, sp(&ctx), false);
    0
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let (size, overflow) = mul(arg(&ctx, 0), arg(&ctx, 1));
    let _ = alloc_entry(size, overflow, sp(&ctx), false);
    0
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let _ = realloc_entry(arg(&ctx, 1), arg(&ctx, 0), false, sp(&ctx));
    0
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let (size, overflow) = mul(arg(&ctx, 1), arg(&ctx, 2));
    let _ = realloc_entry(size, arg(&ctx, 0), overflow, sp(&ctx));
    0
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let _ = memptr_entry(arg(&ctx, 2), arg(&ctx, 0), sp(&ctx));
    0
}

#[uprobe]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let _ = alloc_entry(arg(&ctx, 1), false, sp(&ctx), false);
    0
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let _ = alloc_entry(arg(&ctx, 1), false, sp(&ctx), false);
    0
}

#[uprobe]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let _ = alloc_entry(arg(&ctx, 0), false, sp(&ctx), false);
    0
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let (size, overflow) = page_round(page_size(), arg(&ctx, 0));
    let _ = alloc_entry(size, overflow, sp(&ctx), false);
    0
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    on_task_stack(&ctx);
    let Some((_, tgid)) = entry_caller() else {
        return 0;
    };
    calls::free(tgid, arg(&ctx, 0))
}

/// The exit of every probed call: what it records was read at its entry,
/// with the shape of its result (a new block, a resized one, or one written
/// through `posix_memalign`'s first argument).
#[uretprobe]
pub fn malloc_exit(ctx: RetProbeContext) -> u32 {
    on_task_stack(&ctx);
    calls::call_exit(&ctx)
}
