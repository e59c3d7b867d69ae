//! `Snapshot`: tracemalloc's snapshot of the live blocks, and the entry
//! points of its methods `statistics()`, `compare_to()` and
//! `filter_traces()`: the top of the engine. Each constructor indexes the
//! traces (`engine::index`); the methods check their arguments and call
//! down: into the grouping (`engine::group` for tracemalloc's key types,
//! `engine::labels` for `function` and `module`), which returns the
//! `statistic` types sorted, or into `filter` for the traces to keep.

use std::sync::Arc;

use crate::engine::index::{FrameHints, Index, Interned};
use crate::engine::{group, labels};
use crate::error::ModelError;
use crate::filter::{self, TraceFilter};
use crate::statistic::{GroupBy, Statistic, StatisticDiff};
use crate::trace::{Trace, Traceback};

/// The live blocks of one process at one moment: tracemalloc's `Snapshot`.
///
/// Every constructor indexes the traces once (as `_tracemalloc` interns
/// tracebacks and frames): the distinct tracebacks, frames and file names,
/// numbered in tracemalloc's sort orders, so that `statistics()` and
/// `compare_to()` add and sort integers. The index takes 4 bytes per
/// trace, about 60 per distinct traceback plus 4 per frame of it, and
/// about 80 per distinct frame. Equality compares the traces and the limit
/// only.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every live block, in no particular order.
    pub(crate) traces: Vec<Trace>,
    /// Most frames a traceback may hold: the `nframe` tracing was started
    /// with.
    pub traceback_limit: u32,
    /// The index of `traces`, shared by clones.
    index: Arc<Index>,
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.traceback_limit == other.traceback_limit && self.traces == other.traces
    }
}

impl Eq for Snapshot {}

impl Snapshot {
    /// A snapshot of `traces` taken with at most `traceback_limit` frames
    /// per traceback.
    #[must_use]
    pub fn new(traces: Vec<Trace>, traceback_limit: u32) -> Self {
        let interned = Interned::of(&traces);
        Snapshot::indexed(traces, traceback_limit, interned, None)
    }

    /// The snapshot of `traces` interned as `interned`, indexed (with the
    /// frame numbers `hints`, if any).
    fn indexed(
        traces: Vec<Trace>,
        traceback_limit: u32,
        interned: Interned,
        hints: Option<FrameHints>,
    ) -> Self {
        let index = Arc::new(Index::build(interned, hints));
        Snapshot {
            traces,
            traceback_limit,
            index,
        }
    }

    /// A snapshot whose tracebacks a loader interned already: `ids[i]` is
    /// the index in `tracebacks` of trace `i`'s `Arc`, numbered in order
    /// of first appearance; `hints` number the frames of each of
    /// `tracebacks`. Anything else is ignored (and computed anew).
    #[must_use]
    pub(crate) fn with_interned(
        traces: Vec<Trace>,
        traceback_limit: u32,
        tracebacks: Vec<Arc<Traceback>>,
        ids: Vec<u32>,
        hints: FrameHints,
    ) -> Self {
        match Interned::checked(&traces, tracebacks, ids) {
            Some(interned) => Snapshot::indexed(traces, traceback_limit, interned, Some(hints)),
            None => {
                let interned = Interned::of(&traces);
                Snapshot::indexed(traces, traceback_limit, interned, None)
            }
        }
    }

    /// A snapshot of the traces of this one that `keep` accepts (one flag
    /// per trace), indexed from this one's index.
    pub(crate) fn subset(&self, keep: &[bool]) -> Self {
        let traces = self
            .traces
            .iter()
            .zip(keep)
            .filter(|(_, kept)| **kept)
            .map(|(trace, _)| trace.clone())
            .collect();
        let (interned, parents) = self.index.interned.subset(keep);
        let hints = self.index.hints_for(&parents);
        Snapshot::indexed(traces, self.traceback_limit, interned, Some(hints))
    }

    /// The interned tracebacks.
    pub(crate) fn interned(&self) -> &Interned {
        &self.index.interned
    }

    /// The traces, by value.
    #[must_use]
    pub fn into_traces(self) -> Vec<Trace> {
        self.traces
    }

    /// Every live block, in no particular order.
    #[must_use]
    pub fn traces(&self) -> &[Trace] {
        &self.traces
    }

    /// Most frames a traceback may hold.
    #[must_use]
    pub fn traceback_limit(&self) -> u32 {
        self.traceback_limit
    }

    /// `Snapshot.statistics(key_type, cumulative)`: one [`Statistic`] per
    /// group, biggest first by `size`, then `count`, then traceback (the
    /// label for `function` and `module` groups).
    ///
    /// With `cumulative`, every frame of a traceback (not only the most
    /// recent) adds the trace's size and 1 to its group, once per
    /// occurrence. Cumulative grouping by traceback is
    /// [`ModelError::CumulativeTraceback`].
    pub fn statistics(
        &self,
        group_by: GroupBy,
        cumulative: bool,
    ) -> Result<Vec<Statistic>, ModelError> {
        check_cumulative(group_by, cumulative)?;
        if group_by.is_labelled() {
            return Ok(labels::statistics(
                self.interned(),
                &self.traces,
                group_by,
                cumulative,
            ));
        }
        Ok(group::statistics(
            &self.index,
            &self.traces,
            group_by,
            cumulative,
        ))
    }

    /// `Snapshot.compare_to(old, key_type, cumulative)`: one
    /// [`StatisticDiff`] per group of either snapshot (groups only in `old`
    /// have `size` and `count` 0), biggest first by `|size_diff|`, `size`,
    /// `|count_diff|`, `count`, then traceback (or label).
    ///
    /// Same grouping and errors as [`Snapshot::statistics`].
    pub fn compare_to(
        &self,
        old: &Snapshot,
        group_by: GroupBy,
        cumulative: bool,
    ) -> Result<Vec<StatisticDiff>, ModelError> {
        check_cumulative(group_by, cumulative)?;
        if group_by.is_labelled() {
            return Ok(labels::compare_to(
                (self.interned(), &self.traces),
                (old.interned(), &old.traces),
                group_by,
                cumulative,
            ));
        }
        Ok(group::compare_to(
            (&self.index, &self.traces),
            (&old.index, &old.traces),
            group_by,
            cumulative,
        ))
    }

    /// `Snapshot.filter_traces(filters)`: a new snapshot (same
    /// `traceback_limit`) of the traces that match at least one inclusive
    /// filter (if there is any) and that no exclusive filter excludes, in
    /// their original order. No filters: a copy of every trace.
    #[must_use]
    pub fn filter_traces(&self, filters: &[TraceFilter]) -> Snapshot {
        if filters.is_empty() {
            return self.clone();
        }
        self.subset(&filter::kept(filters, &self.traces, self.interned()))
    }
}

fn check_cumulative(group_by: GroupBy, cumulative: bool) -> Result<(), ModelError> {
    if cumulative && group_by == GroupBy::Traceback {
        Err(ModelError::CumulativeTraceback)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
