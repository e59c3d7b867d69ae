//! Housekeeping: the kernel's process events as they come, and the
//! periodic passes: expiry of ended images (and of tracing state kept for
//! images that are gone), and the orphan sweep over the kernel maps.
use std::time::SystemTime;

use tracer_common::ProcEvent;

use super::Service;
use crate::lifecycle::events::{self, Event};
use crate::lifecycle::registry::EndEvent;
use crate::lifecycle::{orphans, scope};

impl Service {
    /// Handles a batch of kernel process events in order: a new image is
    /// read from `/proc` at once (while it lives), exec and fork events of a
    /// scoped tracerd attach or detach, and the ended images' blocks are
    /// collected and removed from the kernel maps in one pass per batch
    /// (or before a new image of the same pid). New images, and images
    /// that mapped code, wait for their unwind tables in
    /// [`Service::unwind_pending`].
    pub fn handle_events(&self, batch: &[ProcEvent]) {
        let mut ends = Vec::new();
        for event in batch {
            match events::decode(event) {
                Some(Event::New { image, comm }) => {
                    // Events apply in order: an exec's end of the old image
                    // first, so the new image never finds the old one live.
                    if ends.iter().any(|end: &EndEvent| end.image.pid == image.pid) {
                        self.end_images(std::mem::take(&mut ends));
                    }
                    let image = events::new_image(image, &comm);
                    ::tracing::debug!(pid = image.id.pid, gen = image.id.generation, comm = %image.comm, "new image");
                    let (id, maps) = (image.id, image.maps.clone());
                    self.state.locks().registry().registry.add(image);
                    if let Some(maps) = maps {
                        self.queue_unwind(id, maps);
                    }
                }
                Some(Event::End(end)) => ends.push(end),
                Some(Event::Mapped { image }) => {
                    self.queue_discovery(image.pid, true);
                    self.queue_remap(image);
                }
                Some(Event::ScopeCandidate { pid, is_fork }) => {
                    if !is_fork {
                        self.queue_discovery(pid, true);
                    }
                    let mut held = self.state.locks().kernel().scope();
                    scope::on_exec_or_fork(&mut **held.kernel, &held.scope, pid, is_fork);
                }
                None => {}
            }
        }
        self.end_images(ends);
    }

    /// Ends images: their blocks collected in one pass and removed.
    fn end_images(&self, ends: Vec<EndEvent>) {
        if ends.is_empty() {
            return;
        }
        let mut held = self.state.locks().kernel().registry();
        for end in &ends {
            held.kernel
                .remove_process_mappings(end.image.pid, end.image.generation);
        }
        events::end_images(&mut **held.kernel, &mut held.registry, ends);
    }

    /// Drops ended images past their retention (and ends live images whose
    /// process is gone without an end event), then forgets the tracing
    /// state of images the registry no longer knows.
    pub fn expire(&self) {
        let mut held = self.state.locks().registry().control();
        held.registry.expire(SystemTime::now());
        let registry = &held.registry;
        held.control.retain(|image| registry.knows(image));
    }

    /// Detaches the probes of scoped processes that are gone, collects
    /// unreferenced stacks when due, and removes the blocks of images that
    /// ended without their end being handled here (see
    /// [`crate::lifecycle::Registry::orphaned_blocks`]). Returns the number
    /// of blocks removed.
    pub fn sweep_orphans(&self) -> usize {
        let mut held = self.state.locks().kernel();
        scope::prune(&mut **held.kernel);
        let scan = orphans::scan(&mut **held.kernel);
        let mut held = held.registry();
        let doomed = orphans::doomed(&scan, &mut held.registry);
        drop(held.registry);
        held.kernel.remove_blocks(&doomed)
    }
}
