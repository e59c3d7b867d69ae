//! Housekeeping: the kernel's process events as they come, and the
//! periodic passes: expiry of ended images (and of tracing state kept for
//! images that are gone), and the orphan sweep over the kernel maps.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use tracer_common::{AllocInfo, AllocKey, ProcEvent};

use super::Service;
use super::allocators::Discoverer;
use super::unwind::Unwinder;
use crate::lifecycle::events::{self, Event};
use crate::lifecycle::registry::EndEvent;
use crate::lifecycle::{ImageId, ProcessImage, orphans, scope};
use crate::sys::modules::ModuleMaps;

/// What the housekeeping passes remember between ticks, owned by the
/// service and driven from `tasks.rs`.
#[derive(Default)]
pub(super) struct Upkeep {
    /// `drop_events` (the kernel's count of events the full ring lost)
    /// when [`Housekeeping::reconcile_lost_images`] last looked.
    pub(super) events_dropped_seen: std::sync::atomic::AtomicU64,
    /// The orphan sweeps so far ([`Service::sweep_record`]).
    pub(super) sweeps: Sweeps,
    /// The losses last logged, and when ([`Housekeeping::log_drops`]).
    pub(super) drops_logged: std::sync::Mutex<super::losses::LossLog>,
    /// The stacks no block named at the last collection
    /// ([`Housekeeping::collect_stacks`]).
    pub(super) unnamed_stacks: std::sync::Mutex<super::stacks::Unnamed>,
}

/// The orphan sweeps so far ([`Housekeeping::sweep_orphans`]), as
/// `tracer_orphan_sweeps_total` and the last one's gauges show them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepRecord {
    /// Sweeps that ran to their end.
    pub sweeps: u64,
    /// Unix ms when the last one ended (0: none yet).
    pub last_ended_ms: u64,
    /// How long the last one took, from its start (the kernel lock taken)
    /// to its end, in µs.
    pub last_took_us: u64,
}

/// [`SweepRecord`] as the sweep updates it (atomics: read by `/metrics`
/// without any lock).
#[derive(Debug, Default)]
pub(super) struct Sweeps {
    sweeps: std::sync::atomic::AtomicU64,
    last_ended_ms: std::sync::atomic::AtomicU64,
    last_took_us: std::sync::atomic::AtomicU64,
}

/// What [`Housekeeping::read_proc`] read from `/proc` for one event.
#[derive(Debug, Default)]
pub enum ProcRead {
    /// Nothing (an event that needs nothing, or a process already gone).
    #[default]
    Nothing,
    /// A new image (`New`), read as [`ProcessImage::capture`] or
    /// [`ProcessImage::capture_forked`] does.
    Image(Box<ProcessImage>),
    /// The mappings of an image that mapped code (`Mapped`), from
    /// `/proc/PID/maps`.
    Maps(Arc<ModuleMaps>),
}

impl Service {
    /// The orphan sweeps so far: how many, when the last ended, how long
    /// it took. No lock taken.
    pub fn sweep_record(&self) -> SweepRecord {
        use std::sync::atomic::Ordering;
        SweepRecord {
            sweeps: self.upkeep.sweeps.sweeps.load(Ordering::Acquire),
            last_ended_ms: self.upkeep.sweeps.last_ended_ms.load(Ordering::Acquire),
            last_took_us: self.upkeep.sweeps.last_took_us.load(Ordering::Acquire),
        }
    }
}

/// Housekeeping, driven from `tasks.rs`: the kernel's process events as
/// they come, and the periodic passes (expiry, lost images, the stacks'
/// collection, the losses logged, the orphan sweeps) over the service's
/// state, remembering between ticks in the service's `Upkeep`.
pub struct Housekeeping<'a> {
    pub(super) service: &'a Service,
}

impl<'a> Housekeeping<'a> {
    /// The passes over `service`'s state.
    #[must_use]
    pub fn new(service: &'a Service) -> Self {
        Self { service }
    }

    /// Handles a batch of kernel process events in order: a new image is
    /// read from `/proc` at once (while it lives), exec and fork events of a
    /// scoped tracerd attach or detach, and the ended images' blocks are
    /// collected in one pass over the kernel maps per batch, and applied in
    /// order (before a new image of the same pid). New images, and images
    /// that mapped code, wait for their unwind tables in
    /// [`Unwinder::unwind_pending`].
    pub fn handle_events(&self, batch: &[ProcEvent]) {
        self.make_own_levels(batch);
        let read = Self::read_proc(batch);
        self.handle_read_events(batch, read);
    }

    /// Makes the own spill maps `batch` asks for: the levels the programs
    /// asked for (`Spill`; level 0 at an image's first spilled block, as
    /// most images never spill), from the pool, and those it lacks in one
    /// change of `OWN_LIVE` (each waits for an RCU grace period: a batch of
    /// asks from a hundred processes must not wait for a hundred). Done as
    /// soon as the batch is read from the ring, without the kernel lock: a
    /// level the programs wait for must not wait for a read of millions of
    /// blocks.
    pub fn make_own_levels(&self, batch: &[ProcEvent]) {
        let Some(own) = &self.service.own_levels else {
            return;
        };
        let asks: Vec<(ImageId, u32)> = batch
            .iter()
            .filter_map(|event| match events::decode(event) {
                Some(Event::Spill { image, level }) => Some((image, level)),
                _ => None,
            })
            .collect();
        if !asks.is_empty() {
            own.add(&asks);
        }
    }

    /// Reads from `/proc` (no lock taken) what `batch` needs while its
    /// processes live, one entry per event: a new image, and the mappings
    /// of an image that mapped code (`Mapped`: read once per image, at its
    /// last such event of the batch). Done as soon as the batch is read
    /// from the ring, before its handling waits for any lock: a program
    /// that lives 50 ms is gone soon after it loaded its libraries, and
    /// its stacks are symbolized with the mappings read while it lived.
    pub fn read_proc(batch: &[ProcEvent]) -> Vec<ProcRead> {
        let decoded: Vec<Option<Event>> = batch.iter().map(events::decode).collect();
        let mut last_mapped: HashMap<ImageId, usize> = HashMap::new();
        for (index, event) in decoded.iter().enumerate() {
            if let Some(Event::Mapped { image }) = event
                && image.generation != 0
            {
                last_mapped.insert(*image, index);
            }
        }
        // New images first, then the mappings: a new image read after the
        // mappings of a batch's other processes could find its process in
        // the next program it exec'd.
        let mut read: Vec<ProcRead> = decoded
            .iter()
            .map(|event| match event {
                Some(Event::New {
                    image,
                    parent: Some(_),
                    ..
                }) => ProcRead::Image(Box::new(ProcessImage::capture_forked(*image))),
                Some(Event::New { image, comm, .. }) => {
                    ProcRead::Image(Box::new(events::new_image(*image, comm)))
                }
                _ => ProcRead::Nothing,
            })
            .collect();
        for (image, index) in last_mapped {
            if let (Ok(maps), Some(slot)) = (ModuleMaps::capture(image.pid), read.get_mut(index)) {
                *slot = ProcRead::Maps(Arc::new(maps));
            }
        }
        read
    }

    /// Whether the fork of `child` from `parent` is outside the scope: a
    /// scope is chosen, tracerd has no image of the parent, and neither
    /// process matches it (`/proc/PID/exe`, `/proc/PID/cgroup`). The kernel
    /// reports every fork of the host in a scope of pids; such a child is
    /// not registered (it would be listed among the traced processes).
    fn fork_out_of_scope(&self, child: u32, parent: u32) -> bool {
        let scope = self
            .service
            .scope_published
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if scope.is_all()
            || self
                .service
                .state
                .locks()
                .registry()
                .registry
                .get(parent)
                .is_some()
        {
            return false;
        }
        !scope.matches(child) && !scope.matches(parent)
    }

    /// [`Housekeeping::handle_events`] with `/proc` read already
    /// ([`Housekeeping::read_proc`] of the same batch).
    pub fn handle_read_events(&self, batch: &[ProcEvent], mut read: Vec<ProcRead>) {
        let decoded: Vec<Option<Event>> = batch.iter().map(events::decode).collect();
        // The blocks of every image this batch ends, in one pass over the
        // kernel maps (a pass per end made a churn of short-lived programs
        // fall minutes behind: 5 to 20 ms each).
        let ending: HashSet<ImageId> = decoded
            .iter()
            .filter_map(|event| match event {
                Some(Event::End(end)) => Some(end.image),
                _ => None,
            })
            .collect();
        // (The own spill maps the batch asks for were made when it was
        // read: [`Housekeeping::make_own_levels`].)
        let mut blocks = {
            let held = self.service.state.locks().kernel();
            events::blocks_of(&**held.kernel, &ending)
        };
        let mut ends = Vec::new();
        for (index, event) in decoded.into_iter().enumerate() {
            match event {
                Some(Event::New {
                    image,
                    comm,
                    parent,
                }) => {
                    // Events apply in order: an exec's end of the old image
                    // first, so the new image never finds the old one live.
                    if ends.iter().any(|end: &EndEvent| end.image.pid == image.pid) {
                        self.end_images(std::mem::take(&mut ends), &mut blocks);
                    }
                    if let Some(parent) = parent
                        && self.fork_out_of_scope(image.pid, parent)
                    {
                        continue;
                    }
                    let read = match read.get_mut(index).map(std::mem::take) {
                        Some(ProcRead::Image(read)) => *read,
                        _ => events::new_image(image, &comm),
                    };
                    let id = read.id;
                    let known = match parent {
                        Some(parent) => self.service.state.locks().registry().registry.add_forked(
                            read,
                            parent,
                            events::comm_of(&comm),
                        ),
                        None => {
                            self.service.state.locks().registry().registry.add(read);
                            true
                        }
                    };
                    if !known {
                        // A fork of a process tracerd has no image of: what
                        // it runs is read from /proc after all.
                        let exe = crate::sys::procfs::read_exe(id.pid).ok();
                        let maps = crate::sys::modules::ModuleMaps::capture(id.pid)
                            .ok()
                            .map(std::sync::Arc::new);
                        if let Some(image) = self
                            .service
                            .state
                            .locks()
                            .registry()
                            .registry
                            .get_mut(id.pid)
                            && image.id == id
                        {
                            image.exe = exe;
                            image.maps = maps;
                        }
                    }
                    let maps = {
                        let held = self.service.state.locks().registry();
                        let added = held.registry.get(id.pid).filter(|image| image.id == id);
                        if let Some(added) = added {
                            ::tracing::debug!(pid = id.pid, gen = id.generation, comm = %added.comm, ppid = ?added.ppid, maps = added.maps.as_ref().map_or(0, |m| m.mappings().len()), "new image");
                        }
                        added.and_then(|image| image.maps.clone())
                    };
                    if let Some(maps) = maps {
                        Unwinder::new(self.service).queue_unwind(id, maps);
                    }
                }
                Some(Event::End(end)) => ends.push(end),
                Some(Event::Mapped { image }) => {
                    if let Some(ProcRead::Maps(maps)) = read.get_mut(index).map(std::mem::take)
                        && let Some(live) = self
                            .service
                            .state
                            .locks()
                            .registry()
                            .registry
                            .get_mut(image.pid)
                        && live.id == image
                        && live.ended.is_none()
                    {
                        live.maps = Some(maps);
                    }
                    Discoverer::new(self.service).queue_discovery(image.pid, true);
                    Unwinder::new(self.service).queue_remap(image);
                }
                // Its map was made when the batch was read.
                Some(Event::Spill { .. }) => {}
                Some(Event::ScopeCandidate { pid, is_fork }) => {
                    if !is_fork {
                        Discoverer::new(self.service).queue_discovery(pid, true);
                    }
                    let mut held = self.service.state.locks().kernel().scope();
                    scope::on_exec_or_fork(&mut **held.kernel, &held.scope, pid, is_fork);
                }
                None => {}
            }
        }
        self.end_images(ends, &mut blocks);
        self.service.events_applied();
    }

    /// Ends images with their blocks (read already: `blocks`), which leave
    /// the kernel maps.
    fn end_images(
        &self,
        ends: Vec<EndEvent>,
        blocks: &mut HashMap<ImageId, Vec<(AllocKey, AllocInfo)>>,
    ) {
        if ends.is_empty() {
            return;
        }
        let mut held = self.service.state.locks().kernel();
        for end in &ends {
            held.kernel
                .remove_process_mappings(end.image.pid, end.image.generation);
        }
        // The ended blocks' stacks are read under the kernel lock alone;
        // the registry's (which the cheap routes need) is held only to
        // record the ends.
        let images: Vec<ImageId> = ends.iter().map(|end| end.image).collect();
        let (ended, keys) =
            events::collect_ended(&**held.kernel, ends, blocks, &self.service.stopping);
        let mut held = held.registry();
        for (end, kept) in ended {
            held.registry.end(end, kept);
        }
        drop(held.registry);
        events::remove_ended(&mut **held.kernel, &keys);
        held.kernel.drop_own_spill(&images);
    }

    /// Registers the images the kernel tracks (its process totals:
    /// `PROC_SLOTS`, `PROCS`) that the registry does not know, once the
    /// event ring lost events (`drop_events` rose since the last call):
    /// their `New` event was among them. Each is read from `/proc` as a new
    /// image is; a lost end is found by the registry's own check (a live
    /// image whose process is gone). Returns how many were added.
    pub fn reconcile_lost_images(&self) -> usize {
        use std::sync::atomic::Ordering;
        let dropped = self
            .service
            .counters()
            .into_iter()
            .find_map(|(name, value)| (name == "drop_events").then_some(value))
            .unwrap_or(0);
        if self
            .service
            .upkeep
            .events_dropped_seen
            .swap(dropped, Ordering::AcqRel)
            == dropped
        {
            return 0;
        }
        let tracked = self.service.totals.all_proc_stats();
        let unknown: Vec<ImageId> = {
            let held = self.service.state.locks().registry();
            tracked
                .iter()
                .map(|(tgid, stats)| ImageId::new(*tgid, stats.generation))
                .filter(|image| !held.registry.knows(*image))
                .collect()
        };
        for &image in &unknown {
            let read = events::new_image(image, &[0; 16]);
            let maps = read.maps.clone();
            self.service.state.locks().registry().registry.add(read);
            if let Some(maps) = maps {
                Unwinder::new(self.service).queue_unwind(image, maps);
            }
        }
        if !unknown.is_empty() {
            self.service.events_applied();
            tracing::warn!(
                images = unknown.len(),
                events_lost = dropped,
                "the event ring overflowed: images found in the kernel's totals and registered"
            );
        }
        unknown.len()
    }

    /// Drops ended images past their retention (and ends live images whose
    /// process is gone without an end event), then forgets the tracing
    /// state of images the registry no longer knows.
    pub fn expire(&self) {
        let mut held = self.service.state.locks().registry().control();
        held.registry.expire(SystemTime::now());
        let registry = &held.registry;
        held.control.retain(|image| registry.knows(image));
    }

    /// Detaches the probes of scoped processes that are gone, collects
    /// unreferenced stacks when due, and removes the blocks of images that
    /// ended without their end being handled here (see
    /// [`crate::lifecycle::Registry::orphaned_blocks`]). Returns the number
    /// of blocks removed: none when tracerd began to stop during the scan.
    pub fn sweep_orphans(&self) -> usize {
        use std::sync::atomic::Ordering;
        let started = std::time::Instant::now();
        // The walk over every live block (seconds over millions) holds the
        // kernel lock shared: a snapshot's scan runs beside it, and only
        // what changes the kernel side (an image's end) waits for it.
        let held = self.service.state.locks().kernel_shared();
        // The images with own spill maps before the scan: only they may be
        // found stale by it. One whose maps were made during the scan (its
        // first blocks came after the scan read what the kernel tracks,
        // and after its walk passed the own maps) would look ended, and its
        // maps were dropped while it lived: its blocks in them lost, the
        // rest sent to LIVE_ALLOCS.
        let had_maps: HashSet<ImageId> = held.kernel.own_spill_images().into_iter().collect();
        let walked = orphans::walk(&**held.kernel, &self.service.stopping);
        drop(held);
        let Some(digest) =
            walked.and_then(|walked| orphans::digest(walked, &self.service.stopping))
        else {
            return 0;
        };
        let scan = {
            let mut held = self.service.state.locks().kernel();
            scope::prune(&mut **held.kernel);
            orphans::apply(&mut **held.kernel, digest)
        };
        // Blocks of images ended since the walk are among the untracked:
        // the registry dooms only those seen so in two sweeps in a row.
        let Some(untracked) = orphans::untracked(&scan, &self.service.stopping) else {
            return 0;
        };
        let held = self.service.state.locks().kernel();
        let mut held = held.registry();
        let doomed = orphans::doomed(&scan, &untracked, &mut held.registry);
        drop(held.registry);
        let removed = held.kernel.remove_blocks(&doomed);
        // Own spill maps of images the kernel no longer tracks: dropped
        // with their doomed blocks, or at once when they hold none (made
        // for an image that ended meanwhile).
        let holding: HashSet<ImageId> = untracked
            .iter()
            .map(|(key, info)| ImageId::of_block(key, info))
            .collect();
        let doomed_pids: HashSet<u32> = doomed.iter().map(|key| key.tgid).collect();
        let stale: Vec<ImageId> = held
            .kernel
            .own_spill_images()
            .into_iter()
            .filter(|image| had_maps.contains(image) && !scan.tracks(image))
            .filter(|image| !holding.contains(image) || doomed_pids.contains(&image.pid))
            .collect();
        held.kernel.drop_own_spill(&stale);
        drop(held.kernel);
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.service
            .upkeep
            .sweeps
            .last_took_us
            .store(took, Ordering::Release);
        self.service
            .upkeep
            .sweeps
            .last_ended_ms
            .store(crate::sys::unix_ms(SystemTime::now()), Ordering::Release);
        self.service
            .upkeep
            .sweeps
            .sweeps
            .fetch_add(1, Ordering::AcqRel);
        removed
    }

    /// Removes the kernel's totals per stack (`STACK_TOTALS`) of images it
    /// no longer tracks (their generation is in neither `PROC_SLOTS` nor
    /// `PROCS`: they exec'd or exited, and no program writes them again).
    /// The entries are read before the tracked generations, so that an
    /// image that started meanwhile is tracked already when its entries
    /// are seen. Read with the kernel lock shared; it is held alone only to
    /// remove them (the generations of ended images never come back).
    /// Those of an image whose end tracerd has not handled yet stay: they
    /// name its stacks, which its end reads ([`Housekeeping::collect_stacks`]
    /// leaves a named stack). Returns how many were removed.
    pub fn sweep_stack_totals(&self) -> usize {
        let held = self.service.state.locks().kernel_shared();
        let entries = held.kernel.stack_totals(None);
        if entries.is_empty() || self.service.stopping.is_raised() {
            return 0;
        }
        let mut tracked: HashSet<u32> = held
            .kernel
            .all_proc_stats()
            .iter()
            .map(|(_, stats)| stats.generation)
            .collect();
        tracked.extend(
            self.service
                .state
                .locks()
                .registry()
                .registry
                .live()
                .map(|image| image.id.generation),
        );
        let ended: Vec<_> = entries
            .into_iter()
            .filter(|(key, _)| !tracked.contains(&key.generation))
            .map(|(key, _)| key)
            .collect();
        drop(held);
        if ended.is_empty() {
            return 0;
        }
        self.service
            .state
            .locks()
            .kernel()
            .kernel
            .remove_stack_totals(&ended)
    }
}
