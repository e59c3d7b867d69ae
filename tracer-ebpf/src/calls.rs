//! The allocator's calls, as the capture table of docs/architecture.md states them: what
//! each entry records for its return, and what each return does to the
//! live set. The programs (`programs::alloc`) decode the arguments and call
//! these.
//!
//! An entry records the size the call would allocate (and, for `realloc`
//! and `posix_memalign`, the pointer the return needs) in flight
//! ([`crate::inflight`]); the return takes it back and, on success, records
//! the new block with the stack ([`crate::live`]), or removes the block a
//! `realloc` freed or moved. A call nested in another probed call is not a
//! separate allocation: its return finds nothing in flight and does nothing.

use aya_ebpf::programs::RetProbeContext;
use tracer_common::{
    Counter, INFLIGHT_MEMPTR, INFLIGHT_NEW, INFLIGHT_OVERFLOW, INFLIGHT_RESIZE, INFLIGHT_UNSAMPLED,
    Inflight,
};

use crate::{
    counters::count,
    globals::sample_mean,
    inflight::{Entry, record_entry, take_inflight},
    live::{record_alloc, remove_block},
};

/// Entry of an allocator that returns a new block (`sp`: the user stack
/// pointer at the entry; `skippable`: a uprobe session's, whose return is
/// skipped when sampling passes the call over): see [`record_entry`].
#[inline(always)]
pub(crate) fn alloc_entry(size: u64, overflow: bool, sp: u64, skippable: bool) -> Entry {
    record_entry(size, 0, overflow, sp, INFLIGHT_NEW, skippable)
}

/// Entry of `posix_memalign(memptr, align, size)`: the return reads the
/// new block from `memptr`.
#[inline(always)]
pub(crate) fn memptr_entry(size: u64, memptr: u64, sp: u64) -> Entry {
    record_entry(size, memptr, false, sp, INFLIGHT_MEMPTR, false)
}

/// Entry of `realloc(old, size)` and `reallocarray`. When the call cannot be
/// recorded, `old` leaves the live set at once: its return will not be seen,
/// and glibc frees or moves the block (or it stays if the call fails: an
/// untraced live block only undercounts), so keeping it would leave a
/// phantom leak. Its return is never skipped: it takes `old` out.
#[inline(always)]
pub(crate) fn realloc_entry(size: u64, old: u64, overflow: bool, sp: u64) -> Entry {
    let entry = record_entry(size, old, overflow, sp, INFLIGHT_RESIZE, false);
    if let Entry::Dropped(tgid) = entry
        && old != 0
    {
        remove_block(tgid, old, false);
    }
    entry
}

/// The user stack pointer at a return (8 bytes above the call's entry's).
#[inline(always)]
fn ret_sp(ctx: &RetProbeContext) -> u64 {
    // SAFETY: regs points at the probe's saved registers for its duration.
    unsafe { (*ctx.regs).rsp }
}

/// `n * m` and whether it overflowed, without 128-bit multiplication (which
/// the BPF target lacks).
#[inline(always)]
pub(crate) fn mul(n: u64, m: u64) -> (u64, bool) {
    if n == 0 {
        return (0, false);
    }
    // black_box keeps LLVM from turning the division back into a widening
    // multiplication.
    let limit = core::hint::black_box(u64::MAX / n);
    (n.wrapping_mul(m), m > limit)
}

/// `n` rounded up to a multiple of `page` (a power of two), as `pvalloc`
/// allocates, and whether the rounding overflowed.
#[inline(always)]
pub(crate) fn page_round(page: u64, n: u64) -> (u64, bool) {
    let (sum, overflow) = n.overflowing_add(page.wrapping_sub(1));
    (sum & !(page.wrapping_sub(1)), overflow)
}

/// `free(ptr)` by process `tgid`: the block leaves the live set.
/// `free(NULL)` is only counted.
#[inline(always)]
pub(crate) fn free(tgid: u32, ptr: u64) -> u32 {
    if ptr == 0 {
        count(Counter::NullFrees);
        return 0;
    }
    // Sampled: most freed pointers were never recorded, and that is fine.
    remove_block(tgid, ptr, sample_mean() == 0);
    0
}

/// The return of every probed call (`Inflight::shape` says which): the
/// new block, if any, is recorded with the stack. One program for every
/// shape, and one place that records: the kernel verifies the stack walk
/// once, where a program per shape had it verified again in each.
#[inline(always)]
pub(crate) fn call_exit(ctx: &RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight(ret_sp(ctx)) else {
        return 0;
    };
    let ret: u64 = ctx.ret();
    let addr = match inflight.shape {
        INFLIGHT_RESIZE => resized(tgid, &inflight, ret),
        INFLIGHT_MEMPTR => aligned(&inflight, ret as i32),
        _ => returned(&inflight, ret),
    };
    if addr != 0 {
        record_alloc(ctx, tgid, addr, inflight.size);
    }
    0
}

/// Return of malloc, calloc, aligned_alloc, memalign, valloc, pvalloc
/// (result `addr`): the block to record (0: none).
#[inline(always)]
fn returned(inflight: &Inflight, addr: u64) -> u64 {
    if addr == 0 {
        count(Counter::FailedAllocs);
        return 0;
    }
    if unsampled(inflight) {
        return 0;
    }
    addr
}

/// Whether sampling passed the call over (counted).
#[inline(always)]
fn unsampled(inflight: &Inflight) -> bool {
    let passed = inflight.overflow & INFLIGHT_UNSAMPLED != 0;
    if passed {
        count(Counter::Unsampled);
    }
    passed
}

/// Return of realloc and reallocarray (result `addr`): see the capture
/// table of docs/architecture.md. The old block leaves the live set; the
/// new one to record (0: none).
#[inline(always)]
fn resized(tgid: u32, inflight: &Inflight, addr: u64) -> u64 {
    let old = inflight.ptr;
    let exact = sample_mean() == 0;
    if addr != 0 {
        if old != 0 {
            remove_block(tgid, old, exact);
        }
        return if unsampled(inflight) { 0 } else { addr };
    }
    if inflight.size == 0 && inflight.overflow & INFLIGHT_OVERFLOW == 0 && old != 0 {
        // realloc(p, 0) frees p; glibc's inner free() may have removed it
        // already, which is not an unknown free.
        remove_block(tgid, old, false);
    } else {
        count(Counter::FailedAllocs);
    }
    0
}

/// Return of `posix_memalign(&p, align, size)` (result `ret`): only a 0
/// result made a block, at the address it wrote to `p` (read back from the
/// caller); the block to record (0: none).
#[inline(always)]
fn aligned(inflight: &Inflight, ret: i32) -> u64 {
    if ret != 0 || inflight.ptr == 0 {
        count(Counter::FailedAllocs);
        return 0;
    }
    if unsampled(inflight) {
        return 0;
    }
    // SAFETY: bpf_probe_read_user checks the user address itself.
    match unsafe { aya_ebpf::helpers::bpf_probe_read_user(inflight.ptr as *const u64) } {
        Ok(addr) => addr,
        Err(_) => {
            count(Counter::FailedAllocs);
            0
        }
    }
}
