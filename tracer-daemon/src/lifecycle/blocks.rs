//! An image's blocks and totals as read from the kernel: [`raw_blocks`]
//! turns `LIVE_ALLOCS` entries into [`RawBlock`]s (size and return
//! addresses, each distinct stack read once), [`live_stats`] reads the
//! totals of a live image.
use std::{collections::HashMap, sync::Arc};

use tracer_common::{AllocInfo, AllocKey, ProcStats, STACK_ID_NONE};
use tracer_model::Source;

use crate::capture::{ImageId, KernelMaps, ProcTotalsSource, Stopping};

/// A live block as read from the kernel maps: size in bytes and its stack.
#[derive(Clone, Debug)]
pub struct RawBlock {
    /// Requested size in bytes.
    pub size: u64,
    /// Return addresses, frame 0 first; when the stack was not stored, only
    /// frame 0 (kept with every block).
    pub stack: Option<Arc<[u64]>>,
    /// Where it came from (the probe's cookie, `AllocInfo::source`).
    pub source: Source,
}

/// The return addresses of blocks as the kernel names them (stack id and
/// frame 0), each distinct stack read from `STACKS` once: a block whose
/// stack is not stored (or no longer is) keeps its exact call site, frame
/// 0, alone; None when it has neither.
pub struct StackReader<'a> {
    kernel: &'a dyn KernelMaps,
    stored: HashMap<u64, Option<Arc<[u64]>>>,
    frame0_only: HashMap<u64, Arc<[u64]>>,
}

impl<'a> StackReader<'a> {
    /// A reader of `kernel`'s stacks, with nothing read yet.
    pub fn new(kernel: &'a dyn KernelMaps) -> Self {
        Self {
            kernel,
            stored: HashMap::new(),
            frame0_only: HashMap::new(),
        }
    }

    /// The stack `stack_id` (frame 0 first), else `[frame0]`.
    pub fn stack(&mut self, stack_id: u64, frame0: u64) -> Option<Arc<[u64]>> {
        let kernel = self.kernel;
        let stored = if stack_id == STACK_ID_NONE {
            None
        } else {
            self.stored
                .entry(stack_id)
                .or_insert_with(|| kernel.stack(stack_id).map(Arc::from))
                .clone()
        };
        stored.or_else(|| {
            (frame0 != 0).then(|| {
                self.frame0_only
                    .entry(frame0)
                    .or_insert_with(|| Arc::from([frame0]))
                    .clone()
            })
        })
    }
}

/// Reads the stacks of `entries` (each distinct stack id once) into blocks.
/// A block whose stack is not stored keeps its exact call site (frame 0).
/// Once `stopping` is raised, or the thread's interrupt check says to stop
/// ([`tracer_model::interrupt`]), the blocks end at the next entry: only
/// some of them are returned.
pub fn raw_blocks(
    kernel: &dyn KernelMaps,
    entries: &[(AllocKey, AllocInfo)],
    stopping: &Stopping,
) -> Vec<RawBlock> {
    let mut stacks = StackReader::new(kernel);
    entries
        .iter()
        .enumerate()
        .take_while(|(step, _)| {
            !stopping.is_raised() && tracer_model::interrupt::check_every(*step).is_ok()
        })
        .map(|(_, (_, info))| RawBlock {
            size: info.size,
            stack: stacks.stack(info.stack_id, info.frame0),
            source: Source::from_code(info.source),
        })
        .collect()
}

/// The kernel's totals of a live image (zeros when the kernel tracks
/// another generation of its pid, or none), read from `totals` (the
/// kernel side's shared reader, [`KernelMaps::totals`]: no lock needed).
pub fn live_stats(totals: &dyn ProcTotalsSource, image: ImageId) -> ProcStats {
    totals
        .proc_stats(image.pid)
        .filter(|stats| stats.gen_ == image.generation)
        .unwrap_or_default()
}

/// Groups `entries` by image, keeping the order of each image's blocks.
pub fn by_image(
    entries: Vec<(AllocKey, AllocInfo)>,
) -> HashMap<ImageId, Vec<(AllocKey, AllocInfo)>> {
    let mut out: HashMap<ImageId, Vec<_>> = HashMap::new();
    for (key, info) in entries {
        out.entry(ImageId::of_block(&key, &info))
            .or_default()
            .push((key, info));
    }
    out
}
