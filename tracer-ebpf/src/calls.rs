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
use tracer_common::{Counter, INFLIGHT_OVERFLOW, INFLIGHT_UNSAMPLED};

use crate::{
    counters::count,
    globals::sample_mean,
    inflight::{record_entry, take_inflight},
    live::{record_alloc, remove_block},
};

/// Entry of an allocator that returns a new block (`sp`: the user stack
/// pointer at the entry): see [`record_entry`].
#[inline(always)]
pub(crate) fn alloc_entry(size: u64, ptr: u64, overflow: bool, sp: u64) -> u32 {
    let _ = record_entry(size, ptr, overflow, sp);
    0
}

/// Entry of `realloc(old, size)` and `reallocarray`. When the call cannot be
/// recorded, `old` leaves the live set at once: its return will not be seen,
/// and glibc frees or moves the block (or it stays if the call fails: an
/// untraced live block only undercounts), so keeping it would leave a
/// phantom leak.
#[inline(always)]
pub(crate) fn realloc_entry(size: u64, old: u64, overflow: bool, sp: u64) -> u32 {
    if let Some(tgid) = record_entry(size, old, overflow, sp)
        && old != 0
    {
        remove_block(tgid, old, false);
    }
    0
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

/// Return of malloc, calloc, aligned_alloc, memalign, valloc, pvalloc.
#[inline(always)]
pub(crate) fn alloc_exit(ctx: &RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight(ret_sp(ctx)) else {
        return 0;
    };
    let addr: u64 = ctx.ret();
    if addr == 0 {
        count(Counter::FailedAllocs);
        return 0;
    }
    if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
        count(Counter::Unsampled);
        return 0;
    }
    record_alloc(ctx, tgid, addr, inflight.size);
    0
}

/// Return of realloc and reallocarray: see the capture table of docs/architecture.md.
#[inline(always)]
pub(crate) fn realloc_exit(ctx: &RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight(ret_sp(ctx)) else {
        return 0;
    };
    let addr: u64 = ctx.ret();
    let old = inflight.ptr;
    let exact = sample_mean() == 0;
    if addr != 0 {
        if old != 0 {
            remove_block(tgid, old, exact);
        }
        if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
            count(Counter::Unsampled);
        } else {
            record_alloc(ctx, tgid, addr, inflight.size);
        }
    } else if inflight.size == 0 && inflight.overflow & INFLIGHT_OVERFLOW == 0 && old != 0 {
        // realloc(p, 0) frees p; glibc's inner free() may have removed it
        // already, which is not an unknown free.
        remove_block(tgid, old, false);
    } else {
        count(Counter::FailedAllocs);
    }
    0
}

/// Return of `posix_memalign(&p, align, size)`: only a 0 result made a
/// block, at the address it wrote to `p` (read back from the caller).
#[inline(always)]
pub(crate) fn posix_memalign_exit(ctx: &RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight(ret_sp(ctx)) else {
        return 0;
    };
    let ret: i32 = ctx.ret();
    if ret != 0 || inflight.ptr == 0 {
        count(Counter::FailedAllocs);
        return 0;
    }
    if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
        count(Counter::Unsampled);
        return 0;
    }
    // SAFETY: bpf_probe_read_user checks the user address itself.
    let Ok(addr) = (unsafe { aya_ebpf::helpers::bpf_probe_read_user(inflight.ptr as *const u64) })
    else {
        count(Counter::FailedAllocs);
        return 0;
    };
    record_alloc(ctx, tgid, addr, inflight.size);
    0
}
