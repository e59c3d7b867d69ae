//! Snapshots kept on disk ([`OnDisk`]): a snapshot that has a file in the
//! state directory is not held in memory; it is decoded from its file when
//! it is used, and the last few decoded are kept in a small cache
//! ([`Cache`], at most [`CACHE_SNAPSHOTS`] snapshots and an estimated
//! [`CACHE_BYTES`] bytes).
//!
//! The file is checked on every use: it must be the file tracerd wrote (or
//! read at start), the same device, inode, length and modification time,
//! and, when it is read, the same bytes (a 64-bit hash). A file removed
//! behind tracerd's back is [`StoreError::FileGone`]; one replaced or
//! modified is [`StoreError::FileChanged`]; neither is ever decoded into
//! something else than what was stored.
use std::{
    collections::{HashSet, VecDeque},
    fs,
    hash::Hasher as _,
    io::Read as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use tracer_model::{Snapshot, Trace, Traceback, decode};

use super::StoreError;
use crate::sys::fsync::open_regular;

/// Most decoded snapshots the cache holds.
pub const CACHE_SNAPSHOTS: usize = 4;

/// Most bytes the cache holds, as estimated by [`heap_estimate`]: 128 MiB.
/// A snapshot estimated larger than this is decoded on each use and never
/// cached.
pub const CACHE_BYTES: u64 = 128 << 20;

/// What identifies the contents of a snapshot's file: where it is
/// (device, inode), its length and modification time (ns since the Unix
/// epoch), and a hash of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FileCheck {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    hash: u64,
}

impl FileCheck {
    /// The check of a file whose metadata are `meta` and bytes `bytes`.
    pub(super) fn new(meta: &fs::Metadata, bytes: &[u8]) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            hash: hash_of(bytes),
        }
    }

    /// Whether `meta` are those of the checked file (the hash aside).
    fn same_file(&self, meta: &fs::Metadata) -> bool {
        let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        (self.dev, self.ino, self.len, self.mtime_ns)
            == (meta.dev(), meta.ino(), meta.len(), mtime_ns)
    }
}

/// A 64-bit hash of a file's bytes (SipHash with fixed keys: the same in
/// every run).
fn hash_of(bytes: &[u8]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hasher.write(bytes);
    hasher.finish()
}

/// The check of `path` as written just now with `bytes`.
///
/// # Errors
/// [`StoreError::Io`] if its metadata cannot be read.
pub(super) fn check_written(path: &Path, bytes: &[u8]) -> Result<FileCheck, StoreError> {
    let meta = fs::symlink_metadata(path).map_err(|source| StoreError::Io {
        action: "reading the metadata of",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(FileCheck::new(&meta, bytes))
}

/// A snapshot whose traces are in its file only.
#[derive(Clone, Debug)]
pub(super) struct OnDisk {
    /// Its id (the key of the cache, and the id its file's header holds).
    pub id: u64,
    /// Its file.
    pub path: PathBuf,
    /// What the file must be; shared by the clones handed out
    /// ([`super::Loader`]) and updated, under its lock, when the store
    /// rewrites the file (a new label), so that a loader taken before never
    /// mistakes that rewrite for a change behind tracerd's back.
    pub check: Arc<Mutex<FileCheck>>,
}

impl OnDisk {
    /// The snapshot kept in `path`, as checked by `check`.
    pub(super) fn new(id: u64, path: PathBuf, check: FileCheck) -> Self {
        Self {
            id,
            path,
            check: Arc::new(Mutex::new(check)),
        }
    }

    /// The check, locked: hold it while the file is replaced.
    pub(super) fn lock(&self) -> MutexGuard<'_, FileCheck> {
        self.check.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The snapshot, from `cache` if it is there (its file still checked
    /// by its metadata), else read and decoded from its file (O(traces))
    /// and put in the cache.
    ///
    /// # Errors
    /// [`StoreError::FileGone`] if its file no longer exists,
    /// [`StoreError::FileChanged`] if it is no longer the file tracerd
    /// wrote or read at start (or no longer decodes), [`StoreError::Io`] if
    /// it cannot be read.
    pub(super) fn load(&self, cache: &Cache) -> Result<Arc<Snapshot>, StoreError> {
        let changed = |reason: String| StoreError::FileChanged {
            id: self.id,
            path: self.path.clone(),
            reason,
        };
        // The file is opened and compared under the check's lock, so that
        // a rewrite by the store is either all before (and the new check
        // is compared) or all after (and the old file, still open, is
        // read).
        let (mut file, check) = {
            let check = self.lock();
            let (file, meta) = match open_regular(&self.path) {
                Ok(opened) => opened,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    return Err(StoreError::FileGone {
                        id: self.id,
                        path: self.path.clone(),
                    });
                }
                Err(err) if err.kind() == std::io::ErrorKind::InvalidInput => {
                    return Err(changed(format!("it was replaced by {err}")));
                }
                Err(source) => {
                    return Err(StoreError::Io {
                        action: "reading",
                        path: self.path.clone(),
                        source,
                    });
                }
            };
            if !check.same_file(&meta) {
                return Err(changed(
                    "it was replaced or modified (its inode, length or modification time differ)"
                        .into(),
                ));
            }
            (file, *check)
        };
        // The file is the one checked: a cached decoding of it is its
        // traces (a new label rewrites the file, never the traces).
        if let Some(snapshot) = cache.get(self.id) {
            return Ok(snapshot);
        }
        let mut bytes = Vec::with_capacity(usize::try_from(check.len).unwrap_or(0));
        file.read_to_end(&mut bytes)
            .map_err(|source| StoreError::Io {
                action: "reading",
                path: self.path.clone(),
                source,
            })?;
        if bytes.len() as u64 != check.len || hash_of(&bytes) != check.hash {
            return Err(changed("its bytes were modified".into()));
        }
        let decoded = decode(&bytes).map_err(|e| changed(format!("it no longer decodes: {e}")))?;
        drop(bytes);
        let snapshot = Arc::new(decoded.snapshot);
        cache.put(self.id, &snapshot);
        Ok(snapshot)
    }
}

/// An estimate of the memory a decoded snapshot takes, in bytes: its
/// traces, its distinct tracebacks and their frames, its distinct file
/// names, and its index (as `tracer_model::Snapshot` documents it: 4 bytes
/// per trace, about 60 per distinct traceback plus 4 per frame of it).
#[must_use]
pub fn heap_estimate(snapshot: &Snapshot) -> u64 {
    const ARC_COUNTS: usize = 16;
    let traces = snapshot.traces();
    let mut tracebacks = HashSet::new();
    let mut names = HashSet::new();
    let mut bytes = traces.len() * (size_of::<Trace>() + 4);
    // Traces come in runs of one traceback: a run's later traces are
    // passed over without hashing.
    let mut last = std::ptr::null();
    for trace in traces {
        let traceback = Arc::as_ptr(&trace.traceback);
        if traceback == last {
            continue;
        }
        last = traceback;
        if !tracebacks.insert(traceback) {
            continue;
        }
        let frames = trace.traceback.frames();
        bytes += size_of::<Traceback>()
            + ARC_COUNTS
            + 60
            + frames.len() * (size_of::<tracer_model::Frame>() + 4);
        for frame in frames {
            if names.insert(Arc::as_ptr(&frame.filename).cast::<u8>()) {
                bytes += frame.filename.len() + ARC_COUNTS + 80;
            }
        }
    }
    bytes as u64
}

/// One decoded snapshot in the cache.
#[derive(Debug)]
struct Cached {
    id: u64,
    snapshot: Arc<Snapshot>,
    bytes: u64,
}

/// The most recently used decoded snapshots: at most `snapshots` of them
/// and `bytes` bytes (as estimated by [`heap_estimate`]); the least
/// recently used leaves first. Shared by the store and the loaders it
/// hands out; its lock is held only to look up, insert or drop (never
/// while decoding).
#[derive(Debug)]
pub struct Cache {
    snapshots: usize,
    bytes: u64,
    /// Least recently used first.
    held: Mutex<VecDeque<Cached>>,
}

impl Default for Cache {
    fn default() -> Self {
        Self::new(CACHE_SNAPSHOTS, CACHE_BYTES)
    }
}

impl Cache {
    /// A cache of at most `snapshots` snapshots and `bytes` bytes.
    #[must_use]
    pub fn new(snapshots: usize, bytes: u64) -> Self {
        Self {
            snapshots,
            bytes,
            held: Mutex::new(VecDeque::new()),
        }
    }

    fn held(&self) -> MutexGuard<'_, VecDeque<Cached>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Snapshot `id`, if cached; it becomes the most recently used.
    fn get(&self, id: u64) -> Option<Arc<Snapshot>> {
        let mut held = self.held();
        let at = held.iter().position(|c| c.id == id)?;
        let cached = held.remove(at)?;
        let snapshot = Arc::clone(&cached.snapshot);
        held.push_back(cached);
        Some(snapshot)
    }

    /// Caches snapshot `id` as the most recently used, dropping the least
    /// recently used ones beyond the bounds. One larger than the byte
    /// bound is not cached.
    pub(super) fn put(&self, id: u64, snapshot: &Arc<Snapshot>) {
        let bytes = heap_estimate(snapshot);
        let mut held = self.held();
        held.retain(|c| c.id != id);
        if bytes > self.bytes || self.snapshots == 0 {
            return;
        }
        held.push_back(Cached {
            id,
            snapshot: Arc::clone(snapshot),
            bytes,
        });
        while held.len() > self.snapshots || held.iter().map(|c| c.bytes).sum::<u64>() > self.bytes
        {
            held.pop_front();
        }
    }

    /// Drops snapshot `id` from the cache (it was removed from the store).
    pub(super) fn forget(&self, id: u64) {
        self.held().retain(|c| c.id != id);
    }

    /// The ids cached, least recently used first, and their estimated
    /// bytes in total.
    #[must_use]
    pub fn contents(&self) -> (Vec<u64>, u64) {
        let held = self.held();
        (
            held.iter().map(|c| c.id).collect(),
            held.iter().map(|c| c.bytes).sum(),
        )
    }
}
