//! Live blocks: read and removed from the fast table and `LIVE_ALLOCS`.
use std::{cell::Cell, collections::HashSet, ops::ControlFlow, os::fd::AsFd as _};

use tracer_common::{AllocInfo, AllocKey};

use super::live_table::Removed;
use super::{Capture, ImageId};
use crate::sys::bpf as bpf_sys;

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
        let only = want.filter(|w| w.len() == 1).and_then(|w| w.iter().next());
        let broke = Cell::new(false);
        let mut keep = |key: &AllocKey, info: &AllocInfo| {
            if stopping.is_raised() {
                broke.set(true);
                return ControlFlow::Break(());
            }
            let image = ImageId::of_block(key, info);
            let wanted = match (only, want) {
                (Some(only), _) => image == *only,
                (None, Some(want)) => want.contains(&image),
                (None, None) => true,
            };
            if wanted && f(key, info).is_break() {
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
        // BPF_MAP_LOOKUP_BATCH reads thousands of entries per syscall; fall
        // back to one lookup per key where the kernel lacks it (< 5.6).
        if bpf_sys::lookup_batch(
            aya::maps::IterableMap::map(&self.live).fd().as_fd(),
            &mut keep,
        )
        .is_err()
        {
            for (key, info) in self.live.iter().flatten() {
                if keep(&key, &info).is_break() {
                    break;
                }
            }
        }
    }

    /// Removes the given blocks from the fast table or `LIVE_ALLOCS`;
    /// returns how many were removed (a block freed meanwhile is already
    /// gone).
    pub fn remove_blocks(&mut self, keys: &[AllocKey]) -> usize {
        let fd = aya::maps::IterableMap::map(&self.live).fd().as_fd();
        let Some(table) = &self.live_table else {
            return bpf_sys::delete_batch(fd, keys, |_| {});
        };
        let spilled: Vec<AllocKey> = keys
            .iter()
            .filter(|key| table.remove(key) == Removed::NotInTable)
            .copied()
            .collect();
        // The bucket of each block removed from LIVE_ALLOCS is told.
        let removed = bpf_sys::delete_batch(fd, &spilled, |key| table.spill_removed(key));
        keys.len() - spilled.len() + removed
    }
}
