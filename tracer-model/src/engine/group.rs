//! `statistics()` and `compare_to()` for tracemalloc's groupings
//! (`filename`, `lineno`, `traceback`: tracemalloc's `Snapshot._group_by`
//! and `_compare_grouped_stats`).
//!
//! The snapshot's [`Index`] numbers every distinct traceback, frame and
//! file in tracemalloc's sort order, so grouping is additions into dense
//! arrays:
//! 1. stage 1 sums size and count per distinct `Arc<Traceback>` (one pass
//!    over the traces, once, when the snapshot is indexed), then per
//!    traceback;
//! 2. stage 2 adds each traceback's totals to its most recent frame, or
//!    to every frame (each occurrence) under `cumulative`, and frames'
//!    totals to their files (both stages: `totals`);
//! 3. the groups' keys (size, count, id; for diffs the differences and
//!    the position in the merged order of both snapshots' keys) are
//!    packed into integers and sorted (`keys`) while another thread makes
//!    the groups' tracebacks in group order (from the index's tables), and
//!    the results are built in sorted order (here).
//!
//! `compare_to()` matches the two snapshots' groups by merging their
//! ordered files, frames and tracebacks (`merge`), which also orders the
//! groups only one of them has.
//!
//! Representatives (whose `FrameExtra` a statistic reports) are the first
//! occurrences in the snapshot, as the index records them: results do not
//! depend on hash-table or thread order.

use crate::engine::index::{Index, NONE};
use crate::engine::keys::{SortedKeys, signed};
use crate::engine::merge::matched_groups;
use crate::engine::parallel::{join, threads_for};
use crate::engine::table::{AHEAD, prefetch};
use crate::engine::totals::{Totals, difference, group_totals};
use crate::statistic::{GroupBy, Statistic, StatisticDiff};
use crate::trace::Traceback;

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
pub(crate) fn statistics(index: &Index, group_by: GroupBy, cumulative: bool) -> Vec<Statistic> {
    let totals = group_totals(index, group_by, cumulative);
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

/// `Snapshot.compare_to()` for `filename`, `lineno` and `traceback`,
/// sorted: every group of either snapshot (groups only in `old` with size
/// and count 0), the traceback taken from `new` when it has the group;
/// biggest first by `|size_diff|`, size, `|count_diff|`, count, then the
/// position of its key in the merged key order (tracemalloc's traceback
/// order).
pub(crate) fn compare_to(
    new: &Index,
    old: &Index,
    group_by: GroupBy,
    cumulative: bool,
) -> Vec<StatisticDiff> {
    let now = group_totals(new, group_by, cumulative);
    let before = group_totals(old, group_by, cumulative);
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
