//! Steps 2 and 3 of [`Index::build`](super::Index::build) for
//! tracebacks: arcs with equal frame ids become one traceback, and the
//! tracebacks are sorted in tracemalloc's order (frames compared oldest
//! first, a prefix first).

use crate::engine::index::{NONE, at, id};
use crate::engine::table::{AHEAD, Table};

/// Step 2 of [`Index::build`](super::Index::build): each arc's traceback and each traceback's
/// first arc, tracebacks numbered by first appearance.
pub(super) struct Tracebacks {
    pub(super) arc_tb: Vec<u32>,
    pub(super) tb_arc: Vec<u32>,
}

pub(super) fn dedup_tracebacks(
    arc_start: &[usize],
    arc_frames: &[u32],
    arc_hash: &[u64],
) -> Tracebacks {
    let arcs = arc_hash.len();
    // Keyed by hash (0 is the table's empty key: hashes 0 and 1 share a
    // key, which the comparison of the frames tells apart).
    let key = |hash: u64| (hash as usize).max(1);
    let ids_of = |a: u32| {
        let start = at(arc_start, a, 0);
        let end = at(arc_start, a + 1, 0);
        arc_frames.get(start..end).unwrap_or(&[])
    };
    let mut by_hash: Table<usize, u32> = Table::with_capacity(arcs);
    // Per traceback: the previous traceback with the same key.
    let mut chain: Vec<u32> = Vec::with_capacity(arcs);
    let mut arc_tb = Vec::with_capacity(arcs);
    let mut tb_arc: Vec<u32> = Vec::with_capacity(arcs);
    for (a, &hash) in arc_hash.iter().enumerate() {
        if let Some(&ahead) = arc_hash.get(a + AHEAD) {
            by_hash.prefetch(&key(ahead));
        }
        let next = id(tb_arc.len());
        let (slot, new) = by_hash.get_or_insert(key(hash), || next);
        let mut tb = if new { NONE } else { *slot };
        let head = tb;
        while tb != NONE {
            if ids_of(at(&tb_arc, tb, NONE)) == ids_of(id(a)) {
                break;
            }
            tb = at(&chain, tb, NONE);
        }
        if tb == NONE {
            tb = next;
            *slot = next;
            chain.push(head);
            tb_arc.push(id(a));
        }
        arc_tb.push(tb);
    }
    Tracebacks { arc_tb, tb_arc }
}

/// The order of `n` distinct sequences of frame ids (each below `frames`),
/// lexicographic, a sequence before any longer one it starts: as many of
/// each sequence's first ids as fit in 96 bits are packed (id + 1, 0 past
/// the end) above its number, the packed keys sorted, and the runs of
/// equal prefixes sorted by whole sequences.
pub(super) fn sort_sequences<'s>(
    n: usize,
    frames: usize,
    sequence: impl Fn(u32) -> &'s [u32],
) -> Vec<u32> {
    let width = u64::BITS - (frames as u64 + 1).leading_zeros();
    let per_key = (96 / width.max(1)) as usize;
    let mut keys: Vec<u128> = (0..id(n))
        .map(|tb| {
            let ids = sequence(tb);
            let mut prefix = 0u128;
            for k in 0..per_key {
                let symbol = ids.get(k).map_or(0, |&f| u128::from(f) + 1);
                prefix = (prefix << width) | symbol;
            }
            (prefix << (128 - 32 - width as usize * per_key)) << 32 | u128::from(tb)
        })
        .collect();
    keys.sort_unstable();
    let mut order: Vec<u32> = keys.iter().map(|&k| k as u32).collect();
    // Runs of equal prefixes: their sequences are longer than the prefix.
    let mut start = 0;
    while start < keys.len() {
        let prefix = keys.get(start).map_or(0, |k| k >> 32);
        let mut end = start + 1;
        while keys.get(end).is_some_and(|k| k >> 32 == prefix) {
            end += 1;
        }
        if end - start > 1
            && let Some(run) = order.get_mut(start..end)
        {
            run.sort_unstable_by(|&a, &b| sequence(a).cmp(sequence(b)));
        }
        start = end;
    }
    order
}
