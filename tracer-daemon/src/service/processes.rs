//! Processes and `get_traced_memory()`: the one place that turns kernel
//! totals into the numbers a user sees, adjusted as tracemalloc reports
//! them (blocks cleared by `clear_traces()` subtracted, zeros while not
//! tracing). The process list, one process, the system-wide sums,
//! `/metrics` and the last-stop record all come from [`Service::processes`]
//! or [`Service::process`].
use tracer_common::ProcStats;

use super::{Service, ServiceError, Viewer};
use crate::capture::{ImageId, ProcTotalsSource};
use crate::lifecycle::{ImageState, ProcessImage, TracingControl, blocks::live_stats};
use crate::sys::modules::ModuleMaps;
use crate::sys::unix_ms;

/// Longest a query for one process waits for the registry to learn of
/// the image the kernel tracks for it ([`Service::catch_up`]): events are
/// applied within milliseconds, unless their handler waits for a lock.
pub const CATCH_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A process as the API lists it ([`tracer_api::ProcessView`]), and with
/// its tracing state ([`tracer_api::ProcessStatus`]): `current`, `peak`
/// and `blocks` adjusted as tracemalloc reports them.
pub use tracer_api::{ProcessStatus, ProcessView, SystemMemory};

/// The API's word for where an image is in its life.
#[must_use]
pub fn state_of(state: ImageState) -> tracer_api::ProcessState {
    match state {
        ImageState::Alive => tracer_api::ProcessState::Alive,
        ImageState::Exited => tracer_api::ProcessState::Exited,
        ImageState::Exec => tracer_api::ProcessState::Exec,
    }
}

/// The image a query for `pid` means: its live image, else its last ended
/// one, unless that one ended by an exec and the process lives on: then
/// the pid runs an image not traced (yet), and the old image's blocks are
/// not its (None).
pub(super) fn current_image(
    registry: &crate::lifecycle::Registry,
    pid: u32,
) -> Option<&ProcessImage> {
    let image = registry.get(pid)?;
    let execd = image
        .ended
        .as_ref()
        .is_some_and(|ended| ended.reason == crate::lifecycle::image::EndReason::Exec);
    (!execd || !crate::sys::procfs::exists(pid)).then_some(image)
}

/// The kernel's totals of an image: its final ones once it ended, else
/// those of the moment, read from `totals` (no lock of the kernel side).
pub(super) fn stats_of(totals: &dyn ProcTotalsSource, image: &ProcessImage) -> ProcStats {
    match &image.ended {
        Some(ended) => ended.stats,
        None => live_stats(totals, image.id),
    }
}

/// The raw view of an image with the kernel's `stats`.
pub(super) fn view(image: &ProcessImage, stats: ProcStats) -> ProcessView {
    ProcessView {
        pid: image.pid(),
        generation: image.id.generation,
        ppid: image.ppid,
        comm: image.comm.clone(),
        exe: image.exe.clone(),
        nspid: image.nspid,
        cgroup: image.cgroup.clone(),
        container_id: image
            .cgroup
            .as_deref()
            .and_then(crate::sys::procfs::container_id),
        owner_uid: image.owner,
        state: state_of(image.state()),
        first_seen_ms: unix_ms(image.first_seen),
        ended_ms: image.ended.as_ref().map(|e| unix_ms(e.at)),
        current: stats.current,
        peak: stats.peak,
        blocks: stats.blocks,
        allocs: stats.allocs,
        frees: stats.frees,
        unknown_frees: stats.unknown_frees,
        drops: stats.drops,
        cut_tracebacks: stats.cut,
        complete: stats.drops == 0 && stats.cut == 0,
    }
}

/// The view of an image as tracemalloc reports it, with its tracing state.
pub(super) fn status(
    control: &TracingControl,
    image: &ProcessImage,
    stats: ProcStats,
) -> ProcessStatus {
    let mut view = view(image, stats);
    let (current, peak, blocks) = control.adjust(image.id, view.current, view.peak, view.blocks);
    view.current = current;
    view.peak = peak;
    view.blocks = blocks;
    let tracing = control.of(image.id);
    ProcessStatus {
        view,
        is_tracing: tracing.is_tracing,
        traceback_limit: tracing.traceback_limit,
        exact: None,
        watch: None,
    }
}

/// One allocator family's bytes in a process image: (family name, current bytes,
/// peak bytes).
pub type FamilyBytes = (&'static str, u64, u64);

impl Service {
    /// Every traced process `viewer` may see: live ones first by pid, then
    /// ended ones still retained, oldest first, but those an exec replaced
    /// before they allocated anything (a fork's child that exec'd at once:
    /// one per command a shell starts, and nothing to show). Takes the registry and
    /// control locks (held only for short updates), never the kernel's:
    /// the totals are the kernel's of the moment, read through the shared
    /// reader ([`crate::capture::TotalsMaps::totals`]).
    pub fn processes(&self, viewer: Viewer) -> Vec<ProcessStatus> {
        let held = self.state.locks().registry().control();
        let totals = &*self.totals;
        let mut live: Vec<ProcessStatus> = held
            .registry
            .live()
            .filter(|image| viewer.sees_image(image))
            .map(|image| status(&held.control, image, stats_of(totals, image)))
            .collect();
        live.sort_by_key(|s| s.view.pid);
        live.extend(
            held.registry
                .ended()
                .filter(|image| viewer.sees_image(image) && !image.replaced_unused())
                .map(|image| status(&held.control, image, stats_of(totals, image))),
        );
        drop(held);
        for process in &mut live {
            self.add_exact_and_watch(process);
        }
        live
    }

    /// Fills `process`'s `exact` and `watch` (a live image's only), with
    /// no lock of the registry held.
    fn add_exact_and_watch(&self, process: &mut ProcessStatus) {
        if process.view.state.is_alive() {
            process.exact = self.exact_of(process.view.pid);
            process.watch = self.watch_of(process.view.pid);
        }
    }

    /// [`ServiceError::NotTraced`] for `pid`, which the registry does not
    /// know, with why: tracerd's own pid, no such process, outside the
    /// scope, none of the probed files mapped (`/proc/PID/maps`, by device
    /// and inode, so a container's own libc at the same path is told
    /// apart), or no allocation seen yet. Reads the published scope, never
    /// waiting for a scope change in progress (which holds the scope's
    /// lock while it attaches).
    pub(super) fn not_traced(&self, pid: u32) -> ServiceError {
        use super::NotTracedWhy as Why;
        let why = if pid == std::process::id() {
            Why::Tracerd
        } else if !crate::sys::procfs::exists(pid) {
            Why::NoProcess
        } else if crate::sys::procfs::is_zombie(pid) {
            Why::Exited
        } else if !self
            .scope_published
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .matches(pid)
        {
            Why::OutOfScope
        } else {
            // The published copy: a scope change holds the kernel lock
            // for seconds.
            let probed: Vec<(crate::sys::procfs::FileKey, String)> = self
                .libraries
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .map(|l| (l.key, l.path.display().to_string()))
                .collect();
            // A kernel thread (or a zombie) maps nothing: no allocator.
            let maps = match crate::sys::procfs::read_maps(pid) {
                Err(crate::sys::procfs::ProcError::NoMappings { .. }) => Ok(Vec::new()),
                read => read,
            };
            match maps {
                Err(_) => Why::NoProcess,
                Ok(maps)
                    if !maps
                        .iter()
                        .any(|m| probed.iter().any(|(key, _)| m.file_key() == *key)) =>
                {
                    Why::NoProbedAllocator {
                        probed: probed
                            .into_iter()
                            .map(|(_, path)| path)
                            .collect::<Vec<_>>()
                            .join(", "),
                    }
                }
                Ok(_) => Why::NoAllocationSeen,
            }
        };
        ServiceError::NotTraced { pid, why }
    }

    /// The process `pid` means now: its live image, else its last ended one.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`].
    pub fn process(&self, pid: u32) -> Result<ProcessStatus, ServiceError> {
        self.catch_up(pid);
        let held = self.state.locks().registry().control();
        let Some(image) = current_image(&held.registry, pid) else {
            drop(held);
            return Err(self.not_traced(pid));
        };
        let mut process = status(&held.control, image, stats_of(&*self.totals, image));
        drop(held);
        self.add_exact_and_watch(&mut process);
        Ok(process)
    }

    /// [`Service::process`] with the bytes of its image by source: (source
    /// name, current, peak) of each source that has had a block, in
    /// [`tracer_model::FAMILY_NAMES`] order, from the same read of the
    /// kernel's totals (`PROC_SLOTS`/`PROCS`) as the process's own, so they
    /// add up to its `current`. No sources for an image that ended (the
    /// kernel keeps none past exec or exit).
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`].
    pub fn process_with_sources(
        &self,
        pid: u32,
    ) -> Result<(ProcessStatus, Vec<FamilyBytes>), ServiceError> {
        self.catch_up(pid);
        let held = self.state.locks().registry().control();
        let Some(image) = current_image(&held.registry, pid) else {
            drop(held);
            return Err(self.not_traced(pid));
        };
        if let Some(ended) = &image.ended {
            return Ok((status(&held.control, image, ended.stats), Vec::new()));
        }
        let totals = self
            .totals
            .proc_totals(pid)
            .filter(|totals| totals.stats.generation == image.id.generation)
            .unwrap_or_default();
        let sources = tracer_model::FAMILY_NAMES
            .iter()
            .zip(totals.sources)
            .filter(|(_, source)| source.peak != 0 || source.current != 0)
            .map(|(name, source)| (*name, source.current, source.peak))
            .collect();
        let mut process = status(&held.control, image, totals.stats);
        drop(held);
        self.add_exact_and_watch(&mut process);
        Ok((process, sources))
    }

    /// Waits, at most [`CATCH_UP_LIMIT`], until the registry knows the
    /// image the kernel tracks for `pid` (its totals' generation): its
    /// `New` event, sent at its fork or exec, is still on its way (read
    /// from the ring, its `/proc` read, waiting for a lock). Until then
    /// the registry has the image before it (a fork's, whose program is
    /// its parent's) or none, and a query would answer for the wrong image:
    /// the image a fork started and an exec ended at once reads 0 bytes
    /// while its exec's image has allocated (a program that printed a line
    /// read 0 bytes in use), or the pid is not traced at all. A pid the
    /// kernel tracks no image of, or whose image the registry knows, costs
    /// a lookup in each. Past the limit (the event handler held long
    /// behind a lock), the query answers with what the registry has, and
    /// the debug log says so.
    pub(super) fn catch_up(&self, pid: u32) {
        let Some(generation) = self.totals.proc_stats(pid).map(|stats| stats.generation) else {
            return;
        };
        let image = ImageId::new(pid, generation);
        let started = std::time::Instant::now();
        let (applied, signal) = &self.events_applied;
        loop {
            // The count before the look: a batch applied after it wakes the
            // wait below, whatever the look saw.
            let seen = *super::state::lock(applied);
            if self.state.locks().registry().registry.knows(image) {
                return;
            }
            let waited = started.elapsed();
            let Some(left) = CATCH_UP_LIMIT.checked_sub(waited).filter(|d| !d.is_zero()) else {
                ::tracing::debug!(
                    pid,
                    generation,
                    waited_ms = waited.as_millis() as u64,
                    "the kernel's image of a process is not in the registry yet: answered with the one before"
                );
                return;
            };
            let guard = super::state::lock(applied);
            if *guard == seen {
                let _ = signal
                    .wait_timeout(guard, left)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
    }

    /// Records that a batch of kernel events was applied to the registry:
    /// wakes the queries waiting for it ([`Service::catch_up`]).
    pub(super) fn events_applied(&self) {
        let (applied, signal) = &self.events_applied;
        *super::state::lock(applied) += 1;
        signal.notify_all();
    }

    /// Copies of the registry's images `ids` (those it still has, as the
    /// same image; an image that ended is copied as ended), the mappings
    /// of those alive re-read from `/proc/PID/maps` and recorded in the
    /// registry too. The mappings are read without the registry's lock
    /// (opening a library not seen yet takes milliseconds, the maps of a
    /// hundred processes far more): the lock is held for two short looks,
    /// so that the cheap routes, which need it, never wait for `/proc`.
    pub(super) fn refreshed_images(&self, ids: &[ImageId]) -> Vec<ProcessImage> {
        let alive: Vec<ImageId> = {
            let held = self.state.locks().registry();
            ids.iter()
                .copied()
                .filter(|id| held.registry.has_live(*id))
                .collect()
        };
        let read: std::collections::HashMap<ImageId, std::sync::Arc<ModuleMaps>> = alive
            .into_iter()
            .filter_map(|id| Some((id, std::sync::Arc::new(ModuleMaps::capture(id.pid).ok()?))))
            .collect();
        let mut held = self.state.locks().registry();
        ids.iter()
            .filter_map(|id| {
                let image = held.registry.get_mut(id.pid).filter(|i| i.id == *id)?;
                if image.is_alive()
                    && let Some(maps) = read.get(id)
                {
                    image.maps = Some(maps.clone());
                }
                Some(image.clone())
            })
            .collect()
    }

    /// `get_traced_memory()` summed over every live process `viewer` may
    /// see.
    pub fn system_memory(&self, viewer: Viewer) -> SystemMemory {
        self.processes(viewer)
            .iter()
            .filter(|p| p.view.state.is_alive())
            .fold(SystemMemory::default(), |sum, p| SystemMemory {
                current: sum.current.saturating_add(p.view.current),
                peak: sum.peak.saturating_add(p.view.peak),
                blocks: sum.blocks.saturating_add(p.view.blocks),
                processes: sum.processes + 1,
            })
    }
}
