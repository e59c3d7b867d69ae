//! `statistics()` and `compare_to()` for the `function` and `module`
//! groupings, which tracemalloc does not have: the distinct
//! `Arc<Traceback>`s (with their totals from stage 1) are grouped by
//! hashing the label of their most recent frame (or of every frame under
//! `cumulative`), in order of first appearance, on several threads for
//! large snapshots; the groups are then sorted by tracemalloc's orders,
//! the label breaking ties.
//!
//! Representatives (the frame a group's statistic shows) are the first
//! occurrences in the snapshot: results do not depend on hash-table or
//! thread order.

use std::collections::hash_map::Entry;
use std::hash::Hash;
use std::sync::Arc;

use crate::engine::index::Index;
use crate::engine::parallel::{in_parallel, sort_parallel, threads_for};
use crate::engine::totals::{Totals, difference};
use crate::hash::FxHashMap;
use crate::statistic::{GroupBy, Statistic, StatisticDiff, diff_order, statistic_order};
use crate::trace::{Frame, FrameExtra, Traceback, UNKNOWN_FILENAME};

/// `Snapshot.statistics()` for `function` and `module`, sorted by
/// [`statistic_order`] (the label breaking ties).
pub(crate) fn statistics(index: &Index, group_by: GroupBy, cumulative: bool) -> Vec<Statistic> {
    let distinct = distinct_tracebacks(index);
    let statistics = group_labels(&distinct, group_by, cumulative).label_statistics();
    sort_parallel(statistics, statistic_order)
}

/// `Snapshot.compare_to()` for `function` and `module`: every group of
/// either snapshot (groups only in `old` with size and count 0), sorted by
/// [`diff_order`] (the label breaking ties).
pub(crate) fn compare_to(
    new: &Index,
    old: &Index,
    group_by: GroupBy,
    cumulative: bool,
) -> Vec<StatisticDiff> {
    let new_distinct = distinct_tracebacks(new);
    let old_distinct = distinct_tracebacks(old);
    let new_groups = group_labels(&new_distinct, group_by, cumulative);
    let old_groups = group_labels(&old_distinct, group_by, cumulative);
    let diffs = new_groups.label_compare_to(&old_groups);
    sort_parallel(diffs, diff_order)
}

/// Stage 1 result: the traces sharing one `Arc<Traceback>`.
#[derive(Clone, Copy)]
struct Distinct<'a> {
    traceback: &'a Arc<Traceback>,
    totals: Totals,
}

/// Stage 1 for the label groupings: the totals of each arc (the index's),
/// with the arc. Equal tracebacks in different `Arc`s stay apart (their
/// frames' extras may differ).
fn distinct_tracebacks(index: &Index) -> Vec<Distinct<'_>> {
    index
        .interned
        .tracebacks
        .iter()
        .zip(&index.arc_totals)
        .map(|(traceback, &totals)| Distinct { traceback, totals })
        .collect()
}

/// One group: the first key value seen for it (the representative) and
/// its totals.
struct Group<R> {
    rep: R,
    totals: Totals,
}

/// The groups of one snapshot in order of first appearance, with an index
/// from key to position.
struct Groups<K, R> {
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
struct LabelRep<'a> {
    label: &'a Arc<str>,
    frame: &'a Frame,
    function: bool,
}

/// Groups by function or module name.
type LabelGroups<'a> = Groups<&'a str, LabelRep<'a>>;

/// Stage 2 for `function` and `module`: the label of the most recent frame
/// of each distinct traceback, or of every frame (each occurrence) under
/// `cumulative`. Frames with no such name count under `<unknown>`.
fn group_labels<'a>(
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

/// The statistic's one-frame traceback for a label group: the file of the
/// first frame seen ([`Frame::file`]: without its site), at line 0, with
/// the function and module, for `function`; the module path at line 0 for
/// `module`.
fn label_group_traceback(rep: &LabelRep<'_>) -> Traceback {
    let module = rep.frame.extra.as_deref().and_then(|e| e.module.clone());
    let frame = if rep.function {
        let file = match rep.frame.site_start() {
            Some(_) => Arc::from(rep.frame.file()),
            None => Arc::clone(&rep.frame.filename),
        };
        Frame::new(file, 0).with_extra(FrameExtra {
            function: Some(Arc::clone(rep.label)),
            module,
            ..FrameExtra::default()
        })
    } else {
        let frame = Frame::new(Arc::clone(rep.label), 0);
        match module {
            Some(module) => frame.with_extra(FrameExtra {
                module: Some(module),
                ..FrameExtra::default()
            }),
            None => frame,
        }
    };
    Traceback::from_frame(frame)
}

fn label_of(rep: &LabelRep<'_>) -> Option<Arc<str>> {
    Some(Arc::clone(rep.label))
}

impl<'a> LabelGroups<'a> {
    /// `statistics()` of label groups, before sorting.
    fn label_statistics(self) -> Vec<Statistic> {
        self.labelled_statistics(label_group_traceback, label_of)
    }

    /// `compare_to()` of label groups, before sorting.
    fn label_compare_to(&self, old: &LabelGroups<'a>) -> Vec<StatisticDiff> {
        self.labelled_compare_to(old, |rep| &**rep.label, label_group_traceback, label_of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::index::Interned;
    use crate::engine::totals::group_totals;
    use crate::testing::trace;
    use crate::trace::Trace;

    fn index_of(traces: &[Trace]) -> Index {
        Index::of(traces)
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
        let index = index_of(&traces);
        let distinct = distinct_tracebacks(&index);
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
        assert_eq!(
            group_totals(&index, GroupBy::Traceback, false),
            [totals(54, 4), totals(9, 2)]
        );
    }
}
