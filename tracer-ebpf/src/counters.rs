//! The per-CPU counters (`COUNTERS`): [`count`] adds one to a
//! [`Counter`]'s slot on this CPU. Every failure branch of the programs
//! counts one; tracerd sums the CPUs.
//!
//! Atomic adds, though each CPU has its own slots: another task on this
//! CPU may run a program between the load and the store of a plain
//! increment (preemption), and one of the two counts would be lost.

use tracer_common::Counter;

use crate::{atomic::fetch_add, maps::COUNTERS};

/// Adds one to `counter` on this CPU.
#[inline(always)]
pub(crate) fn count(counter: Counter) {
    count_n(counter, 1);
}

/// Adds `n` to `counter` on this CPU (one lookup for a walk's frames).
#[inline(always)]
pub(crate) fn count_n(counter: Counter, n: u64) {
    if n == 0 {
        return;
    }
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        fetch_add(slot, n);
    }
}
