//! Grouping of traces: the core of `statistics()` and `compare_to()`
//! (tracemalloc's `Snapshot._group_by` and `_compare_grouped_stats`).
//!
//! For tracemalloc's groupings (`filename`, `lineno`, `traceback`) the
//! snapshot's [`Index`] numbers every distinct traceback, frame and file
//! in tracemalloc's sort order, so grouping is additions into dense
//! arrays:
//! 1. stage 1 sums size and count per distinct `Arc<Traceback>` (one pass
//!    over the traces), then per traceback;
//! 2. stage 2 adds each traceback's totals to its most recent frame, or
//!    to every frame (each occurrence) under `cumulative`, and frames'
//!    totals to their files;
//! 3. the groups' keys (size, count, id; for diffs the differences and
//!    the position in the merged order of both snapshots' keys) are
//!    packed into integers and sorted while another thread makes the
//!    groups' tracebacks in group order (from the index's tables), and the
//!    results are built in sorted order.
//!
//! `compare_to()` matches the two snapshots' groups by merging their
//! ordered files, frames and tracebacks, which also orders the groups
//! only one of them has.
//!
//! The `function` and `module` groupings (not tracemalloc's) group the
//! distinct `Arc`s by hashing their labels, in order of first appearance.
//!
//! Representatives (whose `FrameExtra` a statistic reports) are the first
//! occurrences in the snapshot, as the index records them: results do not
//! depend on hash-table or thread order.

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::hash::Hash;
use std::sync::Arc;

use super::hash::FxHashMap;
use super::index::{Index, Interned, NONE};
use super::table::{AHEAD, prefetch};
use crate::statistic::{GroupBy, Statistic, StatisticDiff};
use crate::trace::{Frame, FrameExtra, Trace, Traceback, UNKNOWN_FILENAME};

/// Bytes and blocks of one group. Sums saturate instead of wrapping (no
/// real process holds 2^64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Totals {
    /// Sum of block sizes, in bytes.
    pub size: u64,
    /// Number of blocks (frame occurrences under `cumulative`).
    pub count: u64,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.size = self.size.saturating_add(other.size);
        self.count = self.count.saturating_add(other.count);
    }
}

/// Stage 1 result: the traces sharing one `Arc<Traceback>`.
#[derive(Clone, Copy)]
pub(super) struct Distinct<'a> {
    traceback: &'a Arc<Traceback>,
    totals: Totals,
}

/// Inputs smaller than this are grouped on the calling thread only.
const PARALLEL_MIN: usize = 50_000;
/// Most threads one grouping uses.
const MAX_THREADS: usize = 8;

/// How many threads to spread `work` items over.
pub(super) fn threads_for(work: usize) -> usize {
    if work < PARALLEL_MIN {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
}

/// Runs `job(part)` for every part in `0..parts`, part 0 on the calling
/// thread and the others on scoped threads; results in part order. A part
/// whose thread failed is run again on the calling thread.
pub(super) fn in_parallel<T: Send>(parts: usize, job: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if parts <= 1 {
        return vec![job(0)];
    }
    std::thread::scope(|scope| {
        let job = &job;
        let handles: Vec<_> = (1..parts)
            .map(|part| scope.spawn(move || job(part)))
            .collect();
        let mut results = Vec::with_capacity(parts);
        results.push(job(0));
        for (offset, handle) in handles.into_iter().enumerate() {
            results.push(handle.join().unwrap_or_else(|_| job(offset + 1)));
        }
        results
    })
}

/// Sorts `items` by `cmp`, the two halves on two threads when there are
/// many, then merges them.
pub(super) fn sort_parallel<T: Send>(
    mut items: Vec<T>,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering + Sync,
) -> Vec<T> {
    if threads_for(items.len()) < 2 {
        items.sort_unstable_by(&cmp);
        return items;
    }
    let mid = items.len() / 2;
    let failed = std::thread::scope(|scope| {
        let cmp = &cmp;
        let (left, right) = items.split_at_mut(mid);
        let handle = scope.spawn(move || right.sort_unstable_by(cmp));
        left.sort_unstable_by(cmp);
        handle.join().is_err()
    });
    if failed && let Some(right) = items.get_mut(mid..) {
        right.sort_unstable_by(&cmp);
    }
    let right = items.split_off(mid);
    let left = items;
    let mut merged = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some(a), Some(b)) => cmp(a, b) != std::cmp::Ordering::Greater,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_left { left.next() } else { right.next() };
        merged.extend(next);
    }
    merged
}

/// Stage 1: the size and count of the traces of each arc (distinct
/// `Arc<Traceback>`), in order of first appearance: a dense sum, no table.
/// Large snapshots are summed in two halves on two threads.
fn arc_totals(interned: &Interned, traces: &[Trace]) -> Vec<Totals> {
    let n = interned.tracebacks.len();
    let sum = |traces: &[Trace], ids: &[u32]| {
        let mut totals = vec![Totals::default(); n];
        for (trace, &id) in traces.iter().zip(ids) {
            if let Some(slot) = totals.get_mut(id as usize) {
                slot.add(Totals {
                    size: trace.size,
                    count: 1,
                });
            }
        }
        totals
    };
    let parts = threads_for(traces.len()).min(2);
    let mid = traces.len() / 2;
    let halves = in_parallel(parts, |part| {
        let range = match (parts, part) {
            (1, _) => 0..traces.len(),
            (_, 0) => 0..mid,
            _ => mid..traces.len(),
        };
        sum(
            traces.get(range.clone()).unwrap_or(&[]),
            interned.ids.get(range).unwrap_or(&[]),
        )
    });
    sum_parts(halves)
}

/// The element-wise sum of `parts` (all of one length).
fn sum_parts(parts: Vec<Vec<Totals>>) -> Vec<Totals> {
    let mut parts = parts.into_iter();
    let mut totals = parts.next().unwrap_or_default();
    for other in parts {
        for (a, b) in totals.iter_mut().zip(other) {
            a.add(b);
        }
    }
    totals
}

/// Stage 1 for the label groupings: the totals of each arc, with the arc.
/// Equal tracebacks in different `Arc`s stay apart (their frames' extras
/// may differ).
pub(super) fn distinct_tracebacks<'a>(
    interned: &'a Interned,
    traces: &[Trace],
) -> Vec<Distinct<'a>> {
    interned
        .tracebacks
        .iter()
        .zip(arc_totals(interned, traces))
        .map(|(traceback, totals)| Distinct { traceback, totals })
        .collect()
}

/// One group: the first key value seen for it (the representative) and
/// its totals.
pub(super) struct Group<R> {
    rep: R,
    totals: Totals,
}

/// The groups of one snapshot in order of first appearance, with an index
/// from key to position.
pub(super) struct Groups<K, R> {
    index: FxHashMap<K, usize>,
    entries: Vec<Group<R>>,
}

impl<K: Hash + Eq, R> Groups<K, R> {
    fn new() -> Self {
        Groups {
            index: FxHashMap::default(),
            entries: Vec::new(),
        }
    }

    /// Position of the group of `key`, created with `rep` if new.
    fn slot(&mut self, key: K, rep: impl FnOnce() -> R) -> usize {
        match self.index.entry(key) {
            Entry::Occupied(entry) => *entry.get(),
            Entry::Vacant(entry) => {
                self.entries.push(Group {
                    rep: rep(),
                    totals: Totals::default(),
                });
                *entry.insert(self.entries.len() - 1)
            }
        }
    }

    fn add(&mut self, slot: usize, totals: Totals) {
        if let Some(group) = self.entries.get_mut(slot) {
            group.totals.add(totals);
        }
    }

    /// Adds the groups of `later`, computed over traces that come after
    /// this one's (so this one's representatives are the first seen).
    fn absorb(&mut self, later: Groups<K, R>, key_of: impl Fn(&R) -> K)
    where
        R: Copy,
    {
        for group in later.entries {
            let slot = self.slot(key_of(&group.rep), || group.rep);
            self.add(slot, group.totals);
        }
    }

    /// `Snapshot.statistics()` before sorting, with a label per group.
    fn labelled_statistics(
        self,
        traceback_of: impl Fn(&R) -> Traceback,
        label_of: impl Fn(&R) -> Option<Arc<str>>,
    ) -> Vec<Statistic> {
        self.entries
            .iter()
            .map(|group| Statistic {
                traceback: traceback_of(&group.rep),
                size: group.totals.size,
                count: group.totals.count,
                label: label_of(&group.rep),
            })
            .collect()
    }

    /// tracemalloc's `_compare_grouped_stats` (before sorting), with a
    /// label per group: every group of `self` (new) against the group of
    /// the same key in `old` (absent: the diff is the whole group), then
    /// the groups only in `old`, with size and count 0 and negative diffs.
    fn labelled_compare_to(
        &self,
        old: &Groups<K, R>,
        key_of: impl Fn(&R) -> K,
        traceback_of: impl Fn(&R) -> Traceback,
        label_of: impl Fn(&R) -> Option<Arc<str>>,
    ) -> Vec<StatisticDiff> {
        let mut matched = vec![false; old.entries.len()];
        let mut diffs = Vec::with_capacity(self.entries.len() + old.entries.len());
        for group in &self.entries {
            let now = group.totals;
            let mut before = Totals::default();
            if let Some(&slot) = old.index.get(&key_of(&group.rep))
                && let (Some(previous), Some(seen)) = (old.entries.get(slot), matched.get_mut(slot))
            {
                before = previous.totals;
                *seen = true;
            }
            diffs.push(diff(
                traceback_of(&group.rep),
                label_of(&group.rep),
                now,
                before,
            ));
        }
        for (group, seen) in old.entries.iter().zip(&matched) {
            if !seen {
                diffs.push(diff(
                    traceback_of(&group.rep),
                    label_of(&group.rep),
                    Totals::default(),
                    group.totals,
                ));
            }
        }
        diffs
    }
}

fn diff(
    traceback: Traceback,
    label: Option<Arc<str>>,
    now: Totals,
    before: Totals,
) -> StatisticDiff {
    StatisticDiff {
        traceback,
        size: now.size,
        size_diff: difference(now.size, before.size),
        count: now.count,
        count_diff: difference(now.count, before.count),
        label,
    }
}

/// `now - before`, saturating at the `i64` range.
fn difference(now: u64, before: u64) -> i64 {
    let diff = i128::from(now) - i128::from(before);
    i64::try_from(diff).unwrap_or(if diff < 0 { i64::MIN } else { i64::MAX })
}

/// Stage 1 for tracemalloc's groupings: the totals of each traceback of
/// `index` (by frames, numbered in traceback order).
fn traceback_totals(index: &Index, traces: &[Trace]) -> Vec<Totals> {
    let arcs = arc_totals(&index.interned, traces);
    let mut totals = vec![Totals::default(); index.tracebacks()];
    for (arc, &tb) in arcs.iter().zip(&index.arc_tb) {
        if let Some(slot) = totals.get_mut(tb as usize) {
            slot.add(*arc);
        }
    }
    totals
}

/// Stage 2 for `lineno`: the totals of each frame of `index`, from the
/// most recent frame of each traceback, or from every frame (each
/// occurrence) under `cumulative`. Under `cumulative` the tracebacks are
/// split in two halves on two threads when there are many frames.
fn frame_totals(index: &Index, tb_totals: &[Totals], cumulative: bool) -> Vec<Totals> {
    let n = index.frames();
    if !cumulative {
        let mut totals = vec![Totals::default(); n];
        for (tb, &top) in tb_totals.iter().zip(&index.tb_top) {
            if let Some(slot) = totals.get_mut(top as usize) {
                slot.add(*tb);
            }
        }
        return totals;
    }
    let parts = threads_for(index.tb_frames.len()).min(2);
    let tracebacks = tb_totals.len();
    // Split where half the frames are.
    let mid = index
        .tb_start
        .partition_point(|&start| start < index.tb_frames.len() / 2)
        .min(tracebacks);
    let sums = in_parallel(parts, |part| {
        let range = match (parts, part) {
            (1, _) => 0..tracebacks,
            (_, 0) => 0..mid,
            _ => mid..tracebacks,
        };
        let mut totals = vec![Totals::default(); n];
        for tb in range {
            let Some(&add) = tb_totals.get(tb) else {
                continue;
            };
            for &frame in index.tb_frames(tb) {
                if let Some(slot) = totals.get_mut(frame as usize) {
                    slot.add(add);
                }
            }
        }
        totals
    });
    sum_parts(sums)
}

/// Stage 2 for `filename`: the frame totals summed per file.
fn file_totals(index: &Index, frame_totals: &[Totals]) -> Vec<Totals> {
    let mut totals = vec![Totals::default(); index.files()];
    for (frame, &file) in frame_totals.iter().zip(&index.frame_file) {
        if let Some(slot) = totals.get_mut(file as usize) {
            slot.add(*frame);
        }
    }
    totals
}

/// The totals of every group of `index` for a tracemalloc grouping, by
/// group id: traceback, frame or file ids, which follow tracemalloc's
/// order of the group keys.
fn group_totals(
    index: &Index,
    traces: &[Trace],
    group_by: GroupBy,
    cumulative: bool,
) -> Vec<Totals> {
    let tb_totals = traceback_totals(index, traces);
    match group_by {
        GroupBy::Traceback => tb_totals,
        GroupBy::Filename => file_totals(index, &frame_totals(index, &tb_totals, cumulative)),
        _ => frame_totals(index, &tb_totals, cumulative),
    }
}

/// The statistic's traceback for group `id` of `index` under a
/// tracemalloc grouping, from the index's tables (see [`Index`]):
/// - `traceback`: the representative's frames without `total_nframe`, as
///   tracemalloc's `Traceback(frames)`;
/// - `lineno`: the representative's frame itself (its extra included);
/// - `filename`: `filename:0` with no extra (a function and address would
///   describe one arbitrary line of the file).
fn group_traceback(index: &Index, i: usize, group_by: GroupBy, cumulative: bool) -> Traceback {
    let view = match group_by {
        GroupBy::Traceback => index.tb_views.get(i).cloned(),
        GroupBy::Filename => index
            .file_hash
            .get(i)
            .and_then(|&hash| Traceback::one_frame_of(&index.file_frames, i, hash)),
        _ => {
            let table = if cumulative {
                &index.first_frames
            } else {
                &index.top_frames
            };
            index
                .frame_hash
                .get(i)
                .and_then(|&hash| Traceback::one_frame_of(table, i, hash))
        }
    };
    view.unwrap_or_else(|| Traceback::new(Vec::new(), None))
}

/// The tracebacks of groups `0..n` (`group(i)` names group `i`'s index
/// and id, if it is one), made in that order before the results are built
/// in sorted order. Cloning a `traceback` group's view increments a
/// reference count in an allocation of its own: in group order the views
/// are read in turn and each count is fetched ahead, and the stores go to
/// consecutive slots (an atomic increment waits for earlier stores); the
/// sorted pass then only moves the tracebacks out.
fn group_tracebacks<'a>(
    n: usize,
    group: impl Fn(usize) -> Option<(&'a Index, usize)>,
    group_by: GroupBy,
    cumulative: bool,
) -> Vec<Option<Traceback>> {
    (0..n)
        .map(|i| {
            if group_by == GroupBy::Traceback
                && let Some((index, id)) = group(i + AHEAD)
                && let Some(view) = index.tb_views.get(id)
            {
                prefetch(view.clone_target());
            }
            group(i).map(|(index, id)| group_traceback(index, id, group_by, cumulative))
        })
        .collect()
}

/// Moves the traceback of slot `slot` out of `tracebacks` (from
/// [`group_tracebacks`]), prefetching the slot `ahead`.
fn take_traceback(
    tracebacks: &mut [Option<Traceback>],
    slot: u64,
    ahead: Option<u64>,
) -> Traceback {
    let slot_of = |i: u64| usize::try_from(i).unwrap_or(usize::MAX);
    if let Some(next) = ahead.and_then(|a| tracebacks.get(slot_of(a))) {
        prefetch(std::ptr::from_ref(next).cast());
    }
    tracebacks
        .get_mut(slot_of(slot))
        .and_then(Option::take)
        .unwrap_or_else(|| Traceback::new(Vec::new(), None))
}

/// `Snapshot.statistics()` for `filename`, `lineno` and `traceback`,
/// sorted: the groups of the index with their totals, biggest first by
/// size, count, then group id (tracemalloc's traceback order).
pub(super) fn statistics(
    index: &Index,
    traces: &[Trace],
    group_by: GroupBy,
    cumulative: bool,
) -> Vec<Statistic> {
    let totals = group_totals(index, traces, group_by, cumulative);
    let n = totals.len();
    let key = |id: usize| {
        let t = totals.get(id).filter(|t| t.count > 0)?;
        Some([t.size, t.count, id as u64])
    };
    // Sorting and making the tracebacks are independent: on two threads.
    let (keys, mut tracebacks) = join(
        threads_for(n) > 1,
        || SortedKeys::sort(n, key),
        || group_tracebacks(n, |id| key(id).map(|_| (index, id)), group_by, cumulative),
    );
    let mut statistics = Vec::with_capacity(keys.len());
    for i in 0..keys.len() {
        let Some([size, count, id]) = keys.get(i) else {
            continue;
        };
        let ahead = keys.get(i + AHEAD).map(|[_, _, id]| id);
        statistics.push(Statistic {
            traceback: take_traceback(&mut tracebacks, id, ahead),
            size,
            count,
            label: None,
        });
    }
    statistics
}

/// Runs `a` on this thread and `b` on another when `parallel`, else both
/// here; `b` runs here again if its thread failed.
fn join<A, B: Send>(parallel: bool, a: impl FnOnce() -> A, b: impl Fn() -> B + Sync) -> (A, B) {
    if !parallel {
        return (a(), b());
    }
    std::thread::scope(|scope| {
        let b = &b;
        let handle = scope.spawn(b);
        let a = a();
        (a, handle.join().unwrap_or_else(|_| b()))
    })
}

/// Bits needed to hold `x`.
fn width(x: u64) -> u32 {
    u64::BITS - x.leading_zeros()
}

/// Group keys of `N` fields, sorted biggest first (most significant field
/// first). When the fields' values fit in 64 (or 128) bits together,
/// which they do in practice, each key is packed into one `u64` (`u128`),
/// sorted as such and unpacked when read: integers sort several times
/// faster than arrays.
struct SortedKeys<const N: usize> {
    /// Bits of each field in a packed key.
    widths: [u32; N],
    keys: Keys<N>,
}

/// The sorted keys, packed or not.
enum Keys<const N: usize> {
    Narrow(Vec<u64>),
    Wide(Vec<u128>),
    Plain(Vec<[u64; N]>),
}

impl<const N: usize> SortedKeys<N> {
    /// The keys `key(i)` of `0..n` (None: no key), biggest first.
    fn sort(n: usize, key: impl Fn(usize) -> Option<[u64; N]>) -> Self {
        let mut widths = [0u32; N];
        for fields in (0..n).filter_map(&key) {
            for (w, value) in widths.iter_mut().zip(fields) {
                *w = (*w).max(width(value));
            }
        }
        let pack = |fields: [u64; N]| -> u128 {
            let mut packed = 0u128;
            for (&w, value) in widths.iter().zip(fields) {
                packed = (packed << w) | u128::from(value);
            }
            packed
        };
        let total: u32 = widths.iter().sum();
        let keys = if total <= 64 {
            let mut keys: Vec<u64> = (0..n).filter_map(&key).map(|k| pack(k) as u64).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            Keys::Narrow(keys)
        } else if total <= 128 {
            let mut keys: Vec<u128> = (0..n).filter_map(&key).map(pack).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            Keys::Wide(keys)
        } else {
            let mut keys: Vec<[u64; N]> = (0..n).filter_map(&key).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            Keys::Plain(keys)
        };
        SortedKeys { widths, keys }
    }

    /// How many keys.
    fn len(&self) -> usize {
        match &self.keys {
            Keys::Narrow(keys) => keys.len(),
            Keys::Wide(keys) => keys.len(),
            Keys::Plain(keys) => keys.len(),
        }
    }

    /// The `i`th biggest key.
    #[inline]
    fn get(&self, i: usize) -> Option<[u64; N]> {
        let mut packed = match &self.keys {
            Keys::Narrow(keys) => u128::from(*keys.get(i)?),
            Keys::Wide(keys) => *keys.get(i)?,
            Keys::Plain(keys) => return keys.get(i).copied(),
        };
        let mut fields = [0u64; N];
        for (&w, value) in self.widths.iter().zip(fields.iter_mut()).rev() {
            // Widths are at most 64: the mask fits.
            *value = (packed & ((1u128 << w) - 1)) as u64;
            packed >>= w;
        }
        Some(fields)
    }
}

/// The merge of two ascending id sequences `0..new` and `0..old` whose
/// items `cmp` compares across: every item once, ascending, as
/// `(new id, old id)` pairs with [`NONE`] for the side that lacks it.
fn merge(new: usize, old: usize, cmp: impl Fn(u32, u32) -> Ordering) -> Vec<(u32, u32)> {
    let mut merged = Vec::with_capacity(new.max(old));
    merge_into(&mut merged, 0..id(new), 0..id(old), &cmp);
    merged
}

/// [`merge`] of the ranges `new` and `old`, appended to `merged`.
fn merge_into(
    merged: &mut Vec<(u32, u32)>,
    new: std::ops::Range<u32>,
    old: std::ops::Range<u32>,
    cmp: impl Fn(u32, u32) -> Ordering,
) {
    let (mut i, mut j) = (new.start, old.start);
    while i < new.end || j < old.end {
        let order = if i == new.end {
            Ordering::Greater
        } else if j == old.end {
            Ordering::Less
        } else {
            cmp(i, j)
        };
        match order {
            Ordering::Less => {
                merged.push((i, NONE));
                i += 1;
            }
            Ordering::Greater => {
                merged.push((NONE, j));
                j += 1;
            }
            Ordering::Equal => {
                merged.push((i, j));
                i += 1;
                j += 1;
            }
        }
    }
}

/// [`merge`] in two halves on two threads when there are many items: the
/// new items split in the middle, the old ones where the middle new item
/// would go.
fn merge_parallel(
    new: usize,
    old: usize,
    cmp: impl Fn(u32, u32) -> Ordering + Sync,
) -> Vec<(u32, u32)> {
    let parts = threads_for(new + old).min(2);
    if parts < 2 {
        return merge(new, old, cmp);
    }
    let (new, old) = (id(new), id(old));
    let new_mid = new / 2;
    // The old items before the middle new one.
    let (mut low, mut high) = (0, old);
    while low < high {
        let probe = low + (high - low) / 2;
        if cmp(new_mid, probe) == Ordering::Greater {
            low = probe + 1;
        } else {
            high = probe;
        }
    }
    let halves = in_parallel(2, |part| {
        let mut merged = Vec::new();
        if part == 0 {
            merge_into(&mut merged, 0..new_mid, 0..low, &cmp);
        } else {
            merge_into(&mut merged, new_mid..new, low..old, &cmp);
        }
        merged
    });
    let mut halves = halves.into_iter();
    let mut merged = halves.next().unwrap_or_default();
    for half in halves {
        merged.extend(half);
    }
    merged
}

/// Converts a count to `u32`, saturating (ids never reach `u32::MAX`).
fn id(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(NONE)
}

/// Each item's position in `merged`, for the new and the old side.
fn positions(merged: &[(u32, u32)], new: usize, old: usize) -> (Vec<u32>, Vec<u32>) {
    let mut new_pos = vec![NONE; new];
    let mut old_pos = vec![NONE; old];
    for (k, &(a, b)) in merged.iter().enumerate() {
        let k = u32::try_from(k).unwrap_or(NONE);
        if let Some(slot) = new_pos.get_mut(a as usize) {
            *slot = k;
        }
        if let Some(slot) = old_pos.get_mut(b as usize) {
            *slot = k;
        }
    }
    (new_pos, old_pos)
}

/// The groups of two snapshots matched by key, in ascending key order:
/// `(new group id, old group id)`, [`NONE`] where a snapshot lacks the
/// key. Files are merged by name, frames by (merged file, line), and
/// tracebacks by their frames' merged positions, oldest first.
fn matched_groups(new: &Index, old: &Index, group_by: GroupBy) -> Vec<(u32, u32)> {
    let files = merge(new.files(), old.files(), |a, b| {
        match (new.file(a), old.file(b)) {
            (Some(x), Some(y)) if Arc::ptr_eq(x, y) => Ordering::Equal,
            (Some(x), Some(y)) => x.cmp(y),
            _ => Ordering::Equal,
        }
    });
    if group_by == GroupBy::Filename {
        return files;
    }
    let (new_file, old_file) = positions(&files, new.files(), old.files());
    let frame_key = |index: &Index, file_pos: &[u32], f: u32| {
        let i = f as usize;
        let file = index.frame_file.get(i).copied().unwrap_or(NONE);
        (
            file_pos.get(file as usize).copied().unwrap_or(NONE),
            index.frame_lineno.get(i).copied().unwrap_or(0),
        )
    };
    let frames = merge(new.frames(), old.frames(), |a, b| {
        frame_key(new, &new_file, a).cmp(&frame_key(old, &old_file, b))
    });
    if group_by != GroupBy::Traceback {
        return frames;
    }
    let (new_frame, old_frame) = positions(&frames, new.frames(), old.frames());
    // Each old frame's id in `new` (NONE if `new` lacks it): equal frames
    // cost one lookup, and only the first unequal pair is ordered by
    // merged position.
    let mut old_in_new = vec![NONE; old.frames()];
    for &(a, b) in &frames {
        if let Some(slot) = old_in_new.get_mut(b as usize) {
            *slot = a;
        }
    }
    let at = |ids: &[u32], f: u32| ids.get(f as usize).copied().unwrap_or(NONE);
    merge_parallel(new.tracebacks(), old.tracebacks(), |a, b| {
        let x = new.tb_frames(a as usize);
        let y = old.tb_frames(b as usize);
        for (&f, &g) in x.iter().zip(y) {
            if at(&old_in_new, g) != f {
                return at(&new_frame, f).cmp(&at(&old_frame, g));
            }
        }
        x.len().cmp(&y.len())
    })
}

/// `Snapshot.compare_to()` for `filename`, `lineno` and `traceback`,
/// sorted: every group of either snapshot (groups only in `old` with size
/// and count 0), the traceback taken from `new` when it has the group;
/// biggest first by `|size_diff|`, size, `|count_diff|`, count, then the
/// position of its key in the merged key order (tracemalloc's traceback
/// order).
pub(super) fn compare_to(
    (new, new_traces): (&Index, &[Trace]),
    (old, old_traces): (&Index, &[Trace]),
    group_by: GroupBy,
    cumulative: bool,
) -> Vec<StatisticDiff> {
    let now = group_totals(new, new_traces, group_by, cumulative);
    let before = group_totals(old, old_traces, group_by, cumulative);
    let matched = matched_groups(new, old, group_by);
    let get = |totals: &[Totals], id: u32| totals.get(id as usize).copied().unwrap_or_default();
    let totals = |position: usize| {
        let (a, b) = matched.get(position).copied().unwrap_or((NONE, NONE));
        (a, b, get(&now, a), get(&before, b))
    };
    // The sort key, with the signs of the differences last (positions are
    // unique: they never decide). Bit 1: `size_diff` is negative; bit 0:
    // `count_diff` is.
    let key = |position: usize| {
        let (_, _, n, o) = totals(position);
        if n.count == 0 && o.count == 0 {
            return None;
        }
        let size_diff = difference(n.size, o.size);
        let count_diff = difference(n.count, o.count);
        Some([
            size_diff.unsigned_abs(),
            n.size,
            count_diff.unsigned_abs(),
            n.count,
            position as u64,
            (u64::from(size_diff < 0) << 1) | u64::from(count_diff < 0),
        ])
    };
    let group = |position: usize| {
        let (a, b, n, o) = totals(position);
        if n.count > 0 {
            Some((new, a as usize))
        } else if o.count > 0 {
            Some((old, b as usize))
        } else {
            None
        }
    };
    let n = matched.len();
    // Sorting and making the tracebacks are independent: on two threads.
    let (keys, mut tracebacks) = join(
        threads_for(n) > 1,
        || SortedKeys::sort(n, key),
        || group_tracebacks(n, group, group_by, cumulative),
    );
    let mut diffs = Vec::with_capacity(keys.len());
    for i in 0..keys.len() {
        let Some([size_diff, size, count_diff, count, position, negative]) = keys.get(i) else {
            continue;
        };
        let ahead = keys.get(i + AHEAD).map(|key| key[4]);
        diffs.push(StatisticDiff {
            traceback: take_traceback(&mut tracebacks, position, ahead),
            size,
            size_diff: signed(size_diff, negative & 2 != 0),
            count,
            count_diff: signed(count_diff, negative & 1 != 0),
            label: None,
        });
    }
    diffs
}

/// The `i64` of magnitude `magnitude` (from `i64::unsigned_abs`: at most
/// 2^63) and sign `negative`.
fn signed(magnitude: u64, negative: bool) -> i64 {
    match (i64::try_from(magnitude), negative) {
        (Ok(value), false) => value,
        (Ok(value), true) => -value,
        (Err(_), false) => i64::MAX,
        (Err(_), true) => i64::MIN,
    }
}

/// Runs `part` over contiguous chunks of `distinct` on several threads
/// (as many as `work` items call for) and merges the chunks' groups in
/// order, so that the result equals one pass over all of `distinct`.
fn in_chunks<'a, K: Hash + Eq + Send, R: Copy + Send>(
    distinct: &[Distinct<'a>],
    work: usize,
    part: impl Fn(&[Distinct<'a>]) -> Groups<K, R> + Sync,
    key_of: impl Fn(&R) -> K,
) -> Groups<K, R> {
    let parts = threads_for(work).min(distinct.len().max(1));
    let chunk = distinct.len().div_ceil(parts).max(1);
    let results = in_parallel(parts, |i| {
        let start = (i * chunk).min(distinct.len());
        let end = ((i + 1) * chunk).min(distinct.len());
        part(distinct.get(start..end).unwrap_or(&[]))
    });
    let mut results = results.into_iter();
    let Some(mut merged) = results.next() else {
        return Groups::new();
    };
    for later in results {
        merged.absorb(later, &key_of);
    }
    merged
}

/// Work items of a pass over the frames of `distinct`: one frame each, or
/// about 8 (a deep traceback's) under `cumulative`; it sets the threads.
fn frame_work(distinct: &[Distinct<'_>], cumulative: bool) -> usize {
    if cumulative {
        distinct.len().saturating_mul(8)
    } else {
        distinct.len()
    }
}

/// Representative of a `function` or `module` group: its label and the
/// first frame seen with it.
#[derive(Clone, Copy)]
pub(super) struct LabelRep<'a> {
    label: &'a Arc<str>,
    frame: &'a Frame,
    function: bool,
}

/// Groups by function or module name.
pub(super) type LabelGroups<'a> = Groups<&'a str, LabelRep<'a>>;

/// Stage 2 for `function` and `module`: the label of the most recent frame
/// of each distinct traceback, or of every frame (each occurrence) under
/// `cumulative`. Frames with no such name count under `<unknown>`.
pub(super) fn group_labels<'a>(
    distinct: &[Distinct<'a>],
    group_by: GroupBy,
    cumulative: bool,
) -> LabelGroups<'a> {
    let work = frame_work(distinct, cumulative);
    in_chunks(
        distinct,
        work,
        |chunk| group_labels_part(chunk, group_by, cumulative),
        |rep| &**rep.label,
    )
}

fn group_labels_part<'a>(
    distinct: &[Distinct<'a>],
    group_by: GroupBy,
    cumulative: bool,
) -> LabelGroups<'a> {
    static UNKNOWN: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    let unknown: &'static Arc<str> = UNKNOWN.get_or_init(|| Arc::from(UNKNOWN_FILENAME));
    let function = group_by == GroupBy::Function;
    let mut groups = Groups::new();
    // Names are shared `Arc<str>`s: look up by address first.
    let mut by_address: FxHashMap<(*const u8, usize), usize> = FxHashMap::default();
    for d in distinct {
        let traceback: &'a Traceback = d.traceback;
        let frames = traceback.frames();
        let selected = if cumulative {
            frames
        } else {
            frames.get(..1).unwrap_or(&[])
        };
        for frame in selected {
            let extra = frame.extra.as_deref();
            let name = if function {
                extra.and_then(|e| e.function.as_ref())
            } else {
                extra.and_then(|e| e.module.as_ref())
            };
            let label: &'a Arc<str> = name.unwrap_or(unknown);
            let slot = match by_address.entry((label.as_ptr(), label.len())) {
                Entry::Occupied(entry) => *entry.get(),
                Entry::Vacant(entry) => *entry.insert(groups.slot(&**label, || LabelRep {
                    label,
                    frame,
                    function,
                })),
            };
            groups.add(slot, d.totals);
        }
    }
    groups
}

/// The statistic's one-frame traceback for a label group: the first frame
/// seen, at line 0, with the function and module, for `function`; the
/// module path at line 0 for `module`.
fn label_group_traceback(rep: &LabelRep<'_>) -> Traceback {
    let module = rep.frame.extra.as_deref().and_then(|e| e.module.clone());
    let frame = if rep.function {
        Frame {
            filename: Arc::clone(&rep.frame.filename),
            lineno: 0,
            extra: Some(Arc::new(FrameExtra {
                function: Some(Arc::clone(rep.label)),
                module,
                address: None,
            })),
        }
    } else {
        Frame {
            filename: Arc::clone(rep.label),
            lineno: 0,
            extra: module.map(|module| {
                Arc::new(FrameExtra {
                    function: None,
                    module: Some(module),
                    address: None,
                })
            }),
        }
    };
    Traceback::from_frame(frame)
}

fn label_of(rep: &LabelRep<'_>) -> Option<Arc<str>> {
    Some(Arc::clone(rep.label))
}

impl<'a> LabelGroups<'a> {
    /// `statistics()` of label groups, before sorting.
    pub(super) fn label_statistics(self) -> Vec<Statistic> {
        self.labelled_statistics(label_group_traceback, label_of)
    }

    /// `compare_to()` of label groups, before sorting.
    pub(super) fn label_compare_to(&self, old: &LabelGroups<'a>) -> Vec<StatisticDiff> {
        self.labelled_compare_to(old, |rep| &**rep.label, label_group_traceback, label_of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::trace;

    fn index_of(traces: &[Trace]) -> Index {
        Index::build(Interned::of(traces), None)
    }

    #[test]
    fn distinct_tracebacks_sum_runs_and_keep_first_appearance_order() {
        let a = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], None));
        let b = Arc::new(Traceback::new(vec![Frame::new("b.c", 2)], None));
        let a_copy = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], None));
        let traces = [
            trace(1, &b),
            trace(2, &a),
            trace(4, &a),
            trace(8, &b),
            trace(16, &a_copy),
            trace(32, &a),
        ];
        let interned = Interned::of(&traces);
        assert_eq!(interned.ids(), [0, 1, 1, 0, 2, 1]);
        let distinct = distinct_tracebacks(&interned, &traces);
        let seen: Vec<(*const Traceback, Totals)> = distinct
            .iter()
            .map(|d| (Arc::as_ptr(d.traceback), d.totals))
            .collect();
        let totals = |size, count| Totals { size, count };
        assert_eq!(
            seen,
            [
                (Arc::as_ptr(&b), totals(9, 2)),
                (Arc::as_ptr(&a), totals(38, 3)),
                (Arc::as_ptr(&a_copy), totals(16, 1)),
            ]
        );
        // By traceback, equal frames in separate arcs are one group, in
        // traceback order (a.c before b.c).
        let index = index_of(&traces);
        assert_eq!(
            group_totals(&index, &traces, GroupBy::Traceback, false),
            [totals(54, 4), totals(9, 2)]
        );
    }

    #[test]
    fn frame_groups_merge_equal_names_in_separate_allocations() {
        let shared: Arc<str> = Arc::from("a.c");
        let separate: Arc<str> = Arc::from("a.c");
        let frame = |name: &Arc<str>, lineno| Frame {
            filename: Arc::clone(name),
            lineno,
            extra: None,
        };
        let one = Arc::new(Traceback::new(
            vec![frame(&shared, 1), frame(&separate, 1), frame(&shared, 2)],
            None,
        ));
        let two = Arc::new(Traceback::new(vec![frame(&separate, 2)], None));
        let traces = [trace(10, &one), trace(5, &two)];
        let index = index_of(&traces);
        assert_eq!(index.frames(), 2);
        assert_eq!(
            group_totals(&index, &traces, GroupBy::Lineno, true),
            [Totals { size: 20, count: 2 }, Totals { size: 15, count: 2 }]
        );
        assert_eq!(
            group_totals(&index, &traces, GroupBy::Lineno, false),
            [Totals { size: 10, count: 1 }, Totals { size: 5, count: 1 }]
        );
        assert_eq!(
            group_totals(&index, &traces, GroupBy::Filename, false),
            [Totals { size: 15, count: 2 }]
        );
    }

    #[test]
    fn merge_pairs_equal_items_and_keeps_the_rest_in_order() {
        let new = [1, 3, 5, 7];
        let old = [2, 3, 7, 9];
        let merged = merge(new.len(), old.len(), |a, b| {
            new[a as usize].cmp(&old[b as usize])
        });
        assert_eq!(
            merged,
            [(0, NONE), (NONE, 0), (1, 1), (2, NONE), (3, 2), (NONE, 3)]
        );
        assert_eq!(
            positions(&merged, 4, 4),
            (vec![0, 2, 3, 4], vec![1, 2, 4, 5])
        );
        assert!(merge(0, 0, |_, _| Ordering::Equal).is_empty());
    }

    #[test]
    fn packed_sorts_equal_the_plain_sort_whatever_the_widths() {
        let mut random = crate::testing::lcg(7);
        let mut next = move |bits: u32| (random() >> 11) >> (53 - bits.min(53));
        // Small values (one u64), wider ones (one u128), and full-width
        // ones (not packed); some keys absent.
        for bits in [4, 20, 40, 64] {
            let keys: Vec<Option<[u64; 3]>> = (0..2000u64)
                .map(|id| {
                    let big = |v: u64| if bits == 64 { v << 11 | 1 << 63 } else { v };
                    let count = if bits == 64 {
                        big(next(53))
                    } else {
                        next(bits.min(12))
                    };
                    (id % 7 != 3).then(|| [big(next(bits)), count, id])
                })
                .collect();
            let sorted = SortedKeys::sort(keys.len(), |i| keys[i]);
            let mut expected: Vec<[u64; 3]> = keys.iter().flatten().copied().collect();
            expected.sort_by(|a, b| b.cmp(a));
            let got: Vec<[u64; 3]> = (0..sorted.len()).filter_map(|i| sorted.get(i)).collect();
            assert_eq!(got, expected, "{bits} bits");
            assert!(sorted.get(sorted.len()).is_none());
        }
        assert_eq!(signed(5, true), -5);
        assert_eq!(signed(5, false), 5);
        assert_eq!(signed(1 << 63, true), i64::MIN);
        assert_eq!(difference(0, u64::MAX).unsigned_abs(), 1 << 63);
    }
}
