//! The work behind the routes beyond the core: system-wide snapshots
//! (every traced process, domain = pid), stored snapshots as resources
//! (labels, files, automatic snapshots, `since=`), and the rest of
//! tracemalloc's module API (`start`, `stop`, `clear_traces`, `reset_peak`,
//! `get_tracemalloc_memory`, `get_object_traceback`).
//!
//! Every method blocks (map syscalls, DWARF, files): call them from
//! `spawn_blocking`. Lock order: capture, registry, control, store.
use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    control::Tracing,
    daemon::{Daemon, DaemonError, ProcessView, live_stats, lock, raw_blocks},
    store::{
        SnapshotInfo, SnapshotKind, SnapshotStore, SnapshotSummary, StoreError, StoredSnapshot,
        unix_ms,
    },
};
use tracer_model::{
    Completeness, DumpError, ModelError, PickleError, Snapshot, Trace, Traceback, decode,
    load_tracemalloc,
};

/// Errors of the views; [`crate::api`] maps them to statuses.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// From the core (unknown pid, unknown snapshot, another image's).
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// From the store (labels, files).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// From the model (cumulative with traceback).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An uploaded tracer file was refused.
    #[error("{0}")]
    Dump(#[from] DumpError),
    /// An uploaded tracemalloc pickle was refused.
    #[error("{0}")]
    Pickle(#[from] PickleError),
    /// `take_snapshot()` while not tracing (tracemalloc raises
    /// RuntimeError).
    #[error("{}", match pid { Some(pid) => format!("tracing is stopped for pid {pid}: no snapshot can be taken"), None => "tracing is stopped: no snapshot can be taken".to_string() })]
    TracingStopped {
        /// The process, or None system-wide.
        pid: Option<u32>,
    },
    /// The operation needs a live process and this one ended.
    #[error("pid {pid} has {state}: its blocks are gone")]
    Ended {
        /// The process.
        pid: u32,
        /// "exited" or "exec".
        state: &'static str,
    },
    /// `start(nframe)` with nframe outside 1..=tracerd's nframe.
    #[error("the number of frames must be in range [1; {max}], got {nframe}")]
    BadNframe {
        /// Given.
        nframe: u64,
        /// tracerd's nframe.
        max: u32,
    },
    /// `get_object_traceback()`: no traced block starts at this address.
    #[error("no traced block of pid {pid} starts at {address:#x}")]
    NoBlock {
        /// The process.
        pid: u32,
        /// The address asked for.
        address: u64,
    },
    /// A stored snapshot used where one of another scope is needed.
    #[error("snapshot {id} is not of pid {pid}'s current image ({reason})")]
    WrongScope {
        /// The snapshot.
        id: u64,
        /// The process asked about.
        pid: u32,
        /// What it is of.
        reason: String,
    },
}

/// A stored snapshot named by id or by label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotRef {
    /// By id.
    Id(u64),
    /// By label.
    Label(String),
}

/// What a view covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One process (its current image, or its last one if it ended).
    Process(u32),
    /// Every traced process now.
    System,
}

/// A snapshot taken now.
#[derive(Clone, Debug)]
pub struct Now {
    /// The traces.
    pub snapshot: Arc<Snapshot>,
    /// For a process: the process (traced memory adjusted for clears).
    pub process: Option<ProcessView>,
    /// For a process: (pid, gen) and start time of its image.
    pub image: Option<((u32, u32), u64)>,
    /// For the system: the processes it covers, by pid.
    pub pids: Vec<u32>,
    /// (current, peak) in bytes; for the system, the sums.
    pub traced_memory: (u64, u64),
    /// Events its processes lost since their tracing began.
    pub completeness: Completeness,
    /// When.
    pub at: SystemTime,
}

/// The base or new side of a compare: its traces and what to say about it.
#[derive(Clone, Debug)]
pub struct Side {
    /// The traces.
    pub snapshot: Arc<Snapshot>,
    /// JSON describing it (`kind`: `now`, `snapshot`, `tracing_start`,
    /// `since`).
    pub info: Value,
    /// Events its processes lost before it was taken.
    pub completeness: Completeness,
}

/// Where a compare's base comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BaseSpec {
    /// The latest snapshot a user stored of the scope, else the empty
    /// snapshot at tracing start.
    Default,
    /// A stored snapshot.
    Snapshot(SnapshotRef),
    /// The state this long ago, from automatic snapshots.
    Since(Duration),
}

/// How automatic snapshots are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AutoPolicy {
    /// Seconds between two; 0 turns them off.
    pub interval_secs: u64,
    /// Seconds each is kept.
    pub retention_secs: u64,
}

/// One traced image's traces now, for system-wide views and automatic
/// snapshots.
struct ImageNow {
    key: (u32, u32),
    start_time: u64,
    comm: String,
    snapshot: Snapshot,
    traced_memory: (u64, u64),
    /// Events of the image lost since its tracing began.
    drops: u64,
}

/// `get_tracemalloc_memory()`: what tracing costs, in bytes.
#[derive(Clone, Debug, Serialize)]
pub struct TracerMemory {
    /// Memory the kernel charges for tracerd's BPF maps (`memlock` of each).
    pub kernel_maps: u64,
    /// tracerd's resident memory (stored snapshots, symbol caches, ...).
    pub daemon_rss: u64,
    /// The sum: tracemalloc's `get_tracemalloc_memory()`.
    pub total: u64,
    /// Each map: id, type, max_entries, memlock bytes.
    pub maps: Vec<crate::sys::procfs::BpfMapInfo>,
    /// Snapshots held by the store, and their traces.
    pub stored_snapshots: usize,
    /// Traces in stored snapshots.
    pub stored_traces: usize,
}

/// Cuts every traceback of `snapshot` to `limit` frames (one new `Arc` per
/// distinct traceback); `traceback_limit` becomes `limit`.
fn truncate(snapshot: Snapshot, limit: u32) -> Snapshot {
    let limit_usize = limit as usize;
    if snapshot
        .traces()
        .iter()
        .all(|t| t.traceback.frames().len() <= limit_usize)
    {
        // Nothing to cut: the snapshot and its index stay as they are.
        let mut snapshot = snapshot;
        snapshot.traceback_limit = limit;
        return snapshot;
    }
    let mut cut: HashMap<*const Traceback, Arc<Traceback>> = HashMap::new();
    let traces = snapshot
        .into_traces()
        .into_iter()
        .map(|t| {
            let traceback = if t.traceback.frames().len() <= limit_usize {
                t.traceback
            } else {
                Arc::clone(cut.entry(Arc::as_ptr(&t.traceback)).or_insert_with(|| {
                    let frames = t
                        .traceback
                        .frames()
                        .iter()
                        .take(limit_usize)
                        .cloned()
                        .collect();
                    Arc::new(Traceback::new(frames, t.traceback.total_nframe()))
                }))
            };
            Trace {
                domain: t.domain,
                size: t.size,
                traceback,
            }
        })
        .collect();
    Snapshot::new(traces, limit)
}

impl Daemon {
    /// The image a query for `pid` means: (pid, gen) and whether it ended.
    fn image_of(&self, pid: u32) -> Result<((u32, u32), Option<&'static str>), ViewError> {
        let registry = lock(&self.registry);
        let image = registry.get(pid).ok_or(DaemonError::NotTraced { pid })?;
        let ended = image.ended.as_ref().map(|e| match e.reason {
            crate::registry::EndReason::Exit => "exited",
            crate::registry::EndReason::Exec => "exec",
        });
        Ok(((image.pid, image.gen_), ended))
    }

    /// The process view of `pid` with traced memory as tracemalloc reports
    /// it (cleared blocks subtracted; zeros while not tracing).
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`].
    pub fn process_adjusted(&self, pid: u32) -> Result<ProcessView, ViewError> {
        let view = self.process(pid)?;
        let (key, _) = self.image_of(pid)?;
        Ok(self.adjust_view(view, key))
    }

    fn adjust_view(&self, mut view: ProcessView, key: (u32, u32)) -> ProcessView {
        let control = lock(&self.control);
        let (current, peak, blocks) = control.adjust(key, view.current, view.peak, view.blocks);
        view.current = current;
        view.peak = peak;
        view.blocks = blocks;
        view
    }

    /// Every traced process ([`Daemon::processes`]) with traced memory as
    /// tracemalloc reports it, and its tracing state.
    pub fn processes_adjusted(&self) -> Vec<(ProcessView, Tracing)> {
        let views = self.processes();
        let keys: HashMap<u32, u32> = {
            let registry = lock(&self.registry);
            registry.live().map(|i| (i.pid, i.gen_)).collect()
        };
        views
            .into_iter()
            .map(|v| {
                let key = (v.pid, keys.get(&v.pid).copied().unwrap_or(u32::MAX));
                let tracing = lock(&self.control).of(key);
                (self.adjust_view(v, key), tracing)
            })
            .collect()
    }

    /// `take_snapshot()` of a scope, honouring `stop()` and the traceback
    /// limit of `start(nframe)`.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`], [`ViewError::TracingStopped`].
    pub fn snapshot_now(&self, scope: Scope) -> Result<Now, ViewError> {
        match scope {
            Scope::Process(pid) => {
                let (key, _) = self.image_of(pid)?;
                let tracing = lock(&self.control).of(key);
                if !tracing.is_tracing {
                    return Err(ViewError::TracingStopped { pid: Some(pid) });
                }
                let taken = self.take_snapshot(pid)?;
                let at = SystemTime::now();
                let process = self.adjust_view(taken.process, (pid, taken.gen_));
                let snapshot = Arc::unwrap_or_clone(taken.snapshot);
                Ok(Now {
                    snapshot: Arc::new(truncate(snapshot, tracing.traceback_limit)),
                    traced_memory: (process.current, process.peak),
                    completeness: Completeness::of_process(pid, process.drops),
                    process: Some(process),
                    image: Some(((pid, taken.gen_), taken.start_time)),
                    pids: vec![pid],
                    at,
                })
            }
            Scope::System => {
                let control = lock(&self.control).clone();
                let system = control.system();
                let any_tracing =
                    system.is_tracing || control.overrides().any(|(_, t)| t.is_tracing);
                if !any_tracing {
                    return Err(ViewError::TracingStopped { pid: None });
                }
                let images = self.images_now(None);
                let at = SystemTime::now();
                let mut traces = Vec::new();
                let mut pids = Vec::new();
                let (mut current, mut peak) = (0u64, 0u64);
                let mut completeness = Completeness::complete();
                for image in images {
                    pids.push(image.key.0);
                    completeness.add(image.key.0, image.drops);
                    current = current.saturating_add(image.traced_memory.0);
                    peak = peak.saturating_add(image.traced_memory.1);
                    traces.extend(image.snapshot.into_traces());
                }
                pids.sort_unstable();
                Ok(Now {
                    snapshot: Arc::new(Snapshot::new(traces, system.traceback_limit)),
                    process: None,
                    image: None,
                    pids,
                    traced_memory: (current, peak),
                    completeness,
                    at,
                })
            }
        }
    }

    /// The traces of every live, traced image (or of `only` these), in one
    /// pass over `LIVE_ALLOCS`, each symbolized with its own mappings and
    /// cut to its traceback limit.
    fn images_now(&self, only: Option<&HashSet<(u32, u32)>>) -> Vec<ImageNow> {
        let capture = self.capture();
        let mut registry = lock(&self.registry);
        let control = lock(&self.control).clone();
        let pids: Vec<u32> = registry
            .live()
            .filter(|i| control.of((i.pid, i.gen_)).is_tracing)
            .filter(|i| only.is_none_or(|o| o.contains(&(i.pid, i.gen_))))
            .map(|i| i.pid)
            .collect();
        let mut images = Vec::with_capacity(pids.len());
        for pid in pids {
            if let Some(image) = registry.get_mut(pid) {
                image.refresh_maps();
                images.push(image.clone());
            }
        }
        drop(registry);
        let want: HashSet<(u32, u32)> = images.iter().map(|i| (i.pid, i.gen_)).collect();
        let entries = if want.is_empty() {
            Vec::new()
        } else {
            capture.live_blocks(Some(&want))
        };
        let mut by_image: HashMap<(u32, u32), Vec<_>> = HashMap::new();
        for (key, info) in entries {
            by_image
                .entry((key.tgid, info.gen_))
                .or_default()
                .push((key, info));
        }
        let mut blocks = Vec::with_capacity(images.len());
        for image in &images {
            let key = (image.pid, image.gen_);
            let entries = by_image.remove(&key).unwrap_or_default();
            let stats = live_stats(&capture, image);
            blocks.push((raw_blocks(&capture, &entries), stats));
        }
        drop(capture);
        images
            .into_iter()
            .zip(blocks)
            .map(|(image, (raw, stats))| {
                let key = (image.pid, image.gen_);
                let tracing = control.of(key);
                let snapshot = self.build_snapshot(image.pid, &raw, image.maps.as_deref());
                let (current, peak, _) =
                    control.adjust(key, stats.current, stats.peak, stats.blocks);
                ImageNow {
                    key,
                    start_time: image.start_time,
                    comm: image.comm.clone(),
                    snapshot: truncate(snapshot, tracing.traceback_limit),
                    traced_memory: (current, peak),
                    drops: stats.drops,
                }
            })
            .collect()
    }

    /// `take_snapshot()` of a scope, stored under the next id with `label`.
    ///
    /// # Errors
    /// As [`Daemon::snapshot_now`]; [`StoreError`] for the label or file.
    pub fn store_now(
        &self,
        scope: Scope,
        label: Option<String>,
    ) -> Result<SnapshotSummary, ViewError> {
        if let Some(label) = &label {
            crate::store::check_label(label)?;
        }
        let now = self.snapshot_now(scope)?;
        let (pid, gen_, start_time) = match now.image {
            Some(((pid, gen_), start)) => (pid, gen_, start),
            None => (0, 0, 0),
        };
        let stored = StoredSnapshot {
            id: 0,
            pid,
            start_time,
            gen_,
            taken_at: now.at,
            traced_memory: now.traced_memory,
            completeness: now.completeness,
            snapshot: now.snapshot,
        };
        let mut info = SnapshotInfo::new(SnapshotKind::Taken, now.image.map(|(k, _)| k));
        info.label = label;
        info.comm = now.process.map(|p| p.comm);
        let mut store = lock(&self.store);
        let id = store.add(stored, info)?;
        store
            .summary(id)
            .ok_or(ViewError::Daemon(DaemonError::SnapshotNotFound { id }))
    }

    /// Loads a snapshot file (tracer's format, or a tracemalloc pickle when
    /// `tracemalloc`) into the store with `label`. Nothing of the file is
    /// executed; a refused file changes nothing.
    ///
    /// # Errors
    /// [`ViewError::Dump`] / [`ViewError::Pickle`] for a refused file,
    /// [`StoreError`] for the label or the file write.
    pub fn load_snapshot(
        &self,
        bytes: &[u8],
        tracemalloc: bool,
        label: Option<String>,
    ) -> Result<SnapshotSummary, ViewError> {
        if let Some(label) = &label {
            crate::store::check_label(label)?;
        }
        // A tracemalloc file has no notion of loss: it is complete.
        let (snapshot, meta, format) = if tracemalloc {
            (load_tracemalloc(bytes)?, json!({}), "tracemalloc")
        } else {
            let decoded = decode(bytes)?;
            (decoded.snapshot, decoded.meta, "tracer")
        };
        let field = |name: &str| meta.get(name).and_then(Value::as_u64);
        let traced_memory = meta
            .get("traced_memory")
            .and_then(Value::as_array)
            .map(|t| {
                (
                    t.first().and_then(Value::as_u64).unwrap_or(0),
                    t.get(1).and_then(Value::as_u64).unwrap_or(0),
                )
            });
        let size = snapshot
            .traces()
            .iter()
            .fold(0u64, |acc, t| acc.saturating_add(t.size));
        let stored = StoredSnapshot {
            id: 0,
            pid: 0,
            start_time: 0,
            gen_: 0,
            taken_at: field("taken_at_ms").map_or_else(SystemTime::now, |ms| {
                SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
            }),
            traced_memory: traced_memory.unwrap_or((size, size)),
            completeness: Completeness::from_meta(&meta),
            snapshot: Arc::new(snapshot),
        };
        let mut info = SnapshotInfo::new(SnapshotKind::Loaded, None);
        info.label = label;
        info.comm = meta.get("comm").and_then(Value::as_str).map(str::to_string);
        info.source_format = Some(format);
        let mut store = lock(&self.store);
        let id = store.add(stored, info)?;
        store
            .summary(id)
            .ok_or(ViewError::Daemon(DaemonError::SnapshotNotFound { id }))
    }

    /// The id a reference names.
    ///
    /// # Errors
    /// [`DaemonError::SnapshotNotFound`], [`StoreError::LabelNotFound`].
    pub fn resolve(&self, reference: &SnapshotRef) -> Result<u64, ViewError> {
        let store = lock(&self.store);
        match reference {
            SnapshotRef::Id(id) => store
                .get(*id)
                .map(|_| *id)
                .ok_or(ViewError::Daemon(DaemonError::SnapshotNotFound { id: *id })),
            SnapshotRef::Label(label) => store.id_of_label(label).ok_or_else(|| {
                StoreError::LabelNotFound {
                    label: label.clone(),
                }
                .into()
            }),
        }
    }

    /// A stored snapshot and its summary.
    ///
    /// # Errors
    /// As [`Daemon::resolve`].
    pub fn stored(
        &self,
        reference: &SnapshotRef,
    ) -> Result<(StoredSnapshot, SnapshotSummary), ViewError> {
        let id = self.resolve(reference)?;
        let store = lock(&self.store);
        let stored = store
            .get(id)
            .cloned()
            .ok_or(DaemonError::SnapshotNotFound { id })?;
        let summary = store
            .summary(id)
            .ok_or(DaemonError::SnapshotNotFound { id })?;
        Ok((stored, summary))
    }

    /// Summaries of stored snapshots, oldest first: all, or those of `pid`'s
    /// current image.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`] for an unknown pid.
    pub fn list_snapshots(&self, pid: Option<u32>) -> Result<Vec<SnapshotSummary>, ViewError> {
        match pid {
            None => Ok(lock(&self.store).summaries()),
            Some(pid) => {
                let (key, _) = self.image_of(pid)?;
                let store = lock(&self.store);
                let ids: Vec<u64> = store
                    .of_image_all(key.0, key.1)
                    .map(|(s, _)| s.id)
                    .collect();
                Ok(ids.into_iter().filter_map(|id| store.summary(id)).collect())
            }
        }
    }

    /// Files of the state directory that were refused at start.
    pub fn unreadable_snapshots(&self) -> Vec<crate::store::Unreadable> {
        lock(&self.store).unreadable().to_vec()
    }

    /// Sets or removes a label.
    ///
    /// # Errors
    /// As [`SnapshotStore::set_label`].
    pub fn label_snapshot(
        &self,
        reference: &SnapshotRef,
        label: Option<String>,
    ) -> Result<SnapshotSummary, ViewError> {
        let id = self.resolve(reference)?;
        Ok(lock(&self.store).set_label(id, label)?)
    }

    /// Deletes a stored snapshot and its file.
    ///
    /// # Errors
    /// As [`SnapshotStore::remove`].
    pub fn delete_snapshot(&self, reference: &SnapshotRef) -> Result<SnapshotSummary, ViewError> {
        let id = self.resolve(reference)?;
        Ok(lock(&self.store).remove(id)?)
    }

    /// A stored snapshot that must be of `pid`'s current image (for
    /// `/pid/{pid}/compare`).
    fn stored_of_image(&self, pid: u32, reference: &SnapshotRef) -> Result<Side, ViewError> {
        let (key, _) = self.image_of(pid)?;
        let id = self.resolve(reference)?;
        let store = lock(&self.store);
        let stored = store.get(id).ok_or(DaemonError::SnapshotNotFound { id })?;
        let info = store.info(id).ok_or(DaemonError::SnapshotNotFound { id })?;
        if info.image != Some(key) {
            let reason = match (info.image, stored.pid) {
                (Some((p, _)), _) if p == pid => {
                    "an earlier image of this pid (exec or pid reuse)".to_string()
                }
                (Some((p, _)), _) => format!("it is of pid {p}"),
                (None, 0) => format!(
                    "it is {}",
                    if info.kind == SnapshotKind::Loaded {
                        "loaded from a file"
                    } else {
                        "system-wide"
                    }
                ),
                (None, p) => format!("it is of pid {p} in an earlier run of tracerd"),
            };
            return Err(ViewError::WrongScope { id, pid, reason });
        }
        Ok(stored_side(stored, info))
    }

    /// The two sides of `/pid/{pid}/compare` or `/compare`: `new` (None:
    /// now) against the base `spec` says.
    ///
    /// # Errors
    /// Unknown pid or snapshot, a snapshot of another scope, tracing
    /// stopped.
    pub fn compare_sides(
        &self,
        scope: Scope,
        base: &BaseSpec,
        new: Option<&SnapshotRef>,
    ) -> Result<(Side, Side), ViewError> {
        let new_side = match (scope, new) {
            (Scope::Process(pid), Some(reference)) => self.stored_of_image(pid, reference)?,
            (Scope::System, Some(reference)) => {
                let (stored, _) = self.stored(reference)?;
                let store = lock(&self.store);
                let info = store
                    .info(stored.id)
                    .cloned()
                    .unwrap_or_else(|| SnapshotInfo::new(SnapshotKind::Taken, None));
                stored_side(&stored, &info)
            }
            (scope, None) => {
                let now = self.snapshot_now(scope)?;
                Side {
                    snapshot: now.snapshot,
                    info: json!({"kind": "now", "at_ms": unix_ms(now.at)}),
                    completeness: now.completeness,
                }
            }
        };
        let limit = new_side.snapshot.traceback_limit();
        let base_side = match (scope, base) {
            (Scope::Process(pid), BaseSpec::Snapshot(reference)) => {
                self.stored_of_image(pid, reference)?
            }
            (Scope::System, BaseSpec::Snapshot(reference)) => {
                let (stored, _) = self.stored(reference)?;
                let store = lock(&self.store);
                let info = store
                    .info(stored.id)
                    .cloned()
                    .unwrap_or_else(|| SnapshotInfo::new(SnapshotKind::Taken, None));
                stored_side(&stored, &info)
            }
            (Scope::Process(pid), BaseSpec::Default) => {
                let (key, _) = self.image_of(pid)?;
                let store = lock(&self.store);
                let latest = store.of_image(key.0, key.1).last().map(|s| s.id);
                match latest.and_then(|id| Some((store.get(id)?, store.info(id)?))) {
                    Some((stored, info)) => stored_side(stored, info),
                    None => {
                        drop(store);
                        let first_seen = self.process(pid)?.first_seen_ms;
                        empty_side(limit, first_seen)
                    }
                }
            }
            (Scope::System, BaseSpec::Default) => {
                let store = lock(&self.store);
                let latest = store
                    .iter()
                    .filter(|(s, i)| {
                        s.pid == 0 && i.kind == SnapshotKind::Taken && i.image.is_none()
                    })
                    .filter(|(s, _)| s.taken_at >= self.started_at)
                    .last()
                    .map(|(s, i)| stored_side(s, i));
                latest.unwrap_or_else(|| empty_side(limit, unix_ms(self.started_at)))
            }
            (scope, BaseSpec::Since(ago)) => self.since_side(scope, *ago, limit)?,
        };
        Ok((base_side, new_side))
    }

    /// The state `ago` before now, from stored snapshots (automatic ones
    /// included): per image, the latest one taken at or before then, else
    /// the empty state when tracing of the image began.
    fn since_side(&self, scope: Scope, ago: Duration, limit: u32) -> Result<Side, ViewError> {
        let now = SystemTime::now();
        let cutoff = now.checked_sub(ago).unwrap_or(SystemTime::UNIX_EPOCH);
        let keys: Vec<((u32, u32), u64)> = match scope {
            Scope::Process(pid) => {
                let (key, _) = self.image_of(pid)?;
                vec![(key, self.process(pid)?.first_seen_ms)]
            }
            Scope::System => {
                let registry = lock(&self.registry);
                let control = lock(&self.control);
                let cutoff_ms = unix_ms(cutoff);
                registry
                    .live()
                    .filter(|i| control.of((i.pid, i.gen_)).is_tracing)
                    .map(|i| ((i.pid, i.gen_), unix_ms(i.first_seen)))
                    .chain(
                        // Images alive at the cutoff that have ended since.
                        registry
                            .ended()
                            .filter(|i| i.ended.as_ref().is_some_and(|e| unix_ms(e.at) > cutoff_ms))
                            .map(|i| ((i.pid, i.gen_), unix_ms(i.first_seen))),
                    )
                    .collect()
            }
        };
        let store = lock(&self.store);
        let mut traces = Vec::new();
        let mut parts = Vec::new();
        let mut completeness = Completeness::complete();
        for (key, first_seen_ms) in keys {
            let found = store
                .of_image_all(key.0, key.1)
                .filter(|(s, _)| s.taken_at <= cutoff)
                .last();
            match found {
                Some((stored, info)) => {
                    traces.extend(stored.snapshot.traces().iter().cloned());
                    completeness.merge(&stored.completeness);
                    parts.push(json!({"pid": key.0, "kind": "snapshot", "id": stored.id,
                        "snapshot_kind": info.kind, "taken_at_ms": unix_ms(stored.taken_at)}));
                }
                None => parts
                    .push(json!({"pid": key.0, "kind": "tracing_start", "at_ms": first_seen_ms})),
            }
        }
        let info = match (scope, parts.as_slice()) {
            (Scope::Process(_), [part]) => {
                let mut part = part.clone();
                if let Some(map) = part.as_object_mut() {
                    map.remove("pid");
                    map.insert("since_ms".into(), json!(unix_ms(cutoff)));
                }
                part
            }
            _ => json!({"kind": "since", "since_ms": unix_ms(cutoff), "processes": parts}),
        };
        Ok(Side {
            snapshot: Arc::new(Snapshot::new(traces, limit)),
            info,
            completeness,
        })
    }

    /// Takes one automatic snapshot of every traced live image (one pass
    /// over the kernel map) and drops those past `retention`. Returns how
    /// many were taken.
    pub fn auto_snapshots(&self, retention: Duration) -> usize {
        let images = self.images_now(None);
        let at = SystemTime::now();
        let mut store = lock(&self.store);
        let mut taken = 0;
        for image in images {
            let stored = StoredSnapshot {
                id: 0,
                pid: image.key.0,
                start_time: image.start_time,
                gen_: image.key.1,
                taken_at: at,
                traced_memory: image.traced_memory,
                completeness: Completeness::of_process(image.key.0, image.drops),
                snapshot: Arc::new(image.snapshot),
            };
            let mut info = SnapshotInfo::new(SnapshotKind::Auto, Some(image.key));
            info.comm = Some(image.comm);
            match store.add(stored, info) {
                Ok(_) => taken += 1,
                Err(err) => {
                    tracing::warn!(pid = image.key.0, err = %err, "automatic snapshot not stored")
                }
            }
        }
        let expired = store.expire_auto(at, retention);
        tracing::debug!(taken, expired, "automatic snapshots");
        taken
    }

    /// `tracemalloc.is_tracing()` and `get_traceback_limit()`: system-wide
    /// (None) or of `pid`'s image.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`].
    pub fn tracing_state(&self, pid: Option<u32>) -> Result<Value, ViewError> {
        let control = lock(&self.control).clone();
        match pid {
            Some(pid) => {
                let (key, _) = self.image_of(pid)?;
                let state = control.of(key);
                Ok(
                    json!({"pid": pid, "is_tracing": state.is_tracing, "traceback_limit": state.traceback_limit,
                          "max_nframe": control.kernel_nframe()}),
                )
            }
            None => {
                let system = control.system();
                let mut overrides: Vec<Value> = control
                    .overrides()
                    .map(|((pid, _), t)| json!({"pid": pid, "is_tracing": t.is_tracing, "traceback_limit": t.traceback_limit}))
                    .collect();
                overrides.sort_by_key(|v| v["pid"].as_u64());
                Ok(
                    json!({"is_tracing": system.is_tracing, "traceback_limit": system.traceback_limit,
                          "max_nframe": control.kernel_nframe(), "processes": overrides}),
                )
            }
        }
    }

    /// `tracemalloc.start(nframe)`: system-wide or of `pid`'s image. When
    /// tracing already, nothing changes (as in tracemalloc); else what the
    /// kernel recorded while stopped is cleared first, so tracing starts
    /// from nothing. Returns whether it started.
    ///
    /// # Errors
    /// [`ViewError::BadNframe`], [`DaemonError::NotTraced`],
    /// [`ViewError::Ended`].
    pub fn start_tracing(&self, pid: Option<u32>, nframe: Option<u64>) -> Result<bool, ViewError> {
        let max = lock(&self.control).kernel_nframe();
        let nframe = match nframe {
            None => max,
            Some(n) => match u32::try_from(n) {
                Ok(n) if (1..=max).contains(&n) => n,
                _ => return Err(ViewError::BadNframe { nframe: n, max }),
            },
        };
        match pid {
            Some(pid) => {
                let (key, ended) = self.image_of(pid)?;
                if let Some(state) = ended {
                    return Err(ViewError::Ended { pid, state });
                }
                if lock(&self.control).of(key).is_tracing {
                    return Ok(false);
                }
                self.clear_images(&HashSet::from([key]));
                Ok(lock(&self.control).start_image(key, nframe))
            }
            None => {
                {
                    let control = lock(&self.control);
                    let system = control.system();
                    if system.is_tracing && control.overrides().all(|(_, t)| t.is_tracing) {
                        return Ok(false);
                    }
                }
                // Clear every image that is not tracing now.
                let stopped: HashSet<(u32, u32)> = {
                    let registry = lock(&self.registry);
                    let control = lock(&self.control);
                    registry
                        .live()
                        .map(|i| (i.pid, i.gen_))
                        .filter(|k| !control.of(*k).is_tracing)
                        .collect()
                };
                self.clear_images(&stopped);
                Ok(lock(&self.control).start_system(nframe))
            }
        }
    }

    /// `tracemalloc.stop()`: system-wide or of `pid`'s image; clears its
    /// traces, as tracemalloc does.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`], [`ViewError::Ended`].
    pub fn stop_tracing(&self, pid: Option<u32>) -> Result<(), ViewError> {
        match pid {
            Some(pid) => {
                let (key, ended) = self.image_of(pid)?;
                if let Some(state) = ended {
                    return Err(ViewError::Ended { pid, state });
                }
                lock(&self.control).stop_image(key);
                self.clear_images(&HashSet::from([key]));
            }
            None => {
                lock(&self.control).stop_system();
                let all: HashSet<(u32, u32)> = lock(&self.registry)
                    .live()
                    .map(|i| (i.pid, i.gen_))
                    .collect();
                self.clear_images(&all);
            }
        }
        Ok(())
    }

    /// `tracemalloc.clear_traces()` of `pid`: its blocks leave the kernel
    /// map, its traced memory (current and peak) restarts from 0. Returns
    /// the number of blocks cleared.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`], [`ViewError::Ended`].
    pub fn clear_traces(&self, pid: u32) -> Result<u64, ViewError> {
        let (key, ended) = self.image_of(pid)?;
        if let Some(state) = ended {
            return Err(ViewError::Ended { pid, state });
        }
        Ok(self.clear_images(&HashSet::from([key])))
    }

    /// Removes the blocks of `images` from `LIVE_ALLOCS` (one key at a time,
    /// so that only blocks really removed, not freed meanwhile, are counted
    /// in the offsets), and resets their kernel peak.
    fn clear_images(&self, images: &HashSet<(u32, u32)>) -> u64 {
        if images.is_empty() {
            return 0;
        }
        let mut capture = self.capture();
        let entries = capture.live_blocks(Some(images));
        let mut removed: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
        for (key, info) in entries {
            if capture.remove_blocks(&[key]) == 1 {
                let slot = removed.entry((key.tgid, info.gen_)).or_default();
                slot.0 = slot.0.saturating_add(info.size);
                slot.1 += 1;
            }
        }
        for (pid, _) in images {
            capture.reset_peak(*pid);
        }
        let mut control = lock(&self.control);
        let mut total = 0;
        for (key, (bytes, blocks)) in removed {
            control.add_offset(key, bytes, blocks);
            total += blocks;
        }
        total
    }

    /// `tracemalloc.reset_peak()` of `pid`: its peak becomes its current
    /// traced memory.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`], [`ViewError::Ended`].
    pub fn reset_peak_of(&self, pid: u32) -> Result<ProcessView, ViewError> {
        let (_, ended) = self.image_of(pid)?;
        if let Some(state) = ended {
            return Err(ViewError::Ended { pid, state });
        }
        self.capture().reset_peak(pid);
        self.process_adjusted(pid)
    }

    /// `tracemalloc.get_object_traceback()`: the trace of the block of
    /// `pid` that starts at `address`.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`], [`ViewError::Ended`],
    /// [`ViewError::TracingStopped`], [`ViewError::NoBlock`].
    pub fn object_traceback(&self, pid: u32, address: u64) -> Result<Trace, ViewError> {
        let (key, ended) = self.image_of(pid)?;
        if let Some(state) = ended {
            return Err(ViewError::Ended { pid, state });
        }
        let tracing = lock(&self.control).of(key);
        if !tracing.is_tracing {
            return Err(ViewError::TracingStopped { pid: Some(pid) });
        }
        let capture = self.capture();
        let mut registry = lock(&self.registry);
        let entries: Vec<_> = capture
            .live_blocks(Some(&HashSet::from([key])))
            .into_iter()
            .filter(|(k, _)| k.addr == address)
            .collect();
        if entries.is_empty() {
            return Err(ViewError::NoBlock { pid, address });
        }
        let image = registry
            .get_mut(pid)
            .ok_or(DaemonError::NotTraced { pid })?;
        image.refresh_maps();
        let maps = image.maps.clone();
        drop(registry);
        let blocks = raw_blocks(&capture, &entries);
        drop(capture);
        let snapshot = truncate(
            self.build_snapshot(pid, &blocks, maps.as_deref()),
            tracing.traceback_limit,
        );
        snapshot
            .into_traces()
            .into_iter()
            .next()
            .ok_or(ViewError::NoBlock { pid, address })
    }

    /// `tracemalloc.get_tracemalloc_memory()`: the kernel memory of
    /// tracerd's BPF maps plus tracerd's resident memory.
    pub fn tracer_memory(&self) -> TracerMemory {
        let maps = crate::sys::procfs::bpf_maps_of_self();
        let kernel_maps = maps.iter().map(|m| m.memlock).sum();
        let daemon_rss = crate::sys::procfs::self_rss().unwrap_or(0);
        let store = lock(&self.store);
        let stored_traces = store.iter().map(|(s, _)| s.snapshot.traces().len()).sum();
        TracerMemory {
            kernel_maps,
            daemon_rss,
            total: kernel_maps + daemon_rss,
            maps,
            stored_snapshots: store.len(),
            stored_traces,
        }
    }
}

/// What a compare side says about a stored snapshot.
fn snapshot_side(stored: &StoredSnapshot, info: &SnapshotInfo) -> Value {
    json!({"kind": "snapshot", "id": stored.id, "snapshot_kind": info.kind, "label": info.label,
           "taken_at_ms": unix_ms(stored.taken_at)})
}

/// A stored snapshot as a compare side.
fn stored_side(stored: &StoredSnapshot, info: &SnapshotInfo) -> Side {
    Side {
        snapshot: Arc::clone(&stored.snapshot),
        info: snapshot_side(stored, info),
        completeness: stored.completeness.clone(),
    }
}

/// The empty state when tracing began: nothing lost yet.
fn empty_side(limit: u32, at_ms: u64) -> Side {
    Side {
        snapshot: Arc::new(Snapshot::new(Vec::new(), limit)),
        info: json!({"kind": "tracing_start", "at_ms": at_ms}),
        completeness: Completeness::complete(),
    }
}

/// Opens the store in `state_dir` and starts automatic snapshots: what
/// `tracerd` does once at start, inside its tokio runtime.
///
/// # Errors
/// [`StoreError::Io`] if the state directory cannot be used.
pub fn start(daemon: &Arc<Daemon>, state_dir: &Path, policy: AutoPolicy) -> Result<(), StoreError> {
    let store = SnapshotStore::open(state_dir)?;
    for bad in store.unreadable() {
        tracing::error!(target = %bad.path.display(), err = %bad.error, "stored snapshot not loaded");
    }
    tracing::info!(
        snapshots = store.len(),
        refused = store.unreadable().len(),
        "snapshot store opened"
    );
    *lock(&daemon.store) = store;
    if policy.interval_secs > 0 {
        let daemon = Arc::clone(daemon);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(policy.interval_secs));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is immediate: skip it (nothing is traced yet).
            tick.tick().await;
            loop {
                tick.tick().await;
                let daemon = Arc::clone(&daemon);
                let retention = Duration::from_secs(policy.retention_secs);
                let _ = tokio::task::spawn_blocking(move || daemon.auto_snapshots(retention)).await;
            }
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (STYLE.md).
mod tests {
    use super::*;
    use tracer_model::Frame;

    #[test]
    fn truncate_cuts_each_distinct_traceback_once_and_keeps_total_nframe() {
        let deep = Arc::new(Traceback::new(
            (0..5).map(|i| Frame::new("a.c", i)).collect(),
            Some(9),
        ));
        let short = Arc::new(Traceback::new(vec![Frame::new("b.c", 1)], Some(1)));
        let traces = vec![
            Trace {
                domain: 1,
                size: 1,
                traceback: Arc::clone(&deep),
            },
            Trace {
                domain: 1,
                size: 2,
                traceback: Arc::clone(&short),
            },
            Trace {
                domain: 1,
                size: 3,
                traceback: deep,
            },
        ];
        let cut = truncate(Snapshot::new(traces, 16), 2);
        assert_eq!(cut.traceback_limit(), 2);
        let t = cut.traces();
        assert_eq!(
            t[0].traceback
                .frames()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["a.c:0", "a.c:1"]
        );
        assert_eq!(t[0].traceback.total_nframe(), Some(9));
        assert!(Arc::ptr_eq(&t[0].traceback, &t[2].traceback));
        assert!(Arc::ptr_eq(&t[1].traceback, &short));
    }

    #[test]
    fn errors_say_what_tracemalloc_says() {
        assert_eq!(
            ViewError::BadNframe { nframe: 0, max: 16 }.to_string(),
            "the number of frames must be in range [1; 16], got 0"
        );
        assert_eq!(
            ViewError::TracingStopped { pid: Some(7) }.to_string(),
            "tracing is stopped for pid 7: no snapshot can be taken"
        );
    }
}
