//! Allocator discovery's upkeep (`lifecycle::allocators`): the processes
//! of exec and code-mapping events, and every process at start, have their
//! objects examined; objects nobody maps any more stop being probed.
//! Reading objects holds no lock.
use std::time::Instant;

use super::Service;
use crate::lifecycle::allocators::Allocators;
use crate::sys::modules::ModuleCache;

/// Allocator discovery, owned by the service and driven from `tasks.rs`
/// ([`Discoverer`]): its state and its queues.
pub(super) struct Discovery {
    /// Allocator discovery's state (`lifecycle::allocators`); None when
    /// it is off (only the glibc probed from the start).
    pub(super) allocators: Option<std::sync::Mutex<crate::lifecycle::allocators::Allocators>>,
    /// Processes whose mappings discovery reads next (exec, code mapped,
    /// new image).
    pub(super) queue: std::sync::Mutex<Vec<u32>>,
    /// Processes read from events, read once more at the next tick (a
    /// library mapped after its event was handled).
    pub(super) again: std::sync::Mutex<Vec<u32>>,
    /// Whether discovery probes the allocator libraries installed on the
    /// host at start ([`Discoverer::probe_installed`]).
    pub(super) probe_installed: bool,
}

impl Discovery {
    /// Discovery on, with `pinned` (the objects probed from the start)
    /// never dropped; the installed libraries not probed at start.
    pub(super) fn new(pinned: Vec<crate::sys::procfs::FileKey>) -> Self {
        Self {
            allocators: Some(std::sync::Mutex::new(
                crate::lifecycle::allocators::Allocators::new(pinned),
            )),
            queue: std::sync::Mutex::default(),
            again: std::sync::Mutex::default(),
            probe_installed: false,
        }
    }
}

impl Service {
    /// Turns allocator discovery off (`discover_allocators = false`): only
    /// the glibc probed from the start is.
    #[must_use]
    pub fn without_discovery(mut self) -> Self {
        self.discovery.allocators = None;
        self
    }

    /// Discovery that also probes the allocator libraries installed on the
    /// host at start ([`Discoverer::probe_installed`]).
    pub fn with_installed_allocators(mut self) -> Self {
        self.discovery.probe_installed = true;
        self
    }
}

/// Allocator discovery, driven from `tasks.rs` and queued by the events'
/// handling: reads the queued processes' mappings and probes the
/// allocators among them, over the service's `Discovery`.
pub struct Discoverer<'a> {
    service: &'a Service,
}

impl<'a> Discoverer<'a> {
    /// The discovery over `service`'s state.
    #[must_use]
    pub fn new(service: &'a Service) -> Self {
        Self { service }
    }

    /// Queues process `pid` for [`Discoverer::discover_pending`]; `again`:
    /// read it once more at the next tick too.
    pub(super) fn queue_discovery(&self, pid: u32, again: bool) {
        if self.service.discovery.allocators.is_none() {
            return;
        }
        for (queue, wanted) in [
            (&self.service.discovery.queue, true),
            (&self.service.discovery.again, again),
        ] {
            if !wanted {
                continue;
            }
            let mut queue = queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !queue.contains(&pid) {
                queue.push(pid);
            }
        }
    }

    /// Probes the allocator libraries installed on the host
    /// (`lifecycle::allocators::installed_libraries`) that define an
    /// allocator and are not probed yet, for every process, before any
    /// process maps them: a program that links one is traced from its first
    /// allocation. They stay probed (pinned). Returns how many it probed.
    pub fn probe_installed(&self) -> usize {
        let Some(allocators) = self
            .service
            .discovery
            .allocators
            .as_ref()
            .filter(|_| self.service.discovery.probe_installed)
        else {
            return 0;
        };
        let lock = || super::state::lock(allocators);
        let mut probed = 0;
        for path in crate::lifecycle::allocators::installed_libraries() {
            if self.service.stopping() {
                break;
            }
            let Some(key) = crate::sys::procfs::FileKey::of_path(&path) else {
                continue;
            };
            if lock().knows(key) {
                continue;
            }
            lock().pin(key);
            let Some(found) = Allocators::examine_file(&path) else {
                continue;
            };
            let (family, points) = (found.probes.family, found.probes.points.len());
            match self.probe_library(found) {
                Ok(()) => {
                    probed += 1;
                    tracing::info!(object = %path.display(), family = family.name(), points, "probing an installed allocator");
                }
                Err(err) => {
                    tracing::warn!(object = %path.display(), %err, "cannot probe an installed allocator");
                }
            }
        }
        probed
    }

    /// Queues every process on the host (at start).
    pub fn discover_all(&self) {
        let started = Instant::now();
        let pids = crate::sys::procfs::all_pids();
        for &pid in &pids {
            self.queue_discovery(pid, false);
        }
        let probed = self.discover_pending();
        tracing::info!(
            processes = pids.len(),
            probed,
            ms = started.elapsed().as_millis(),
            "allocators of the running processes found"
        );
    }

    /// Queues the processes read from events once more (each tick), and
    /// reads every queued one.
    pub fn discover_again(&self) {
        let again = std::mem::take(
            &mut *self
                .service
                .discovery
                .again
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for pid in again {
            self.queue_discovery(pid, false);
        }
        self.discover_pending();
    }

    /// Reads the mappings of every queued process in scope and probes the
    /// allocators of the objects among them not examined yet. Returns how
    /// many objects it began to probe.
    pub fn discover_pending(&self) -> usize {
        let Some(allocators) = &self.service.discovery.allocators else {
            return 0;
        };
        let lock = || super::state::lock(allocators);
        let pids = std::mem::take(
            &mut *self
                .service
                .discovery
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let own = std::process::id();
        let mut probed = 0;
        for pid in pids {
            if self.service.stopping() {
                break;
            }
            if pid == own || !self.service.state.locks().scope().scope.matches(pid) {
                continue;
            }
            let Ok(maps) = ModuleCache::global().capture(pid) else {
                continue;
            };
            // (The guard must not live through the loop, which locks again.)
            let unexamined = lock().unexamined(&maps);
            for module in unexamined {
                let key = module.key();
                let Some(found) = Allocators::examine(&module, pid) else {
                    lock().examined(key, pid, false);
                    continue;
                };
                let (path, family) = (found.library.path.clone(), found.probes.family);
                let points = found.probes.points.len();
                let added = self.probe_library(found);
                match &added {
                    Ok(()) => {
                        probed += 1;
                        tracing::info!(pid, object = %path.display(), family = family.name(), points, "probing an allocator");
                    }
                    Err(err) => {
                        tracing::warn!(pid, object = %path.display(), %err, "cannot probe an allocator");
                    }
                }
                lock().examined(key, pid, added.is_ok());
            }
        }
        probed
    }

    /// Stops probing the objects found by discovery that no process has
    /// mapped for `lifecycle::allocators::UNUSED_GRACE`; returns how many.
    pub fn drop_unused_allocators(&self) -> usize {
        let Some(allocators) = &self.service.discovery.allocators else {
            return 0;
        };
        let unused = allocators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .unused(Instant::now());
        if unused.is_empty() {
            return 0;
        }
        self.service
            .exec_holds
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let mut held = self.service.state.locks().kernel();
        for key in &unused {
            if held.kernel.remove_library(*key) {
                tracing::info!(dev = ?key.dev, inode = key.inode, "no process maps an allocator any more: no longer probed");
            }
        }
        self.publish_libraries(held.kernel.libraries());
        unused.len()
    }

    /// Probes a library found by discovery (the kernel lock held for the
    /// attach alone) and publishes the new list for `/health`.
    ///
    /// # Errors
    /// [`crate::capture::CaptureError::Attach`]; nothing stays attached.
    pub(super) fn probe_library(
        &self,
        found: crate::capture::probes::Found,
    ) -> Result<(), crate::capture::CaptureError> {
        let mut held = self.service.state.locks().kernel();
        let added = held.kernel.add_library(found);
        self.publish_libraries(held.kernel.libraries());
        added
    }

    /// Replaces the list `/health` shows (called with the kernel lock
    /// held, so that publications follow the kernel's order).
    fn publish_libraries(&self, libraries: &[crate::capture::AttachedLibrary]) {
        *self
            .service
            .libraries
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = libraries.to_vec();
    }
}
