//! Live blocks: read and removed from the fast table and `LIVE_ALLOCS`.
use std::{collections::HashSet, ops::ControlFlow, os::fd::AsFd as _};

use tracer_common::{AllocInfo, AllocKey};

use super::live_table::Removed;
use super::{Capture, ImageId};
use crate::sys::bpf as bpf_sys;

impl Capture {
    /// Every live block of the process images `want` (tgid, generation),
    /// read from the fast table (through its mapping) and `LIVE_ALLOCS`;
    /// with `want` None, every block of every process. One pass over each;
    /// once tracerd is stopping, the pass ends at the next block and what
    /// was read so far is returned (see [`super::Stopping`]).
    pub fn live_blocks(&self, want: Option<&HashSet<ImageId>>) -> Vec<(AllocKey, AllocInfo)> {
        let mut out = Vec::new();
        let stopping = &self.stopping;
        let mut keep = |key: &AllocKey, info: &AllocInfo| {
            if stopping.is_raised() {
                return ControlFlow::Break(());
            }
            match want {
                Some(want) if !want.contains(&ImageId::of_block(key, info)) => {}
                _ => out.push((*key, *info)),
            }
            ControlFlow::Continue(())
        };
        if let Some(table) = &self.live_table {
            table.for_each(|key, info| keep(&key, &info));
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
        out
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
