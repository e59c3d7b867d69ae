//! Stored snapshots: `take_snapshot()` kept under an id, with an optional
//! label, per process image or system-wide, and snapshots loaded from files.
//!
//! With a state directory ([`SnapshotStore::open`]), every snapshot a user
//! stores (taken, loaded, or labelled) is a file
//! `<state_dir>/snapshots/<id>.tsnap` in tracer's dump format
//! ([`tracer_model::encode`]), written atomically: to a temporary file, fsync,
//! rename over the final name, fsync of the directory. So after any crash
//! (SIGKILL, power loss) each file is either the whole old version or the
//! whole new one. At start every file is read back; a file that does not
//! decode is reported (see [`SnapshotStore::unreadable`]) and left where it
//! is, and the others load normally.
//!
//! Automatic snapshots (kind `auto`, taken every interval of every traced
//! process) stay in memory for their retention: after a restart the kernel's
//! live blocks start over, so they would compare against nothing. Labelling
//! one keeps it (it becomes a file like the others).
//!
//! Ids are unique for the life of the state directory, restarts included:
//! they are handed out from blocks reserved in `<state_dir>/snapshots/next-id`
//! before use, so even a SIGKILL never lets an id be given twice.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use serde::Serialize;
use serde_json::{Value, json};

use crate::sys::fsync::{WriteError, sync_dir, write_atomically};
use tracer_model::{Completeness, Snapshot, decode, encode};

/// File name suffix of a stored snapshot.
pub const SNAPSHOT_SUFFIX: &str = "tsnap";
/// How many ids are reserved on disk at a time.
const ID_BLOCK: u64 = 1024;
/// Longest label, in bytes.
pub const MAX_LABEL_LEN: usize = 64;

/// Errors of the store: file I/O and the rules on labels.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file or directory operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("writing", "renaming", ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// No stored snapshot has this id.
    #[error("no snapshot with id {id}")]
    NotFound {
        /// The id asked for.
        id: u64,
    },
    /// No stored snapshot has this label.
    #[error("no snapshot labelled {label:?}")]
    LabelNotFound {
        /// The label asked for.
        label: String,
    },
    /// The label is already used by another snapshot.
    #[error("label {label:?} is already used by snapshot {id}")]
    LabelTaken {
        /// The label.
        label: String,
        /// The snapshot that has it.
        id: u64,
    },
    /// The label is not a valid one.
    #[error("invalid label {label:?}: {reason}")]
    InvalidLabel {
        /// The label given.
        label: String,
        /// Why.
        reason: &'static str,
    },
}

impl From<WriteError> for StoreError {
    fn from(err: WriteError) -> Self {
        StoreError::Io {
            action: err.action,
            path: err.path,
            source: err.source,
        }
    }
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

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

    fn parse(text: &str) -> Option<Self> {
        match text {
            "taken" => Some(SnapshotKind::Taken),
            "auto" => Some(SnapshotKind::Auto),
            "loaded" => Some(SnapshotKind::Loaded),
            _ => None,
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
    pub gen_: u32,
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
    /// The process image of this tracerd run it belongs to, `(pid, gen)`;
    /// None for system-wide and loaded snapshots, and for snapshots of an
    /// earlier run (read back from the state directory), whose pid and
    /// generation name images that no longer exist.
    pub image: Option<(u32, u32)>,
    /// The process's name (`comm`) when it was taken, if known.
    pub comm: Option<String>,
    /// Where a loaded snapshot came from: `tracer` or `tracemalloc`.
    pub source_format: Option<&'static str>,
}

impl SnapshotInfo {
    /// A snapshot of kind `kind` with no label.
    #[must_use]
    pub fn new(kind: SnapshotKind, image: Option<(u32, u32)>) -> Self {
        Self {
            kind,
            label: None,
            image,
            comm: None,
            source_format: None,
        }
    }

    fn kept_on_disk(&self) -> bool {
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
    /// `complete`, `drops` and `drops_by_pid` (see [`Completeness`]).
    #[serde(flatten)]
    pub completeness: Completeness,
    /// True if it was stored by this run of tracerd; false for snapshots
    /// read back from the state directory (their pid names no process of
    /// this run, so `/pid/{pid}` routes never use them).
    pub this_run: bool,
    /// True if it is kept in the state directory.
    pub persisted: bool,
}

impl StoredSnapshot {
    /// The API's view of it, without what only the store knows (kind
    /// `taken`, no label).
    pub fn summary(&self) -> SnapshotSummary {
        let info = SnapshotInfo::new(SnapshotKind::Taken, Some((self.pid, self.gen_)));
        self.summary_with(&info, false, true)
    }

    fn summary_with(
        &self,
        info: &SnapshotInfo,
        persisted: bool,
        this_run: bool,
    ) -> SnapshotSummary {
        SnapshotSummary {
            id: self.id,
            pid: (self.pid != 0).then_some(self.pid),
            kind: info.kind,
            label: info.label.clone(),
            taken_at_ms: unix_ms(self.taken_at),
            traces: self.snapshot.traces().len(),
            size: self
                .snapshot
                .traces()
                .iter()
                .fold(0u64, |acc, t| acc.saturating_add(t.size)),
            current: self.traced_memory.0,
            peak: self.traced_memory.1,
            traceback_limit: self.snapshot.traceback_limit(),
            comm: info.comm.clone(),
            completeness: self.completeness.clone(),
            this_run,
            persisted,
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
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

/// A file of the state directory that could not be read back.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Unreadable {
    /// The file.
    pub path: PathBuf,
    /// Why it was refused.
    pub error: String,
}

/// One entry of the store.
#[derive(Clone, Debug)]
struct Entry {
    stored: StoredSnapshot,
    info: SnapshotInfo,
    persisted: bool,
    this_run: bool,
}

impl Entry {
    fn summary(&self) -> SnapshotSummary {
        self.stored
            .summary_with(&self.info, self.persisted, self.this_run)
    }
}

/// The store: snapshots by id, and their files when it has a directory.
#[derive(Debug, Default)]
pub struct SnapshotStore {
    next_id: u64,
    /// Ids below this are reserved on disk (0: none yet).
    reserved: u64,
    entries: BTreeMap<u64, Entry>,
    dir: Option<PathBuf>,
    unreadable: Vec<Unreadable>,
}

impl SnapshotStore {
    /// Opens (creating it if needed) `<state_dir>/snapshots` and reads back
    /// every stored snapshot. Leftover temporary files of an interrupted
    /// write are removed; files that do not decode are listed in
    /// [`SnapshotStore::unreadable`] and left in place.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the directory cannot be created or listed, or
    /// the id file cannot be written.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        let dir = state_dir.join("snapshots");
        fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        let mut store = Self {
            dir: Some(dir.clone()),
            ..Self::default()
        };
        let mut max_id = 0;
        let listing = fs::read_dir(&dir).map_err(io("listing", &dir))?;
        let mut paths: Vec<PathBuf> = listing.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if name.starts_with('.') && name.ends_with(".tmp") {
                // An interrupted write: the final file (if any) is intact.
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(stem) = name.strip_suffix(&format!(".{SNAPSHOT_SUFFIX}")) else {
                continue;
            };
            match read_snapshot_file(&path, stem) {
                Ok(entry) => {
                    max_id = max_id.max(entry.stored.id);
                    if let Some(label) = &entry.info.label
                        && let Some(other) = store.id_of_label(label)
                    {
                        store.unreadable.push(Unreadable {
                            path: path.clone(),
                            error: format!("label {label:?} is also used by snapshot {other}"),
                        });
                        continue;
                    }
                    store.entries.insert(entry.stored.id, entry);
                }
                Err(error) => {
                    tracing::warn!(target = %path.display(), err = %error, "stored snapshot refused");
                    store.unreadable.push(Unreadable { path, error });
                }
            }
        }
        let reserved = read_next_id(&dir.join("next-id"));
        store.next_id = reserved.max(max_id);
        store.reserved = store.next_id;
        Ok(store)
    }

    /// Files of the state directory that were refused at open, with why.
    pub fn unreadable(&self) -> &[Unreadable] {
        &self.unreadable
    }

    /// The directory snapshot files live in, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The next id, reserving a new block on disk first when needed.
    fn allocate_id(&mut self) -> Result<u64, StoreError> {
        let id = self.next_id + 1;
        if let Some(dir) = &self.dir
            && id > self.reserved
        {
            let reserved = self.next_id + ID_BLOCK;
            write_atomically(&dir.join("next-id"), format!("{reserved}\n").as_bytes())?;
            self.reserved = reserved;
        }
        self.next_id = id;
        Ok(id)
    }

    /// Stores a snapshot under the next id (kind `taken`, of its image, no
    /// label), as [`SnapshotStore::add`] does; a failure to write its file is
    /// logged and the snapshot is kept in memory. Returns the id.
    pub fn insert(&mut self, stored: StoredSnapshot) -> u64 {
        let info = SnapshotInfo::new(SnapshotKind::Taken, Some((stored.pid, stored.gen_)));
        match self.add(stored.clone(), info.clone()) {
            Ok(id) => id,
            Err(err) => {
                tracing::warn!(err = %err, "snapshot kept in memory only");
                let id = self.next_id + 1;
                self.next_id = id;
                let stored = StoredSnapshot { id, ..stored };
                self.entries.insert(
                    id,
                    Entry {
                        stored,
                        info,
                        persisted: false,
                        this_run: true,
                    },
                );
                id
            }
        }
    }

    /// Stores a snapshot under the next id with `info`; it is written to the
    /// state directory unless it is an unlabelled automatic one.
    ///
    /// # Errors
    /// [`StoreError::LabelTaken`] / [`StoreError::InvalidLabel`] for its
    /// label, [`StoreError::Io`] if its file cannot be written (nothing is
    /// stored then).
    pub fn add(
        &mut self,
        mut stored: StoredSnapshot,
        info: SnapshotInfo,
    ) -> Result<u64, StoreError> {
        if let Some(label) = &info.label {
            check_label(label)?;
            if let Some(id) = self.id_of_label(label) {
                return Err(StoreError::LabelTaken {
                    label: label.clone(),
                    id,
                });
            }
        }
        let id = self.allocate_id()?;
        stored.id = id;
        let mut entry = Entry {
            stored,
            info,
            persisted: false,
            this_run: true,
        };
        if entry.info.kept_on_disk() {
            self.persist(&mut entry)?;
        }
        self.entries.insert(id, entry);
        Ok(id)
    }

    fn persist(&self, entry: &mut Entry) -> Result<(), StoreError> {
        if let Some(dir) = &self.dir {
            let bytes = encode(&entry.stored.snapshot, &meta_of(entry));
            write_atomically(&file_of(dir, entry.stored.id), &bytes)?;
            entry.persisted = true;
        }
        Ok(())
    }

    /// Sets (or with None removes) the label of snapshot `id`. Labelling an
    /// automatic snapshot keeps it: it is written to the state directory and
    /// no longer expires.
    ///
    /// # Errors
    /// [`StoreError::NotFound`], [`StoreError::InvalidLabel`],
    /// [`StoreError::LabelTaken`], [`StoreError::Io`] (the label is then
    /// unchanged).
    pub fn set_label(
        &mut self,
        id: u64,
        label: Option<String>,
    ) -> Result<SnapshotSummary, StoreError> {
        if let Some(label) = &label {
            check_label(label)?;
            if let Some(other) = self.id_of_label(label)
                && other != id
            {
                return Err(StoreError::LabelTaken {
                    label: label.clone(),
                    id: other,
                });
            }
        }
        let mut entry = self
            .entries
            .get(&id)
            .cloned()
            .ok_or(StoreError::NotFound { id })?;
        entry.info.label = label;
        if entry.info.kept_on_disk() {
            self.persist(&mut entry)?;
        }
        let summary = entry.summary();
        self.entries.insert(id, entry);
        Ok(summary)
    }

    /// Removes snapshot `id` and its file.
    ///
    /// # Errors
    /// [`StoreError::NotFound`], [`StoreError::Io`] if the file cannot be
    /// removed (the snapshot then stays).
    pub fn remove(&mut self, id: u64) -> Result<SnapshotSummary, StoreError> {
        let entry = self.entries.get(&id).ok_or(StoreError::NotFound { id })?;
        if entry.persisted
            && let Some(dir) = &self.dir
        {
            let path = file_of(dir, id);
            match fs::remove_file(&path) {
                Ok(()) => sync_dir(dir)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("removing", &path)(e)),
            }
        }
        let mut entry = self
            .entries
            .remove(&id)
            .ok_or(StoreError::NotFound { id })?;
        entry.persisted = false;
        Ok(entry.summary())
    }

    /// Drops automatic snapshots (unlabelled) taken more than `retention`
    /// before `now`; returns how many.
    pub fn expire_auto(&mut self, now: SystemTime, retention: Duration) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, e| {
            e.info.kind != SnapshotKind::Auto
                || e.info.label.is_some()
                || now.duration_since(e.stored.taken_at).unwrap_or_default() <= retention
        });
        before - self.entries.len()
    }

    /// Number of stored snapshots.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no snapshot is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The snapshot `id`.
    pub fn get(&self, id: u64) -> Option<&StoredSnapshot> {
        self.entries.get(&id).map(|e| &e.stored)
    }

    /// What the store knows of snapshot `id`.
    pub fn info(&self, id: u64) -> Option<&SnapshotInfo> {
        self.entries.get(&id).map(|e| &e.info)
    }

    /// The summary of snapshot `id`.
    pub fn summary(&self, id: u64) -> Option<SnapshotSummary> {
        self.entries.get(&id).map(Entry::summary)
    }

    /// The id of the snapshot labelled `label`.
    pub fn id_of_label(&self, label: &str) -> Option<u64> {
        self.entries
            .values()
            .find(|e| e.info.label.as_deref() == Some(label))
            .map(|e| e.stored.id)
    }

    /// Every snapshot, oldest first, with its info.
    pub fn iter(&self) -> impl Iterator<Item = (&StoredSnapshot, &SnapshotInfo)> {
        self.entries.values().map(|e| (&e.stored, &e.info))
    }

    /// Summaries of every snapshot, oldest first.
    pub fn summaries(&self) -> Vec<SnapshotSummary> {
        self.entries.values().map(Entry::summary).collect()
    }

    /// Snapshots a user stored of the image (pid, generation) in this run,
    /// oldest first (automatic ones excluded: they are used through
    /// `since=` or by id). The generation, not the start time, tells images
    /// apart: exec keeps the start time.
    pub fn of_image(&self, pid: u32, gen_: u32) -> impl Iterator<Item = &StoredSnapshot> {
        self.of_image_all(pid, gen_)
            .filter(|(_, info)| info.kind != SnapshotKind::Auto)
            .map(|(s, _)| s)
    }

    /// Every snapshot of the image (pid, generation) in this run, automatic
    /// ones included, oldest first.
    pub fn of_image_all(
        &self,
        pid: u32,
        gen_: u32,
    ) -> impl Iterator<Item = (&StoredSnapshot, &SnapshotInfo)> {
        self.iter()
            .filter(move |(_, info)| info.image == Some((pid, gen_)))
    }
}

fn file_of(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id}.{SNAPSHOT_SUFFIX}"))
}

/// The metadata kept in a snapshot file's header.
fn meta_of(entry: &Entry) -> Value {
    let s = &entry.stored;
    let mut meta = json!({
        "id": s.id,
        "pid": s.pid,
        "start_time": s.start_time,
        "gen": s.gen_,
        "taken_at_ms": unix_ms(s.taken_at),
        "traced_memory": [s.traced_memory.0, s.traced_memory.1],
        "kind": entry.info.kind.as_str(),
        "label": entry.info.label,
        "comm": entry.info.comm,
        "source_format": entry.info.source_format,
    });
    if let Some(map) = meta.as_object_mut() {
        s.completeness.insert_into(map);
    }
    meta
}

fn read_snapshot_file(path: &Path, stem: &str) -> Result<Entry, String> {
    let bytes = fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let decoded = decode(&bytes).map_err(|e| e.to_string())?;
    let meta = &decoded.meta;
    let field = |name: &str| meta.get(name).and_then(Value::as_u64);
    let id = field("id").ok_or("its header has no snapshot id")?;
    if stem != id.to_string() {
        return Err(format!(
            "its header says snapshot {id}, its name says {stem}"
        ));
    }
    let kind = meta
        .get("kind")
        .and_then(Value::as_str)
        .and_then(SnapshotKind::parse)
        .unwrap_or(SnapshotKind::Taken);
    let label = meta
        .get("label")
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(label) = &label {
        check_label(label).map_err(|e| e.to_string())?;
    }
    let traced = meta.get("traced_memory").and_then(Value::as_array);
    let traced_at = |i: usize| {
        traced
            .and_then(|t| t.get(i))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let source_format = match meta.get("source_format").and_then(Value::as_str) {
        Some("tracemalloc") => Some("tracemalloc"),
        Some("tracer") => Some("tracer"),
        _ => None,
    };
    let stored = StoredSnapshot {
        id,
        pid: field("pid")
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
        start_time: field("start_time").unwrap_or(0),
        gen_: field("gen")
            .and_then(|g| u32::try_from(g).ok())
            .unwrap_or(0),
        taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(field("taken_at_ms").unwrap_or(0)),
        traced_memory: (traced_at(0), traced_at(1)),
        completeness: Completeness::from_meta(meta),
        snapshot: Arc::new(decoded.snapshot),
    };
    let info = SnapshotInfo {
        kind,
        label,
        // An earlier run's pid and generation name no live image.
        image: None,
        comm: meta.get("comm").and_then(Value::as_str).map(str::to_string),
        source_format,
    };
    Ok(Entry {
        stored,
        info,
        persisted: true,
        this_run: false,
    })
}

fn read_next_id(path: &Path) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (STYLE.md).
mod tests {
    use super::*;
    use tracer_model::{Frame, Trace, Traceback};

    fn stored(pid: u32, gen_: u32) -> StoredSnapshot {
        let tb = Arc::new(Traceback::new(vec![Frame::new("a.c", 3)], Some(1)));
        StoredSnapshot {
            id: 0,
            pid,
            start_time: 77,
            gen_,
            taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            traced_memory: (300, 400),
            completeness: Completeness::complete(),
            snapshot: Arc::new(Snapshot::new(
                vec![Trace {
                    domain: pid,
                    size: 300,
                    traceback: tb,
                }],
                16,
            )),
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tracer-store-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn ids_increase_and_a_reused_pid_sees_only_its_own() {
        let mut store = SnapshotStore::default();
        assert_eq!(store.insert(stored(5, 1)), 1);
        assert_eq!(store.insert(stored(5, 2)), 2);
        let ids: Vec<u64> = store.of_image(5, 2).map(|s| s.id).collect();
        assert_eq!(ids, vec![2]);
    }

    #[test]
    fn labels_are_checked_unique_and_findable() {
        let mut store = SnapshotStore::default();
        let mut info = SnapshotInfo::new(SnapshotKind::Taken, Some((5, 1)));
        info.label = Some("before".into());
        let id = store.add(stored(5, 1), info.clone()).unwrap();
        assert_eq!(store.id_of_label("before"), Some(id));
        let err = store.add(stored(5, 1), info).unwrap_err();
        assert_eq!(
            err.to_string(),
            "label \"before\" is already used by snapshot 1"
        );
        for bad in ["", "123", "now", "a b", &"x".repeat(65)] {
            assert!(
                matches!(check_label(bad), Err(StoreError::InvalidLabel { .. })),
                "{bad:?}"
            );
        }
        check_label("v1.2:pre-fix_x").unwrap();
        let other = store.insert(stored(5, 1));
        assert!(matches!(
            store.set_label(other, Some("before".into())),
            Err(StoreError::LabelTaken { id: 1, .. })
        ));
        store.set_label(id, None).unwrap();
        assert_eq!(
            store
                .set_label(other, Some("before".into()))
                .unwrap()
                .label
                .as_deref(),
            Some("before")
        );
    }

    #[test]
    fn files_survive_a_reopen_and_ids_are_never_reused() {
        let dir = temp_dir("reopen");
        let mut store = SnapshotStore::open(&dir).unwrap();
        let mut info = SnapshotInfo::new(SnapshotKind::Taken, Some((5, 1)));
        info.label = Some("before".into());
        info.comm = Some("app".into());
        let a = store.add(stored(5, 1), info).unwrap();
        let b = store
            .add(
                stored(6, 1),
                SnapshotInfo::new(SnapshotKind::Taken, Some((6, 1))),
            )
            .unwrap();
        let auto = store
            .add(
                stored(6, 1),
                SnapshotInfo::new(SnapshotKind::Auto, Some((6, 1))),
            )
            .unwrap();
        store.remove(b).unwrap();
        assert_eq!((a, b, auto), (1, 2, 3));
        drop(store);

        let store = SnapshotStore::open(&dir).unwrap();
        assert!(store.unreadable().is_empty());
        let summaries = store.summaries();
        assert_eq!(
            summaries.len(),
            1,
            "the removed and the automatic one are gone"
        );
        let s = &summaries[0];
        assert_eq!(
            (s.id, s.pid, s.label.as_deref(), s.comm.as_deref()),
            (1, Some(5), Some("before"), Some("app"))
        );
        assert_eq!(
            (s.taken_at_ms, s.current, s.peak, s.traces, s.size),
            (1_700_000_000_123, 300, 400, 1, 300)
        );
        assert!(!s.this_run && s.persisted);
        assert_eq!(store.get(1).unwrap().snapshot, stored(5, 1).snapshot);
        assert_eq!(
            store.of_image(5, 1).count(),
            0,
            "an earlier run's image is not this run's"
        );
        let mut store = store;
        let next = store
            .add(stored(7, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
            .unwrap();
        assert!(next > auto, "id {next} reused");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn drops_survive_a_reopen_and_files_without_them_read_as_complete() {
        let dir = temp_dir("drops");
        let mut store = SnapshotStore::open(&dir).unwrap();
        let mut lossy = stored(5, 1);
        lossy.completeness = Completeness::of_process(5, 476);
        lossy.completeness.add(6, 24);
        let id = store
            .add(lossy, SnapshotInfo::new(SnapshotKind::Taken, None))
            .unwrap();
        let complete = store
            .add(stored(7, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
            .unwrap();
        drop(store);
        // A file written before drops were recorded: its meta has no such key.
        let old = json!({"id": 9, "pid": 8, "kind": "taken", "traced_memory": [300, 400]});
        fs::write(
            dir.join("snapshots/9.tsnap"),
            encode(&stored(8, 1).snapshot, &old),
        )
        .unwrap();

        let store = SnapshotStore::open(&dir).unwrap();
        assert!(store.unreadable().is_empty(), "{:?}", store.unreadable());
        let summary = serde_json::to_value(store.summary(id).unwrap()).unwrap();
        assert_eq!(summary["complete"], false);
        assert_eq!(summary["drops"], 500);
        assert_eq!(summary["drops_by_pid"], json!({"5": 476, "6": 24}));
        for other in [complete, 9] {
            let summary = serde_json::to_value(store.summary(other).unwrap()).unwrap();
            assert_eq!(
                (
                    &summary["complete"],
                    &summary["drops"],
                    &summary["drops_by_pid"]
                ),
                (&json!(true), &json!(0), &json!({})),
                "{summary}"
            );
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn completeness_merges_per_pid_and_reads_bad_meta_safely() {
        let mut all = Completeness::complete();
        assert!(all.is_complete());
        all.add(3, 0);
        assert_eq!(all, Completeness::complete(), "no drop adds no pid");
        all.merge(&Completeness::of_process(3, 2));
        all.merge(&Completeness::of_process(3, 5));
        all.add(4, u64::MAX);
        assert_eq!(all.drops(), u64::MAX);
        assert_eq!(all.by_pid().get(&3), Some(&7));
        assert!(!all.is_complete());
        let read = Completeness::from_meta(&json!({
            "drops": 1, "drops_by_pid": {"x": 4, "2": "many", "9": 3, "10": 0}
        }));
        assert_eq!(
            read,
            Completeness::of_process(9, 3),
            "total raised to the sum"
        );
        assert_eq!(
            Completeness::from_meta(&json!({"drops": "lots"})),
            Completeness::complete()
        );
        let mut map = serde_json::Map::new();
        Completeness::of_process(9, 3).insert_into(&mut map);
        assert_eq!(
            Value::Object(map),
            json!({"complete": false, "drops": 3, "drops_by_pid": {"9": 3}})
        );
    }

    #[test]
    fn a_corrupt_file_is_refused_and_the_others_load() {
        let dir = temp_dir("corrupt");
        let mut store = SnapshotStore::open(&dir).unwrap();
        for _ in 0..3 {
            store
                .add(stored(5, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
                .unwrap();
        }
        drop(store);
        let two = dir.join("snapshots/2.tsnap");
        let bytes = fs::read(&two).unwrap();
        fs::write(&two, &bytes[..bytes.len() / 2]).unwrap();
        fs::write(dir.join("snapshots/.3.tsnap.99.tmp"), b"partial").unwrap();
        fs::write(
            dir.join("snapshots/9.tsnap"),
            fs::read(dir.join("snapshots/1.tsnap")).unwrap(),
        )
        .unwrap();
        let store = SnapshotStore::open(&dir).unwrap();
        let ids: Vec<u64> = store.summaries().iter().map(|s| s.id).collect();
        assert_eq!(ids, [1, 3]);
        let refused: Vec<(String, String)> = store
            .unreadable()
            .iter()
            .map(|u| {
                (
                    u.path.file_name().unwrap().to_string_lossy().into_owned(),
                    u.error.clone(),
                )
            })
            .collect();
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert_eq!(refused[0].0, "2.tsnap");
        assert!(
            refused[0]
                .1
                .starts_with("corrupt or truncated tracer snapshot: CRC-32 is"),
            "{}",
            refused[0].1
        );
        assert_eq!(
            refused[1],
            (
                "9.tsnap".into(),
                "its header says snapshot 1, its name says 9".into()
            )
        );
        assert!(two.exists(), "a refused file is left for inspection");
        assert!(
            !dir.join("snapshots/.3.tsnap.99.tmp").exists(),
            "leftover temp files are removed"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn automatic_snapshots_expire_unless_labelled() {
        let dir = temp_dir("auto");
        let mut store = SnapshotStore::open(&dir).unwrap();
        let old = store
            .add(
                stored(5, 1),
                SnapshotInfo::new(SnapshotKind::Auto, Some((5, 1))),
            )
            .unwrap();
        let kept = store
            .add(
                stored(5, 1),
                SnapshotInfo::new(SnapshotKind::Auto, Some((5, 1))),
            )
            .unwrap();
        assert!(
            !dir.join(format!("snapshots/{old}.tsnap")).exists(),
            "auto snapshots stay in memory"
        );
        store.set_label(kept, Some("keep".into())).unwrap();
        assert!(
            dir.join(format!("snapshots/{kept}.tsnap")).exists(),
            "labelling keeps it on disk"
        );
        let later = SystemTime::UNIX_EPOCH
            + Duration::from_millis(1_700_000_000_123)
            + Duration::from_secs(601);
        assert_eq!(store.expire_auto(later, Duration::from_secs(600)), 1);
        assert!(store.get(old).is_none());
        assert!(store.get(kept).is_some());
        let _ = fs::remove_dir_all(&dir);
    }
}
