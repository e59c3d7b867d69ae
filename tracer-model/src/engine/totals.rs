//! Stages 1 and 2 of tracemalloc's groupings: the totals (bytes and
//! blocks) of every distinct `Arc<Traceback>`, every traceback, every frame
//! and every file, as dense arrays indexed by the [`Index`]'s ids.

use crate::engine::index::{Index, Interned};
use crate::engine::parallel::{in_parallel, threads_for};
use crate::statistic::GroupBy;
use crate::trace::Block;

/// Bytes and blocks of one group. Sums saturate instead of wrapping (no
/// real process holds 2^64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Sum of block sizes, in bytes.
    pub size: u64,
    /// Number of blocks (frame occurrences under `cumulative`).
    pub count: u64,
}

impl Totals {
    pub(crate) fn add(&mut self, other: Totals) {
        self.size = self.size.saturating_add(other.size);
        self.count = self.count.saturating_add(other.count);
    }
}

/// Stage 1: the size and count of the blocks of each arc (distinct
/// `Arc<Traceback>`), in order of first appearance: a dense sum, no table.
/// Large snapshots are summed in two halves on two threads. Computed once,
/// when a snapshot is indexed (the index keeps it): every grouping starts
/// from it, so that a call costs O(distinct tracebacks), not O(traces).
pub(crate) fn arc_totals<B: Block + Sync>(interned: &Interned, traces: &[B]) -> Vec<Totals> {
    let n = interned.tracebacks.len();
    let sum = |traces: &[B], ids: &[u32]| {
        let mut totals = vec![Totals::default(); n];
        for (trace, &id) in traces.iter().zip(ids) {
            if let Some(slot) = totals.get_mut(id as usize) {
                let (size, count) = trace.size_count();
                slot.add(Totals { size, count });
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

/// `now - before`, saturating at the `i64` range.
pub(super) fn difference(now: u64, before: u64) -> i64 {
    let diff = i128::from(now) - i128::from(before);
    i64::try_from(diff).unwrap_or(if diff < 0 { i64::MIN } else { i64::MAX })
}

/// Stage 1 for tracemalloc's groupings: the totals of each traceback of
/// `index` (by frames, numbered in traceback order), from the index's arc
/// totals.
fn traceback_totals(index: &Index) -> Vec<Totals> {
    let mut totals = vec![Totals::default(); index.tracebacks()];
    for (arc, &tb) in index.arc_totals.iter().zip(&index.arc_tb) {
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
pub(super) fn group_totals(index: &Index, group_by: GroupBy, cumulative: bool) -> Vec<Totals> {
    let tb_totals = traceback_totals(index);
    match group_by {
        GroupBy::Traceback => tb_totals,
        GroupBy::Filename => file_totals(index, &frame_totals(index, &tb_totals, cumulative)),
        _ => frame_totals(index, &tb_totals, cumulative),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::testing::trace;
    use crate::trace::{Frame, Trace, Traceback};

    fn index_of(traces: &[Trace]) -> Index {
        Index::of(traces)
    }

    #[test]
    fn frame_groups_merge_equal_names_in_separate_allocations() {
        let shared: Arc<str> = Arc::from("a.c");
        let separate: Arc<str> = Arc::from("a.c");
        let frame = |name: &Arc<str>, lineno| Frame::new(Arc::clone(name), lineno);
        let one = Arc::new(Traceback::new(
            vec![frame(&shared, 1), frame(&separate, 1), frame(&shared, 2)],
            None,
        ));
        let two = Arc::new(Traceback::new(vec![frame(&separate, 2)], None));
        let traces = [trace(10, &one), trace(5, &two)];
        let index = index_of(&traces);
        assert_eq!(index.frames(), 2);
        assert_eq!(
            group_totals(&index, GroupBy::Lineno, true),
            [Totals { size: 20, count: 2 }, Totals { size: 15, count: 2 }]
        );
        assert_eq!(
            group_totals(&index, GroupBy::Lineno, false),
            [Totals { size: 10, count: 1 }, Totals { size: 5, count: 1 }]
        );
        assert_eq!(
            group_totals(&index, GroupBy::Filename, false),
            [Totals { size: 15, count: 2 }]
        );
    }
}
