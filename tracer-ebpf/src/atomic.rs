//! Atomic read-modify-write on map values, in BPF assembly.
//!
//! The BPF target has no `Atomic*` types and aya-build compiles for the
//! generic (v1) CPU, where LLVM refuses to use the result of an atomic add;
//! the kernel itself runs the v3 atomic instructions (BPF_FETCH,
//! BPF_CMPXCHG, BPF_XCHG, since 5.12), so they are written here in BPF
//! assembly.
//!
//! Contract: `p` points into a map value, 8-byte aligned, alive while the
//! program runs, and every concurrent writer of `*p` uses these functions
//! (or is its only owner, as documented where it writes).

use core::arch::asm;

/// Atomically adds `v` (wrapping) to `*p` and returns the value before.
#[inline(always)]
pub(crate) fn fetch_add(p: *mut u64, v: u64) -> u64 {
    let mut v = v;
    // SAFETY: p points into a map value, 8-byte aligned, alive while the
    // program runs; all concurrent writers use atomics.
    unsafe {
        asm!("{v} = atomic_fetch_add((u64 *)({p} + 0), {v})", p = in(reg) p, v = inout(reg) v);
    }
    v
}

/// Atomically sets `*p` to `new` if it is `expected`; returns the value seen.
#[inline(always)]
pub(crate) fn compare_exchange(p: *mut u64, expected: u64, new: u64) -> u64 {
    let mut seen = expected;
    // SAFETY: as for fetch_add. cmpxchg compares with and returns into r0.
    unsafe {
        asm!("r0 = cmpxchg_64({p} + 0, r0, {new})", p = in(reg) p, new = in(reg) new,
             inout("r0") seen);
    }
    seen
}

/// Atomically sets `*p` to `v`; returns the value before.
#[inline(always)]
pub(crate) fn exchange(p: *mut u64, v: u64) -> u64 {
    let mut v = v;
    // SAFETY: as for fetch_add.
    unsafe {
        asm!("{v} = xchg_64({p} + 0, {v})", p = in(reg) p, v = inout(reg) v);
    }
    v
}

/// Atomically ors `v` into `*p`; returns the value before.
#[inline(always)]
pub(crate) fn fetch_or(p: *mut u64, v: u64) -> u64 {
    let mut v = v;
    // SAFETY: as for fetch_add.
    unsafe {
        asm!("{v} = atomic_fetch_or((u64 *)({p} + 0), {v})", p = in(reg) p, v = inout(reg) v);
    }
    v
}
