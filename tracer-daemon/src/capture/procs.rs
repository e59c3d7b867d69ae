//! Per-process totals: the slot of `PROC_SLOTS` a process owns, or its
//! entry of `PROCS` when its slot is taken by another process.
use tracer_common::{ProcStats, ProcTotals};

use super::Capture;

impl Capture {
    /// Totals of one process's current image, from its slot of `PROC_SLOTS`
    /// or from `PROCS`.
    pub fn proc_stats(&self, tgid: u32) -> Option<ProcStats> {
        self.proc_totals(tgid).map(|totals| totals.stats)
    }

    /// Totals of one process's current image with its bytes by source,
    /// from its slot of `PROC_SLOTS` or from `PROCS`.
    pub fn proc_totals(&self, tgid: u32) -> Option<ProcTotals> {
        self.proc_slots.get_totals(tgid).or_else(|| {
            self.proc_slots
                .spilled(tgid)
                .then(|| self.procs.get(&tgid, 0).ok())
                .flatten()
        })
    }

    /// Sets the stacks count ([`ProcTotals::stacks`]) of each image of
    /// `counts` that the kernel still tracks (same tgid and generation):
    /// the distinct stacks its live blocks reference, so that stacks
    /// collected since leave its share.
    pub fn set_stack_counts(&mut self, counts: &[(u32, u32, u64)]) {
        for &(tgid, gen_, stacks) in counts {
            if self.proc_slots.set_stacks(tgid, gen_, stacks) || !self.proc_slots.spilled(tgid) {
                continue;
            }
            if let Ok(mut totals) = self.procs.get(&tgid, 0)
                && totals.stats.gen_ == gen_
            {
                totals.stacks = stacks;
                let _ = self.procs.insert(tgid, totals, 0);
            }
        }
    }

    /// Every traced process (`PROC_SLOTS` and `PROCS`): tgid → totals.
    pub fn all_proc_stats(&self) -> Vec<(u32, ProcStats)> {
        let mut all = self.proc_slots.all();
        all.extend(
            self.procs
                .iter()
                .filter_map(Result::ok)
                .map(|(tgid, totals)| (tgid, totals.stats)),
        );
        all
    }

    /// Sets the peak of `tgid` to its current value (`reset_peak()`), and
    /// each source's peak to its current.
    pub fn reset_peak(&mut self, tgid: u32) -> bool {
        if self.proc_slots.reset_peak(tgid) {
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
