//! The kernel's process events (the `EVENTS` ring buffer), decoded through
//! [`ProcEventKind`]'s `TryFrom<u32>` and applied: a new image is read from `/proc` while it
//! lives; ended images have their blocks collected in one pass over the
//! kernel maps, kept as their last state, and removed from the maps.
use std::collections::{HashMap, HashSet};

use tracer_common::{AllocInfo, AllocKey, ProcEvent, ProcEventKind};

use super::blocks::{by_image, raw_blocks};
use super::image::{EndReason, ProcessImage};
use super::registry::{EndEvent, Registry};
use crate::capture::{ImageId, KernelMaps, Stopping};

/// One decoded process event.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A new image: at a fork, an exec, or (a process running before
    /// tracerd) its first allocation.
    New {
        /// The image.
        image: ImageId,
        /// The kernel's `comm` then, NUL-padded (used when `/proc` is gone).
        comm: [u8; 16],
        /// The parent's pid when the image starts at a fork (None: at an
        /// exec or a first allocation).
        parent: Option<u32>,
    },
    /// An image ended (exec or exit), with its final totals.
    End(EndEvent),
    /// A traced image is mapping a file's code (`dlopen`): its mappings
    /// are re-read for the unwinder.
    Mapped {
        /// The image.
        image: ImageId,
    },
    /// A traced image needs the next level of its own spill map.
    Spill {
        /// The image.
        image: ImageId,
        /// The level asked for.
        level: u32,
    },
    /// A process exec'd or forked while scoped (it may enter or leave the
    /// scope).
    ScopeCandidate {
        /// The process.
        pid: u32,
        /// A fork (else an exec).
        is_fork: bool,
    },
}

/// Decodes a kernel event; None for an unknown kind.
#[must_use]
pub fn decode(event: &ProcEvent) -> Option<Event> {
    let image = ImageId::new(event.tgid, event.generation);
    let end = |reason| {
        Event::End(EndEvent {
            image,
            reason,
            stats: event.stats,
        })
    };
    Some(match ProcEventKind::try_from(event.kind).ok()? {
        ProcEventKind::New => Event::New {
            image,
            comm: event.comm,
            parent: (event.detail != 0).then_some(event.detail),
        },
        ProcEventKind::Exec => end(EndReason::Exec),
        ProcEventKind::Exit => end(EndReason::Exit),
        ProcEventKind::ExecAny => Event::ScopeCandidate {
            pid: event.tgid,
            is_fork: false,
        },
        ProcEventKind::Fork => Event::ScopeCandidate {
            pid: event.tgid,
            is_fork: true,
        },
        ProcEventKind::Mapped => Event::Mapped { image },
        ProcEventKind::Spill => Event::Spill {
            image,
            level: event.detail,
        },
    })
}

/// A new image as read from `/proc` now, named by the kernel's `comm` of
/// its event (`/proc/PID/comm` when the event has none).
#[must_use]
pub fn new_image(image: ImageId, kernel_comm: &[u8; 16]) -> ProcessImage {
    let mut read = ProcessImage::capture(image);
    // The kernel's comm is the image's own, sent at its exec; `/proc` read
    // a moment later may show the next program the process exec'd since.
    let comm = comm_of(kernel_comm);
    if !comm.is_empty() {
        read.comm = comm;
    }
    read
}

/// The kernel's `comm` of an event, NUL-padded, as a string.
#[must_use]
pub fn comm_of(kernel_comm: &[u8; 16]) -> String {
    let len = kernel_comm
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(kernel_comm.len());
    String::from_utf8_lossy(kernel_comm.get(..len).unwrap_or_default()).into_owned()
}

/// The live blocks of `images` in the kernel maps, by image: one pass over
/// the maps for every image that ends in a batch of events (see
/// [`end_images_from`]).
pub fn blocks_of(
    kernel: &dyn KernelMaps,
    images: &HashSet<ImageId>,
) -> HashMap<ImageId, Vec<(AllocKey, AllocInfo)>> {
    if images.is_empty() {
        return HashMap::new();
    }
    by_image(kernel.live_blocks(Some(images)))
}

/// Ends `ends` in the registry: each ended image's blocks are read in one
/// pass over the kernel maps and kept as its last state, then removed from
/// the maps. One process can end twice in a batch (exec, then exit): ends
/// are keyed by image, never by pid alone. Returns the blocks removed.
/// Once `stopping` is raised, the blocks kept are only some of them (the
/// maps go with tracerd a moment later).
pub fn end_images(
    kernel: &mut dyn KernelMaps,
    registry: &mut Registry,
    ends: Vec<EndEvent>,
    stopping: &Stopping,
) -> usize {
    let want: HashSet<ImageId> = ends.iter().map(|e| e.image).collect();
    let mut blocks = blocks_of(kernel, &want);
    end_images_from(kernel, registry, ends, &mut blocks, stopping)
}

/// [`end_images`] with the blocks read already ([`blocks_of`] of these
/// images and maybe others, taken out as used): a batch of events reads the
/// maps once for all its ends, however many times its new images make it
/// apply the ends before them. An image's blocks do not change once it
/// ended: no call of it runs after its exit or exec.
pub fn end_images_from(
    kernel: &mut dyn KernelMaps,
    registry: &mut Registry,
    ends: Vec<EndEvent>,
    blocks: &mut HashMap<ImageId, Vec<(AllocKey, AllocInfo)>>,
    stopping: &Stopping,
) -> usize {
    if ends.is_empty() {
        return 0;
    }
    let images: Vec<ImageId> = ends.iter().map(|end| end.image).collect();
    let (ended, keys) = collect_ended(&*kernel, ends, blocks, stopping);
    for (end, kept) in ended {
        registry.end(end, kept);
    }
    let removed = remove_ended(kernel, &keys);
    kernel.drop_own_spill(&images);
    removed
}

/// An ended image with the blocks it keeps as its last state.
pub type EndedBlocks = (EndEvent, Vec<super::RawBlock>);

/// The first step of [`end_images_from`], which needs the kernel maps but
/// not the registry: each ended image's blocks (taken out of `blocks`)
/// read into what it keeps (their stacks read), and the keys of all of
/// them, to remove once the registry has them ([`remove_ended`]).
pub fn collect_ended(
    kernel: &dyn KernelMaps,
    ends: Vec<EndEvent>,
    blocks: &mut HashMap<ImageId, Vec<(AllocKey, AllocInfo)>>,
    stopping: &Stopping,
) -> (Vec<EndedBlocks>, Vec<AllocKey>) {
    let mut keys = Vec::new();
    let ended = ends
        .into_iter()
        .map(|end| {
            let entries = blocks.remove(&end.image).unwrap_or_default();
            keys.extend(entries.iter().map(|(k, _)| *k));
            let kept = raw_blocks(kernel, &entries, stopping);
            tracing::debug!(pid = end.image.pid, gen = end.image.generation, blocks = kept.len(), "image ended");
            (end, kept)
        })
        .collect();
    (ended, keys)
}

/// The last step of [`end_images_from`]: the ended images' blocks `keys`
/// leave the kernel maps. Returns how many were removed.
pub fn remove_ended(kernel: &mut dyn KernelMaps, keys: &[AllocKey]) -> usize {
    let started = std::time::Instant::now();
    let removed = kernel.remove_blocks(keys);
    tracing::debug!(
        removed,
        remove_ms = started.elapsed().as_millis() as u64,
        "ended images removed from the kernel maps"
    );
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::ProcStats;

    fn event(kind: ProcEventKind) -> ProcEvent {
        ProcEvent {
            kind: kind as u32,
            tgid: 42,
            generation: 7,
            comm: *b"app\0\0\0\0\0\0\0\0\0\0\0\0\0",
            stats: ProcStats {
                current: 5,
                ..ProcStats::default()
            },
            ..ProcEvent::default()
        }
    }

    #[test]
    fn every_kind_decodes_through_the_enum_and_unknown_kinds_are_skipped() {
        assert!(matches!(
            decode(&event(ProcEventKind::New)),
            Some(Event::New { image, .. }) if image == ImageId::new(42, 7)
        ));
        assert!(matches!(
            decode(&event(ProcEventKind::Exec)),
            Some(Event::End(EndEvent { reason: EndReason::Exec, stats, .. })) if stats.current == 5
        ));
        assert!(matches!(
            decode(&event(ProcEventKind::Exit)),
            Some(Event::End(EndEvent {
                reason: EndReason::Exit,
                ..
            }))
        ));
        assert!(matches!(
            decode(&event(ProcEventKind::ExecAny)),
            Some(Event::ScopeCandidate {
                pid: 42,
                is_fork: false
            })
        ));
        assert!(matches!(
            decode(&event(ProcEventKind::Fork)),
            Some(Event::ScopeCandidate {
                pid: 42,
                is_fork: true
            })
        ));
        assert!(matches!(
            decode(&event(ProcEventKind::Mapped)),
            Some(Event::Mapped { image }) if image == ImageId::new(42, 7)
        ));
        let mut unknown = event(ProcEventKind::New);
        unknown.kind = 99;
        assert!(decode(&unknown).is_none());
    }

    #[test]
    fn a_process_gone_before_proc_is_read_keeps_the_kernels_comm() {
        // Above the kernel's largest pid_max: never a process.
        let image = new_image(ImageId::new(5_000_000, 1), b"short-lived\0\0\0\0\0");
        assert_eq!(image.comm, "short-lived");
        assert_eq!(image.start_time, 0);
    }
}
