//! The per-CPU counters (`COUNTERS`): [`count`] adds one to a
//! [`Counter`]'s slot on this CPU. Every failure branch of the programs
//! counts one; tracerd sums the CPUs.

use tracer_common::Counter;

use crate::maps::COUNTERS;

/// Adds one to `counter` on this CPU.
#[inline(always)]
pub(crate) fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot; BPF programs are not migrated while they run.
        unsafe { *slot += 1 };
    }
}

/// Adds `n` to `counter` on this CPU (one lookup for a walk's frames).
#[inline(always)]
pub(crate) fn count_n(counter: Counter, n: u64) {
    if n == 0 {
        return;
    }
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: as in `count`.
        unsafe { *slot += n };
    }
}
