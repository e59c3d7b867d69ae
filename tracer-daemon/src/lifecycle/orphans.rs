//! The housekeeping sweep over the kernel maps: blocks of images that ended
//! without their end event (lost to a full ring buffer) are removed (see
//! [`Registry::orphaned_blocks`]), and stacks no block references are
//! collected when `STACKS` is half full.
use std::collections::{HashMap, HashSet};

use tracer_common::{AllocInfo, AllocKey, MAP_STACKS, STACK_ID_NONE};

use super::registry::Registry;
use crate::capture::{ImageId, KernelMaps, Stopping};

/// What one scan of the kernel maps found: every live block, the stacks
/// listed before the scan (when collection is due), and the images the
/// kernel tracks (read after the blocks).
#[derive(Debug, Default)]
pub struct Scan {
    entries: Vec<(AllocKey, AllocInfo)>,
    tracked: HashSet<ImageId>,
}

impl Scan {
    /// Whether the kernel tracked `image` (its totals) at the scan.
    #[must_use]
    pub fn tracks(&self, image: &ImageId) -> bool {
        self.tracked.contains(image)
    }
}

/// What [`walk`] read: every live block, and the stacks listed before it
/// (when collection is due).
#[derive(Debug, Default)]
pub struct Walked {
    entries: Vec<(AllocKey, AllocInfo)>,
    stacks_before: Option<Vec<u64>>,
}

/// The scan's first step: reads every live block, and first the stored
/// stacks' ids when `STACKS` is at least half full (collection is due:
/// those that no block references are collected, [`digest`] and [`apply`];
/// a block stored after the walk with such a stack shows no traceback
/// until that stack is stored again by its next allocation). Only reads:
/// the kernel lock may be shared meanwhile (a snapshot's scan need not
/// wait for it). None, with nothing collected, when `stopping` was raised
/// during the walk: the blocks read are then only some of them.
pub fn walk(kernel: &dyn KernelMaps, stopping: &Stopping) -> Option<Walked> {
    let max_stacks = u64::from(kernel.config().max_stacks);
    let stacks_before = (kernel.stacks_stored() * 2 > max_stacks).then(|| kernel.stack_ids());
    let entries = kernel.live_blocks(None);
    (!stopping.is_raised()).then_some(Walked {
        entries,
        stacks_before,
    })
}

/// What [`digest`] made of a walk, for [`apply`].
#[derive(Debug, Default)]
pub struct Digest {
    walked: Walked,
    /// The ids listed before the walk that no block references (None:
    /// collection not due).
    unreferenced: Option<Vec<u64>>,
    /// (tgid, generation, distinct stacks) of every image with blocks.
    stack_counts: Vec<(u32, u32, u64)>,
}

/// The stacks no block of `walked` references (of those listed before it)
/// and each image's distinct stacks: a pass over the blocks that needs no
/// lock. None once `stopping` is raised.
pub fn digest(walked: Walked, stopping: &Stopping) -> Option<Digest> {
    let unreferenced = match &walked.stacks_before {
        Some(before) => {
            let mut referenced: HashSet<u64> = HashSet::new();
            for (step, (_, info)) in walked.entries.iter().enumerate() {
                if stopped(step, stopping) {
                    return None;
                }
                referenced.insert(info.stack_id);
            }
            Some(
                before
                    .iter()
                    .copied()
                    .filter(|id| !referenced.contains(id))
                    .collect(),
            )
        }
        None => None,
    };
    let stack_counts = stack_counts(&walked.entries, stopping)?;
    Some(Digest {
        walked,
        unreferenced,
        stack_counts,
    })
}

/// Collects the unreferenced stacks of `digest` (see [`walk`]), sets each
/// image's stack count, and reads the images the kernel tracks now (after
/// the blocks were read): the kernel lock held alone.
pub fn apply(kernel: &mut dyn KernelMaps, digest: Digest) -> Scan {
    if let Some(unreferenced) = &digest.unreferenced {
        let removed = kernel.remove_stacks(unreferenced);
        tracing::info!(removed, map = MAP_STACKS, "collected unreferenced stacks");
    }
    kernel.set_stack_counts(&digest.stack_counts);
    let tracked = kernel
        .all_proc_stats()
        .into_iter()
        .map(|(tgid, stats)| ImageId::new(tgid, stats.generation))
        .collect();
    Scan {
        entries: digest.walked.entries,
        tracked,
    }
}

/// The distinct stored stacks the blocks of `entries` reference, by image:
/// (tgid, generation, stacks), what each image's share of `STACKS` counts.
fn stack_counts(
    entries: &[(AllocKey, AllocInfo)],
    stopping: &Stopping,
) -> Option<Vec<(u32, u32, u64)>> {
    let mut stacks: HashMap<ImageId, HashSet<u64>> = HashMap::new();
    for (step, (key, info)) in entries.iter().enumerate() {
        if stopped(step, stopping) {
            return None;
        }
        if info.stack_id != STACK_ID_NONE {
            stacks
                .entry(ImageId::of_block(key, info))
                .or_default()
                .insert(info.stack_id);
        }
    }
    Some(
        stacks
            .into_iter()
            .map(|(image, ids)| (image.pid, image.generation, ids.len() as u64))
            .collect(),
    )
}

/// Whether tracerd's stop was raised, looked at every 65,536 steps of a
/// pass over the blocks: a pass under the kernel lock ends soon after it,
/// so that the stop's record (which reads the counters under that lock)
/// is not kept waiting by millions of blocks.
fn stopped(step: usize, stopping: &Stopping) -> bool {
    step.is_multiple_of(65_536) && stopping.is_raised()
}

/// The blocks of `scan` whose image the kernel no longer tracks: the only
/// ones that can be orphaned (usually none). Found without the registry,
/// so that its lock, which the cheap routes need, is not held over
/// millions of blocks.
/// None once `stopping` is raised (the sweep then changes nothing).
pub fn untracked(scan: &Scan, stopping: &Stopping) -> Option<Vec<(AllocKey, AllocInfo)>> {
    let mut out = Vec::new();
    for (step, (key, info)) in scan.entries.iter().enumerate() {
        if stopped(step, stopping) {
            return None;
        }
        if !scan.tracked.contains(&ImageId::of_block(key, info)) {
            out.push((*key, *info));
        }
    }
    Some(out)
}

/// The blocks to remove among `untracked` (those of [`untracked`] of
/// `scan`): those of images that are orphaned for the second sweep in a
/// row.
pub fn doomed(
    scan: &Scan,
    untracked: &[(AllocKey, AllocInfo)],
    registry: &mut Registry,
) -> Vec<AllocKey> {
    registry.orphaned_blocks(untracked, &scan.tracked)
}
