//! Sampling (when tracerd sets a mean interval, `SAMPLE_MEAN` != 0): which
//! allocations are recorded. Owns `SAMPLE_LEFT` (per-CPU countdown) and
//! reads `EXP_TABLE` (exponential variates filled by tracerd, since BPF has
//! no floating point).
//!
//! Preemption. Another task on this CPU may run [`take_sample`] in the
//! middle of ours, so the countdown is only ever changed by atomic adds: a
//! read-modify-write would lose the other task's bytes.

use tracer_common::EXP_TABLE_LEN;

use crate::{
    atomic::{exchange, fetch_add},
    maps::{EXP_TABLE, SAMPLE_LEFT},
};

/// Byte-weighted Poisson sampling, as tcmalloc and jemalloc do it: every
/// byte is sampled with probability 1/mean, so an allocation of `size`
/// bytes is sampled with probability 1 - exp(-size/mean). A per-CPU
/// countdown of bytes is refilled with exponential variates (memoryless,
/// so sharing it between the threads of a CPU keeps the probabilities).
///
/// The allocation whose subtraction takes the countdown from 0 or more to
/// below 0 is sampled, and only its task refills it (no other task sees
/// the countdown cross 0 until it is refilled): it adds a variate less
/// what it left, so the bytes other tasks took meanwhile count against the
/// new interval, as they would have one after another. Should they exceed
/// it (a sample point fell in one of them, not recorded: it takes a
/// preemption in the few instructions between and a whole interval's
/// bytes), it sets a new interval.
#[inline(always)]
pub(crate) fn take_sample(size: u64, mean: u64) -> bool {
    let Some(left) = SAMPLE_LEFT.get_ptr_mut(0) else {
        return true;
    };
    // Larger sizes (failed calls) count as 2^62 bytes: no overflow.
    let size = if size > 1 << 62 { 1 << 62 } else { size };
    let left = left.cast::<u64>();
    let before = fetch_add(left, size.wrapping_neg()) as i64;
    let mut seen = before.wrapping_sub(size as i64);
    if before < 0 || seen >= 0 {
        return false;
    }
    // Ours to refill: carry the bytes other tasks took since our
    // subtraction into the next interval.
    let add = variate(mean).wrapping_sub(seen);
    seen = (fetch_add(left, add as u64) as i64).wrapping_add(add);
    if seen < 0 {
        // They took more than the interval: start a new one from here.
        exchange(left, variate(mean) as u64);
    }
    true
}

/// Bytes to the next sampled one: an exponential variate of mean `mean`
/// from `EXP_TABLE`, at least 1.
#[inline(always)]
fn variate(mean: u64) -> i64 {
    // SAFETY: a helper with no preconditions.
    let r = unsafe { aya_ebpf::helpers::bpf_get_prandom_u32() };
    let e = EXP_TABLE
        .get(r & (EXP_TABLE_LEN - 1))
        .copied()
        .unwrap_or(1 << 16);
    ((mean.wrapping_mul(u64::from(e))) >> 16) as i64 + 1
}
