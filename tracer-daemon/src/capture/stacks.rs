//! Stacks: the return addresses the programs store in `STACKS` once per
//! distinct stack, by id, and the epoch that empties every CPU's cache of
//! its last stack when stacks are collected.
use std::os::fd::AsFd as _;

use tracer_common::{
    MAP_STACKS, MAP_SWITCHES, STACK_CHECK_SEED, STACK_CUT, stack_check_frame, stack_check_word,
};

/// The last word of a stack whose walk was cut: never a return address.
pub const STACK_CUT_MARK: u64 = 0;

use super::Capture;
use crate::sys::bpf as bpf_sys;

/// Whether `check`, the first word of a `STACKS` value, is the check hash
/// of `frames`, the value's frames: false for a value a program copied
/// from its per-CPU scratch while another task's walk on the same CPU
/// overwrote it (preemption), in the moment before the program removes it.
pub fn stack_intact(check: u64, frames: &[u64]) -> bool {
    let cut = check & STACK_CUT != 0;
    let hash = frames
        .iter()
        .fold(STACK_CHECK_SEED, |hash, &ip| stack_check_frame(hash, ip));
    stack_check_word(hash, frames.len() as u64, cut) == check
}

/// Stack `id` of the `STACKS` map `fd` (values of a check word and
/// `walk_frames` frames), as [`Capture::stack`] gives it.
pub(super) fn read_stack(
    fd: std::os::fd::BorrowedFd<'_>,
    walk_frames: u32,
    id: u64,
) -> Option<Vec<u64>> {
    let mut value = vec![0u64; 1 + walk_frames as usize];
    bpf_sys::lookup(fd, &id, &mut value).ok()?;
    let (&check, rest) = value.split_first()?;
    let cut = check & STACK_CUT != 0;
    let mut frames: Vec<u64> = rest.iter().copied().take_while(|&ip| ip != 0).collect();
    if !stack_intact(check, &frames) {
        tracing::debug!(map = MAP_STACKS, id, "stack whose check is not its frames'");
        return None;
    }
    if cut {
        frames.push(STACK_CUT_MARK);
    }
    Some(frames)
}

/// `STACKS_HELD`, mapped: the stacks in `STACKS` as the programs count
/// them (each stored raises it), which tracerd lowers for each stack it
/// collects, so that the map's reserve (`GLOBAL_STACKS_RESERVE_FROM`)
/// opens again as it empties.
pub(super) struct StacksHeld {
    map: memmap2::MmapRaw,
}

impl StacksHeld {
    /// Maps the one-slot array `fd` read-write.
    ///
    /// # Errors
    /// The kernel refused the mapping (the map is not `BPF_F_MMAPABLE`).
    pub(super) fn map(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd as _;
        let map = memmap2::MmapOptions::new()
            .len(size_of::<u64>())
            .map_raw(fd.as_raw_fd())?;
        Ok(Self { map })
    }

    fn word(&self) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: the mapping holds slot 0 (8 bytes, page-aligned); the
        // programs change it only atomically.
        unsafe { &*self.map.as_ptr().cast::<std::sync::atomic::AtomicU64>() }
    }

    /// The count now.
    pub(super) fn get(&self) -> u64 {
        self.word().load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lowers the count by `removed` stacks, never below 0.
    pub(super) fn release(&self, removed: u64) {
        let _ = self.word().fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Relaxed,
            |held| Some(held.saturating_sub(removed)),
        );
    }
}

impl Capture {
    /// The return addresses of stack `id` (frame 0 first: the call site in
    /// the allocator's caller), from `STACKS`, followed by
    /// [`STACK_CUT_MARK`] when the walk was cut (it could not reach the
    /// outermost frame); None if it is not there, or if its first word is
    /// not the check hash of its frames ([`stack_intact`]).
    pub fn stack(&self, id: u64) -> Option<Vec<u64>> {
        read_stack(self.stacks.fd().as_fd(), self.config.walk_frames, id)
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
        self.stacks_held.release(removed as u64);
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

    /// Stacks now in `STACKS`, as the programs count them (`STACKS_HELD`:
    /// one read, rather than a syscall per stack).
    pub fn stacks_stored(&self) -> u64 {
        self.stacks_held.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first word the programs store for `frames`.
    fn word(frames: &[u64], cut: bool) -> u64 {
        let hash = frames
            .iter()
            .fold(STACK_CHECK_SEED, |hash, &ip| stack_check_frame(hash, ip));
        stack_check_word(hash, frames.len() as u64, cut)
    }

    #[test]
    fn the_fuller_the_stack_map_the_fewer_stacks_a_process_may_hold_to_store_one() {
        let mut config = crate::capture::CaptureConfig::from(&crate::config::Config::default());
        config.max_stacks = 1024;
        assert_eq!(config.process_max_stacks(), 512);
        assert_eq!(config.stacks_reserve_from(), 768);
        // Below the reserve: the share alone.
        assert!(!config.past_stack_share(511, 767));
        assert!(config.past_stack_share(512, 100));
        // In it: less than a quarter of the room left (256 at 768 stored,
        // 64 at 960, 1 at 1020).
        assert!(!config.past_stack_share(63, 768));
        assert!(config.past_stack_share(64, 768));
        assert!(!config.past_stack_share(15, 960));
        assert!(config.past_stack_share(16, 960));
        assert!(!config.past_stack_share(0, 1020));
        assert!(config.past_stack_share(1, 1020));
        // A process may hold the whole map: no share, no reserve.
        config.process_share = 100;
        assert_eq!(config.stacks_reserve_from(), 0);
        assert!(!config.past_stack_share(1000, 1020));
    }

    #[test]
    fn a_stack_is_intact_only_with_the_check_of_its_own_frames() {
        let frames = [0x40_1136, 0x40_1180, 0x7f00_0002_9d90];
        assert!(stack_intact(word(&frames, false), &frames));
        assert!(stack_intact(word(&frames, true), &frames));
        // Another walk's frame in the middle, a frame missing, one more.
        let torn = [0x40_1136, 0x40_11a4, 0x7f00_0002_9d90];
        assert!(!stack_intact(word(&frames, false), &torn));
        assert!(!stack_intact(word(&frames, false), &frames[..2]));
        assert!(!stack_intact(word(&frames[..2], false), &frames));
        // The cut bit is part of the check.
        assert!(!stack_intact(word(&frames, false) | STACK_CUT, &frames));
    }
}
