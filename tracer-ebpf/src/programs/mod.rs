//! The programs: entry points only, one file per kind of hook. Each decodes
//! its context (arguments, return value, tracepoint record) and calls into
//! the modules that own the data; no map is touched here.
//!
//! Program names are the ones `tracer_common::PROBES`, `SESSION_PROGRAM`,
//! `TRACEPOINTS`, `MMAP_TRACEPOINTS` and `FLOOR_PROGRAMS` list: tracerd finds each by its function name.

mod alloc;
mod floor;
mod lifecycle;
mod mappings;
mod session;

use aya_ebpf::EbpfContext;

/// Keeps the calling program's frame on its task's kernel stack: a
/// tail call into [`crate::maps::NO_PRIVATE_STACK`], which is empty, so it
/// returns at once (a bounds check and a NULL slot, a few ns). Its being
/// there is what counts: the verifier gives no private stack to a program
/// that can tail-call, and a uprobe program runs preemptible, so a
/// per-CPU private stack could be written by another task on the same CPU
/// between two of its steps (docs/architecture.md, "Preemption").
#[inline(always)]
pub(crate) fn on_task_stack<C: EbpfContext>(ctx: &C) {
    // SAFETY: `ctx` is the program's own context; the slot is empty, so the
    // call returns here.
    unsafe { crate::maps::NO_PRIVATE_STACK.tail_call(ctx, 0) };
}

/// [`on_task_stack`] for the uprobe session program, through a prog array
/// of its own ([`crate::maps::NO_PRIV_SESSION`]).
#[inline(always)]
pub(crate) fn session_on_task_stack<C: EbpfContext>(ctx: &C) {
    // SAFETY: as in on_task_stack.
    unsafe { crate::maps::NO_PRIV_SESSION.tail_call(ctx, 0) };
}
