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
    collections::{BTreeMap, HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde::Serialize;
use std::sync::Arc;
use tracer_model::{Snapshot, encode};

use crate::capture::ImageId;
use crate::sys::fsync::{WriteError, create_private_dir, sync_dir, write_atomically};

mod compact;
mod disk;
mod files;
mod quota;
mod stored;

pub use disk::{CACHE_BYTES, CACHE_SNAPSHOTS, Cache, heap_estimate};
pub use files::{SNAPSHOT_SUFFIX, dir_bytes};
pub use quota::{Quota, Quotas};
pub use stored::{
    MAX_LABEL_LEN, SnapshotHead, SnapshotInfo, SnapshotKind, SnapshotSummary, StoredSnapshot,
    check_label,
};

use compact::{Compact, Interner};
use disk::{OnDisk, check_written};
use files::{file_of, meta_of, read_next_id, read_snapshot_file};
use stored::Shape;

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
    /// Storing the snapshot would exceed a quota, even with every
    /// automatic snapshot it may evict gone; nothing was stored or evicted.
    #[error("{}", quota::describe(*quota, *limit, *held, *need, *owner))]
    QuotaFull {
        /// The quota.
        quota: Quota,
        /// Its value (snapshots, or bytes).
        limit: u64,
        /// What is held that counts against it and is never evicted
        /// automatically (snapshots, or bytes).
        held: u64,
        /// What the snapshot needs (1 snapshot, or its bytes).
        need: u64,
        /// For a per-owner quota, the owner (uid).
        owner: Option<u32>,
    },
    /// The file of a stored snapshot no longer exists: it was removed
    /// behind tracerd's back.
    #[error(
        "the file of snapshot {id}, {}, was removed behind tracerd's back: its traces are gone",
        path.display()
    )]
    FileGone {
        /// The snapshot.
        id: u64,
        /// Its file.
        path: PathBuf,
    },
    /// The file of a stored snapshot is no longer the one tracerd wrote
    /// (or read at start): it was replaced or modified behind its back;
    /// it is not used.
    #[error("the file of snapshot {id}, {}, changed behind tracerd's back: {reason}", path.display())]
    FileChanged {
        /// The snapshot.
        id: u64,
        /// Its file.
        path: PathBuf,
        /// What differs.
        reason: String,
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

const KINDS: [SnapshotKind; 3] = [
    SnapshotKind::Taken,
    SnapshotKind::Auto,
    SnapshotKind::Loaded,
];

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
            // Read whole once, to check it and count its summary; its
            // traces are dropped and read again when it is used.
            match read_snapshot_file(&path, stem) {
                Ok(entry) => {
                    max_id = max_id.max(entry.head.id);
                    if let Some(label) = &entry.info.label
                        && let Some(other) = store.id_of_label(label)
                    {
                        store.unreadable.push(Unreadable {
                            path: path.clone(),
                            error: format!("label {label:?} is also used by snapshot {other}"),
                        });
                        continue;
                    }
                    store.entries.insert(entry.head.id, entry);
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

    /// The ids of the automatic snapshots to evict, oldest first, so that
    /// `entry` fits the quotas (replacing the entry `replacing`, if any).
    ///
    /// # Errors
    /// [`StoreError::QuotaFull`]: the first quota it does not fit even with
    /// every automatic snapshot other than itself evicted.
    fn room_for(&self, entry: &Entry, replacing: Option<u64>) -> Result<Vec<u64>, StoreError> {
        let quotas = self.quotas;
        let full = |quota: Quota, held: u64, need: u64, owner: Option<u32>| StoreError::QuotaFull {
            quota,
            limit: quota.of(&quotas),
            held,
            need,
            owner,
        };
        let others = || {
            self.entries
                .values()
                .filter(move |e| Some(e.head.id) != replacing)
        };
        if let Some(uid) = entry.info.owner {
            let (count, bytes) = others()
                .filter(|e| e.info.owner == Some(uid))
                .fold((0u64, 0u64), |(c, b), e| (c + 1, b.saturating_add(e.bytes)));
            if count + 1 > quotas.snapshots_per_owner {
                return Err(full(Quota::SnapshotsPerOwner, count, 1, Some(uid)));
            }
            if bytes.saturating_add(entry.bytes) > quotas.bytes_per_owner {
                return Err(full(Quota::BytesPerOwner, bytes, entry.bytes, Some(uid)));
            }
        }
        let (mut count, mut bytes) = others().fold((1u64, entry.bytes), |(c, b), e| {
            (c + 1, b.saturating_add(e.bytes))
        });
        let mut evict = Vec::new();
        for victim in others().filter(|e| e.evictable()) {
            if count <= quotas.snapshots && bytes <= quotas.bytes {
                break;
            }
            evict.push(victim.head.id);
            count -= 1;
            bytes = bytes.saturating_sub(victim.bytes);
        }
        if count > quotas.snapshots {
            return Err(full(Quota::Snapshots, count - 1, 1, None));
        }
        if bytes > quotas.bytes {
            return Err(full(
                Quota::Bytes,
                bytes.saturating_sub(entry.bytes),
                entry.bytes,
                None,
            ));
        }
        Ok(evict)
    }

    /// Drops the automatic snapshots `ids` (their files too, if any: an
    /// unlabelled automatic snapshot read back from an earlier run),
    /// counted as evictions.
    fn evict(&mut self, ids: &[u64]) {
        for id in ids {
            if let Some(entry) = self.entries.remove(id) {
                self.cache.forget(*id);
                self.evicted += 1;
                tracing::debug!(
                    id,
                    pid = entry.head.pid,
                    bytes = entry.bytes,
                    "automatic snapshot evicted for the quotas"
                );
                self.remove_file_of(&entry);
            }
        }
        if !ids.is_empty() {
            self.forget_unused_interners();
        }
    }

    /// Removes the file of a dropped entry, if it has one (best effort:
    /// logged on failure).
    fn remove_file_of(&self, entry: &Entry) {
        if entry.persisted
            && let Some(dir) = &self.dir
        {
            let path = file_of(dir, entry.head.id);
            if let Err(err) = fs::remove_file(&path)
                && err.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(target = %path.display(), %err, "cannot remove the file of a dropped snapshot");
            }
        }
    }

    /// Drops the interners of images that have no compact snapshot left.
    fn forget_unused_interners(&mut self) {
        let used: HashSet<ImageId> = self
            .entries
            .values()
            .filter(|e| matches!(e.body, Body::Compact(_)))
            .filter_map(|e| e.info.image)
            .collect();
        self.interners.retain(|image, _| used.contains(image));
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

    /// Drops automatic snapshots (unlabelled) taken more than `retention`
    /// before `now`; returns how many.
    pub fn expire_auto(&mut self, now: SystemTime, retention: Duration) -> usize {
        let expired: Vec<u64> = self
            .entries
            .values()
            .filter(|e| {
                e.evictable() && now.duration_since(e.head.taken_at).unwrap_or_default() > retention
            })
            .map(|e| e.head.id)
            .collect();
        for id in &expired {
            if let Some(entry) = self.entries.remove(id) {
                self.cache.forget(*id);
                self.remove_file_of(&entry);
            }
        }
        if !expired.is_empty() {
            self.forget_unused_interners();
        }
        expired.len()
    }

    /// Number of stored snapshots.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no snapshot is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Counts and bytes per kind, evictions and refusals.
    pub fn stats(&self) -> StoreStats {
        let by_kind = KINDS
            .iter()
            .map(|kind| {
                let (count, bytes) = self
                    .entries
                    .values()
                    .filter(|e| e.info.kind == *kind)
                    .fold((0u64, 0u64), |(c, b), e| (c + 1, b.saturating_add(e.bytes)));
                (*kind, count, bytes)
            })
            .collect();
        let refused = KINDS
            .iter()
            .map(|kind| (*kind, self.refused.get(kind.as_str()).copied().unwrap_or(0)))
            .collect();
        StoreStats {
            by_kind,
            evicted: self.evicted,
            refused,
            quotas: self.quotas,
        }
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
