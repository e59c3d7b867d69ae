//! Totals per (image, stack) from `STACK_TOTALS`: what statistics of a live
//! image read instead of its blocks (see `tracer_common::stack_totals`).
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};

use tracer_common::{StackTotals, StackTotalsKey};

use super::Capture;
use crate::sys::bpf as bpf_sys;

/// What statistics of a live image read: `STACK_TOTALS` and `STACKS`,
/// through descriptors of their own, without the kernel lock, so that a
/// statistics request never waits for a sweep or a snapshot's read of
/// millions of blocks ([`super::KernelMaps::totals_reader`]).
pub trait StackTotalsSource: Send + Sync {
    /// Every entry of `STACK_TOTALS` whose generation is in `generations`
    /// (None: every entry), in one pass of batch lookups over the map (its
    /// entries are per distinct stack of each image, not per block). Only
    /// some of them once tracerd's stop is raised.
    fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)>;

    /// The return addresses of stack `id`, frame 0 first, as
    /// [`super::KernelMaps::stack`].
    fn stack(&self, id: u64) -> Option<Vec<u64>>;
}

/// [`StackTotalsSource`] of the loaded maps: duplicates of their
/// descriptors, made at load.
pub struct TotalsReader {
    stack_totals: OwnedFd,
    stacks: OwnedFd,
    /// Frames a `STACKS` value holds.
    walk_frames: u32,
    /// tracerd's stop ([`super::KernelMaps::stop_with`]): a read ends at
    /// its next entry once raised.
    stopping: std::sync::Mutex<super::Stopping>,
}

impl TotalsReader {
    /// A reader of `stack_totals` and `stacks` (`walk_frames` frames a
    /// value) through duplicates of their descriptors.
    ///
    /// # Errors
    /// The descriptors could not be duplicated (no descriptor left).
    pub(super) fn new(
        stack_totals: BorrowedFd<'_>,
        stacks: BorrowedFd<'_>,
        walk_frames: u32,
        stopping: super::Stopping,
    ) -> std::io::Result<Self> {
        Ok(Self {
            stack_totals: stack_totals.try_clone_to_owned()?,
            stacks: stacks.try_clone_to_owned()?,
            walk_frames,
            stopping: std::sync::Mutex::new(stopping),
        })
    }

    /// Ends reads early once `stopping` is raised.
    pub(super) fn stop_with(&self, stopping: super::Stopping) {
        *self
            .stopping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = stopping;
    }
}

impl StackTotalsSource for TotalsReader {
    fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        let stopping = self
            .stopping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        read_stack_totals(self.stack_totals.as_fd(), &stopping, generations)
    }

    fn stack(&self, id: u64) -> Option<Vec<u64>> {
        super::stacks::read_stack(self.stacks.as_fd(), self.walk_frames, id)
    }
}

/// Every entry of the `STACK_TOTALS` map `fd` whose generation is in
/// `generations` (None: every entry), until `stopping` is raised.
fn read_stack_totals(
    fd: BorrowedFd<'_>,
    stopping: &super::Stopping,
    generations: Option<&HashSet<u32>>,
) -> Vec<(StackTotalsKey, StackTotals)> {
    let mut out = Vec::new();
    let mut keep = |key: &StackTotalsKey, totals: &StackTotals| {
        if stopping.is_raised() {
            return ControlFlow::Break(());
        }
        if generations.is_none_or(|want| want.contains(&key.gen_)) {
            out.push((*key, *totals));
        }
        ControlFlow::Continue(())
    };
    if bpf_sys::lookup_batch(fd, &mut keep).is_err() {
        bpf_sys::lookup_each(fd, &mut keep);
    }
    out
}

impl Capture {
    /// [`StackTotalsSource::stack_totals`] of the loaded `STACK_TOTALS`.
    pub fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        let fd = aya::maps::IterableMap::map(&self.stack_totals).fd().as_fd();
        read_stack_totals(fd, &self.stopping, generations)
    }

    /// Deletes entries of `STACK_TOTALS` (those of ended images: the
    /// programs never write them again); returns how many were there.
    pub fn remove_stack_totals(&mut self, keys: &[StackTotalsKey]) -> usize {
        let fd = aya::maps::IterableMap::map(&self.stack_totals).fd().as_fd();
        bpf_sys::delete_batch(fd, keys, |_| {})
    }
}
