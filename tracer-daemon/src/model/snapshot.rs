//! `Snapshot.statistics()` and `Snapshot.compare_to()`, with the result types
//! `Statistic` and `StatisticDiff`.
//!
//! Grouping runs in two stages so that the per-trace work is one lookup
//! keyed by the traceback's `Arc` address, with no allocation:
//! 1. sum size and count per distinct `Arc<Traceback>`;
//! 2. group those sums by the key (`(filename, lineno)`, `(filename, 0)` or
//!    the whole traceback, compared by content), once per distinct
//!    traceback, or once per frame of it under `cumulative`.
//!
//! Group keys are unique, so the sort orders below are total and the
//! results do not depend on hash-table order.

use std::collections::hash_map::Entry;
use std::fmt;
use std::hash::Hash;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::ModelError;
use super::format::{format_size_f64, true_div};
use super::hash::FxHashMap;
use super::traceback::{Frame, Trace, Traceback, serialize_traceback};

/// How `statistics()` and `compare_to()` group traces: tracemalloc's
/// `key_type`. Parsed from and shown as `filename`, `lineno`, `traceback`.
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
}

impl GroupBy {
    /// The word tracemalloc uses: `"filename"`, `"lineno"` or `"traceback"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Filename => "filename",
            GroupBy::Lineno => "lineno",
            GroupBy::Traceback => "traceback",
        }
    }
}

impl fmt::Display for GroupBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GroupBy {
    type Err = ModelError;

    /// Exactly `filename`, `lineno` or `traceback` (case-sensitive, as in
    /// tracemalloc); anything else is [`ModelError::UnknownGroupBy`].
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "filename" => Ok(GroupBy::Filename),
            "lineno" => Ok(GroupBy::Lineno),
            "traceback" => Ok(GroupBy::Traceback),
            _ => Err(ModelError::UnknownGroupBy {
                value: value.to_owned(),
            }),
        }
    }
}

/// Memory allocated at one group key: tracemalloc's `Statistic`.
///
/// JSON: `{"traceback": [frames, most recent first], "size": bytes,
/// "count": blocks}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Statistic {
    /// The group key: one frame (`lineno`; `filename:0` for `filename`) or
    /// the whole traceback (`traceback`), with no `total_nframe`.
    #[serde(serialize_with = "serialize_traceback")]
    pub traceback: Arc<Traceback>,
    /// Sum of the sizes of the group's blocks, in bytes.
    pub size: u64,
    /// Number of blocks in the group (under `cumulative`, one per frame
    /// occurrence: a frame twice in a traceback counts twice, as in
    /// tracemalloc).
    pub count: u64,
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
            self.traceback,
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
/// "count": blocks, "count_diff": blocks}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct StatisticDiff {
    /// The group key, as in [`Statistic::traceback`].
    #[serde(serialize_with = "serialize_traceback")]
    pub traceback: Arc<Traceback>,
    /// Bytes in the group in the new snapshot; 0 if the group is gone.
    pub size: u64,
    /// `size` minus the group's bytes in the old snapshot (saturating at the
    /// `i64` range).
    pub size_diff: i64,
    /// Blocks in the group in the new snapshot; 0 if the group is gone.
    pub count: u64,
    /// `count` minus the group's blocks in the old snapshot.
    pub count_diff: i64,
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
            self.traceback,
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every live block, in no particular order.
    pub traces: Vec<Trace>,
    /// Most frames a traceback may hold: the `nframe` tracing was started
    /// with.
    pub traceback_limit: u32,
}

impl Snapshot {
    /// A snapshot of `traces` taken with at most `traceback_limit` frames
    /// per traceback.
    #[must_use]
    pub fn new(traces: Vec<Trace>, traceback_limit: u32) -> Self {
        Snapshot {
            traces,
            traceback_limit,
        }
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
    /// group, biggest first by `size`, then `count`, then traceback.
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
        let distinct = distinct_tracebacks(&self.traces);
        let mut statistics: Vec<Statistic> = match group_by {
            GroupBy::Traceback => group_tracebacks(&distinct)
                .into_iter()
                .map(|(key, totals)| totals.statistic(traceback_group_key(key)))
                .collect(),
            GroupBy::Lineno | GroupBy::Filename => group_frames(&distinct, group_by, cumulative)
                .into_iter()
                .map(|(key, group)| {
                    group
                        .totals
                        .statistic(frame_group_key(key, group.frame, group_by))
                })
                .collect(),
        };
        statistics.sort_unstable_by(|a, b| {
            b.size
                .cmp(&a.size)
                .then(b.count.cmp(&a.count))
                .then_with(|| b.traceback.cmp(&a.traceback))
        });
        Ok(statistics)
    }

    /// `Snapshot.compare_to(old, key_type, cumulative)`: one
    /// [`StatisticDiff`] per group of either snapshot (groups only in `old`
    /// have `size` and `count` 0), biggest first by `|size_diff|`, `size`,
    /// `|count_diff|`, `count`, then traceback.
    ///
    /// Same grouping and errors as [`Snapshot::statistics`].
    pub fn compare_to(
        &self,
        old: &Snapshot,
        group_by: GroupBy,
        cumulative: bool,
    ) -> Result<Vec<StatisticDiff>, ModelError> {
        check_cumulative(group_by, cumulative)?;
        let new_distinct = distinct_tracebacks(&self.traces);
        let old_distinct = distinct_tracebacks(&old.traces);
        let mut diffs = match group_by {
            GroupBy::Traceback => diff_groups(
                group_tracebacks(&new_distinct),
                group_tracebacks(&old_distinct),
                |totals| *totals,
                |key, _| traceback_group_key(key),
            ),
            GroupBy::Lineno | GroupBy::Filename => diff_groups(
                group_frames(&new_distinct, group_by, cumulative),
                group_frames(&old_distinct, group_by, cumulative),
                |group| group.totals,
                |key, group| frame_group_key(*key, group.frame, group_by),
            ),
        };
        diffs.sort_unstable_by(|a, b| {
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
                .then_with(|| b.traceback.cmp(&a.traceback))
        });
        Ok(diffs)
    }
}

fn check_cumulative(group_by: GroupBy, cumulative: bool) -> Result<(), ModelError> {
    if cumulative && group_by == GroupBy::Traceback {
        Err(ModelError::CumulativeTraceback)
    } else {
        Ok(())
    }
}

/// Bytes and blocks of one group. Sums saturate instead of wrapping (no
/// real process holds 2^64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    size: u64,
    count: u64,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.size = self.size.saturating_add(other.size);
        self.count = self.count.saturating_add(other.count);
    }

    fn statistic(self, traceback: Arc<Traceback>) -> Statistic {
        Statistic {
            traceback,
            size: self.size,
            count: self.count,
        }
    }
}

/// Stage 1: the traces sharing one `Arc<Traceback>`.
struct Distinct<'a> {
    traceback: &'a Arc<Traceback>,
    totals: Totals,
}

/// Stage 1: sums per `Arc<Traceback>` address, in order of first
/// appearance. Equal tracebacks in different `Arc`s stay separate here and
/// are merged by stage 2.
fn distinct_tracebacks(traces: &[Trace]) -> Vec<Distinct<'_>> {
    let mut index: FxHashMap<*const Traceback, usize> = FxHashMap::default();
    let mut distinct: Vec<Distinct<'_>> = Vec::new();
    // Consecutive traces often share a stack: skip the lookup for them.
    let mut previous: Option<(*const Traceback, usize)> = None;
    for trace in traces {
        let pointer = Arc::as_ptr(&trace.traceback);
        let slot = match previous {
            Some((p, slot)) if p == pointer => slot,
            _ => match index.entry(pointer) {
                Entry::Occupied(entry) => *entry.get(),
                Entry::Vacant(entry) => {
                    entry.insert(distinct.len());
                    distinct.push(Distinct {
                        traceback: &trace.traceback,
                        totals: Totals::default(),
                    });
                    distinct.len() - 1
                }
            },
        };
        previous = Some((pointer, slot));
        if let Some(group) = distinct.get_mut(slot) {
            group.totals.add(Totals {
                size: trace.size,
                count: 1,
            });
        }
    }
    distinct
}

/// Stage 2 for `traceback`: distinct tracebacks merged by content.
fn group_tracebacks<'a>(distinct: &[Distinct<'a>]) -> FxHashMap<&'a Arc<Traceback>, Totals> {
    let mut groups: FxHashMap<&'a Arc<Traceback>, Totals> = FxHashMap::default();
    groups.reserve(distinct.len());
    for d in distinct {
        groups.entry(d.traceback).or_default().add(d.totals);
    }
    groups
}

/// A `lineno` or `filename` group: the first frame seen with the key (its
/// `extra` is reported) and the totals.
struct FrameGroup<'a> {
    frame: &'a Frame,
    totals: Totals,
}

/// Key of a frame group: `(filename, lineno)`, lineno 0 for `filename`.
type FrameKey<'a> = (&'a str, u32);

/// Stage 2 for `lineno` and `filename`: the most recent frame of each
/// distinct traceback, or every frame of it under `cumulative`.
fn group_frames<'a>(
    distinct: &[Distinct<'a>],
    group_by: GroupBy,
    cumulative: bool,
) -> FxHashMap<FrameKey<'a>, FrameGroup<'a>> {
    let mut groups: FxHashMap<FrameKey<'a>, FrameGroup<'a>> = FxHashMap::default();
    let keep_lineno = group_by == GroupBy::Lineno;
    for d in distinct {
        let traceback: &'a Traceback = d.traceback;
        let frames = traceback.frames();
        let selected = if cumulative {
            frames
        } else {
            frames.get(..1).unwrap_or(&[])
        };
        for frame in selected {
            let key = (&*frame.filename, if keep_lineno { frame.lineno } else { 0 });
            groups
                .entry(key)
                .or_insert(FrameGroup {
                    frame,
                    totals: Totals::default(),
                })
                .totals
                .add(d.totals);
        }
    }
    groups
}

/// The statistic's traceback for a `traceback` group: the same frames
/// without `total_nframe`, as tracemalloc's `Traceback(frames)`.
fn traceback_group_key(traceback: &Arc<Traceback>) -> Arc<Traceback> {
    if traceback.total_nframe().is_none() {
        Arc::clone(traceback)
    } else {
        Arc::new(traceback.without_total_nframe())
    }
}

/// The statistic's one-frame traceback for a `lineno` or `filename` group.
/// A `filename` group's frame has lineno 0 and no `extra` (its function and
/// address would describe one arbitrary line of the file).
fn frame_group_key(key: FrameKey<'_>, frame: &Frame, group_by: GroupBy) -> Arc<Traceback> {
    let extra = match group_by {
        GroupBy::Lineno => frame.extra.clone(),
        GroupBy::Filename | GroupBy::Traceback => None,
    };
    Arc::new(Traceback::from_frame(Frame {
        filename: Arc::clone(&frame.filename),
        lineno: key.1,
        extra,
    }))
}

/// tracemalloc's `_compare_grouped_stats`: every new group against the old
/// group of the same key (absent: diff = the whole group), then the old
/// groups left over (size and count 0, negative diffs).
fn diff_groups<K: Hash + Eq, G>(
    new: FxHashMap<K, G>,
    mut old: FxHashMap<K, G>,
    totals: impl Fn(&G) -> Totals,
    key_traceback: impl Fn(&K, &G) -> Arc<Traceback>,
) -> Vec<StatisticDiff> {
    let mut diffs = Vec::with_capacity(new.len() + old.len());
    for (key, group) in &new {
        let now = totals(group);
        let before = old.remove(key).map(|g| totals(&g)).unwrap_or_default();
        diffs.push(StatisticDiff {
            traceback: key_traceback(key, group),
            size: now.size,
            size_diff: difference(now.size, before.size),
            count: now.count,
            count_diff: difference(now.count, before.count),
        });
    }
    for (key, group) in &old {
        let before = totals(group);
        diffs.push(StatisticDiff {
            traceback: key_traceback(key, group),
            size: 0,
            size_diff: difference(0, before.size),
            count: 0,
            count_diff: difference(0, before.count),
        });
    }
    diffs
}

/// `now - before`, saturating at the `i64` range.
fn difference(now: u64, before: u64) -> i64 {
    let diff = i128::from(now) - i128::from(before);
    i64::try_from(diff).unwrap_or(if diff < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests;
