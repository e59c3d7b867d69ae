//! `take_snapshot()` of a process or of every process now; stored
//! snapshots as resources (ids, labels, files) in [`stored`], snapshot files
//! loaded from users in [`loaded`]; automatic snapshots in
//! [`super::triggers`].
use std::{collections::HashSet, sync::Arc, time::SystemTime};

use tracer_model::{Completeness, Snapshot};

use super::processes::{ProcessStatus, stats_of, status};
use super::{Service, ServiceError, Viewer};
use crate::capture::ImageId;
use crate::lifecycle::blocks::{StackReader, by_image, live_raw_blocks, live_stats, raw_blocks};
use crate::lifecycle::{ImageState, ProcessImage, RawBlock};
use crate::snapshot::{AllocatorFrames, truncate};

mod loaded;
mod stored;

/// What a live view covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// One process (its current image, or its last one if it ended).
    Process(u32),
    /// Every traced process now that the viewer may see, one domain per
    /// pid.
    System,
}

/// A stored snapshot named by id or by label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotRef {
    /// By id.
    Id(u64),
    /// By label.
    Label(String),
}

/// A snapshot taken now.
#[derive(Clone, Debug)]
pub struct Now {
    /// The traces.
    pub snapshot: Arc<Snapshot>,
    /// For a process: the process (traced memory adjusted for clears).
    pub process: Option<ProcessStatus>,
    /// For a process: its image and the image's start time.
    pub image: Option<(ImageId, u64)>,
    /// For the system: the processes it covers, by pid.
    pub pids: Vec<u32>,
    /// (current, peak) in bytes; for the system, the sums.
    pub traced_memory: (u64, u64),
    /// Events its processes lost since their tracing began.
    pub completeness: Completeness,
    /// Whether its tracebacks dropped the allocation machinery's leading
    /// frames.
    pub allocator_frames: AllocatorFrames,
    /// When.
    pub at: SystemTime,
}

/// One traced image's traces now, for system-wide views and automatic
/// snapshots (`super::triggers`).
pub(super) struct ImageNow {
    pub(super) id: ImageId,
    pub(super) start_time: u64,
    pub(super) comm: String,
    pub(super) snapshot: Snapshot,
    pub(super) traced_memory: (u64, u64),
    /// Events of the image lost since its tracing began.
    pub(super) drops: u64,
    /// Its blocks recorded with a cut traceback since its tracing began.
    pub(super) cut: u64,
}

/// An image's blocks as read now (or kept at its end), with what the view
/// of it needs.
struct Taken {
    image: ProcessImage,
    blocks: Blocks,
    status: ProcessStatus,
}

/// The blocks a snapshot is built from: those an ended image kept
/// (shared), or those just read (owned: copying millions of blocks into a
/// shared slice would cost as much as a tenth of reading them).
enum Blocks {
    /// An ended image's last blocks.
    Kept(Arc<[RawBlock]>),
    /// Read from the kernel maps now.
    Read(Vec<RawBlock>),
}

impl std::ops::Deref for Blocks {
    type Target = [RawBlock];
    fn deref(&self) -> &[RawBlock] {
        match self {
            Blocks::Kept(blocks) => blocks,
            Blocks::Read(blocks) => blocks,
        }
    }
}

/// The most blocks a read makes room for ahead (16 M blocks, 512 MiB):
/// beyond it the vector grows as blocks come.
const MAX_EXPECTED_BLOCKS: u64 = 1 << 24;

impl Service {
    /// The image a query for `pid` means and, if it ended, how.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`].
    pub(super) fn image_of(&self, pid: u32) -> Result<(ImageId, Option<ImageState>), ServiceError> {
        self.catch_up(pid);
        let held = self.state.locks().registry();
        let Some(image) = super::processes::current_image(&held.registry, pid) else {
            drop(held);
            return Err(self.not_traced(pid));
        };
        let state = image.state();
        Ok((image.id, (!state.is_alive()).then_some(state)))
    }

    /// The image a query for `pid` means, which must not have ended.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`], [`ServiceError::Ended`].
    pub(super) fn live_image_of(&self, pid: u32) -> Result<ImageId, ServiceError> {
        match self.image_of(pid)? {
            (image, None) => Ok(image),
            (_, Some(state)) => Err(ServiceError::Ended { pid, state }),
        }
    }

    /// The image the registry has for `pid` now, its mappings re-read
    /// (`/proc/PID/maps`, outside the registry lock: see
    /// [`Service::refreshed_images`]); None when it has none.
    fn current_image_refreshed(&self, pid: u32) -> Option<ProcessImage> {
        let id = self
            .state
            .locks()
            .registry()
            .registry
            .get(pid)
            .map(|i| i.id);
        id.and_then(|id| self.refreshed_images(&[id]).pop())
    }

    /// Every live block of `pid`'s current image (or the blocks its last
    /// image had when it ended), with its mappings refreshed. The scan of
    /// the live blocks holds the kernel lock shared (beside other reads,
    /// the sweep's walk among them; an end's handling waits) and no other:
    /// the registry and control locks, which the cheap routes need, are
    /// taken only for short looks before and after it.
    fn take(&self, pid: u32) -> Result<Taken, ServiceError> {
        self.catch_up(pid);
        let Some(image) = self.current_image_refreshed(pid) else {
            return Err(self.not_traced(pid));
        };
        let (blocks, stats) = match &image.ended {
            Some(ended) => (Blocks::Kept(ended.blocks.clone()), ended.stats),
            None => {
                // Room for the blocks the kernel counts now (more may come).
                let expected = live_stats(&*self.totals, image.id)
                    .blocks
                    .min(MAX_EXPECTED_BLOCKS);
                let held = self.state.locks().kernel_shared();
                let kernel = &**held.kernel;
                let blocks = Blocks::Read(live_raw_blocks(
                    kernel,
                    image.id,
                    usize::try_from(expected).unwrap_or(0),
                    &self.stopping,
                ));
                // Its totals as the scan ends (its end cannot be handled
                // while the kernel lock is held).
                (blocks, stats_of(&*self.totals, &image))
            }
        };
        let status = status(&self.state.locks().control().control, &image, stats);
        Ok(Taken {
            image,
            blocks,
            status,
        })
    }

    /// The view of `pid` now for statistics and `compare_to()`: a snapshot
    /// of totals made from the kernel's totals per stack of its live image
    /// (`STACK_TOTALS`, minus what `clear_traces()` removed), which costs
    /// its distinct stacks rather than its blocks; the snapshot of its
    /// blocks ([`Service::snapshot_now_with`]) where those totals cannot
    /// serve: an image that ended, sampling on, a stack totals entry lost
    /// (the map was full), or a system-wide target. Its `traces()` is empty
    /// for a snapshot of totals: callers that need the blocks take
    /// [`Service::snapshot_now_with`].
    ///
    /// # Errors
    /// As [`Service::snapshot_now_with`].
    pub fn grouped_now(
        &self,
        viewer: Viewer,
        target: Target,
        frames: AllocatorFrames,
    ) -> Result<Now, ServiceError> {
        if let Target::Process(pid) = target
            && let Some(now) = self.totals_now(pid, frames)?
        {
            return Ok(now);
        }
        self.snapshot_now_with(viewer, target, frames)
    }

    /// [`Service::grouped_now`] of a process from the kernel's totals per
    /// stack; None where they cannot serve.
    fn totals_now(&self, pid: u32, frames: AllocatorFrames) -> Result<Option<Now>, ServiceError> {
        if self.builder.sample_interval != 0 {
            return Ok(None);
        }
        // As take(): the registry and control locks (which the cheap routes
        // need) only for short looks, the kernel's maps under its lock alone.
        let Some(image) = self.current_image_refreshed(pid) else {
            return Ok(None);
        };
        let (tracing, offsets) = {
            let held = self.state.locks().control();
            (
                held.control.of(image.id),
                held.control.stack_offsets(image.id),
            )
        };
        if image.ended.is_some() || !tracing.is_tracing {
            return Ok(None);
        }
        // Exact while no block of the image was refused a key.
        let Some(kernel) = self
            .totals
            .image_totals(image.id)
            .filter(|totals| totals.stack_totals_lost == 0)
        else {
            return Ok(None);
        };
        // Without the kernel lock: a sweep or a snapshot's read of millions
        // of blocks never delays statistics. By the image's keys alone
        // while it put none in since they were read (its count of them is
        // read first).
        let reader = &*self.totals_reader;
        let entries = reader.image_stack_totals(image.id.generation, kernel.stack_keys);
        let mut stacks = StackReader::from_source(reader);
        let mut groups = Vec::with_capacity(entries.len());
        for (key, totals) in entries {
            let (mut count, mut size) = (totals.count, totals.size);
            if let Some(offset) = offsets.as_ref().and_then(|o| o.get(&key)) {
                count = count.saturating_sub(offset.blocks);
                size = size.saturating_sub(offset.bytes);
            }
            if count == 0 {
                continue;
            }
            groups.push((
                stacks.stack(key.stack_id, key.frame0),
                tracer_model::AllocatorFamily::from_code(key.source),
                count,
                size,
            ));
        }
        let stats = stats_of(&*self.totals, &image);
        let status = status(&self.state.locks().control().control, &image, stats);
        let at = SystemTime::now();
        let snapshot = self.builder.build_totals(
            pid,
            &groups,
            image.maps.as_deref(),
            frames,
            tracing.traceback_limit,
        );
        self.unless_stopping()?;
        Ok(Some(Now {
            snapshot: Arc::new(snapshot),
            traced_memory: (status.view.current, status.view.peak),
            completeness: Completeness::of_process(
                pid,
                status.view.drops,
                status.view.cut_tracebacks,
            ),
            process: Some(status),
            image: Some((image.id, image.start_time)),
            pids: vec![pid],
            allocator_frames: frames,
            at,
        }))
    }

    /// `take_snapshot()` of a target as an operator sees it, honouring
    /// `stop()` and the traceback limit of `start(nframe)`, with the
    /// allocation machinery's leading frames dropped (as
    /// [`Service::snapshot_now_with`] with [`AllocatorFrames::Drop`]).
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`], [`ServiceError::TracingStopped`].
    pub fn snapshot_now(&self, target: Target) -> Result<Now, ServiceError> {
        self.snapshot_now_with(Viewer::Operator, target, AllocatorFrames::Drop)
    }

    /// `take_snapshot()` of a target for `viewer` (system-wide: the
    /// processes they may see; a process: the caller checked
    /// [`Service::visible`]), honouring `stop()` and the traceback limit
    /// of `start(nframe)`; `frames` says whether the allocation
    /// machinery's leading frames are dropped or kept.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`], [`ServiceError::TracingStopped`];
    /// [`ServiceError::Stopping`] when tracerd began to stop meanwhile.
    pub fn snapshot_now_with(
        &self,
        viewer: Viewer,
        target: Target,
        frames: AllocatorFrames,
    ) -> Result<Now, ServiceError> {
        match target {
            Target::Process(pid) => {
                let (image, _) = self.image_of(pid)?;
                let tracing = self.state.locks().control().control.of(image);
                if !tracing.is_tracing {
                    return Err(ServiceError::TracingStopped { pid: Some(pid) });
                }
                let taken = self.take(pid)?;
                let at = SystemTime::now();
                let snapshot =
                    self.builder
                        .build(pid, &taken.blocks, taken.image.maps.as_deref(), frames);
                self.unless_stopping()?;
                let process = taken.status;
                Ok(Now {
                    snapshot: Arc::new(truncate(snapshot, tracing.traceback_limit)),
                    traced_memory: (process.view.current, process.view.peak),
                    completeness: Completeness::of_process(
                        pid,
                        process.view.drops,
                        process.view.cut_tracebacks,
                    ),
                    process: Some(process),
                    image: Some((taken.image.id, taken.image.start_time)),
                    pids: vec![pid],
                    allocator_frames: frames,
                    at,
                })
            }
            Target::System => {
                let control = self.state.locks().control().control.clone();
                let system = control.system();
                let any_tracing =
                    system.is_tracing || control.overrides().any(|(_, t)| t.is_tracing);
                if !any_tracing {
                    return Err(ServiceError::TracingStopped { pid: None });
                }
                let images = self.images_now(viewer, frames)?;
                let at = SystemTime::now();
                let mut traces = Vec::new();
                let mut pids = Vec::new();
                let (mut current, mut peak) = (0u64, 0u64);
                let mut completeness = Completeness::complete();
                for image in images {
                    pids.push(image.id.pid);
                    completeness.add(image.id.pid, image.drops, image.cut);
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
                    allocator_frames: frames,
                    at,
                })
            }
        }
    }

    /// The traces of every live, traced image `viewer` may see, in one pass
    /// over the kernel maps, each symbolized with its own mappings (the
    /// machinery's frames dropped or kept as `frames` says) and cut to its
    /// traceback limit.
    ///
    /// # Errors
    /// [`ServiceError::Stopping`] when tracerd began to stop meanwhile.
    pub(super) fn images_now(
        &self,
        viewer: Viewer,
        frames: AllocatorFrames,
    ) -> Result<Vec<ImageNow>, ServiceError> {
        let (ids, control) = {
            let held = self.state.locks().registry().control();
            let control = held.control.clone();
            let ids: Vec<ImageId> = held
                .registry
                .live()
                .filter(|i| viewer.sees_image(i))
                .map(|i| i.id)
                .filter(|id| control.of(*id).is_tracing)
                .collect();
            (ids, control)
        };
        // Mappings read without the registry's lock, then the scan under
        // the kernel lock shared and no other (see `take`).
        let images: Vec<ProcessImage> = self
            .refreshed_images(&ids)
            .into_iter()
            .filter(ProcessImage::is_alive)
            .collect();
        let held = self.state.locks().kernel_shared();
        let kernel = &**held.kernel;
        let want: HashSet<ImageId> = images.iter().map(|i| i.id).collect();
        let entries = if want.is_empty() {
            Vec::new()
        } else {
            kernel.live_blocks(Some(&want))
        };
        let mut by_image = by_image(entries);
        let blocks: Vec<_> = images
            .iter()
            .map(|image| {
                let entries = by_image.remove(&image.id).unwrap_or_default();
                (
                    raw_blocks(kernel, &entries, &self.stopping),
                    live_stats(&*self.totals, image.id),
                )
            })
            .collect();
        drop(held);
        let images = images
            .into_iter()
            .zip(blocks)
            .map(|(image, (raw, stats))| {
                let tracing = control.of(image.id);
                let snapshot = self
                    .builder
                    .build(image.pid(), &raw, image.maps.as_deref(), frames);
                let (current, peak, _) =
                    control.adjust(image.id, stats.current, stats.peak, stats.blocks);
                ImageNow {
                    id: image.id,
                    start_time: image.start_time,
                    comm: image.comm.clone(),
                    snapshot: truncate(snapshot, tracing.traceback_limit),
                    traced_memory: (current, peak),
                    drops: stats.drops,
                    cut: stats.cut,
                }
            })
            .collect();
        self.unless_stopping()?;
        Ok(images)
    }
}
