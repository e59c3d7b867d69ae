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
//!    packed into integers and sorted, and the results built in order
//!    from the index's shared tables.
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
use super::snapshot::{GroupBy, Statistic, StatisticDiff};
use super::table::{AHEAD, prefetch};
use super::traceback::{Frame, FrameExtra, Trace, Traceback, UNKNOWN_FILENAME};

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
fn group_traceback(index: &Index, id: u32, group_by: GroupBy, cumulative: bool) -> Traceback {
    let i = id as usize;
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

/// Prefetches what [`group_traceback`] reads for group `id` of a
/// `traceback` grouping (the others read shared tables): the view when
/// `far`, else the reference count its clone increments.
fn touch(index: &Index, id: u32, group_by: GroupBy, far: bool) {
    if group_by != GroupBy::Traceback {
        return;
    }
    if let Some(view) = index.tb_views.get(id as usize) {
        if far {
            prefetch(std::ptr::from_ref(view).cast());
        } else {
            prefetch(view.clone_target());
        }
    }
}

/// Builds `make(i)` for every `i` in `0..n`, in order, on this thread:
/// the clones of the index's shared tables increment one reference count,
/// which two threads would pass back and forth.
fn build<T>(n: usize, make: impl Fn(usize) -> T) -> Vec<T> {
    (0..n).map(make).collect()
}

/// A statistic's sort key: biggest first by size, count, then group id
/// (tracemalloc's traceback order), all descending.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct StatKey {
    size: u64,
    count: u64,
    id: u32,
}

/// `Snapshot.statistics()` for `filename`, `lineno` and `traceback`,
/// sorted: the groups of the index with their totals, biggest first.
pub(super) fn statistics(
    index: &Index,
    traces: &[Trace],
    group_by: GroupBy,
    cumulative: bool,
) -> Vec<Statistic> {
    let totals = group_totals(index, traces, group_by, cumulative);
    let keys: Vec<StatKey> = totals
        .iter()
        .enumerate()
        .filter(|(_, t)| t.count > 0)
        .map(|(id, t)| StatKey {
            size: t.size,
            count: t.count,
            id: u32::try_from(id).unwrap_or(NONE),
        })
        .collect();
    let keys = sort_statistics(keys);
    build(keys.len(), |i| {
        if let Some(far) = keys.get(i + 2 * AHEAD) {
            touch(index, far.id, group_by, true);
        }
        if let Some(ahead) = keys.get(i + AHEAD) {
            touch(index, ahead.id, group_by, false);
        }
        let key = keys.get(i).copied().unwrap_or(StatKey {
            size: 0,
            count: 0,
            id: NONE,
        });
        Statistic {
            traceback: group_traceback(index, key.id, group_by, cumulative),
            size: key.size,
            count: key.count,
            label: None,
        }
    })
}

/// Sorts statistic keys biggest first.
fn sort_statistics(keys: Vec<StatKey>) -> Vec<StatKey> {
    sort_packed(
        keys,
        |k| [k.size, k.count, u64::from(k.id)],
        |[size, count, id]| StatKey {
            size,
            count,
            id: u32::try_from(id).unwrap_or(NONE),
        },
    )
}

/// Bits needed to hold `x`.
fn width(x: u64) -> u32 {
    u64::BITS - x.leading_zeros()
}

/// Sorts `items` biggest first by their `fields` (most significant first;
/// `T`'s own order must be the same). When the fields' values fit in 64
/// (or 128) bits together, which they do in practice, each item is packed
/// into one `u64` (`u128`) and unpacked after: integers sort several times
/// faster than structs.
fn sort_packed<T: Ord + Send, const N: usize>(
    items: Vec<T>,
    fields: impl Fn(&T) -> [u64; N],
    unpack: impl Fn([u64; N]) -> T,
) -> Vec<T> {
    let mut widths = [0u32; N];
    for item in &items {
        for (w, value) in widths.iter_mut().zip(fields(item)) {
            *w = (*w).max(width(value));
        }
    }
    let total: u32 = widths.iter().sum();
    let pack = |item: &T| -> u128 {
        let mut packed = 0u128;
        for (&w, value) in widths.iter().zip(fields(item)) {
            packed = (packed << w) | u128::from(value);
        }
        packed
    };
    let unpack_from = |mut packed: u128| -> T {
        let mut values = [0u64; N];
        for (&w, value) in widths.iter().zip(values.iter_mut()).rev() {
            let mask = (1u128 << w) - 1;
            *value = (packed & mask) as u64;
            packed >>= w;
        }
        unpack(values)
    };
    if total <= 64 {
        let packed: Vec<u64> = items.iter().map(|item| pack(item) as u64).collect();
        sort_parallel(packed, |a, b| b.cmp(a))
            .into_iter()
            .map(|p| unpack_from(u128::from(p)))
            .collect()
    } else if total <= 128 {
        let packed: Vec<u128> = items.iter().map(pack).collect();
        sort_parallel(packed, |a, b| b.cmp(a))
            .into_iter()
            .map(unpack_from)
            .collect()
    } else {
        sort_parallel(items, |a, b| b.cmp(a))
    }
}

/// The merge of two ascending id sequences `0..new` and `0..old` whose
/// items `cmp` compares across: every item once, ascending, as
/// `(new id, old id)` pairs with [`NONE`] for the side that lacks it.
fn merge(new: usize, old: usize, cmp: impl Fn(u32, u32) -> Ordering) -> Vec<(u32, u32)> {
    let mut merged = Vec::with_capacity(new.max(old));
    let (mut i, mut j) = (0u32, 0u32);
    let (new, old) = (
        u32::try_from(new).unwrap_or(NONE),
        u32::try_from(old).unwrap_or(NONE),
    );
    while i < new || j < old {
        let order = if i == new {
            Ordering::Greater
        } else if j == old {
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
    merged
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
    let position = |pos: &[u32], f: &u32| pos.get(*f as usize).copied().unwrap_or(NONE);
    merge(new.tracebacks(), old.tracebacks(), |a, b| {
        let x = new.tb_frames(a as usize);
        let y = old.tb_frames(b as usize);
        x.iter()
            .map(|f| position(&new_frame, f))
            .cmp(y.iter().map(|f| position(&old_frame, f)))
    })
}

/// A diff's sort key: biggest first by `|size_diff|`, size,
/// `|count_diff|`, count, then the position of its key in the merged key
/// order (tracemalloc's traceback order), all descending; then the signs
/// of the differences (positions are unique: they never decide).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct DiffKey {
    size_diff: u64,
    size: u64,
    count_diff: u64,
    count: u64,
    position: u32,
    /// Bit 1: `size_diff` is negative; bit 0: `count_diff` is.
    negative: u8,
}

impl DiffKey {
    fn signed(magnitude: u64, negative: bool) -> i64 {
        // Magnitudes come from `i64::unsigned_abs`: at most 2^63.
        let value = i64::try_from(magnitude).unwrap_or(i64::MAX);
        if negative {
            if magnitude > i64::MAX as u64 {
                i64::MIN
            } else {
                -value
            }
        } else {
            value
        }
    }
}

/// Sorts diff keys biggest first.
fn sort_diffs(keys: Vec<DiffKey>) -> Vec<DiffKey> {
    sort_packed(
        keys,
        |k| {
            [
                k.size_diff,
                k.size,
                k.count_diff,
                k.count,
                u64::from(k.position),
                u64::from(k.negative),
            ]
        },
        |[size_diff, size, count_diff, count, position, negative]| DiffKey {
            size_diff,
            size,
            count_diff,
            count,
            position: u32::try_from(position).unwrap_or(NONE),
            negative: u8::try_from(negative).unwrap_or(0),
        },
    )
}

/// `Snapshot.compare_to()` for `filename`, `lineno` and `traceback`,
/// sorted: every group of either snapshot (groups only in `old` with size
/// and count 0), the traceback taken from `new` when it has the group.
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
    let mut keys = Vec::with_capacity(matched.len());
    // Per position: the group's id in `new` when it has the group, else
    // its id in `old` with the `OLD` flag.
    let mut source: Vec<u64> = Vec::with_capacity(matched.len());
    for (position, &(a, b)) in matched.iter().enumerate() {
        let n = get(&now, a);
        let o = get(&before, b);
        source.push(if n.count > 0 {
            u64::from(a)
        } else {
            u64::from(b) | OLD
        });
        if n.count == 0 && o.count == 0 {
            continue;
        }
        let size_diff = difference(n.size, o.size);
        let count_diff = difference(n.count, o.count);
        keys.push(DiffKey {
            size_diff: size_diff.unsigned_abs(),
            size: n.size,
            count_diff: count_diff.unsigned_abs(),
            count: n.count,
            position: u32::try_from(position).unwrap_or(NONE),
            negative: (u8::from(size_diff < 0) << 1) | u8::from(count_diff < 0),
        });
    }
    drop((now, before, matched));
    let keys = sort_diffs(keys);
    let group = |key: &DiffKey| {
        let id = source
            .get(key.position as usize)
            .copied()
            .unwrap_or(u64::from(NONE));
        let index = if id & OLD == 0 { new } else { old };
        (index, id as u32)
    };
    // Three dependent reads per traceback group (its source, its view,
    // the reference count): fetched ahead at three distances.
    let traceback = group_by == GroupBy::Traceback;
    build(keys.len(), |i| {
        if traceback {
            if let Some(far) = keys.get(i + 2 * AHEAD)
                && let Some(source) = source.get(far.position as usize)
            {
                prefetch(std::ptr::from_ref(source).cast());
            }
            if let Some(ahead) = keys.get(i + AHEAD) {
                let (index, id) = group(ahead);
                touch(index, id, group_by, true);
            }
            if let Some(ahead) = keys.get(i + AHEAD / 2) {
                let (index, id) = group(ahead);
                touch(index, id, group_by, false);
            }
        }
        let key = keys.get(i).copied().unwrap_or(DiffKey {
            size_diff: 0,
            size: 0,
            count_diff: 0,
            count: 0,
            position: NONE,
            negative: 0,
        });
        let (index, id) = group(&key);
        StatisticDiff {
            traceback: group_traceback(index, id, group_by, cumulative),
            size: key.size,
            size_diff: DiffKey::signed(key.size_diff, key.negative & 2 != 0),
            count: key.count,
            count_diff: DiffKey::signed(key.count_diff, key.negative & 1 != 0),
            label: None,
        }
    })
}

/// The flag of an id in `old` in [`compare_to`]'s sources.
const OLD: u64 = 1 << 32;

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

    fn trace(size: u64, traceback: &Arc<Traceback>) -> Trace {
        Trace {
            domain: 1,
            size,
            traceback: Arc::clone(traceback),
        }
    }

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
    fn packed_sorts_equal_the_struct_sort_whatever_the_widths() {
        let mut seed = 7u64;
        let mut next = move |bits: u32| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 11) >> (53 - bits.min(53))
        };
        // Small values (one u64), wider ones (one u128), and full-width
        // ones (no packing).
        for bits in [4, 20, 53] {
            let keys: Vec<StatKey> = (0..2000)
                .map(|id| StatKey {
                    size: next(bits),
                    count: next(bits.min(20)),
                    id,
                })
                .collect();
            let mut expected = keys.clone();
            expected.sort_by(|a, b| b.cmp(a));
            assert!(sort_statistics(keys) == expected, "{bits} bits");
            let diffs: Vec<DiffKey> = (0..2000)
                .map(|position| DiffKey {
                    size_diff: next(bits),
                    size: next(bits),
                    count_diff: next(bits.min(8)),
                    count: next(bits.min(8)),
                    position,
                    negative: (next(2) & 3) as u8,
                })
                .collect();
            let mut expected = diffs.clone();
            expected.sort_by(|a, b| b.cmp(a));
            assert!(sort_diffs(diffs) == expected, "{bits} bits");
        }
        let huge = vec![
            StatKey {
                size: u64::MAX,
                count: u64::MAX,
                id: 1,
            },
            StatKey {
                size: u64::MAX,
                count: u64::MAX,
                id: 2,
            },
        ];
        assert_eq!(
            sort_statistics(huge)
                .iter()
                .map(|k| k.id)
                .collect::<Vec<_>>(),
            [2, 1]
        );
    }
}
