//! Calls in flight: the per-thread slots of `INFLIGHT_SLOTS` that hold an
//! allocator call between its entry and its return, and `INFLIGHT`, the
//! spill for threads whose slot is taken.
use std::os::fd::BorrowedFd;

use tracer_common::{InflightSlot, MAP_INFLIGHT_SLOTS};

use crate::sys::bpf as bpf_sys;

/// Slots of `INFLIGHT_SLOTS` (the array `fd`) that a thread holds now (a
/// call in progress): one batch read of the array, thousands of slots a
/// syscall; 0 where the kernel has no batch lookups.
pub(super) fn slots_in_use(fd: BorrowedFd<'_>) -> u64 {
    let mut used = 0u64;
    let mut count = |_: &u32, slot: &InflightSlot| {
        used += u64::from(slot.owner != 0);
        std::ops::ControlFlow::Continue(())
    };
    if bpf_sys::lookup_batch(fd, &mut count).is_err() {
        tracing::debug!(
            map = MAP_INFLIGHT_SLOTS,
            "no batch lookup: slots in use not counted"
        );
    }
    used
}

/// Largest `inflight_slots`: the kernel's largest pid_max (PID_MAX_LIMIT),
/// so that every thread id has a slot of its own.
pub const MAX_INFLIGHT_SLOTS: u32 = 1 << 22;
