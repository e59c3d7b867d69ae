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
//! decode, or is not a regular file (a FIFO would block the read forever),
//! is reported (see [`SnapshotStore::unreadable`]), logged and left where
//! it is, its id stays reserved, and the others load normally. The
//! directory is created 0700 and its files 0600
//! ([`crate::sys::fsync`]).
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
    time::{Duration, SystemTime},
};

use serde::Serialize;
use tracer_model::encode;

use crate::capture::ImageId;
use crate::sys::fsync::{WriteError, create_private_dir, sync_dir, write_atomically};

mod files;
mod stored;

pub use files::SNAPSHOT_SUFFIX;
pub use stored::{
    MAX_LABEL_LEN, SnapshotInfo, SnapshotKind, SnapshotSummary, StoredSnapshot, check_label,
};

use files::{file_of, meta_of, read_next_id, read_snapshot_file};

/// How many ids are reserved on disk at a time.
const ID_BLOCK: u64 = 1024;

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
    #[error("label {label:?} is already used by {}", match id {
        Some(id) => format!("snapshot {id}"),
        None => "another snapshot".to_string(),
    })]
    LabelTaken {
        /// The label.
        label: String,
        /// The snapshot that has it; None when the caller may not see it
        /// (`service::access`).
        id: Option<u64>,
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

/// A write to the state directory that failed, logged (as an error, with
/// the file: a full disk must show in the log, not only in one client's
/// answer) and turned into [`StoreError::Io`].
fn failed_write(err: WriteError) -> StoreError {
    tracing::error!(
        target = %err.path.display(),
        action = err.action,
        err = %err.source,
        "cannot write to the state directory: the snapshot is not stored"
    );
    err.into()
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
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
        create_private_dir(&dir).map_err(io("creating", &dir))?;
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
            // The id its name claims stays reserved whether or not the file
            // reads back: a refused file is left for inspection, and a new
            // snapshot must never be written over it.
            if let Ok(id) = stem.parse::<u64>() {
                max_id = max_id.max(id);
            }
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

    /// The next id, reserving a new block on disk first when needed.
    fn allocate_id(&mut self) -> Result<u64, StoreError> {
        let id = self.next_id + 1;
        if let Some(dir) = &self.dir
            && id > self.reserved
        {
            let reserved = self.next_id + ID_BLOCK;
            write_atomically(&dir.join("next-id"), format!("{reserved}\n").as_bytes())
                .map_err(failed_write)?;
            self.reserved = reserved;
        }
        self.next_id = id;
        Ok(id)
    }

    #[cfg(test)]
    /// Stores a snapshot under the next id (kind `taken`, of its image, no
    /// label), as [`SnapshotStore::add`] does; a failure to write its file is
    /// logged and the snapshot is kept in memory. Returns the id.
    pub(crate) fn insert(&mut self, stored: StoredSnapshot) -> u64 {
        let info = SnapshotInfo::new(
            SnapshotKind::Taken,
            Some(ImageId::new(stored.pid, stored.gen_)),
        );
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
                    id: Some(id),
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
            write_atomically(&file_of(dir, entry.stored.id), &bytes).map_err(failed_write)?;
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
                    id: Some(other),
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
    pub fn of_image(&self, image: ImageId) -> impl Iterator<Item = &StoredSnapshot> {
        self.of_image_all(image)
            .filter(|(_, info)| info.kind != SnapshotKind::Auto)
            .map(|(s, _)| s)
    }

    /// Every snapshot of the image (pid, generation) in this run, automatic
    /// ones included, oldest first.
    pub fn of_image_all(
        &self,
        image: ImageId,
    ) -> impl Iterator<Item = (&StoredSnapshot, &SnapshotInfo)> {
        self.iter()
            .filter(move |(_, info)| info.image == Some(image))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests;
