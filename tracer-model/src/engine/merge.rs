//! How `compare_to()` matches the groups of two snapshots: each side's
//! files, frames and tracebacks are numbered in tracemalloc's order, so
//! merging the ordered sequences pairs equal keys and orders the keys only
//! one side has.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::engine::index::{Index, NONE};
use crate::engine::parallel::{in_parallel, threads_for};
use crate::statistic::GroupBy;

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
/// key. Files are merged by text (for `filename`), frames by (merged name,
/// line) (a frame's name is its file name, a site included: the files
/// unless some frame has a site), and tracebacks by their frames' merged
/// positions, oldest first.
pub(super) fn matched_groups(new: &Index, old: &Index, group_by: GroupBy) -> Vec<(u32, u32)> {
    let by_text = |x: Option<&Arc<str>>, y: Option<&Arc<str>>| match (x, y) {
        (Some(x), Some(y)) if Arc::ptr_eq(x, y) => Ordering::Equal,
        (Some(x), Some(y)) => x.cmp(y),
        _ => Ordering::Equal,
    };
    if group_by == GroupBy::Filename {
        return merge(new.files(), old.files(), |a, b| {
            by_text(new.file(a), old.file(b))
        });
    }
    let names = merge(new.names(), old.names(), |a, b| {
        by_text(new.name(a), old.name(b))
    });
    let (new_name, old_name) = positions(&names, new.names(), old.names());
    let frame_key = |index: &Index, name_pos: &[u32], f: u32| {
        let i = f as usize;
        let name = index.frame_name(i);
        (
            name_pos.get(name as usize).copied().unwrap_or(NONE),
            index.frame_lineno.get(i).copied().unwrap_or(0),
        )
    };
    let frames = merge(new.frames(), old.frames(), |a, b| {
        frame_key(new, &new_name, a).cmp(&frame_key(old, &old_name, b))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
