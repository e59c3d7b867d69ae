//! An image's blocks and totals as read from the kernel: [`raw_blocks`]
//! turns `LIVE_ALLOCS` entries into [`RawBlock`]s (size and return
//! addresses, each distinct stack read once), [`live_stats`] reads the
//! totals of a live image.
use std::{
    collections::{HashMap, HashSet},
    ops::ControlFlow,
    sync::Arc,
};

use tracer_common::{AllocInfo, AllocKey, ProcStats, STACK_ID_NONE};
use tracer_model::AllocatorFamily;

use crate::capture::stack_totals::StackTotalsSource;
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
    pub source: AllocatorFamily,
}

/// A block's return addresses, frame 0 first (None: unknown).
type BlockStack = Option<Arc<[u64]>>;

/// The return addresses of blocks as the kernel names them (stack id and
/// frame 0), each distinct stack read from `STACKS` once: a block whose
/// stack is not stored (or no longer is) keeps its exact call site, frame
/// 0, alone; None when it has neither.
pub struct StackReader<'a> {
    kernel: Stacks<'a>,
    stored: HashMap<u64, Option<Arc<[u64]>>>,
    frame0_only: HashMap<u64, Arc<[u64]>>,
    /// The last (stack id, frame 0) asked and its answer: blocks come in
    /// runs of one stack, and a hit costs no hashing.
    last: Option<(u64, u64, BlockStack)>,
}

/// Where a [`StackReader`] reads `STACKS`: the kernel maps (under the
/// kernel lock), or the statistics' reader of its own.
#[derive(Clone, Copy)]
enum Stacks<'a> {
    Kernel(&'a dyn KernelMaps),
    AllocatorFamily(&'a dyn StackTotalsSource),
}

impl Stacks<'_> {
    fn stack(self, id: u64) -> Option<Vec<u64>> {
        match self {
            Self::Kernel(kernel) => kernel.stack(id),
            Self::AllocatorFamily(source) => source.stack(id),
        }
    }
}

impl<'a> StackReader<'a> {
    /// A reader of `kernel`'s stacks, with nothing read yet.
    pub fn new(kernel: &'a dyn KernelMaps) -> Self {
        Self::of(Stacks::Kernel(kernel))
    }

    /// A reader of the stacks of `source` (no kernel lock needed), with
    /// nothing read yet.
    pub fn from_source(source: &'a dyn StackTotalsSource) -> Self {
        Self::of(Stacks::AllocatorFamily(source))
    }

    fn of(kernel: Stacks<'a>) -> Self {
        Self {
            kernel,
            stored: HashMap::new(),
            frame0_only: HashMap::new(),
            last: None,
        }
    }

    /// The stack `stack_id` (frame 0 first), else `[frame0]`.
    pub fn stack(&mut self, stack_id: u64, frame0: u64) -> Option<Arc<[u64]>> {
        if let Some((id, frame, stack)) = &self.last
            && *id == stack_id
            && *frame == frame0
        {
            return stack.clone();
        }
        let stack = self.lookup(stack_id, frame0);
        self.last = Some((stack_id, frame0, stack.clone()));
        stack
    }

    /// [`StackReader::stack`] through the tables.
    fn lookup(&mut self, stack_id: u64, frame0: u64) -> Option<Arc<[u64]>> {
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
            source: AllocatorFamily::from_code(info.source),
        })
        .collect()
}

/// The live blocks of `image` read straight from the kernel maps into
/// blocks ([`raw_blocks`] of [`BlockMaps::live_blocks`] without keeping
/// each key and value first); `expected` blocks are made room for. Once
/// `stopping` is raised, or the thread's interrupt check says to stop, the
/// blocks end at the next entry: only some of them are returned.
pub fn live_raw_blocks(
    kernel: &dyn KernelMaps,
    image: ImageId,
    expected: usize,
    stopping: &Stopping,
) -> Vec<RawBlock> {
    let mut stacks = StackReader::new(kernel);
    let mut out = Vec::with_capacity(expected);
    let mut step = 0usize;
    kernel.for_each_live_block(Some(&HashSet::from([image])), &mut |_, info| {
        if stopping.is_raised() || tracer_model::interrupt::check_every(step).is_err() {
            return ControlFlow::Break(());
        }
        step += 1;
        out.push(RawBlock {
            size: info.size,
            stack: stacks.stack(info.stack_id, info.frame0),
            source: AllocatorFamily::from_code(info.source),
        });
        ControlFlow::Continue(())
    });
    out
}

/// The kernel's totals of a live image (zeros when the kernel tracks
/// another generation of its pid, or none), read from `totals` (the
/// kernel side's shared reader, [`TotalsMaps::totals`]: no lock needed).
pub fn live_stats(totals: &dyn ProcTotalsSource, image: ImageId) -> ProcStats {
    totals
        .proc_stats(image.pid)
        .filter(|stats| stats.generation == image.generation)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;
    use crate::capture::BlockMaps;
    use crate::capture::fake::FakeKernel;

    #[test]
    fn a_streamed_read_is_the_blocks_of_its_image_as_the_two_pass_read_gives_them() {
        let kernel = FakeKernel::new(16);
        let (image, _) = kernel.start(10);
        kernel.start(11);
        kernel.alloc(10, 0x1000, 24, &[0x40, 0x50]);
        kernel.alloc(11, 0x1000, 99, &[0x40, 0x50]);
        kernel.alloc(10, 0x2000, 32, &[0x40, 0x50]);
        kernel.alloc(10, 0x3000, 8, &[0x60]);
        kernel.alloc(10, 0x4000, 16, &[0x40, 0x50]);
        kernel.alloc(10, 0x5000, 40, &[]);
        let stopping = Stopping::default();
        let streamed = live_raw_blocks(&kernel, image, 2, &stopping);
        let entries = kernel.live_blocks(Some(&HashSet::from([image])));
        let two_pass = raw_blocks(&kernel, &entries, &stopping);
        let shape = |blocks: &[RawBlock]| -> Vec<(u64, Option<Vec<u64>>)> {
            blocks
                .iter()
                .map(|b| (b.size, b.stack.as_ref().map(|s| s.to_vec())))
                .collect()
        };
        assert_eq!(
            shape(&streamed),
            [
                (24, Some(vec![0x40, 0x50])),
                (32, Some(vec![0x40, 0x50])),
                (8, Some(vec![0x60])),
                (16, Some(vec![0x40, 0x50])),
                (40, None),
            ]
        );
        assert_eq!(shape(&streamed), shape(&two_pass));
        // One stack read once is one allocation for all its blocks, even
        // after another stack came between them.
        let first = streamed[0].stack.as_ref().unwrap();
        assert!(Arc::ptr_eq(first, streamed[1].stack.as_ref().unwrap()));
        assert!(Arc::ptr_eq(first, streamed[3].stack.as_ref().unwrap()));
    }

    #[test]
    fn a_streamed_read_ends_at_once_when_tracerd_stops() {
        let kernel = FakeKernel::new(16);
        let (image, _) = kernel.start(10);
        kernel.alloc(10, 0x1000, 24, &[0x40]);
        let stopping = Stopping::default();
        stopping.raise();
        assert!(live_raw_blocks(&kernel, image, 0, &stopping).is_empty());
    }
}
