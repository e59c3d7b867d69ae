//! Per-process totals: the slot of `PROC_SLOTS` a process owns, or its
//! entry of `PROCS` when its slot is taken by another process.
//!
//! They are read through [`ProcTotalsMaps`], shared (an [`Arc`]) between
//! [`Capture`] and whoever holds [`TotalsMaps::totals`](super::TotalsMaps::totals):
//! the slots are a shared mapping read with atomics and `PROCS` is read by
//! lookups on a descriptor of its own, so a reader needs no lock of
//! tracerd's, and a long pass over the live blocks under the kernel side's
//! lock never holds up a process's totals.
use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::Arc;

use tracer_common::{ProcStats, ProcTotals};

use super::Capture;
use super::proc_slots::ProcSlots;
use crate::sys::bpf as bpf_sys;

/// The kernel's per-process totals, as a reader without the kernel side's
/// lock sees them: each read is the kernel's value at that moment (the
/// programs change them concurrently, field by field, as they always did;
/// tracerd's own changes, `reset_peak` and the stacks count, are single
/// stores of a field).
pub trait ProcTotalsSource: Send + Sync {
    /// Totals of `tgid`'s current image with its bytes by source, from its
    /// slot of `PROC_SLOTS` or from `PROCS`; None: not tracked.
    fn proc_totals(&self, tgid: u32) -> Option<ProcTotals>;

    /// Totals of every process the programs track: tgid → totals.
    fn all_proc_stats(&self) -> Vec<(u32, ProcStats)>;

    /// Totals of `tgid`'s current image; None: not tracked.
    fn proc_stats(&self, tgid: u32) -> Option<ProcStats> {
        self.proc_totals(tgid).map(|totals| totals.stats)
    }

    /// Totals of `image` while it is its pid's current image (the kernel
    /// tracks that generation); None once it ended, or when not tracked.
    fn image_totals(&self, image: super::ImageId) -> Option<ProcTotals> {
        self.proc_totals(image.pid)
            .filter(|totals| totals.stats.generation == image.generation)
    }
}

/// `PROC_SLOTS` (mapped) and `PROCS` (a descriptor of its own), read
/// without any lock of tracerd's.
pub struct ProcTotalsMaps {
    /// `PROC_SLOTS`, mapped.
    pub(super) slots: ProcSlots,
    /// `PROCS` (tgid → [`ProcTotals`]), a duplicate of the descriptor
    /// `Capture` writes through.
    procs: OwnedFd,
}

impl ProcTotalsMaps {
    /// The reader over the mapped `slots` and the map `procs`.
    pub(super) fn new(slots: ProcSlots, procs: OwnedFd) -> Self {
        Self { slots, procs }
    }

    /// The entry of `tgid` in `PROCS`.
    fn spilled_totals(&self, tgid: u32) -> Option<ProcTotals> {
        bpf_sys::lookup_value(self.procs.as_fd(), &tgid).ok()
    }
}

impl ProcTotalsSource for ProcTotalsMaps {
    fn proc_totals(&self, tgid: u32) -> Option<ProcTotals> {
        self.slots.get_totals(tgid).or_else(|| {
            self.slots
                .spilled(tgid)
                .then(|| self.spilled_totals(tgid))?
        })
    }

    fn all_proc_stats(&self) -> Vec<(u32, ProcStats)> {
        let mut all = self.slots.all();
        let mut spilled = Vec::new();
        let batched = bpf_sys::lookup_batch(
            self.procs.as_fd(),
            &mut |tgid: &u32, totals: &ProcTotals| {
                spilled.push((*tgid, totals.stats));
                std::ops::ControlFlow::Continue(())
            },
        );
        if batched.is_err() {
            // No batch lookups (Linux < 5.6): one lookup per key.
            spilled = bpf_sys::keys::<u32>(self.procs.as_fd())
                .into_iter()
                .filter_map(|tgid| Some((tgid, self.spilled_totals(tgid)?.stats)))
                .collect();
        }
        all.extend(spilled);
        all
    }
}

impl Capture {
    /// The reader of the per-process totals, shared.
    pub fn totals(&self) -> Arc<ProcTotalsMaps> {
        self.totals.clone()
    }

    /// Totals of one process's current image, from its slot of `PROC_SLOTS`
    /// or from `PROCS`.
    pub fn proc_stats(&self, tgid: u32) -> Option<ProcStats> {
        self.totals.proc_stats(tgid)
    }

    /// Totals of one process's current image with its bytes by source,
    /// from its slot of `PROC_SLOTS` or from `PROCS`.
    pub fn proc_totals(&self, tgid: u32) -> Option<ProcTotals> {
        self.totals.proc_totals(tgid)
    }

    /// Sets the stacks count ([`ProcTotals::stacks`]) of each image of
    /// `counts` that the kernel still tracks (same tgid and generation):
    /// the distinct stacks its live blocks reference, so that stacks
    /// collected since leave its share.
    pub fn set_stack_counts(&mut self, counts: &[(u32, u32, u64)]) {
        for &(tgid, generation, stacks) in counts {
            let slots = &self.totals.slots;
            if slots.set_stacks(tgid, generation, stacks) || !slots.spilled(tgid) {
                continue;
            }
            if let Ok(mut totals) = self.procs.get(&tgid, 0)
                && totals.stats.generation == generation
            {
                totals.stacks = stacks;
                let _ = self.procs.insert(tgid, totals, 0);
            }
        }
    }

    /// Every traced process (`PROC_SLOTS` and `PROCS`): tgid → totals.
    pub fn all_proc_stats(&self) -> Vec<(u32, ProcStats)> {
        self.totals.all_proc_stats()
    }

    /// Sets the peak of `tgid` to its current value (`reset_peak()`), and
    /// each source's peak to its current.
    pub fn reset_peak(&mut self, tgid: u32) -> bool {
        if self.totals.slots.reset_peak(tgid) {
            return true;
        }
        let Ok(mut totals) = self.procs.get(&tgid, 0) else {
            return false;
        };
        totals.stats.peak = totals.stats.current;
        for source in &mut totals.sources {
            source.peak = source.current;
        }
        self.procs.insert(tgid, totals, 0).is_ok()
    }
}
