//! Totals per (image, stack) from `STACK_TOTALS`: what statistics of a live
//! image read instead of its blocks (see `tracer_common::stack_totals`).
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use tracer_common::{StackTotals, StackTotalsKey};

use super::Capture;
use crate::sys::bpf as bpf_sys;

/// What statistics of a live image read: `STACK_TOTALS` and `STACKS`,
/// through descriptors of their own, without the kernel lock, so that a
/// statistics request never waits for a sweep or a snapshot's read of
/// millions of blocks ([`super::StackMaps::totals_reader`]).
pub trait StackTotalsSource: Send + Sync {
    /// Every entry of `STACK_TOTALS` whose generation is in `generations`
    /// (None: every entry), in one pass of batch lookups over the map (its
    /// entries are per distinct stack of each image, not per block). Only
    /// some of them once tracerd's stop is raised.
    fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)>;

    /// The entries of `STACK_TOTALS` of image `generation`, whose
    /// [`ProcTotals::stack_keys`](tracer_common::ProcTotals::stack_keys)
    /// the caller read as `stack_keys` just before: by default a pass as
    /// [`StackTotalsSource::stack_totals`] of that generation.
    fn image_stack_totals(
        &self,
        generation: u32,
        stack_keys: u64,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        let _ = stack_keys;
        self.stack_totals(Some(&HashSet::from([generation])))
    }

    /// The return addresses of stack `id`, frame 0 first, as
    /// [`super::StackMaps::stack`].
    fn stack(&self, id: u64) -> Option<Vec<u64>>;

    /// How [`StackTotalsSource::image_stack_totals`] read, since load.
    fn reads(&self) -> StackTotalsReads {
        StackTotalsReads::default()
    }
}

/// How an image's stack totals were read since tracerd loaded (`GET
/// /maps`): by its keys, or by a pass over every image's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StackTotalsReads {
    /// Reads by the image's keys, one lookup each (its stacks unchanged
    /// since a pass read them).
    pub by_keys: u64,
    /// Reads by a pass over every image's entries.
    pub passes: u64,
}

/// Images whose keys [`TotalsReader`] keeps at most (past it, it forgets
/// them all and reads them again as they are asked for).
const INDEXED_IMAGES_MAX: usize = 4096;

/// A lookup of one key costs about this many entries of a batch pass: an
/// image's totals are read by its keys while it has fewer than the map's
/// entries over this.
const LOOKUP_COST_IN_ENTRIES: usize = 8;

/// The keys of `STACK_TOTALS` each image had when a pass read them.
#[derive(Default)]
struct KeyIndex {
    /// Generation → the image's `stack_keys` count before the pass, and
    /// the keys of that generation the pass found.
    images: HashMap<u32, (u64, Vec<StackTotalsKey>)>,
    /// Entries of every image the last pass found.
    entries: usize,
}

/// [`StackTotalsSource`] of the loaded maps: duplicates of their
/// descriptors, made at load.
pub struct TotalsReader {
    stack_totals: OwnedFd,
    stacks: OwnedFd,
    /// Frames a `STACKS` value holds.
    walk_frames: u32,
    /// tracerd's stop ([`super::ProbeMaps::stop_with`]): a read ends at
    /// its next entry once raised.
    stopping: std::sync::Mutex<super::Stopping>,
    /// The keys of the images whose totals were read: while an image's
    /// `stack_keys` count is what it was, they are all its keys.
    index: std::sync::Mutex<KeyIndex>,
    /// Reads by keys since load.
    by_keys: AtomicU64,
    /// Reads by a pass since load.
    passes: AtomicU64,
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
            index: std::sync::Mutex::default(),
            by_keys: AtomicU64::new(0),
            passes: AtomicU64::new(0),
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
        let stopping = self.stopping();
        read_stack_totals(self.stack_totals.as_fd(), &stopping, generations).0
    }

    /// By the image's keys, one lookup each, when a pass read them while
    /// its `stack_keys` count was what it is now (the programs count a key
    /// after putting it in, so every key counted then was there for the
    /// pass) and they are few beside the map's entries: O(the image's
    /// stacks), not O(every image's). Otherwise a pass, whose keys of the
    /// image are kept for the next read.
    fn image_stack_totals(
        &self,
        generation: u32,
        stack_keys: u64,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        let fd = self.stack_totals.as_fd();
        let known = {
            let index = self.index();
            index
                .images
                .get(&generation)
                .filter(|(counted, keys)| {
                    *counted == stack_keys
                        && keys.len().saturating_mul(LOOKUP_COST_IN_ENTRIES) < index.entries
                })
                .map(|(_, keys)| keys.clone())
        };
        if let Some(keys) = known
            && let Some(entries) = lookup_keys(fd, keys)
        {
            self.by_keys.fetch_add(1, Ordering::Relaxed);
            return entries;
        }
        self.passes.fetch_add(1, Ordering::Relaxed);
        let stopping = self.stopping();
        let (entries, seen) = read_stack_totals(fd, &stopping, Some(&HashSet::from([generation])));
        if !stopping.is_raised() {
            let mut index = self.index();
            if index.images.len() >= INDEXED_IMAGES_MAX {
                index.images.clear();
            }
            index.entries = seen;
            let keys = entries.iter().map(|(key, _)| *key).collect();
            index.images.insert(generation, (stack_keys, keys));
        }
        entries
    }

    fn reads(&self) -> StackTotalsReads {
        StackTotalsReads {
            by_keys: self.by_keys.load(Ordering::Relaxed),
            passes: self.passes.load(Ordering::Relaxed),
        }
    }

    fn stack(&self, id: u64) -> Option<Vec<u64>> {
        super::stacks::read_stack(self.stacks.as_fd(), self.walk_frames, id)
    }
}

impl TotalsReader {
    /// tracerd's stop as it is now set.
    fn stopping(&self) -> super::Stopping {
        self.stopping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The index, locked (a poisoned lock is taken as is: every change to
    /// it is whole).
    fn index(&self) -> std::sync::MutexGuard<'_, KeyIndex> {
        self.index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The entries of `keys` in the `STACK_TOTALS` map `fd`, one lookup each
/// (a key gone is left out); None when a lookup failed otherwise.
fn lookup_keys(
    fd: BorrowedFd<'_>,
    keys: Vec<StackTotalsKey>,
) -> Option<Vec<(StackTotalsKey, StackTotals)>> {
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        match bpf_sys::lookup_value::<_, StackTotals>(fd, &key) {
            Ok(totals) => out.push((key, totals)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(_) => return None,
        }
    }
    Some(out)
}

/// Every entry of the `STACK_TOTALS` map `fd` whose generation is in
/// `generations` (None: every entry), until `stopping` is raised; and how
/// many entries of every generation the pass saw.
fn read_stack_totals(
    fd: BorrowedFd<'_>,
    stopping: &super::Stopping,
    generations: Option<&HashSet<u32>>,
) -> (Vec<(StackTotalsKey, StackTotals)>, usize) {
    let mut out = Vec::new();
    let mut seen = 0;
    let mut keep = |key: &StackTotalsKey, totals: &StackTotals| {
        if stopping.is_raised() {
            return ControlFlow::Break(());
        }
        seen += 1;
        if generations.is_none_or(|want| want.contains(&key.generation)) {
            out.push((*key, *totals));
        }
        ControlFlow::Continue(())
    };
    if bpf_sys::lookup_batch(fd, &mut keep).is_err() {
        bpf_sys::lookup_each(fd, &mut keep);
    }
    (out, seen)
}

impl Capture {
    /// [`StackTotalsSource::stack_totals`] of the loaded `STACK_TOTALS`.
    pub fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        let fd = aya::maps::IterableMap::map(&self.stack_totals).fd().as_fd();
        read_stack_totals(fd, &self.stopping, generations).0
    }

    /// Deletes entries of `STACK_TOTALS` (those of ended images: the
    /// programs never write them again); returns how many were there.
    pub fn remove_stack_totals(&mut self, keys: &[StackTotalsKey]) -> usize {
        let fd = aya::maps::IterableMap::map(&self.stack_totals).fd().as_fd();
        bpf_sys::delete_batch(fd, keys, |_| {})
    }
}
