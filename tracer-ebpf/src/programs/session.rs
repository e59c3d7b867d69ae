//! The uprobe session program (`tracer_common::SESSION_PROGRAM`, Linux
//! 6.13+): tracerd attaches it, when it samples, in place of the entry
//! programs of `tracer_common::SESSION_ENTRIES` and of their exit. The
//! kernel runs it at a call's entry and, unless that run returned 1, again
//! at the call's return. An entry that sampling passes over returns 1 (a
//! `malloc` or `calloc` shape: see `inflight::record_entry`), and so does
//! one whose return has nothing to do: the return's trap and program are
//! not paid for such calls, where a uretprobe's always are.
//!
//! Which run is which: the kernel runs the entry with the instruction
//! pointer at the probed address, the one `bpf_get_func_ip` gives in both
//! runs, and the return with it at the caller's return address, which
//! never is the probed function's own (a call right before a function's
//! first byte would be the caller's last instruction, and a call that
//! returns is never last). The kernel's `bpf_session_is_return` kfunc says
//! the same, but aya cannot relocate a call to a kernel function.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_attach_cookie, generated::bpf_get_func_ip},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{SESSION_KIND_SHIFT, SessionKind};

use super::{
    alloc::{arg, sp},
    session_on_task_stack,
};
use crate::{
    calls::{self, alloc_entry, memptr_entry, mul, page_round, realloc_entry},
    globals::page_size,
    inflight::Entry,
};

/// Whether this run of the session is the call's return (see the module
/// doc).
#[inline(always)]
fn is_return(ctx: &ProbeContext) -> bool {
    // SAFETY: regs points at the probe's saved registers for its duration;
    // the helper reads the running probe's own context.
    let (ip, func) = unsafe { ((*ctx.regs).rip, bpf_get_func_ip(ctx.as_ptr())) };
    ip != func
}

/// Every allocating call of `tracer_common::SESSION_ENTRIES`, entry and
/// return: the entry decodes the arguments of its kind (the attach
/// cookie's high bits) as that kind's entry program does; the return is
/// `malloc_exit`'s. Written out, not with aya's `#[uprobe]`, whose program
/// always returns 0: the session's entry says with its result whether
/// the return runs.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn alloc_session(ctx: *mut c_void) -> u32 {
    session(&ProbeContext::new(ctx))
}

/// [`alloc_session`]'s body: 1 from an entry whose return is skipped, else 0.
#[inline(always)]
fn session(ctx: &ProbeContext) -> u32 {
    session_on_task_stack(ctx);
    if is_return(ctx) {
        return calls::call_exit(&RetProbeContext::new(ctx.as_ptr()));
    }
    // SAFETY: the helper reads the running probe's own link.
    let kind = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } >> SESSION_KIND_SHIFT;
    let sp = sp(ctx);
    let entry = match kind {
        k if k == SessionKind::Malloc as u64 || k == SessionKind::Valloc as u64 => {
            alloc_entry(arg(ctx, 0), false, sp, k == SessionKind::Malloc as u64)
        }
        k if k == SessionKind::Calloc as u64 => {
            let (size, overflow) = mul(arg(ctx, 0), arg(ctx, 1));
            alloc_entry(size, overflow, sp, true)
        }
        k if k == SessionKind::Realloc as u64 => realloc_entry(arg(ctx, 1), arg(ctx, 0), false, sp),
        k if k == SessionKind::Reallocarray as u64 => {
            let (size, overflow) = mul(arg(ctx, 1), arg(ctx, 2));
            realloc_entry(size, arg(ctx, 0), overflow, sp)
        }
        k if k == SessionKind::PosixMemalign as u64 => memptr_entry(arg(ctx, 2), arg(ctx, 0), sp),
        k if k == SessionKind::AlignedAlloc as u64 || k == SessionKind::Memalign as u64 => {
            alloc_entry(arg(ctx, 1), false, sp, false)
        }
        k if k == SessionKind::Pvalloc as u64 => {
            let (size, overflow) = page_round(page_size(), arg(ctx, 0));
            alloc_entry(size, overflow, sp, false)
        }
        _ => Entry::Nothing,
    };
    entry.session_return()
}
