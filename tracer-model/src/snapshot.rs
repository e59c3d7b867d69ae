//! `Snapshot` with `statistics()` and `compare_to()`, and their result types
//! `Statistic` and `StatisticDiff`. The grouping itself is in `group`.
//!
//! Group keys are unique, so the sort orders below are total: the results
//! do not depend on the order of the traces or of any hash table.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::ModelError;
use super::group::{self, distinct_tracebacks, group_labels, sort_parallel};
use super::index::{FrameHints, Index, Interned};
use crate::text::format::{format_size_f64, true_div};
use crate::trace::{Trace, Traceback};

/// How `statistics()` and `compare_to()` group traces: tracemalloc's
/// `key_type` (`filename`, `lineno`, `traceback`), plus `function` and
/// `module`, which tracemalloc does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    /// By the file name of the most recent frame; the group's frame is
    /// `filename:0`.
    Filename,
    /// By the most recent frame, `filename:lineno`.
    Lineno,
    /// By the whole traceback.
    Traceback,
    /// By the function of the most recent frame (its
    /// [`FrameExtra::function`](super::FrameExtra), `<unknown>` when not
    /// known). The group's frame is the first frame seen in that function,
    /// at line 0; the statistic's `label` is the function name.
    Function,
    /// By the object file (executable or shared library) of the most recent
    /// frame ([`FrameExtra::module`](super::FrameExtra), `<unknown>` when
    /// not known). The group's frame is `module:0`; the `label` is the
    /// module path.
    Module,
}

impl GroupBy {
    /// Every grouping, in the order the API lists them.
    pub const ALL: [GroupBy; 5] = [
        GroupBy::Filename,
        GroupBy::Lineno,
        GroupBy::Traceback,
        GroupBy::Function,
        GroupBy::Module,
    ];

    /// The word tracemalloc uses: `"filename"`, `"lineno"` or `"traceback"`
    /// (and `"function"`, `"module"`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Filename => "filename",
            GroupBy::Lineno => "lineno",
            GroupBy::Traceback => "traceback",
            GroupBy::Function => "function",
            GroupBy::Module => "module",
        }
    }

    /// Whether the groups are named by a label (function, module) rather
    /// than by frames.
    #[must_use]
    pub fn is_labelled(self) -> bool {
        matches!(self, GroupBy::Function | GroupBy::Module)
    }
}

impl fmt::Display for GroupBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GroupBy {
    type Err = ModelError;

    /// Exactly `filename`, `lineno`, `traceback`, `function` or `module`
    /// (case-sensitive, as in tracemalloc); anything else is
    /// [`ModelError::UnknownGroupBy`].
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "filename" => Ok(GroupBy::Filename),
            "lineno" => Ok(GroupBy::Lineno),
            "traceback" => Ok(GroupBy::Traceback),
            "function" => Ok(GroupBy::Function),
            "module" => Ok(GroupBy::Module),
            _ => Err(ModelError::UnknownGroupBy {
                value: value.to_owned(),
            }),
        }
    }
}

/// Memory allocated at one group key: tracemalloc's `Statistic`.
///
/// JSON: `{"traceback": [frames, most recent first], "size": bytes,
/// "count": blocks}`, plus `"label"` for `function` and `module` groups.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Statistic {
    /// The group key: one frame (`lineno`; `filename:0` for `filename`) or
    /// the whole traceback (`traceback`), with no `total_nframe`.
    pub traceback: Traceback,
    /// Sum of the sizes of the group's blocks, in bytes.
    pub size: u64,
    /// Number of blocks in the group (under `cumulative`, one per frame
    /// occurrence: a frame twice in a traceback counts twice, as in
    /// tracemalloc).
    pub count: u64,
    /// The group's name for `function` and `module` groups (shown instead
    /// of the traceback by `str()`); None for tracemalloc's groupings.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_label"
    )]
    pub label: Option<Arc<str>>,
}

impl Statistic {
    /// Average block size in bytes, `size / count` (Python's correctly
    /// rounded `int / int`); `None` when `count` is 0.
    #[must_use]
    pub fn average(&self) -> Option<f64> {
        true_div(self.size, self.count)
    }
}

/// `str(Statistic)`:
/// `a.c:12: size=5000 KiB, count=20000, average=256 B`.
impl fmt::Display for Statistic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: size={}, count={}",
            GroupName(&self.traceback, self.label.as_deref()),
            format_size_f64(self.size as f64, false),
            self.count
        )?;
        if let Some(average) = self.average() {
            write!(f, ", average={}", format_size_f64(average, false))?;
        }
        Ok(())
    }
}

/// Change of one group between an old and a new snapshot: tracemalloc's
/// `StatisticDiff`.
///
/// JSON: `{"traceback": [frames], "size": bytes, "size_diff": bytes,
/// "count": blocks, "count_diff": blocks}`, plus `"label"` for `function`
/// and `module` groups.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct StatisticDiff {
    /// The group key, as in [`Statistic::traceback`].
    pub traceback: Traceback,
    /// Bytes in the group in the new snapshot; 0 if the group is gone.
    pub size: u64,
    /// `size` minus the group's bytes in the old snapshot (saturating at the
    /// `i64` range).
    pub size_diff: i64,
    /// Blocks in the group in the new snapshot; 0 if the group is gone.
    pub count: u64,
    /// `count` minus the group's blocks in the old snapshot.
    pub count_diff: i64,
    /// The group's name for `function` and `module` groups, as in
    /// [`Statistic::label`].
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_label"
    )]
    pub label: Option<Arc<str>>,
}

impl StatisticDiff {
    /// Average block size in the new snapshot, in bytes; `None` when
    /// `count` is 0.
    #[must_use]
    pub fn average(&self) -> Option<f64> {
        true_div(self.size, self.count)
    }
}

/// `str(StatisticDiff)`:
/// `a.c:12: size=5000 KiB (+5000 KiB), count=20000 (+20000), average=256 B`.
impl fmt::Display for StatisticDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: size={} ({}), count={} ({:+})",
            GroupName(&self.traceback, self.label.as_deref()),
            format_size_f64(self.size as f64, false),
            format_size_f64(self.size_diff as f64, true),
            self.count,
            self.count_diff
        )?;
        if let Some(average) = self.average() {
            write!(f, ", average={}", format_size_f64(average, false))?;
        }
        Ok(())
    }
}

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
        if !group_by.is_labelled() {
            return Ok(group::statistics(
                &self.index,
                &self.traces,
                group_by,
                cumulative,
            ));
        }
        let distinct = distinct_tracebacks(self.interned(), &self.traces);
        let statistics = group_labels(&distinct, group_by, cumulative).label_statistics();
        Ok(sort_parallel(statistics, |a, b| {
            b.size
                .cmp(&a.size)
                .then(b.count.cmp(&a.count))
                .then_with(|| group_order(b, a))
        }))
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
        if !group_by.is_labelled() {
            return Ok(group::compare_to(
                (&self.index, &self.traces),
                (&old.index, &old.traces),
                group_by,
                cumulative,
            ));
        }
        let new_distinct = distinct_tracebacks(self.interned(), &self.traces);
        let old_distinct = distinct_tracebacks(old.interned(), &old.traces);
        let diffs = group_labels(&new_distinct, group_by, cumulative)
            .label_compare_to(&group_labels(&old_distinct, group_by, cumulative));
        Ok(sort_parallel(diffs, |a, b| {
            b.size_diff
                .unsigned_abs()
                .cmp(&a.size_diff.unsigned_abs())
                .then(b.size.cmp(&a.size))
                .then(
                    b.count_diff
                        .unsigned_abs()
                        .cmp(&a.count_diff.unsigned_abs()),
                )
                .then(b.count.cmp(&a.count))
                .then_with(|| group_order(b, a))
        }))
    }
}

/// What a statistic or diff is keyed by, for the last sort key.
trait GroupKey {
    fn key(&self) -> (&Traceback, Option<&str>);
}

impl GroupKey for Statistic {
    fn key(&self) -> (&Traceback, Option<&str>) {
        (&self.traceback, self.label.as_deref())
    }
}

impl GroupKey for StatisticDiff {
    fn key(&self) -> (&Traceback, Option<&str>) {
        (&self.traceback, self.label.as_deref())
    }
}

/// The last sort key: the label when both have one (labels are unique
/// within one result), else tracemalloc's traceback order.
fn group_order<T: GroupKey>(a: &T, b: &T) -> std::cmp::Ordering {
    match (a.key(), b.key()) {
        ((_, Some(x)), (_, Some(y))) => x.cmp(y),
        ((x, _), (y, _)) => x.cmp(y),
    }
}

/// The name `str()` shows for a group: its label, else the traceback.
struct GroupName<'a>(&'a Traceback, Option<&'a str>);

impl fmt::Display for GroupName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(label) => f.write_str(label),
            None => self.0.fmt(f),
        }
    }
}

#[allow(clippy::ref_option)] // serde's serialize_with passes &Option.
fn serialize_label<S: serde::Serializer>(
    label: &Option<Arc<str>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match label {
        Some(label) => serializer.serialize_str(label),
        None => serializer.serialize_none(),
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
