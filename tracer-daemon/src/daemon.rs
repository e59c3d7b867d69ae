//! The daemon's state and the work behind every route: handling process
//! events from the kernel, and turning kernel maps into tracemalloc
//! snapshots (read blocks → read stacks → symbolize → [`Snapshot`]).
//!
//! Every method here blocks (map syscalls, DWARF): call them from
//! `spawn_blocking`.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::SystemTime,
};

use serde::Serialize;
use tracer_common::{AllocInfo, AllocKey, ProcEvent, ProcEventKind, ProcStats, STACK_ID_NONE};

use crate::{
    capture::Capture,
    registry::{EndEvent, EndReason, ProcessImage, RawBlock, Registry},
    store::{SnapshotStore, SnapshotSummary, StoredSnapshot, unix_ms},
    symbolize::Symbolizer,
    sys::modules::ModuleMaps,
};
use tracer_model::{Completeness, Frame, FrameExtra, Snapshot, Trace, Traceback};

/// Errors of the daemon's operations; [`crate::api`] maps them to statuses.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No allocation of this pid was seen since tracerd started, and no
    /// ended image of it is retained.
    #[error("pid {pid} is not traced: no allocation seen from it since tracerd started")]
    NotTraced {
        /// The pid asked for.
        pid: u32,
    },
    /// No stored snapshot has this id.
    #[error("no snapshot with id {id}")]
    SnapshotNotFound {
        /// The id asked for.
        id: u64,
    },
    /// The snapshot exists but is of another process (or an earlier image of
    /// this pid).
    #[error("snapshot {id} is of pid {of_pid}, another process than pid {pid} now")]
    SnapshotOfOtherProcess {
        /// The snapshot id.
        id: u64,
        /// The process it is of.
        of_pid: u32,
        /// The process asked about.
        pid: u32,
    },
    /// The model refused the request (e.g. cumulative with traceback).
    #[error(transparent)]
    Model(#[from] tracer_model::ModelError),
}

/// A process as the API lists it.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessView {
    /// Process id.
    pub pid: u32,
    /// `/proc/PID/comm` when first seen.
    pub comm: String,
    /// `/proc/PID/exe` when first seen.
    pub exe: Option<String>,
    /// "alive", or "exited"/"exec" once the image ended.
    pub state: &'static str,
    /// Unix ms of the first allocation seen.
    pub first_seen_ms: u64,
    /// Unix ms the image ended, if it did.
    pub ended_ms: Option<u64>,
    /// Bytes in live blocks (`get_traced_memory()[0]`).
    pub current: u64,
    /// Peak of `current` in bytes (`get_traced_memory()[1]`).
    pub peak: u64,
    /// Live blocks.
    pub blocks: u64,
    /// Allocations seen.
    pub allocs: u64,
    /// Frees of traced blocks seen.
    pub frees: u64,
    /// Frees of untraced pointers.
    pub unknown_frees: u64,
    /// Blocks not traced because a kernel map was full.
    pub drops: u64,
    /// True when no event of this image was lost (`drops == 0`): its traces
    /// and totals are exact. False means the data undercounts.
    pub complete: bool,
}

/// A snapshot taken now, with what the API reports beside it.
#[derive(Clone, Debug)]
pub struct TakenSnapshot {
    /// The process view at that moment.
    pub process: ProcessView,
    /// The traces.
    pub snapshot: Arc<Snapshot>,
    /// Image identity, for the store.
    pub start_time: u64,
    /// Kernel generation of the image.
    pub gen_: u32,
}

/// The daemon's shared state. Lock order: capture, registry, control, store.
pub struct Daemon {
    pub(crate) capture: Mutex<Capture>,
    pub(crate) registry: Mutex<Registry>,
    pub(crate) store: Mutex<SnapshotStore>,
    /// tracemalloc's start/stop/clear_traces state (see [`crate::views`]).
    pub(crate) control: Mutex<crate::control::TracingControl>,
    pub(crate) symbolizer: Symbolizer,
    pub(crate) nframe: u32,
    /// Mean sampling interval in bytes; 0: exact.
    pub(crate) sample_interval: u64,
    /// Images whose blocks looked orphaned at the last sweep.
    orphans: Mutex<HashSet<(u32, u32)>>,
    /// Which processes are traced (see [`crate::scope`]).
    pub(crate) scope: Mutex<crate::scope::Scope>,
    /// When tracing began (wall clock).
    pub started_at: SystemTime,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock must not take the daemon down with it:
    // the data is still consistent enough to serve.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Daemon {
    /// A daemon over a loaded capture; ended images are kept for `retention`.
    pub fn new(capture: Capture, retention: std::time::Duration) -> Self {
        let nframe = capture.config().nframe;
        let sample_interval = capture.config().sample_interval;
        Self {
            capture: Mutex::new(capture),
            registry: Mutex::new(Registry::new(retention)),
            store: Mutex::new(SnapshotStore::default()),
            control: Mutex::new(crate::control::TracingControl::new(nframe)),
            symbolizer: Symbolizer::new(),
            nframe,
            sample_interval,
            orphans: Mutex::new(HashSet::new()),
            scope: Mutex::new(crate::scope::Scope::default()),
            started_at: SystemTime::now(),
        }
    }

    /// The capture (kernel side), locked.
    pub fn capture(&self) -> MutexGuard<'_, Capture> {
        lock(&self.capture)
    }

    /// The traceback limit in frames.
    pub fn nframe(&self) -> u32 {
        self.nframe
    }

    /// Handles a batch of kernel process events: new images are read from
    /// `/proc` first (while they live), then every ended image's blocks are
    /// collected and removed from `LIVE_ALLOCS` in one pass over the map.
    pub fn handle_events(&self, events: &[ProcEvent]) {
        let mut ends = Vec::new();
        for event in events {
            let kind = match event.kind {
                1 => ProcEventKind::New,
                2 => ProcEventKind::Exec,
                3 => ProcEventKind::Exit,
                4 => ProcEventKind::ExecAny,
                5 => ProcEventKind::Fork,
                _ => continue,
            };
            if matches!(kind, ProcEventKind::ExecAny | ProcEventKind::Fork) {
                self.scope_candidate(event.tgid, kind == ProcEventKind::Fork);
                continue;
            }
            if kind == ProcEventKind::New {
                let mut image = ProcessImage::capture(event.tgid, event.gen_);
                if image.comm.is_empty() {
                    // Gone before /proc could be read: the kernel's name.
                    let len = event
                        .comm
                        .iter()
                        .position(|&b| b == 0)
                        .unwrap_or(event.comm.len());
                    image.comm = String::from_utf8_lossy(&event.comm[..len]).into_owned();
                }
                tracing::debug!(pid = event.tgid, gen = event.gen_, comm = %image.comm, "new image");
                lock(&self.registry).add(image);
            } else if let Some(end) = EndEvent::new(kind, event.tgid, event.gen_, event.stats) {
                ends.push(end);
            }
        }
        if ends.is_empty() {
            return;
        }
        // One process can end twice in a batch (exec, then exit): key by
        // image, never by pid alone.
        let want: HashSet<(u32, u32)> = ends.iter().map(|e| (e.pid, e.gen_)).collect();
        let started = std::time::Instant::now();
        let mut capture = self.capture();
        let entries = capture.live_blocks(Some(&want));
        let scanned = started.elapsed();
        let mut by_image: HashMap<(u32, u32), Vec<(AllocKey, AllocInfo)>> = HashMap::new();
        for (key, info) in entries {
            by_image
                .entry((key.tgid, info.gen_))
                .or_default()
                .push((key, info));
        }
        let keys: Vec<AllocKey> = by_image.values().flatten().map(|(k, _)| *k).collect();
        let mut registry = lock(&self.registry);
        for end in ends {
            let entries = by_image.remove(&(end.pid, end.gen_)).unwrap_or_default();
            let blocks = raw_blocks(&capture, &entries);
            tracing::debug!(pid = end.pid, gen = end.gen_, blocks = blocks.len(), "image ended");
            registry.end(end, blocks);
        }
        drop(registry);
        let collected = started.elapsed();
        let removed = capture.remove_blocks(&keys);
        tracing::debug!(
            images = want.len(),
            removed,
            scan_ms = scanned.as_millis() as u64,
            collect_ms = (collected - scanned).as_millis() as u64,
            remove_ms = (started.elapsed() - collected).as_millis() as u64,
            "ended images removed from the kernel maps"
        );
    }

    /// Drops ended images past their retention.
    pub fn expire(&self) {
        lock(&self.registry).expire(SystemTime::now());
    }

    /// Removes blocks of images that ended without their end being handled
    /// here (an event lost to a full ring buffer): blocks whose (tgid,
    /// generation) is no longer in `PROCS` and is not a live image, seen so
    /// in two sweeps in a row (so an end event in flight is never raced).
    /// `PROCS` is read after `LIVE_ALLOCS`: a block's `PROCS` entry is
    /// created before the block, so a block of a live image always matches.
    /// Returns the number of blocks removed.
    pub fn sweep_orphans(&self) -> usize {
        self.prune_scope();
        let mut capture = self.capture();
        // Stacks are collected when STACKS is half full: the ids listed
        // *before* the scan of LIVE_ALLOCS that no block references. (A
        // block stored after the scan with such a stack shows no traceback
        // until that stack is stored again by its next allocation.)
        let stacks_before = (capture.map_usage_of_stacks() * 2 > u64::from(capture.max_stacks()))
            .then(|| capture.stack_ids());
        let entries = capture.live_blocks(None);
        if let Some(before) = stacks_before {
            let referenced: HashSet<u64> = entries.iter().map(|(_, info)| info.stack_id).collect();
            let unreferenced: Vec<u64> = before
                .into_iter()
                .filter(|id| !referenced.contains(id))
                .collect();
            let removed = capture.remove_stacks(&unreferenced);
            tracing::info!(
                removed,
                map = tracer_common::MAP_STACKS,
                "collected unreferenced stacks"
            );
        }
        let current: HashSet<(u32, u32)> = capture
            .all_proc_stats()
            .into_iter()
            .map(|(tgid, stats)| (tgid, stats.gen_))
            .collect();
        let registry = lock(&self.registry);
        let mut orphans = lock(&self.orphans);
        let mut seen = HashSet::new();
        let mut doomed = Vec::new();
        for (key, info) in entries {
            let image = (key.tgid, info.gen_);
            if current.contains(&image) || registry.has_live(image.0, image.1) {
                continue;
            }
            seen.insert(image);
            if orphans.contains(&image) {
                doomed.push(key);
            }
        }
        drop(registry);
        *orphans = seen;
        drop(orphans);
        capture.remove_blocks(&doomed)
    }

    /// Every traced process: live ones first by pid, then ended ones still
    /// retained.
    pub fn processes(&self) -> Vec<ProcessView> {
        let capture = self.capture();
        let registry = lock(&self.registry);
        let mut live: Vec<ProcessView> = registry
            .live()
            .map(|image| view(image, live_stats(&capture, image)))
            .collect();
        live.sort_by_key(|v| v.pid);
        live.extend(
            registry
                .ended()
                .map(|image| view(image, ended_stats(image))),
        );
        live
    }

    /// The view of `pid` now (its live image, else its last ended one).
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`].
    pub fn process(&self, pid: u32) -> Result<ProcessView, DaemonError> {
        let capture = self.capture();
        let registry = lock(&self.registry);
        let image = registry.get(pid).ok_or(DaemonError::NotTraced { pid })?;
        let stats = match image.ended {
            Some(_) => ended_stats(image),
            None => live_stats(&capture, image),
        };
        Ok(view(image, stats))
    }

    /// `take_snapshot()` of `pid`: every live block of its current image
    /// (or the blocks its last image had when it ended), symbolized.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`].
    pub fn take_snapshot(&self, pid: u32) -> Result<TakenSnapshot, DaemonError> {
        let capture = self.capture();
        let mut registry = lock(&self.registry);
        let image = registry
            .get_mut(pid)
            .ok_or(DaemonError::NotTraced { pid })?;
        let (blocks, stats) = match &image.ended {
            Some(ended) => (ended.blocks.clone(), ended.stats),
            None => {
                image.refresh_maps();
                let want = HashSet::from([(image.pid, image.gen_)]);
                let entries = capture.live_blocks(Some(&want));
                (raw_blocks(&capture, &entries), live_stats(&capture, image))
            }
        };
        drop(capture);
        let image = image.clone();
        drop(registry);
        let snapshot = self.build_snapshot(pid, &blocks, image.maps.as_deref());
        Ok(TakenSnapshot {
            process: view(&image, stats),
            snapshot: Arc::new(snapshot),
            start_time: image.start_time,
            gen_: image.gen_,
        })
    }

    /// Turns raw blocks into a [`Snapshot`]: one symbolization per distinct
    /// stack, tracebacks truncated to `nframe` frames, domain = pid.
    pub fn build_snapshot(
        &self,
        pid: u32,
        blocks: &[RawBlock],
        maps: Option<&ModuleMaps>,
    ) -> Snapshot {
        let mut tracebacks: HashMap<*const u64, Arc<Traceback>> = HashMap::new();
        let unknown = Arc::new(Traceback::new(vec![Frame::unknown()], Some(1)));
        let mean = self.sample_interval;
        if mean > 0 {
            return Snapshot::new(self.estimated_traces(pid, blocks, maps, mean), self.nframe);
        }
        let mut traces = Vec::with_capacity(blocks.len());
        for block in blocks {
            let traceback = match &block.stack {
                None => unknown.clone(),
                Some(stack) => tracebacks
                    .entry(stack.as_ptr())
                    .or_insert_with(|| Arc::new(self.traceback(stack, maps)))
                    .clone(),
            };
            traces.push(Trace {
                domain: pid,
                size: block.size,
                traceback,
            });
        }
        Snapshot::new(traces, self.nframe)
    }

    /// Sampled blocks to traces with unbiased estimates. A block of `s`
    /// bytes was sampled with probability p = 1 - exp(-s/mean), so it stands
    /// for 1/p blocks and s/p bytes (Horvitz-Thompson). Per traceback the
    /// estimates are summed, and the group is rebuilt as round(count)
    /// traces (at least 1) whose sizes add up to round(bytes): statistics
    /// and compare_to then report the estimated count and size.
    fn estimated_traces(
        &self,
        pid: u32,
        blocks: &[RawBlock],
        maps: Option<&ModuleMaps>,
        mean: u64,
    ) -> Vec<Trace> {
        let mut groups: HashMap<Option<*const u64>, EstimatedGroup> = HashMap::new();
        for block in blocks {
            let s = block.size as f64;
            let p = -(-s / mean as f64).exp_m1();
            let (count, bytes) = if p > 0.0 {
                (1.0 / p, s / p)
            } else {
                (mean as f64, 0.0)
            };
            let key = block.stack.as_ref().map(|stack| stack.as_ptr());
            let entry = groups
                .entry(key)
                .or_insert_with(|| (block.stack.clone(), 0.0, 0.0));
            entry.1 += count;
            entry.2 += bytes;
        }
        let mut traces = Vec::new();
        for (_, (stack, count, bytes)) in groups {
            let traceback = match &stack {
                Some(stack) => Arc::new(self.traceback(stack, maps)),
                None => Arc::new(Traceback::new(vec![Frame::unknown()], Some(1))),
            };
            let n = (count.round() as u64).max(1);
            let total = bytes.round() as u64;
            let (each, extra) = (total / n, total % n);
            for i in 0..n {
                let size = each + u64::from(i < extra);
                traces.push(Trace {
                    domain: pid,
                    size,
                    traceback: traceback.clone(),
                });
            }
        }
        traces
    }

    fn traceback(&self, stack: &[u64], maps: Option<&ModuleMaps>) -> Traceback {
        let limit = self.nframe as usize;
        let mut frames = Vec::new();
        if let Some(maps) = maps {
            for per_address in self.symbolizer.symbolize(maps, stack) {
                for sym in per_address {
                    frames.push(Frame {
                        filename: sym.filename,
                        lineno: sym.lineno,
                        extra: Some(Arc::new(FrameExtra {
                            function: sym.function,
                            module: sym.module,
                            address: Some(sym.address),
                        })),
                    });
                }
            }
        } else {
            frames.extend(stack.iter().map(|&address| Frame {
                extra: Some(Arc::new(FrameExtra {
                    function: None,
                    module: None,
                    address: Some(address),
                })),
                ..Frame::unknown()
            }));
        }
        if frames.is_empty() {
            frames.push(Frame::unknown());
        }
        let total = u32::try_from(frames.len()).unwrap_or(u32::MAX);
        frames.truncate(limit);
        Traceback::new(frames, Some(total))
    }

    /// `get_traced_memory()` of `pid`: (current, peak) in bytes.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`].
    pub fn traced_memory(&self, pid: u32) -> Result<(u64, u64), DaemonError> {
        let view = self.process(pid)?;
        Ok((view.current, view.peak))
    }

    /// `take_snapshot()` of `pid`, kept in the store.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`].
    pub fn store_snapshot(&self, pid: u32) -> Result<SnapshotSummary, DaemonError> {
        let taken = self.take_snapshot(pid)?;
        let stored = StoredSnapshot {
            id: 0,
            pid,
            start_time: taken.start_time,
            gen_: taken.gen_,
            taken_at: SystemTime::now(),
            traced_memory: (taken.process.current, taken.process.peak),
            completeness: Completeness::of_process(pid, taken.process.drops),
            snapshot: taken.snapshot,
        };
        let mut store = lock(&self.store);
        let id = store.insert(stored);
        store
            .get(id)
            .map(StoredSnapshot::summary)
            .ok_or(DaemonError::SnapshotNotFound { id })
    }

    /// Stored snapshots of the image `pid` means now, oldest first.
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`].
    pub fn snapshots_of(&self, pid: u32) -> Result<Vec<SnapshotSummary>, DaemonError> {
        let gen_ = self.gen_of(pid)?;
        Ok(lock(&self.store)
            .of_image(pid, gen_)
            .map(StoredSnapshot::summary)
            .collect())
    }

    fn gen_of(&self, pid: u32) -> Result<u32, DaemonError> {
        lock(&self.registry)
            .get(pid)
            .map(|i| i.gen_)
            .ok_or(DaemonError::NotTraced { pid })
    }

    /// Stored snapshot `id`, which must be of the image `pid` means now.
    ///
    /// # Errors
    /// [`DaemonError::SnapshotNotFound`], [`DaemonError::SnapshotOfOtherProcess`].
    pub fn stored_of(&self, pid: u32, id: u64) -> Result<StoredSnapshot, DaemonError> {
        let gen_ = self.gen_of(pid)?;
        let store = lock(&self.store);
        let stored = store.get(id).ok_or(DaemonError::SnapshotNotFound { id })?;
        if stored.pid != pid || stored.gen_ != gen_ {
            return Err(DaemonError::SnapshotOfOtherProcess {
                id,
                of_pid: stored.pid,
                pid,
            });
        }
        Ok(stored.clone())
    }

    /// The default base of a compare for `pid`: its latest stored snapshot,
    /// else None (the empty snapshot at tracing start).
    ///
    /// # Errors
    /// [`DaemonError::NotTraced`].
    pub fn latest_stored(&self, pid: u32) -> Result<Option<StoredSnapshot>, DaemonError> {
        let gen_ = self.gen_of(pid)?;
        Ok(lock(&self.store).of_image(pid, gen_).last().cloned())
    }

    /// The kernel maps' use: entries and capacity of each, live blocks per
    /// process, and the eBPF programs' counters.
    pub fn kernel_maps(&self) -> serde_json::Value {
        let capture = self.capture();
        let maps: serde_json::Map<String, serde_json::Value> = capture
            .map_usage()
            .into_iter()
            .map(|(name, entries, capacity)| {
                (
                    name.to_string(),
                    serde_json::json!({"entries": entries, "capacity": capacity}),
                )
            })
            .collect();
        let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
        for (key, _) in capture.live_blocks(None) {
            *by_pid.entry(key.tgid).or_default() += 1;
        }
        let counters: serde_json::Map<String, serde_json::Value> = capture
            .counters()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.into()))
            .collect();
        serde_json::json!({
            "maps": maps,
            "live_allocs_by_pid": by_pid,
            "counters": counters,
        })
    }
}

/// A traceback's sampled blocks: its stack, estimated count and bytes.
type EstimatedGroup = (Option<Arc<[u64]>>, f64, f64);

/// Reads the stacks of `entries` (each distinct stack id once) into blocks.
pub(crate) fn raw_blocks(capture: &Capture, entries: &[(AllocKey, AllocInfo)]) -> Vec<RawBlock> {
    let mut stacks: HashMap<u64, Option<Arc<[u64]>>> = HashMap::new();
    let mut frame0_only: HashMap<u64, Arc<[u64]>> = HashMap::new();
    entries
        .iter()
        .map(|(_, info)| {
            let stored = if info.stack_id == STACK_ID_NONE {
                None
            } else {
                stacks
                    .entry(info.stack_id)
                    .or_insert_with(|| capture.stack(info.stack_id).map(Arc::from))
                    .clone()
            };
            // Without its stack a block still has its exact call site.
            let stack = stored.or_else(|| {
                (info.frame0 != 0).then(|| {
                    frame0_only
                        .entry(info.frame0)
                        .or_insert_with(|| Arc::from([info.frame0]))
                        .clone()
                })
            });
            RawBlock {
                size: info.size,
                stack,
            }
        })
        .collect()
}

pub(crate) fn live_stats(capture: &Capture, image: &ProcessImage) -> ProcStats {
    capture
        .proc_stats(image.pid)
        .filter(|stats| stats.gen_ == image.gen_)
        .unwrap_or_default()
}

pub(crate) fn ended_stats(image: &ProcessImage) -> ProcStats {
    image.ended.as_ref().map(|e| e.stats).unwrap_or_default()
}

pub(crate) fn view(image: &ProcessImage, stats: ProcStats) -> ProcessView {
    ProcessView {
        pid: image.pid,
        comm: image.comm.clone(),
        exe: image.exe.clone(),
        state: match image.ended.as_ref().map(|e| e.reason) {
            None => "alive",
            Some(EndReason::Exit) => "exited",
            Some(EndReason::Exec) => "exec",
        },
        first_seen_ms: unix_ms(image.first_seen),
        ended_ms: image.ended.as_ref().map(|e| unix_ms(e.at)),
        current: stats.current,
        peak: stats.peak,
        blocks: stats.blocks,
        allocs: stats.allocs,
        frees: stats.frees,
        unknown_frees: stats.unknown_frees,
        drops: stats.drops,
        complete: stats.drops == 0,
    }
}
