//! Sampling (when tracerd sets a mean interval, `SAMPLE_MEAN` != 0): which
//! allocations are recorded. Owns `SAMPLE_LEFT` (per-CPU countdown) and
//! reads `EXP_TABLE` (exponential variates filled by tracerd, since BPF has
//! no floating point).

use tracer_common::EXP_TABLE_LEN;

use crate::maps::{EXP_TABLE, SAMPLE_LEFT};

/// Byte-weighted Poisson sampling, as tcmalloc and jemalloc do it: every
/// byte is sampled with probability 1/mean, so an allocation of `size`
/// bytes is sampled with probability 1 - exp(-size/mean). A per-CPU
/// countdown of bytes is refilled with exponential variates (memoryless,
/// so sharing it between the threads of a CPU keeps the probabilities).
#[inline(always)]
pub(crate) fn take_sample(size: u64, mean: u64) -> bool {
    let Some(left) = SAMPLE_LEFT.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: this CPU's slot.
    let mut remaining = unsafe { *left }.wrapping_sub(size as i64);
    let sampled = remaining <= 0;
    if sampled {
        // SAFETY: a helper with no preconditions.
        let r = unsafe { aya_ebpf::helpers::bpf_get_prandom_u32() };
        let e = EXP_TABLE
            .get(r & (EXP_TABLE_LEN - 1))
            .copied()
            .unwrap_or(1 << 16);
        remaining = ((mean.wrapping_mul(u64::from(e))) >> 16) as i64 + 1;
    }
    // SAFETY: as above.
    unsafe { *left = remaining };
    sampled
}
