//! The unwinder's upkeep: each new image's files get their unwind tables
//! and the kernel its executable mappings; mappings of images that are no
//! longer live leave the kernel. Compiling holds no lock.
use std::sync::Arc;

use super::Service;
use super::exec_hold::ExecHolder;
use crate::capture::ImageId;
use crate::lifecycle::unwind;
use crate::sys::modules::ModuleMaps;

/// The unwinder's work, owned by the service and driven from `tasks.rs`
/// ([`Unwinder::unwind_pending`]): new images waiting for their unwind
/// tables and mappings, images that mapped code, and the mappings the
/// kernel was given.
#[derive(Default)]
pub(super) struct UnwindWork {
    /// New images waiting for their unwind tables and mappings
    /// ([`Unwinder::unwind_pending`]), kept out of the event loop: compiling
    /// a large file takes long enough that the next events' processes
    /// could be gone before they are read.
    pub(super) queue: std::sync::Mutex<
        Vec<(
            crate::capture::ImageId,
            std::sync::Arc<crate::sys::modules::ModuleMaps>,
        )>,
    >,
    /// Images that mapped code since their mappings were read (`Mapped`
    /// events), for [`Unwinder::unwind_pending`] to re-read.
    pub(super) remap: std::sync::Mutex<Vec<crate::capture::ImageId>>,
    /// The mappings last given to the unwinder, by image: what a re-read
    /// of `/proc/PID/maps` is compared with (the registry's copy is
    /// re-read by snapshots too, so it cannot tell what the kernel has).
    pub(super) unwound: std::sync::Mutex<
        std::collections::HashMap<
            crate::capture::ImageId,
            std::sync::Arc<crate::sys::modules::ModuleMaps>,
        >,
    >,
}

/// The unwinder's work, driven from `tasks.rs` and queued by the events'
/// handling and the exec holds: new images' unwind tables and mappings,
/// images that mapped code, the tables of the libraries found at start,
/// over the service's `UnwindWork`.
pub struct Unwinder<'a> {
    service: &'a Service,
}

impl<'a> Unwinder<'a> {
    /// The unwinder over `service`'s state.
    #[must_use]
    pub fn new(service: &'a Service) -> Self {
        Self { service }
    }

    /// Compiles, at start, the unwind tables of the host's NSS modules
    /// (`libnss_*.so*` in the C library's default directories): glibc
    /// loads them with `dlopen` at a process's first `getpwnam` or
    /// `getaddrinfo`, and a process that allocates in one a moment later
    /// (nginx's workers, right after their fork, switching user) would
    /// have its stack cut there until its `Mapped` event is handled.
    /// Returns how many files were offered. Nothing with the unwinder off.
    pub fn preload_unwind_tables(&self) -> usize {
        let mut files: Vec<(crate::sys::procfs::FileKey, std::fs::File)> = Vec::new();
        for dir in crate::elf::ldso::DEFAULT_DIRS {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if !(name.starts_with("libnss_") && name.contains(".so")) {
                    continue;
                }
                let Ok(file) = std::fs::File::open(entry.path()) else {
                    continue;
                };
                if let Some(key) = crate::sys::procfs::FileKey::of_file(&file)
                    && !files.iter().any(|(k, _)| *k == key)
                {
                    files.push((key, file));
                }
            }
        }
        let objects: Vec<(crate::sys::procfs::FileKey, &std::fs::File)> =
            files.iter().map(|(key, file)| (*key, file)).collect();
        ExecHolder::new(self.service).tables_before_exec(&objects);
        objects.len()
    }

    /// Compiles the unwind tables of the files the processes in scope
    /// run now (every process's for a scope of all; tracerd calls it for
    /// a chosen scope, before it says ready), named in
    /// `FILE_TABLES`: a process that ran before tracerd has no image until
    /// its first allocation, and its walks until its mappings are written
    /// go through the kernel's VMAs, cut at every file without a table.
    /// tracerd's own process is left out. Returns how many files were
    /// offered (read from `/proc/PID/maps`; each file once).
    pub fn preload_running_tables(&self) -> usize {
        let scope = self
            .service
            .scope_published
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let own = std::process::id();
        let pids: Vec<u32> = crate::sys::procfs::all_pids()
            .into_iter()
            .filter(|&pid| pid != own && (scope.is_all() || scope.matches(pid)))
            .collect();
        self.tables_of(&pids)
    }

    /// Compiles the unwind tables of the files processes `pids` map now
    /// (read from `/proc/PID/maps`; each file once, those with a table
    /// already skipped), as [`Unwinder::preload_running_tables`] does for
    /// the scope: before a running process is traced exactly, so that its
    /// first walks are whole. Returns how many files were offered.
    pub fn tables_of(&self, pids: &[u32]) -> usize {
        let maps: Vec<ModuleMaps> = pids
            .iter()
            .filter_map(|&pid| ModuleMaps::capture(pid).ok())
            .collect();
        let mut seen = std::collections::HashSet::new();
        let objects: Vec<(crate::sys::procfs::FileKey, &std::fs::File)> = maps
            .iter()
            .flat_map(|maps| maps.mappings())
            .filter_map(|m| Some((m.module.key(), m.module.file()?)))
            .filter(|(key, _)| seen.insert(*key))
            .collect();
        ExecHolder::new(self.service).tables_before_exec(&objects);
        objects.len()
    }

    /// Queues `image` (mappings `maps`) for [`Unwinder::unwind_pending`].
    pub(super) fn queue_unwind(&self, image: ImageId, maps: Arc<ModuleMaps>) {
        self.service
            .unwind
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((image, maps));
    }

    /// Queues `image`, which mapped code (a `Mapped` event), for
    /// [`Unwinder::unwind_pending`] to re-read its mappings.
    pub(super) fn queue_remap(&self, image: ImageId) {
        let mut queue = self
            .service
            .unwind
            .remap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !queue.contains(&image) {
            queue.push(image);
        }
    }

    /// Gives every queued new image its unwind tables and mappings (see
    /// [`Unwinder::unwind_image`]), and re-reads the mappings of the queued
    /// images that mapped code, updating those that changed; returns how
    /// many images it handled. Run outside the event loop (`tasks`), after
    /// each batch of events.
    pub fn unwind_pending(&self) -> usize {
        let mut done = 0;
        loop {
            let remap = std::mem::take(
                &mut *self
                    .service
                    .unwind
                    .remap
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            if !remap.is_empty() {
                done += self.remap(&remap);
            }
            let pending = std::mem::take(
                &mut *self
                    .service
                    .unwind
                    .queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            if pending.is_empty() && remap.is_empty() {
                return done;
            }
            for (image, maps) in pending {
                if self.service.stopping() {
                    return done;
                }
                self.unwind_image(image, maps);
                done += 1;
            }
        }
    }

    /// Gives the kernel what it needs to unwind `image`'s stacks (mappings
    /// `maps`): the tables of its files not yet loaded, compiled here
    /// without a lock, then its mappings. Nothing when the unwinder is off.
    fn unwind_image(&self, image: ImageId, maps: Arc<ModuleMaps>) {
        let plan = {
            let held = self.service.state.locks().kernel_shared();
            if held.kernel.config().unwind_table_rows == 0 {
                return;
            }
            unwind::plan(&**held.kernel, image, maps.clone())
        };
        let compiled = unwind::compile_missing(&plan.missing);
        self.service
            .unwind
            .unwound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(image, maps.clone());
        let mut held = self.service.state.locks().kernel().registry();
        // The image may have ended while its files were compiled (its end
        // removes its mappings under the kernel lock, held from here on:
        // the registry's, which the cheap routes need, is not).
        let alive = held.registry.has_live(image);
        drop(held.registry);
        unwind::install(&mut **held.kernel, &plan, &compiled);
        if !alive {
            held.kernel
                .remove_process_mappings(image.pid, image.generation);
        }
    }

    /// Re-reads the mappings of the live images whose mappings the kernel
    /// has (libraries loaded since, by `dlopen`) and updates those that
    /// changed; removes the mappings of images no longer live. Returns how
    /// many were updated.
    pub fn refresh_unwind(&self) -> usize {
        // Each second: the kernel lock shared, taken alone only when there
        // are mappings to remove (a writer waiting for a long read, a
        // snapshot's scan, would hold up every read after it).
        let (stale, images) = {
            let held = self.service.state.locks().kernel_shared().registry();
            let images = held.kernel.unwind_processes();
            let stale = images.iter().any(|image| !held.registry.has_live(*image));
            (stale, images)
        };
        let (images, pruned) = if stale {
            let mut held = self.service.state.locks().kernel().registry();
            let registry = &held.registry;
            let pruned = unwind::prune(&mut **held.kernel, |image| registry.has_live(image));
            (held.kernel.unwind_processes(), pruned)
        } else {
            (images, 0)
        };
        {
            let held = self.service.state.locks().registry();
            self.service
                .unwind
                .unwound
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|image, _| held.registry.has_live(*image));
        }
        if pruned > 0 {
            tracing::debug!(pruned, "unwind mappings of ended images removed");
        }
        self.remap(&images)
    }

    /// Re-reads the mappings of the live `images` and gives the unwinder
    /// those that differ from what it was given; returns how many.
    fn remap(&self, images: &[ImageId]) -> usize {
        // Each process's mappings read without the registry's lock.
        let refreshed = self.service.refreshed_images(images);
        let changed = {
            let unwound = self
                .service
                .unwind
                .unwound
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut changed = Vec::new();
            for live in refreshed.iter().filter(|i| i.is_alive()) {
                let image = live.id;
                if let Some(now) = &live.maps
                    && !unwound
                        .get(&image)
                        .is_some_and(|before| same_mappings(now, before))
                {
                    changed.push((image, now.clone()));
                }
            }
            changed
        };
        let n = changed.len();
        for (image, maps) in changed {
            self.unwind_image(image, maps);
        }
        n
    }
}

/// Whether two reads of a process's mappings have the same executable
/// mappings of the same files.
fn same_mappings(a: &ModuleMaps, b: &ModuleMaps) -> bool {
    a.anonymous() == b.anonymous()
        && a.mappings().len() == b.mappings().len()
        && a.mappings().iter().zip(b.mappings()).all(|(x, y)| {
            x.start == y.start
                && x.end == y.end
                && x.offset == y.offset
                && x.module.key() == y.module.key()
        })
}
