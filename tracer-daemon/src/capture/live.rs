//! Live blocks: read and removed from the fast table and `LIVE_ALLOCS`.
use std::{cell::Cell, collections::HashSet, ops::ControlFlow, os::fd::AsFd as _, sync::Arc};

use tracer_common::{AllocInfo, AllocKey};

use super::live_table::Removed;
use super::{Capture, ImageId, ProcTotalsSource as _};
use crate::sys::bpf as bpf_sys;

/// The fewest buckets of `LIVE_ALLOCS` (its capacity rounded up to a
/// power of two, as the kernel sizes a hash) read by two walks at once: a
/// walk of fewer costs less than the second thread.
pub(super) const SPLIT_BUCKETS: u32 = 1 << 16;

/// Whether a hash of `buckets` buckets is read by two walks at once: it is
/// large, and two CPUs are there.
pub(super) fn two_walks(buckets: u32) -> bool {
    buckets >= SPLIT_BUCKETS && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
}

impl Capture {
    /// Calls `f` with every live block of the process images `want`
    /// (tgid, generation), read from the fast table (through its mapping)
    /// and `LIVE_ALLOCS`, until it breaks; with `want` None, every block of
    /// every process. One pass over each; once tracerd is stopping, the
    /// pass ends at the next block (see [`super::Stopping`]).
    pub fn for_each_live_block(
        &self,
        want: Option<&HashSet<ImageId>>,
        f: &mut dyn FnMut(&AllocKey, &AllocInfo) -> ControlFlow<()>,
    ) {
        let stopping = &self.stopping;
        // One image wanted (a snapshot of a process): compared, not hashed
        // (a lookup in the set costs as much as the rest of the block).
        // Owned: the helper of a walk in two halves may outlive this call.
        let only = want
            .filter(|w| w.len() == 1)
            .and_then(|w| w.iter().next())
            .copied();
        let set = want.filter(|w| w.len() != 1).map(|w| Arc::new(w.clone()));
        let wanted: bpf_sys::Wanted<AllocKey, AllocInfo> =
            Arc::new(move |key: &AllocKey, info: &AllocInfo| {
                let image = ImageId::of_block(key, info);
                match (only, &set) {
                    (Some(only), _) => image == only,
                    (None, Some(set)) => set.contains(&image),
                    (None, None) => true,
                }
            });
        let broke = Cell::new(false);
        let mut keep = |key: &AllocKey, info: &AllocInfo| {
            if stopping.is_raised() {
                broke.set(true);
                return ControlFlow::Break(());
            }
            if wanted(key, info) && f(key, info).is_break() {
                broke.set(true);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        };
        if let Some(table) = &self.live_table {
            table.for_each(|key, info| keep(&key, &info));
        }
        if broke.get() {
            return;
        }
        // The images' own spill maps: only the wanted images' are read.
        let owned: Vec<ImageId> = match want {
            Some(want) => want
                .iter()
                .filter(|image| self.own.has(image))
                .copied()
                .collect(),
            None => self.own.images(),
        };
        for image in &owned {
            if self.own.for_each_block(image, &mut keep) {
                return;
            }
        }
        // LIVE_ALLOCS only where a wanted image may have blocks there: a
        // live image whose count of them is 0 has none.
        if let Some(want) = want
            && want.iter().all(|image| self.spills_nothing_shared(image))
        {
            return;
        }
        // BPF_MAP_LOOKUP_BATCH reads thousands of entries per syscall (in
        // two walks at once where the map is large and two CPUs are there);
        // fall back to one lookup per key where the kernel lacks it (< 5.6).
        let fd = aya::maps::IterableMap::map(&self.live).fd().as_fd();
        let buckets = self
            .config
            .max_live_blocks
            .checked_next_power_of_two()
            .unwrap_or(1 << 31);
        let read = if two_walks(buckets) {
            bpf_sys::lookup_batch_halves(fd, buckets, Arc::clone(&wanted), &mut keep)
        } else {
            bpf_sys::lookup_batch(fd, &mut keep)
        };
        if read.is_err() {
            bpf_sys::lookup_each(fd, &mut keep);
        }
    }

    /// Whether `image` is live and has no block in `LIVE_ALLOCS` (its
    /// `shared_spill`, which the programs keep never below the truth, is 0).
    fn spills_nothing_shared(&self, image: &ImageId) -> bool {
        self.totals
            .image_totals(*image)
            .is_some_and(|t| t.shared_spill == 0)
    }

    /// Removes the given blocks from the fast table, the images' own spill
    /// maps or `LIVE_ALLOCS`; returns how many were removed (a block freed
    /// meanwhile is already gone).
    pub fn remove_blocks(&mut self, keys: &[AllocKey]) -> usize {
        self.remove_from(keys, None, &mut |_| {})
    }

    /// Removes the given blocks of the live image `image` (`clear-traces`),
    /// calling `removed` with each one removed (a block freed meanwhile is
    /// already gone), and lowers the image's counts of blocks in its own
    /// maps and in `LIVE_ALLOCS` by those removed from there (in its slot of
    /// `PROC_SLOTS`; an image in `PROCS` keeps them high, which costs only a
    /// longer read). Returns how many were removed.
    pub fn remove_image_blocks(
        &mut self,
        image: ImageId,
        keys: &[AllocKey],
        removed: &mut dyn FnMut(&AllocKey),
    ) -> usize {
        self.remove_from(keys, Some(image), removed)
    }

    /// [`Self::remove_blocks`], of the image `only` when given (its spill
    /// counts lowered).
    fn remove_from(
        &mut self,
        keys: &[AllocKey],
        only: Option<ImageId>,
        removed: &mut dyn FnMut(&AllocKey),
    ) -> usize {
        let fd = aya::maps::IterableMap::map(&self.live).fd().as_fd();
        let table = self.live_table.as_deref();
        let mut in_table = 0;
        let spilled: Vec<AllocKey> = keys
            .iter()
            .filter(|key| {
                let gone = table.is_some_and(|table| table.remove(key) == Removed::Table);
                if gone {
                    removed(key);
                    in_table += 1;
                }
                !gone
            })
            .copied()
            .collect();
        // The bucket of each block removed from a spill is told.
        let mut told = |key: &AllocKey| {
            if let Some(table) = table {
                table.spill_removed(key);
            }
            removed(key);
        };
        let mut own = 0;
        let shared = self.own.remove(spilled, only, |key| {
            told(key);
            own += 1;
        });
        let shared = bpf_sys::delete_batch(fd, &shared, told);
        if let Some(image) = only {
            self.totals
                .slots
                .lower_spill(image.pid, image.generation, own as u64, shared as u64);
        }
        in_table + own + shared
    }
}
