//! Per-process totals: the slot of `PROC_SLOTS` a process owns, or its
//! entry of `PROCS` when its slot is taken by another process.
use tracer_common::ProcStats;

use super::Capture;

impl Capture {
    /// Totals of one process's current image, from its slot of `PROC_SLOTS`
    /// or from `PROCS`.
    pub fn proc_stats(&self, tgid: u32) -> Option<ProcStats> {
        self.proc_slots.get(tgid).or_else(|| {
            self.proc_slots
                .spilled(tgid)
                .then(|| self.procs.get(&tgid, 0).ok())
                .flatten()
        })
    }

    /// Every traced process (`PROC_SLOTS` and `PROCS`): tgid → totals.
    pub fn all_proc_stats(&self) -> Vec<(u32, ProcStats)> {
        let mut all = self.proc_slots.all();
        all.extend(self.procs.iter().filter_map(Result::ok));
        all
    }

    /// Sets the peak of `tgid` to its current value (`reset_peak()`).
    pub fn reset_peak(&mut self, tgid: u32) -> bool {
        if self.proc_slots.reset_peak(tgid) {
            return true;
        }
        let Ok(mut stats) = self.procs.get(&tgid, 0) else {
            return false;
        };
        stats.peak = stats.current;
        self.procs.insert(tgid, stats, 0).is_ok()
    }
}
