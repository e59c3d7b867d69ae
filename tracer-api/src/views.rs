//! The views of a target (a process now, every process now, a stored
//! snapshot): statistics, compare and traces, and the model's values they
//! carry as a reader sees them.
use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::{AllocatorFrames, Completeness, ProcessView, SnapshotKind, SnapshotSummary};

/// One frame of a traceback (`{"filename", "lineno"}` as tracemalloc's,
/// plus what symbolization knew).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// Source file path from the debug info; for a frame with no line
    /// info, `FILE!FUNCTION+0xOFFSET` or `FILE+0xOFFSET`; `<unknown>`.
    pub filename: String,
    /// Line number in `filename`, 0 when unknown.
    pub lineno: u32,
    /// The part of `filename` before its site, for a frame with a site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The function containing the call site (demangled), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Path of the mapped object file, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// Return address in the traced process, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<u64>,
    /// The module's GNU build id (lowercase hex), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
}

/// tracemalloc's `Statistic`, with its `str()`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statistic {
    /// Blocks in the group.
    pub count: u64,
    /// The group's name for `function` and `module` groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Bytes in the group (requested sizes).
    pub size: u64,
    /// `str(statistic)`.
    pub text: String,
    /// The group key: one frame, or the whole traceback, most recent first.
    pub traceback: Vec<Frame>,
}

/// tracemalloc's `StatisticDiff`, with its `str()`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatisticDiff {
    /// Blocks in the group in the new side.
    pub count: u64,
    /// `count` less the base side's.
    pub count_diff: i64,
    /// The group's name for `function` and `module` groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Bytes in the group in the new side.
    pub size: u64,
    /// `size` less the base side's, in bytes.
    pub size_diff: i64,
    /// `str(diff)`.
    pub text: String,
    /// The group key, as in [`Statistic::traceback`].
    pub traceback: Vec<Frame>,
}

/// tracemalloc's `Trace`: one live block, with its `str()`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// The pid of the block's process.
    pub domain: u32,
    /// Requested size in bytes.
    pub size: u64,
    /// The allocator family that recorded it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `str(trace)`.
    pub text: String,
    /// The allocation's frames, most recent first.
    pub traceback: Vec<Frame>,
}

/// Where a process's statistics came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Totals {
    /// The kernel's totals per stack of a live image (costs its distinct
    /// stacks).
    PerStack,
    /// Its blocks, read one by one (an ended image, sampling on, a full
    /// `STACK_TOTALS`, or every process at once).
    PerBlock,
}

/// What a statistics answer is of (its keys merged into the answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StatisticsTarget {
    /// `GET /pid/{pid}/statistics`: one process now.
    Process {
        /// Whether the allocation machinery's frames were dropped.
        allocator_frames: AllocatorFrames,
        /// Process id.
        pid: u32,
        /// The process; null when the image ended and is no longer kept.
        process: Option<ProcessView>,
        /// Where the statistics came from.
        totals: Totals,
    },
    /// `GET /statistics`: every traced process now.
    System {
        /// Whether the allocation machinery's frames were dropped.
        allocator_frames: AllocatorFrames,
        /// `get_traced_memory()[0]` summed over the processes, in bytes.
        current: u64,
        /// Peaks summed, in bytes.
        peak: u64,
        /// The processes in the answer.
        pids: Vec<u32>,
        /// Where the statistics came from.
        totals: Totals,
    },
    /// `GET /snapshots/{id}/statistics`.
    Stored {
        /// The snapshot's summary.
        snapshot: SnapshotSummary,
    },
}

/// What a traces answer is of (its keys merged into the answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TracesTarget {
    /// `GET /pid/{pid}/traces`.
    Process {
        /// Whether the allocation machinery's frames were dropped.
        allocator_frames: AllocatorFrames,
        /// Process id.
        pid: u32,
    },
    /// `GET /traces`.
    System {
        /// Whether the allocation machinery's frames were dropped.
        allocator_frames: AllocatorFrames,
        /// The processes in the answer.
        pids: Vec<u32>,
    },
    /// `GET /snapshots/{id}/traces`.
    Stored {
        /// The snapshot's summary.
        snapshot: SnapshotSummary,
    },
}

/// A statistics answer (`format=json`, through a Value: keys sorted):
/// `snapshot.filter_traces(filters).statistics(group_by, cumulative)`.
/// `S` is a statistic: the model's with its text, or [`Statistic`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatisticsAnswer<S = Statistic> {
    /// What it is of.
    #[serde(flatten)]
    pub target: StatisticsTarget,
    /// Its completeness.
    #[serde(flatten)]
    pub completeness: Completeness,
    /// `cumulative` as asked.
    pub cumulative: bool,
    /// The filters as asked, by parameter name.
    pub filters: BTreeMap<String, Vec<String>>,
    /// `group_by` as asked (or its default).
    pub group_by: String,
    /// `limit` as asked; 0: every group.
    pub limit: usize,
    /// The groups, largest first, at most `limit`.
    pub statistics: Vec<S>,
    /// Groups before the limit.
    pub total: usize,
    /// The traceback limit of the snapshot, in frames.
    pub traceback_limit: u32,
    /// Traces (blocks) left after the filters.
    pub traces: u64,
}

/// What a compare side is: its `kind` (the tag) and what that kind says
/// of it. Times are Unix ms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SideKind {
    /// A stored snapshot.
    Snapshot {
        /// Its id.
        id: u64,
        /// How it came to be.
        snapshot_kind: SnapshotKind,
        /// Its label (`Some(None)`: the key with null), on a side chosen
        /// by id or as the default base; absent on one chosen by `since=`.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        label: Option<Option<String>>,
        /// Unix ms when it was taken.
        taken_at_ms: u64,
        /// What it did with the allocation machinery's frames (`Some(None)`:
        /// the key with null, unknown), as `label`.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        allocator_frames: Option<Option<AllocatorFrames>>,
        /// Unix ms of the moment `since=` asked for, when chosen by it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since_ms: Option<u64>,
    },
    /// The empty state when tracing (of the image) began.
    TracingStart {
        /// Unix ms when tracing began.
        at_ms: u64,
        /// Unix ms of the moment `since=` asked for, when chosen by it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since_ms: Option<u64>,
    },
    /// A snapshot taken now.
    Now {
        /// Unix ms when it was taken.
        at_ms: u64,
        /// What it did with the allocation machinery's frames.
        allocator_frames: AllocatorFrames,
    },
    /// Every process's state at `since_ms`, one side each.
    Since {
        /// Unix ms of the moment `since=` asked for.
        since_ms: u64,
        /// The side of each process (a stored snapshot, or its tracing
        /// start).
        processes: Vec<SincePart>,
    },
}

impl SideKind {
    /// The stored snapshot's id, for a [`SideKind::Snapshot`].
    #[must_use]
    pub fn snapshot_id(&self) -> Option<u64> {
        match self {
            SideKind::Snapshot { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// The stored snapshot's label, for a [`SideKind::Snapshot`] that has
    /// one.
    #[must_use]
    pub fn label(&self) -> Option<&str> {
        match self {
            SideKind::Snapshot {
                label: Some(Some(label)),
                ..
            } => Some(label),
            _ => None,
        }
    }
}

/// One process's part of a [`SideKind::Since`] side: `{"pid": ...}` and
/// its side's keys (no completeness of its own).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SincePart {
    /// Process id.
    pub pid: u32,
    /// Its side ([`SideKind::Snapshot`] or [`SideKind::TracingStart`]).
    #[serde(flatten)]
    pub kind: SideKind,
}

/// One side of a compare (`base` or `new`): what it is, and its
/// completeness, in one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompareSide {
    /// What the side is (`kind` and its keys).
    #[serde(flatten)]
    pub kind: SideKind,
    /// Its completeness.
    #[serde(flatten)]
    pub completeness: Completeness,
}

/// A field that may be absent (None), null (`Some(None)`) or a value.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A compare answer (`format=json`, through a Value: keys sorted):
/// `new.compare_to(base, group_by, cumulative)` of the filtered sides.
/// `D` is a diff: the model's with its text, or [`StatisticDiff`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompareAnswer<D = StatisticDiff> {
    /// The older side.
    pub base: CompareSide,
    /// True when both sides are complete.
    pub complete: bool,
    /// `cumulative` as asked.
    pub cumulative: bool,
    /// The filters as asked, by parameter name.
    pub filters: BTreeMap<String, Vec<String>>,
    /// `group_by` as asked (or its default).
    pub group_by: String,
    /// `limit` as asked; 0: every group.
    pub limit: usize,
    /// The newer side.
    pub new: CompareSide,
    /// The process (`/pid/{pid}/compare` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The groups, largest change first, at most `limit`.
    pub statistics: Vec<D>,
    /// Groups before the limit.
    pub total: usize,
}

/// A traces answer (`format=json`, written trace by trace, keys sorted):
/// the filtered traces, paged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracesAnswer<T = Trace> {
    /// What it is of.
    #[serde(flatten)]
    pub target: TracesTarget,
    /// Its completeness.
    #[serde(flatten)]
    pub completeness: Completeness,
    /// The filters as asked, by parameter name.
    pub filters: BTreeMap<String, Vec<String>>,
    /// `limit` as asked; 0: every trace from `offset`.
    pub limit: usize,
    /// The first trace's index.
    pub offset: usize,
    /// Traces after the filters, before paging.
    pub total: usize,
    /// The traceback limit of the snapshot, in frames.
    pub traceback_limit: u32,
    /// The page's traces.
    pub traces: Vec<T>,
}
