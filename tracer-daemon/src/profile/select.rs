//! The statistics call behind statistics, compare and profile answers: a
//! snapshot's traces filtered, grouped by the model
//! (`Snapshot.statistics`, `compare_to`) and cut to a limit.
use tracer_model::{GroupBy, ModelError, Snapshot, Statistic, StatisticDiff, TraceFilter};

/// Which traces, grouped how, and how many groups.
#[derive(Clone, Debug)]
pub struct Selection {
    /// The grouping (`key_type`).
    pub group_by: GroupBy,
    /// tracemalloc's `cumulative`.
    pub cumulative: bool,
    /// Most groups kept, biggest first; 0 keeps every group.
    pub limit: usize,
    /// The traces kept (`Snapshot.filter_traces`).
    pub filters: Vec<TraceFilter>,
}

/// Groups cut to a selection's limit, with how many there were.
#[derive(Clone, Debug)]
pub struct Grouped<T> {
    /// The groups kept, biggest first.
    pub groups: Vec<T>,
    /// The number of groups before the limit.
    pub total: usize,
}

impl Selection {
    /// `snapshot`'s traces this selection keeps.
    pub fn filter(&self, snapshot: &Snapshot) -> Snapshot {
        snapshot.filter_traces(&self.filters)
    }

    /// The statistics of `filtered` (a snapshot [`Selection::filter`]ed).
    ///
    /// # Errors
    /// The model's: a cumulative grouping by traceback, an interruption.
    pub fn statistics(&self, filtered: &Snapshot) -> Result<Grouped<Statistic>, ModelError> {
        let statistics = filtered.statistics(self.group_by, self.cumulative)?;
        Ok(self.cut(statistics))
    }

    /// `new.compare_to(base)` of both sides filtered.
    ///
    /// # Errors
    /// As [`Selection::statistics`].
    pub fn compare(
        &self,
        base: &Snapshot,
        new: &Snapshot,
    ) -> Result<Grouped<StatisticDiff>, ModelError> {
        let new = self.filter(new);
        let base = self.filter(base);
        let diffs = new.compare_to(&base, self.group_by, self.cumulative)?;
        Ok(self.cut(diffs))
    }

    fn cut<T>(&self, mut groups: Vec<T>) -> Grouped<T> {
        let total = groups.len();
        if self.limit > 0 {
            groups.truncate(self.limit);
        }
        Grouped { groups, total }
    }
}
