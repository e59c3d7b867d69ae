//! Stacks: the return addresses the programs store in `STACKS` once per
//! distinct stack, by id, and the epoch that empties every CPU's cache of
//! its last stack when stacks are collected.
use std::os::fd::AsFd as _;

use tracer_common::{MAP_SWITCHES, STACK_CUT};

/// The last word of a stack whose walk was cut: never a return address.
pub const STACK_CUT_MARK: u64 = 0;

use super::Capture;
use crate::sys::bpf as bpf_sys;

impl Capture {
    /// The return addresses of stack `id` (frame 0 first: the call site in
    /// the allocator's caller), from `STACKS`, followed by
    /// [`STACK_CUT_MARK`] when the walk was cut (it could not reach the
    /// outermost frame); None if it is not there.
    pub fn stack(&self, id: u64) -> Option<Vec<u64>> {
        let mut value = vec![0u64; 1 + self.config.walk_frames as usize];
        let fd = self.stacks.fd().as_fd();
        bpf_sys::lookup(fd, &id, &mut value).ok()?;
        let cut = value[0] & STACK_CUT != 0;
        let mut frames: Vec<u64> = value
            .into_iter()
            .skip(1)
            .take_while(|&ip| ip != 0)
            .collect();
        if cut {
            frames.push(STACK_CUT_MARK);
        }
        Some(frames)
    }

    /// Every stack id in `STACKS` (one syscall per id).
    pub fn stack_ids(&self) -> Vec<u64> {
        bpf_sys::keys::<u64>(self.stacks.fd().as_fd())
    }

    /// Removes the given stacks from `STACKS` and raises the stack epoch
    /// (`SWITCHES[SWITCH_STACK_EPOCH]`), which empties every CPU's cache of
    /// its last stack; returns how many were removed.
    pub fn remove_stacks(&mut self, ids: &[u64]) -> usize {
        let fd = self.stacks.fd().as_fd();
        let removed = ids.iter().filter(|id| bpf_sys::delete(fd, *id)).count();
        // Every CPU's cache of its last stack may name a removed one.
        let epoch = self
            .switches
            .get(&tracer_common::SWITCH_STACK_EPOCH, 0)
            .unwrap_or(0);
        if let Err(err) =
            self.switches
                .set(tracer_common::SWITCH_STACK_EPOCH, epoch.wrapping_add(1), 0)
        {
            tracing::warn!(map = MAP_SWITCHES, %err, "cannot raise the stack epoch");
        }
        removed
    }

    /// Stacks now in `STACKS` (one syscall per stack).
    pub fn stacks_stored(&self) -> u64 {
        bpf_sys::count_keys::<u64>(self.stacks.fd().as_fd())
    }
}
