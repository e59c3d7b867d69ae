//! One level map of the per-image spill: what it is, how tracerd makes it,
//! and how it is put in `OWN_LIVE` under its id.
use std::{
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
    sync::Arc,
};

use tracer_common::AllocInfo;

use crate::sys::bpf as bpf_sys;

/// One level map: its id (its key in `OWN_LIVE`), its descriptor, and the
/// blocks it holds at most.
#[derive(Clone, Debug)]
pub(super) struct LevelMap {
    pub(super) id: u32,
    pub(super) map: Arc<OwnedFd>,
    pub(super) blocks: u64,
}

/// A level map of `blocks` blocks with id `id`; None when the kernel
/// refused (logged).
pub(super) fn create_level(id: u32, blocks: u64) -> Option<LevelMap> {
    match bpf_sys::create_hash::<u64, AllocInfo>(
        "own_spill",
        u32::try_from(blocks).unwrap_or(u32::MAX),
        bpf_sys::BPF_F_NO_PREALLOC,
    ) {
        Ok(map) => Some(LevelMap {
            id,
            map: Arc::new(map),
            blocks,
        }),
        Err(e) => {
            tracing::debug!(blocks, err = %e, "spill map not created: its blocks go to LIVE_ALLOCS");
            None
        }
    }
}

/// Puts `maps` in `OWN_LIVE` (`outer`) under their ids, in one batch (one
/// grace period), one at a time for those the batch did not put (a kernel
/// without the batch command); whether each is there.
pub(super) fn put_in_outer(outer: BorrowedFd<'_>, maps: &[&LevelMap]) -> Vec<bool> {
    if maps.is_empty() {
        return Vec::new();
    }
    let ids: Vec<u32> = maps.iter().map(|level| level.id).collect();
    let fds: Vec<u32> = maps
        .iter()
        .map(|level| level.map.as_raw_fd() as u32)
        .collect();
    let put = bpf_sys::update_batch(outer, &ids, &fds, 0).unwrap_or_else(|(put, e)| {
        tracing::debug!(err = %e, put, of = ids.len(), "spill maps not put in one batch: one at a time");
        put
    });
    (0..ids.len())
        .map(|index| {
            index < put
                || bpf_sys::update(outer, &ids[index], &fds[index], 0)
                    .inspect_err(|e| tracing::debug!(id = ids[index], err = %e, "spill map not put in OWN_LIVE: its blocks go to LIVE_ALLOCS"))
                    .is_ok()
        })
        .collect()
}
