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
//! A snapshot that has a file is not kept in memory: the store keeps its
//! head and what its summary shows (counted when it was stored, or when
//! its file was read at start), and decodes its file each time it is used
//! ([`Loader::load`], without the store's lock), its traces in the file's
//! order. The last [`CACHE_SNAPSHOTS`] (4) snapshots decoded, at most
//! [`CACHE_BYTES`] (128 MiB, estimated), stay decoded in a cache, so
//! repeated statistics and compares on one snapshot decode it once. A
//! file removed behind tracerd's back is then [`StoreError::FileGone`],
//! one replaced or modified [`StoreError::FileChanged`] ([`disk`]).
//! Without a state directory every snapshot is kept whole in memory.
//!
//! Automatic snapshots (kind `auto`, taken every interval of every traced
//! process) stay in memory for their retention: after a restart the kernel's
//! live blocks start over, so they would compare against nothing. They are
//! kept compactly ([`compact`]): traces grouped, tracebacks shared by the
//! automatic snapshots of one process image, decoded on use. Labelling
//! one keeps it (it becomes a file like the others).
//!
//! Quotas ([`Quotas`]) bound how many snapshots the store holds, and how
//! many bytes, in total and per owner. A new automatic snapshot, or one a
//! user stores, that would exceed a total first evicts the oldest
//! unlabelled automatic snapshots (counted, see [`StoreStats`]); when that
//! is not enough (or a per-owner quota is full: automatic snapshots are
//! nobody's) it is refused with [`StoreError::QuotaFull`]. Snapshots a user
//! stored are never evicted.
//!
//! Ids are unique for the life of the state directory, restarts included:
//! they are handed out from blocks reserved in `<state_dir>/snapshots/next-id`
//! before use, so even a SIGKILL never lets an id be given twice.
use std::{
    collections::{BTreeMap, HashMap},
    fs,
    path::{Path, PathBuf},
};

use serde::Serialize;
use std::sync::Arc;
use tracer_model::{Snapshot, encode};

use crate::capture::ImageId;
use crate::sys::fsync::{sync_dir, write_atomically};

mod compact;
mod disk;
mod error;
mod evict;
mod files;
mod open;
mod quota;
mod stored;

pub use disk::{CACHE_BYTES, CACHE_SNAPSHOTS, Cache, heap_estimate};
pub use error::StoreError;
pub use files::{SNAPSHOT_SUFFIX, dir_bytes};
pub use quota::{Quota, Quotas};
pub use stored::{
    MAX_LABEL_LEN, SnapshotHead, SnapshotInfo, SnapshotKind, SnapshotSummary, StoredSnapshot,
    check_label, store_frames, wire_completeness, wire_frames, wire_kind,
};

use compact::{Compact, Interner};
use disk::{OnDisk, check_written};
use error::{failed_write, io};
use files::{file_of, meta_of};
use stored::Shape;

/// A file of the state directory that could not be read back.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Unreadable {
    /// The file.
    pub path: PathBuf,
    /// Why it was refused.
    pub error: String,
}

/// The traces of an entry: whole (without a state directory), compact
/// (automatic snapshots), or in its file.
#[derive(Clone, Debug)]
enum Body {
    Whole(Arc<Snapshot>),
    Compact(Compact),
    OnDisk(OnDisk),
}

impl Body {
    /// The traces: decoded if compact, from `cache` or decoded from the
    /// file if on disk.
    ///
    /// # Errors
    /// As [`OnDisk::load`].
    fn snapshot(&self, cache: &Cache) -> Result<Arc<Snapshot>, StoreError> {
        match self {
            Body::Whole(snapshot) => Ok(Arc::clone(snapshot)),
            Body::Compact(compact) => Ok(Arc::new(compact.decode())),
            Body::OnDisk(on_disk) => on_disk.load(cache),
        }
    }
}

/// One entry of the store.
#[derive(Clone, Debug)]
struct Entry {
    head: SnapshotHead,
    body: Body,
    shape: Shape,
    info: SnapshotInfo,
    persisted: bool,
    this_run: bool,
    /// What it counts against the quotas: its file's size when persisted,
    /// else its compact form's bytes (or, without a state directory, what
    /// its file would take).
    bytes: u64,
}

impl Entry {
    fn summary(&self) -> SnapshotSummary {
        self.head.summary_with(
            &self.info,
            self.shape,
            self.persisted,
            self.this_run,
            self.bytes,
        )
    }

    /// An unlabelled automatic snapshot: the only kind evicted or expired.
    fn evictable(&self) -> bool {
        self.info.kind == SnapshotKind::Auto && self.info.label.is_none()
    }
}

/// A stored snapshot taken out of the store to be decoded without its
/// lock ([`SnapshotStore::loader`]); cheap to make (a few `Arc`s).
#[derive(Clone, Debug)]
pub struct Loader {
    head: SnapshotHead,
    body: Body,
    cache: Arc<Cache>,
}

impl Loader {
    /// The snapshot, decoded if it is kept compactly or in its file
    /// (O(traces); a file's decoding is cached, see [`Cache`]).
    ///
    /// # Errors
    /// For a snapshot kept in its file: [`StoreError::FileGone`] if the
    /// file was removed, [`StoreError::FileChanged`] if it was replaced or
    /// modified, [`StoreError::Io`] if it cannot be read.
    pub fn load(self) -> Result<StoredSnapshot, StoreError> {
        let snapshot = self.body.snapshot(&self.cache)?;
        Ok(self.head.with(snapshot))
    }

    /// Its head.
    #[must_use]
    pub fn head(&self) -> &SnapshotHead {
        &self.head
    }
}

/// Counts and bytes of the store, for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Per kind (`taken`, `auto`, `loaded`): snapshots held and their bytes
    /// (as [`SnapshotSummary::bytes`]).
    pub by_kind: Vec<(SnapshotKind, u64, u64)>,
    /// Automatic snapshots evicted to make room under the quotas since
    /// start.
    pub evicted: u64,
    /// Snapshots refused by a quota since start, per kind.
    pub refused: Vec<(SnapshotKind, u64)>,
    /// The quotas in force.
    pub quotas: Quotas,
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
    quotas: Quotas,
    /// The tracebacks of each image's automatic snapshots.
    interners: HashMap<ImageId, Interner>,
    evicted: u64,
    refused: BTreeMap<&'static str, u64>,
    /// The snapshots last decoded from their files.
    cache: Arc<Cache>,
}

impl SnapshotStore {
    /// Sets the quotas. Snapshots held beyond them stay (a user's are
    /// never removed automatically); new ones are refused until there is
    /// room.
    pub fn set_quotas(&mut self, quotas: Quotas) {
        self.quotas = quotas;
    }

    /// The quotas in force.
    pub fn quotas(&self) -> Quotas {
        self.quotas
    }

    /// Files of the state directory that were refused at open, with why.
    pub fn unreadable(&self) -> &[Unreadable] {
        &self.unreadable
    }

    /// The state directory (the parent of its `snapshots` directory), if
    /// the store has one.
    pub fn state_dir(&self) -> Option<&Path> {
        self.dir.as_deref().and_then(Path::parent)
    }

    #[cfg(test)]
    /// Stores a snapshot under the next id (kind `taken`, of its image, no
    /// label), as [`SnapshotStore::add`] does; a failure to write its file is
    /// logged and the snapshot is kept in memory. Returns the id.
    pub(crate) fn insert(&mut self, stored: StoredSnapshot) -> u64 {
        let info = SnapshotInfo::new(
            SnapshotKind::Taken,
            Some(ImageId::new(stored.pid, stored.generation)),
        );
        match self.add(stored.clone(), info.clone()) {
            Ok(id) => id,
            Err(err) => {
                tracing::warn!(err = %err, "snapshot kept in memory only");
                let id = self.next_id + 1;
                self.next_id = id;
                let (mut head, snapshot) = stored.split();
                head.id = id;
                self.entries.insert(
                    id,
                    Entry {
                        head,
                        shape: Shape::of(&snapshot),
                        body: Body::Whole(snapshot),
                        info,
                        persisted: false,
                        this_run: true,
                        bytes: 0,
                    },
                );
                id
            }
        }
    }

    /// Stores a snapshot under the next id with `info`; it is written to the
    /// state directory unless it is an unlabelled automatic one, which is
    /// kept compactly in memory. Automatic snapshots are evicted, oldest
    /// first, when the quotas need it.
    ///
    /// # Errors
    /// [`StoreError::LabelTaken`] / [`StoreError::InvalidLabel`] for its
    /// label, [`StoreError::QuotaFull`], [`StoreError::Io`] if its file
    /// cannot be written (nothing is stored or evicted then).
    pub fn add(&mut self, stored: StoredSnapshot, info: SnapshotInfo) -> Result<u64, StoreError> {
        if let Some(label) = &info.label {
            check_label(label)?;
            if let Some(id) = self.id_of_label(label) {
                return Err(StoreError::LabelTaken {
                    label: label.clone(),
                    id: Some(id),
                });
            }
        }
        // The id it will have; allocated (reserved on disk) only once it
        // fits the quotas, so that a refused snapshot takes no id.
        let id = self.next_id + 1;
        let (mut head, snapshot) = stored.split();
        head.id = id;
        let shape = Shape::of(&snapshot);
        let body = if info.kind == SnapshotKind::Auto {
            let interner = match info.image {
                Some(image) => self.interners.entry(image).or_default(),
                None => &mut Interner::default(),
            };
            Body::Compact(Compact::new(&snapshot, interner))
        } else {
            Body::Whole(Arc::clone(&snapshot))
        };
        let mut entry = Entry {
            head,
            body,
            shape,
            info,
            persisted: false,
            this_run: true,
            bytes: 0,
        };
        let file = entry
            .info
            .kept_on_disk()
            .then(|| encode(&snapshot, &meta_of(&entry)));
        entry.bytes = match (&file, &entry.body) {
            (Some(bytes), _) => bytes.len() as u64,
            (None, Body::Compact(compact)) => compact.bytes(),
            (None, Body::Whole(_) | Body::OnDisk(_)) => 0,
        };
        let evict = self.room_for(&entry, None).inspect_err(|_| {
            *self.refused.entry(entry.info.kind.as_str()).or_default() += 1;
            self.forget_unused_interners();
        })?;
        let allocated = self.allocate_id()?;
        if allocated != id {
            // Never: nothing else allocates while the store is borrowed.
            return Err(StoreError::Io {
                action: "allocating an id for",
                path: self.dir.clone().unwrap_or_default(),
                source: std::io::Error::other(format!("id {allocated}, expected {id}")),
            });
        }
        if let Some(bytes) = file {
            self.persist(&mut entry, &snapshot, &bytes)?;
        }
        self.evict(&evict);
        self.entries.insert(id, entry);
        Ok(id)
    }

    /// Writes the file of `entry` (when the store has a directory), its
    /// traces `snapshot` encoded as `bytes`, and marks it persisted. A
    /// snapshot kept whole is then kept in its file only (and cached, as
    /// the most recently used); the check of one kept on disk is updated
    /// under its lock, so that no loader mistakes the rewrite for a change
    /// behind tracerd's back.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the file cannot be written (logged; the old
    /// file, if any, is unchanged).
    fn persist(
        &self,
        entry: &mut Entry,
        snapshot: &Arc<Snapshot>,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let id = entry.head.id;
        let path = file_of(dir, id);
        let checked = match &entry.body {
            Body::OnDisk(on_disk) => {
                let mut check = on_disk.lock();
                write_atomically(&path, bytes).map_err(failed_write)?;
                check_written(&path, bytes).map(|new| *check = new)
            }
            Body::Whole(_) => {
                write_atomically(&path, bytes).map_err(failed_write)?;
                check_written(&path, bytes).map(|check| {
                    self.cache.put(id, snapshot);
                    entry.body = Body::OnDisk(OnDisk::new(id, path.clone(), check));
                })
            }
            Body::Compact(_) => {
                // A labelled automatic snapshot: its compact form is small,
                // and it goes back to memory if its label is removed.
                write_atomically(&path, bytes).map_err(failed_write)?;
                Ok(())
            }
        };
        if let Err(err) = checked {
            // Written, but its metadata cannot be read (never seen): kept
            // in memory, which never goes wrong.
            tracing::warn!(target = %path.display(), %err, "snapshot kept in memory beside its file");
            entry.body = Body::Whole(Arc::clone(snapshot));
        }
        entry.persisted = true;
        Ok(())
    }

    /// Sets (or with None removes) the label of snapshot `id`. Labelling an
    /// automatic snapshot keeps it: it is written to the state directory and
    /// no longer expires nor is evicted; removing the label of an automatic
    /// snapshot removes its file, and it expires again.
    ///
    /// # Errors
    /// [`StoreError::NotFound`], [`StoreError::InvalidLabel`],
    /// [`StoreError::LabelTaken`], [`StoreError::QuotaFull`] (its file
    /// would not fit), [`StoreError::Io`], and for a snapshot kept in its
    /// file [`StoreError::FileGone`] / [`StoreError::FileChanged`] (the
    /// label is then unchanged).
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
        let mut evict = Vec::new();
        if entry.info.kept_on_disk() {
            let snapshot = entry.body.snapshot(&self.cache)?;
            let bytes = encode(&snapshot, &meta_of(&entry));
            entry.bytes = bytes.len() as u64;
            evict = self.room_for(&entry, Some(id)).inspect_err(|_| {
                *self.refused.entry(entry.info.kind.as_str()).or_default() += 1;
            })?;
            self.persist(&mut entry, &snapshot, &bytes)?;
        } else if entry.info.kind == SnapshotKind::Auto {
            // An automatic snapshot no longer labelled: back to memory,
            // compact (one read back from an earlier run's file is
            // compacted now), and it expires again.
            if !matches!(entry.body, Body::Compact(_)) {
                let snapshot = entry.body.snapshot(&self.cache)?;
                let interner = match entry.info.image {
                    Some(image) => self.interners.entry(image).or_default(),
                    None => &mut Interner::default(),
                };
                entry.body = Body::Compact(Compact::new(&snapshot, interner));
            }
            if let Body::Compact(compact) = &entry.body {
                entry.bytes = compact.bytes();
            }
            self.remove_file_of(&entry);
            self.cache.forget(id);
            entry.persisted = false;
        }
        self.evict(&evict);
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
        self.cache.forget(id);
        self.forget_unused_interners();
        entry.persisted = false;
        Ok(entry.summary())
    }

    /// Number of stored snapshots.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no snapshot is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Snapshot `id`, to be decoded without the store's lock.
    pub fn loader(&self, id: u64) -> Option<Loader> {
        self.entries.get(&id).map(|e| Loader {
            head: e.head.clone(),
            body: e.body.clone(),
            cache: Arc::clone(&self.cache),
        })
    }

    /// Snapshot `id`, decoded now if it is kept compactly or in its file
    /// (prefer [`SnapshotStore::loader`] under a lock).
    ///
    /// # Errors
    /// [`StoreError::NotFound`], and as [`Loader::load`].
    pub fn get(&self, id: u64) -> Result<StoredSnapshot, StoreError> {
        self.loader(id).ok_or(StoreError::NotFound { id })?.load()
    }

    /// The cache of snapshots decoded from their files.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The head of snapshot `id`.
    pub fn head(&self, id: u64) -> Option<&SnapshotHead> {
        self.entries.get(&id).map(|e| &e.head)
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
            .map(|e| e.head.id)
    }

    /// Every snapshot's head, oldest first, with its info.
    pub fn iter(&self) -> impl Iterator<Item = (&SnapshotHead, &SnapshotInfo)> {
        self.entries.values().map(|e| (&e.head, &e.info))
    }

    /// Summaries of every snapshot, oldest first.
    pub fn summaries(&self) -> Vec<SnapshotSummary> {
        self.entries.values().map(Entry::summary).collect()
    }

    /// Snapshots a user stored of the image (pid, generation) in this run,
    /// oldest first (automatic ones excluded: they are used through
    /// `since=` or by id). The generation, not the start time, tells images
    /// apart: exec keeps the start time.
    pub fn of_image(&self, image: ImageId) -> impl Iterator<Item = &SnapshotHead> {
        self.of_image_all(image)
            .filter(|(_, info)| info.kind != SnapshotKind::Auto)
            .map(|(s, _)| s)
    }

    /// Every snapshot of the image (pid, generation) in this run, automatic
    /// ones included, oldest first.
    pub fn of_image_all(
        &self,
        image: ImageId,
    ) -> impl Iterator<Item = (&SnapshotHead, &SnapshotInfo)> {
        self.iter()
            .filter(move |(_, info)| info.image == Some(image))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests;
