//! What the store keeps of a snapshot: [`StoredSnapshot`] (the traces and
//! the numbers beside them), [`SnapshotInfo`] (kind, label, image) and
//! [`SnapshotSummary`] (what the API shows), and the rules on labels.
use std::{sync::Arc, time::SystemTime};

use serde::Serialize;
use tracer_model::{Completeness, Snapshot};

use super::StoreError;
use crate::capture::ImageId;
use crate::snapshot::AllocatorFrames;
use crate::sys::unix_ms;

/// Longest label, in bytes.
pub const MAX_LABEL_LEN: usize = 64;

/// How a snapshot came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// `POST .../snapshots`: taken on request.
    Taken,
    /// Taken by tracerd every snapshot interval.
    Auto,
    /// Loaded from a file (`POST /snapshots` with a body).
    Loaded,
}

impl SnapshotKind {
    /// The word used in the API and the files.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Taken => "taken",
            SnapshotKind::Auto => "auto",
            SnapshotKind::Loaded => "loaded",
        }
    }

    /// The kind the API's word names.
    #[must_use]
    pub fn from_wire(kind: tracer_api::SnapshotKind) -> Self {
        match kind {
            tracer_api::SnapshotKind::Taken => SnapshotKind::Taken,
            tracer_api::SnapshotKind::Auto => SnapshotKind::Auto,
            tracer_api::SnapshotKind::Loaded => SnapshotKind::Loaded,
        }
    }
}

/// A snapshot kept in the store.
#[derive(Clone, Debug)]
pub struct StoredSnapshot {
    /// Its id, unique in the state directory, increasing from 1.
    pub id: u64,
    /// The process it was taken of; 0 when it is not of one process (taken
    /// system-wide, or loaded from a file).
    pub pid: u32,
    /// That process image's start time (clock ticks since boot), so a reused
    /// pid never picks up another process's snapshots.
    pub start_time: u64,
    /// The image's kernel generation.
    pub generation: u32,
    /// When it was taken (wall clock).
    pub taken_at: SystemTime,
    /// `get_traced_memory()` at that moment: (current, peak) in bytes.
    pub traced_memory: (u64, u64),
    /// Whether its processes lost events before it was taken.
    pub completeness: Completeness,
    /// The traces.
    pub snapshot: Arc<Snapshot>,
}

/// What the store knows of a snapshot beyond its traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// How it came to be.
    pub kind: SnapshotKind,
    /// Its label, unique in the store.
    pub label: Option<String>,
    /// The process image of this tracerd run it belongs to;
    /// None for system-wide and loaded snapshots, and for snapshots of an
    /// earlier run (read back from the state directory), whose pid and
    /// generation name images that no longer exist.
    pub image: Option<ImageId>,
    /// The process's name (`comm`) when it was taken, if known.
    pub comm: Option<String>,
    /// Where a loaded snapshot came from: `tracer` or `tracemalloc`.
    pub source_format: Option<&'static str>,
    /// Whether its tracebacks dropped the allocation machinery's leading
    /// frames; None when unknown (a tracemalloc file, or a file written
    /// before tracerd recorded it).
    pub allocator_frames: Option<AllocatorFrames>,
    /// The unprivileged user (uid) who stored it, who may see, label and
    /// delete it besides the operators; None: the operators' (taken or
    /// loaded by one, or automatic).
    pub owner: Option<u32>,
}

impl SnapshotInfo {
    /// A snapshot of kind `kind` with no label.
    #[must_use]
    pub fn new(kind: SnapshotKind, image: Option<ImageId>) -> Self {
        Self {
            kind,
            label: None,
            image,
            comm: None,
            source_format: None,
            allocator_frames: None,
            owner: None,
        }
    }

    pub(super) fn kept_on_disk(&self) -> bool {
        self.kind != SnapshotKind::Auto || self.label.is_some()
    }
}

/// What the API shows of a stored snapshot.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// Snapshot id.
    pub id: u64,
    /// Process id; null for system-wide and loaded snapshots.
    pub pid: Option<u32>,
    /// `taken`, `auto` or `loaded`.
    pub kind: SnapshotKind,
    /// Label, or null.
    pub label: Option<String>,
    /// Unix time in ms when it was taken (loaded: when it was loaded, or the
    /// time recorded in a tracer file).
    pub taken_at_ms: u64,
    /// Number of traces (live blocks).
    pub traces: usize,
    /// Sum of the traces' sizes in bytes.
    pub size: u64,
    /// Traced memory (current) in bytes at that moment.
    pub current: u64,
    /// Traced memory peak in bytes at that moment.
    pub peak: u64,
    /// The traceback limit (`nframe`) it was taken with.
    pub traceback_limit: u32,
    /// The process's name when it was taken, if known.
    pub comm: Option<String>,
    /// `drop` when its tracebacks start after the allocation machinery,
    /// `keep` when they start where the allocator was called; null when
    /// unknown (loaded from a tracemalloc file).
    pub allocator_frames: Option<AllocatorFrames>,
    /// The uid of the unprivileged user who stored it; null: the
    /// operators'.
    pub owner_uid: Option<u32>,
    /// `complete`, `drops` and `drops_by_pid` (see [`Completeness`]).
    #[serde(flatten)]
    pub completeness: Completeness,
    /// True if it was stored by this run of tracerd; false for snapshots
    /// read back from the state directory (their pid names no process of
    /// this run, so `/pid/{pid}` routes never use them).
    pub this_run: bool,
    /// True if it is kept in the state directory.
    pub persisted: bool,
    /// Bytes it counts against the store's quotas (`max_snapshot_bytes`):
    /// its file's size when `persisted`, else the bytes of its compact form
    /// in memory (an automatic snapshot's grouped traces and a pointer per
    /// distinct traceback; the tracebacks are shared with the process's
    /// other automatic snapshots and not counted).
    pub bytes: u64,
}

impl SnapshotSummary {
    /// As the API sends it.
    #[must_use]
    pub fn wire(&self) -> tracer_api::SnapshotSummary {
        tracer_api::SnapshotSummary {
            id: self.id,
            pid: self.pid,
            kind: wire_kind(self.kind),
            label: self.label.clone(),
            taken_at_ms: self.taken_at_ms,
            traces: self.traces,
            size: self.size,
            current: self.current,
            peak: self.peak,
            traceback_limit: self.traceback_limit,
            comm: self.comm.clone(),
            allocator_frames: self.allocator_frames.map(wire_frames),
            owner_uid: self.owner_uid,
            completeness: wire_completeness(&self.completeness),
            this_run: self.this_run,
            persisted: self.persisted,
            bytes: self.bytes,
        }
    }
}

/// The API's word for how a snapshot came to be.
#[must_use]
pub fn wire_kind(kind: SnapshotKind) -> tracer_api::SnapshotKind {
    match kind {
        SnapshotKind::Taken => tracer_api::SnapshotKind::Taken,
        SnapshotKind::Auto => tracer_api::SnapshotKind::Auto,
        SnapshotKind::Loaded => tracer_api::SnapshotKind::Loaded,
    }
}

/// The API's word for what a snapshot did with the allocation machinery.
#[must_use]
pub fn wire_frames(frames: AllocatorFrames) -> tracer_api::AllocatorFrames {
    match frames {
        AllocatorFrames::Drop => tracer_api::AllocatorFrames::Drop,
        AllocatorFrames::Keep => tracer_api::AllocatorFrames::Keep,
    }
}

/// What a header's or a query's `allocator_frames` says, as the store
/// keeps it.
#[must_use]
pub fn store_frames(frames: tracer_api::AllocatorFrames) -> AllocatorFrames {
    match frames {
        tracer_api::AllocatorFrames::Drop => AllocatorFrames::Drop,
        tracer_api::AllocatorFrames::Keep => AllocatorFrames::Keep,
    }
}

/// A snapshot's completeness as the API and the files carry it.
#[must_use]
pub fn wire_completeness(completeness: &Completeness) -> tracer_api::Completeness {
    tracer_api::Completeness {
        complete: completeness.is_complete(),
        drops: completeness.drops(),
        drops_by_pid: completeness.by_pid().clone(),
        cut_tracebacks: completeness.cut_tracebacks(),
        cut_tracebacks_by_pid: completeness.cut_by_pid().clone(),
    }
}

/// Everything the store keeps of a snapshot but its traces: what lists,
/// summaries and lookups by image need without decoding it.
#[derive(Clone, Debug)]
pub struct SnapshotHead {
    /// As [`StoredSnapshot::id`].
    pub id: u64,
    /// As [`StoredSnapshot::pid`].
    pub pid: u32,
    /// As [`StoredSnapshot::start_time`].
    pub start_time: u64,
    /// As [`StoredSnapshot::generation`].
    pub generation: u32,
    /// As [`StoredSnapshot::taken_at`].
    pub taken_at: SystemTime,
    /// As [`StoredSnapshot::traced_memory`].
    pub traced_memory: (u64, u64),
    /// As [`StoredSnapshot::completeness`].
    pub completeness: Completeness,
}

/// What a summary shows of a snapshot's traces, counted once when it is
/// stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shape {
    /// Number of traces.
    pub traces: usize,
    /// Sum of their sizes in bytes.
    pub size: u64,
    /// Its traceback limit.
    pub traceback_limit: u32,
}

impl Shape {
    pub(super) fn of(snapshot: &Snapshot) -> Self {
        Self {
            traces: snapshot.traces().len(),
            size: snapshot
                .traces()
                .iter()
                .fold(0u64, |acc, t| acc.saturating_add(t.size)),
            traceback_limit: snapshot.traceback_limit(),
        }
    }
}

impl StoredSnapshot {
    /// Its head and its traces.
    #[must_use]
    pub fn split(self) -> (SnapshotHead, Arc<Snapshot>) {
        (
            SnapshotHead {
                id: self.id,
                pid: self.pid,
                start_time: self.start_time,
                generation: self.generation,
                taken_at: self.taken_at,
                traced_memory: self.traced_memory,
                completeness: self.completeness,
            },
            self.snapshot,
        )
    }
}

impl SnapshotHead {
    /// The stored snapshot of this head and `snapshot`.
    #[must_use]
    pub fn with(self, snapshot: Arc<Snapshot>) -> StoredSnapshot {
        StoredSnapshot {
            id: self.id,
            pid: self.pid,
            start_time: self.start_time,
            generation: self.generation,
            taken_at: self.taken_at,
            traced_memory: self.traced_memory,
            completeness: self.completeness,
            snapshot,
        }
    }

    /// The API's view of it, with what the store knows of it.
    pub(super) fn summary_with(
        &self,
        info: &SnapshotInfo,
        shape: Shape,
        persisted: bool,
        this_run: bool,
        bytes: u64,
    ) -> SnapshotSummary {
        SnapshotSummary {
            id: self.id,
            pid: (self.pid != 0).then_some(self.pid),
            kind: info.kind,
            label: info.label.clone(),
            taken_at_ms: unix_ms(self.taken_at),
            traces: shape.traces,
            size: shape.size,
            current: self.traced_memory.0,
            peak: self.traced_memory.1,
            traceback_limit: shape.traceback_limit,
            comm: info.comm.clone(),
            allocator_frames: info.allocator_frames,
            owner_uid: info.owner,
            completeness: self.completeness.clone(),
            this_run,
            persisted,
            bytes,
        }
    }
}

/// Checks a label: 1 to 64 bytes of `A-Z a-z 0-9 . _ : -`, not only digits
/// (so that a `base=` parameter can hold an id or a label), not `now`.
///
/// # Errors
/// [`StoreError::InvalidLabel`] saying why.
pub fn check_label(label: &str) -> Result<(), StoreError> {
    let bad = |reason| {
        Err(StoreError::InvalidLabel {
            label: label.to_string(),
            reason,
        })
    };
    if label.is_empty() || label.len() > MAX_LABEL_LEN {
        return bad("a label has 1 to 64 characters");
    }
    if !label
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    {
        return bad("a label uses only A-Z, a-z, 0-9, '.', '_', ':' and '-'");
    }
    if label.bytes().all(|b| b.is_ascii_digit()) {
        return bad("a label must not be all digits (that would read as an id)");
    }
    if label == "now" {
        return bad("\"now\" means the current state, not a snapshot");
    }
    Ok(())
}
