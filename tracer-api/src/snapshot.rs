//! Stored snapshots: their summary (`/snapshots`, `/snapshots/{id}`, the
//! `snapshot` of a stored view), the completeness every view and file
//! carries, and the header (`meta`) of a snapshot file.
use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// What a snapshot does with the allocation machinery's leading frames
/// (`allocator_frames`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllocatorFrames {
    /// Dropped: frame 0 is the user's (the default).
    #[default]
    Drop,
    /// Kept: frame 0 is where the allocator was called, as captured.
    Keep,
}

/// How a snapshot came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// `POST .../snapshots`: taken on request.
    Taken,
    /// Taken by tracerd every snapshot interval.
    Auto,
    /// Loaded from a file (`POST /snapshots` with a body).
    Loaded,
}

/// Whether a snapshot's data is every live block with its whole traceback:
/// events lost because a kernel map was full (`drops`, counted by the
/// kernel per process) and blocks recorded with a cut traceback. Flattened
/// into every statistics, compare and traces answer, compare side,
/// snapshot summary and file header. Keys in the model's order (sent so
/// inside a [`SnapshotSummary`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completeness {
    /// True when no event was lost and no traceback cut.
    #[serde(default = "yes")]
    pub complete: bool,
    /// Events (allocations) lost, summed over the processes.
    #[serde(default)]
    pub drops: u64,
    /// Drops of each process that had any, by pid.
    #[serde(default, deserialize_with = "by_pid")]
    pub drops_by_pid: BTreeMap<u32, u64>,
    /// Blocks with a cut traceback, summed over the processes.
    #[serde(default)]
    pub cut_tracebacks: u64,
    /// Cut tracebacks of each process that had any, by pid.
    #[serde(default, deserialize_with = "by_pid")]
    pub cut_tracebacks_by_pid: BTreeMap<u32, u64>,
}

fn yes() -> bool {
    true
}

/// A map by pid: JSON's keys are strings (read as such even where serde
/// buffers a flattened struct, which does not parse them as numbers).
fn by_pid<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u32, u64>, D::Error> {
    BTreeMap::<String, u64>::deserialize(d)?
        .into_iter()
        .map(|(pid, n)| {
            pid.parse()
                .map(|pid| (pid, n))
                .map_err(|_| serde::de::Error::custom(format!("{pid:?} is not a pid")))
        })
        .collect()
}

/// What the API shows of a stored snapshot (sent as this struct by the
/// routes that answer one; through a Value, keys sorted, inside lists and
/// views).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSummary {
    /// Snapshot id.
    pub id: u64,
    /// Process id; null for system-wide and loaded snapshots.
    pub pid: Option<u32>,
    /// `taken`, `auto` or `loaded`.
    pub kind: SnapshotKind,
    /// Label, or null.
    pub label: Option<String>,
    /// Unix ms when it was taken (loaded: when it was loaded, or the time
    /// recorded in a tracer file).
    pub taken_at_ms: u64,
    /// Number of traces (live blocks).
    pub traces: usize,
    /// Sum of the traces' sizes in bytes.
    pub size: u64,
    /// Traced memory (current) in bytes at that moment.
    pub current: u64,
    /// Traced memory peak in bytes at that moment.
    pub peak: u64,
    /// The traceback limit (`nframe`) it was taken with, in frames.
    pub traceback_limit: u32,
    /// The process's name when it was taken, if known.
    pub comm: Option<String>,
    /// `drop` or `keep`; null when unknown (loaded from a tracemalloc file).
    pub allocator_frames: Option<AllocatorFrames>,
    /// The uid of the unprivileged user who stored it; null: the operators'.
    pub owner_uid: Option<u32>,
    /// Its completeness.
    #[serde(flatten)]
    pub completeness: Completeness,
    /// True if it was stored by this run of tracerd.
    pub this_run: bool,
    /// True if it is kept in the state directory.
    pub persisted: bool,
    /// Bytes it counts against the store's quotas (`max_snapshot_bytes`).
    pub bytes: u64,
}

/// `GET /snapshots` and `GET /pid/{pid}/snapshots` (through a Value: keys
/// sorted, the summaries' too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotList {
    /// The process asked about (`/pid/{pid}/snapshots` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The snapshots the viewer may see, by id.
    pub snapshots: Vec<SnapshotSummary>,
    /// `/snapshots` only: the state directory's files refused at start,
    /// each with why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<Vec<Value>>,
}

/// The `meta` object in a snapshot file's header (tracer's dump format):
/// what the store keeps of a snapshot beyond its traces. Written through
/// a Value (keys sorted). Read leniently, as files of earlier versions
/// and of other writers are: a field that is absent or does not parse
/// reads as None.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// `drop` or `keep`; null when unknown.
    #[serde(default, deserialize_with = "lenient")]
    pub allocator_frames: Option<AllocatorFrames>,
    /// The process's name when it was taken.
    #[serde(default, deserialize_with = "lenient")]
    pub comm: Option<String>,
    /// Snapshot id; a file of the store's state directory must have one
    /// (its name is `<id>.tsnap`).
    #[serde(default, deserialize_with = "lenient")]
    pub id: Option<u64>,
    /// `taken`, `auto` or `loaded`.
    #[serde(default, deserialize_with = "lenient")]
    pub kind: Option<SnapshotKind>,
    /// Its label, or null.
    #[serde(default, deserialize_with = "lenient")]
    pub label: Option<String>,
    /// Process id; null for system-wide and loaded snapshots.
    #[serde(default, deserialize_with = "lenient")]
    pub pid: Option<u32>,
    /// Unix ms when it was taken.
    #[serde(default, deserialize_with = "lenient")]
    pub taken_at_ms: Option<u64>,
    /// `get_traced_memory()` then, in bytes: current and peak (an element
    /// that does not parse reads as 0).
    #[serde(default, deserialize_with = "lenient_pair")]
    pub traced_memory: Option<[u64; 2]>,
    /// What only the store's own files have (absent from a dump).
    #[serde(flatten)]
    pub store: Option<StoreHeader>,
    /// Its completeness (read by the model's `Completeness::from_meta`,
    /// which checks the totals against the sums).
    #[serde(flatten, default, deserialize_with = "lenient_flat")]
    pub completeness: Completeness,
}

/// The fields of a snapshot file's header that only the store writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreHeader {
    /// The image's generation (the kernel's) when it was taken.
    #[serde(rename = "gen", default, deserialize_with = "lenient")]
    pub generation: Option<u32>,
    /// The uid of the unprivileged user who stored it; null: the operators'.
    #[serde(default, deserialize_with = "lenient")]
    pub owner_uid: Option<u32>,
    /// `tracer` or `tracemalloc`: the format of the file it was loaded
    /// from; null when taken.
    #[serde(default, deserialize_with = "lenient")]
    pub source_format: Option<String>,
    /// The process's start time (`/proc/PID/stat` field 22, clock ticks
    /// since boot) when it was taken.
    #[serde(default, deserialize_with = "lenient")]
    pub start_time: Option<u64>,
}

impl SnapshotHeader {
    /// The header in a file's `meta`; never fails (see [`SnapshotHeader`]).
    #[must_use]
    pub fn from_meta(meta: &Value) -> Self {
        Self::deserialize(meta).unwrap_or_default()
    }

    /// The header as the file's `meta` object.
    #[must_use]
    pub fn to_meta(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| Value::Object(serde_json::Map::new()))
    }
}

/// `T`, or None when the value is not one.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).ok())
}

/// An array's first two elements as whole numbers (0 for one that is
/// not); None when it is not an array.
fn lenient_pair<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u64; 2]>, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(value.as_array().map(|items| {
        let at = |i: usize| items.get(i).and_then(Value::as_u64).unwrap_or(0);
        [at(0), at(1)]
    }))
}

/// A flattened `T`, its default when it does not parse.
fn lenient_flat<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).unwrap_or_default())
}

/// `DELETE /snapshots/{id}` (through a Value: keys sorted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDeleted {
    /// The summary of the snapshot removed.
    pub deleted: SnapshotSummary,
}
