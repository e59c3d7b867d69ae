//! tracemalloc's result types: `GroupBy` (the `key_type`), `Statistic`
//! and `StatisticDiff`, their `str()` texts and JSON, and the orders
//! `statistics()` and `compare_to()` sort them in.
//!
//! Below both the grouping (`engine`) and `Snapshot`: the engine builds
//! these values and `snapshot.rs` returns them; nothing here knows how
//! they were computed.
//!
//! Group keys are unique, so the sort orders below are total: the results
//! do not depend on the order of the traces or of any hash table.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::text::format::{format_size_f64, true_div};
use crate::trace::Traceback;

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
    /// [`FrameExtra::function`](crate::FrameExtra), `<unknown>` when not
    /// known). The group's frame is the first frame seen in that function,
    /// at line 0; the statistic's `label` is the function name.
    Function,
    /// By the object file (executable or shared library) of the most recent
    /// frame ([`FrameExtra::module`](crate::FrameExtra), `<unknown>` when
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

/// `Snapshot.statistics()`'s order (tracemalloc's
/// `sort(reverse=True, key=Statistic._sort_key)`): biggest first by
/// `size`, then `count`, then the group key descending. The engine sorts
/// tracemalloc's own groupings by integer keys packed in this same order.
pub(crate) fn statistic_order(a: &Statistic, b: &Statistic) -> Ordering {
    b.size
        .cmp(&a.size)
        .then(b.count.cmp(&a.count))
        .then_with(|| group_order(b, a))
}

/// `Snapshot.compare_to()`'s order (tracemalloc's
/// `sort(reverse=True, key=StatisticDiff._sort_key)`): biggest first by
/// `|size_diff|`, `size`, `|count_diff|`, `count`, then the group key
/// descending.
pub(crate) fn diff_order(a: &StatisticDiff, b: &StatisticDiff) -> Ordering {
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
fn group_order<T: GroupKey>(a: &T, b: &T) -> Ordering {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Frame;

    #[test]
    fn group_by_parses_and_names_valid_values_on_error() {
        for group_by in GroupBy::ALL {
            assert_eq!(group_by.to_string().parse::<GroupBy>(), Ok(group_by));
        }
        let err = "Lineno".parse::<GroupBy>().expect_err("case-sensitive");
        assert_eq!(
            err.to_string(),
            "unknown key_type: 'Lineno'; valid values are 'filename', 'lineno', 'traceback', 'function', 'module'"
        );
        assert_eq!(
            serde_json::to_value(GroupBy::Traceback).expect("serializes"),
            "traceback"
        );
    }

    #[test]
    fn statistic_texts_and_json_match_tracemalloc() {
        let traceback = Traceback::new(vec![Frame::new("a.c", 1)], None);
        let stat = Statistic {
            traceback: traceback.clone(),
            size: u64::MAX,
            count: 3,
            label: None,
        };
        assert_eq!(
            stat.to_string(),
            "a.c:1: size=16777216 TiB, count=3, average=5592405 TiB"
        );
        let diff = StatisticDiff {
            traceback,
            size: 0,
            size_diff: -300,
            count: 0,
            count_diff: -3,
            label: None,
        };
        assert_eq!(diff.to_string(), "a.c:1: size=0 B (-300 B), count=0 (-3)");
        assert_eq!(diff.average(), None);
        assert_eq!(
            serde_json::to_value(&diff).expect("serializes"),
            serde_json::json!({
                "traceback": [{"filename": "a.c", "lineno": 1}],
                "size": 0, "size_diff": -300, "count": 0, "count_diff": -3
            })
        );
        assert_eq!(
            serde_json::to_value(&stat).expect("serializes")["size"],
            u64::MAX
        );
    }
}
