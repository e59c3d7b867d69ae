//! The first level of a snapshot's index: the traces' distinct
//! `Arc<Traceback>`s ("arcs"), by address, in order of first appearance,
//! with each trace's arc.

use std::sync::Arc;

use crate::engine::index::NONE;
use crate::engine::table::{AHEAD, Table};
use crate::trace::{Block, Traceback};

/// The distinct `Arc<Traceback>`s of a snapshot's traces, in order of
/// first appearance, and each trace's index into them: tracebacks interned
/// as `_tracemalloc` interns them. Loaders and the capture know the
/// sharing already and hand it over ([`Interned::checked`]); otherwise it is
/// computed from the addresses ([`Interned::of`]).
#[derive(Debug, Default)]
pub(crate) struct Interned {
    /// Distinct by address, first appearance first.
    pub(in crate::engine) tracebacks: Vec<Arc<Traceback>>,
    /// One per trace: its traceback's index in `tracebacks`.
    pub(in crate::engine) ids: Vec<u32>,
}

impl Interned {
    /// Interns `traces` (or any items of a snapshot) by the address of
    /// their tracebacks: one table access per item (none within a run of
    /// items sharing one `Arc`), prefetched [`AHEAD`] items in advance.
    pub(crate) fn of<B: Block>(traces: &[B]) -> Self {
        // At most one entry per run of items sharing one `Arc`: a snapshot
        // of a few long runs gets a small table rather than a million
        // buckets to fill.
        let runs = 1 + traces
            .windows(2)
            .filter(|pair| match pair {
                [a, b] => !Arc::ptr_eq(a.traceback(), b.traceback()),
                _ => false,
            })
            .count();
        let mut table: Table<usize, u32> =
            Table::with_capacity((traces.len() / 4).min(runs).min(1 << 20));
        let mut tracebacks: Vec<Arc<Traceback>> = Vec::new();
        let mut ids = Vec::with_capacity(traces.len());
        let address = |trace: &B| Arc::as_ptr(trace.traceback()) as usize;
        let mut last: Option<(usize, u32)> = None;
        for (position, trace) in traces.iter().enumerate() {
            if let Some(ahead) = traces.get(position + AHEAD) {
                table.prefetch(&address(ahead));
            }
            let key = address(trace);
            let id = match last {
                Some((previous, id)) if previous == key => id,
                _ => {
                    let next = u32::try_from(tracebacks.len()).unwrap_or(NONE);
                    let (id, new) = table.get_or_insert(key, || next);
                    if new {
                        tracebacks.push(Arc::clone(trace.traceback()));
                    }
                    *id
                }
            };
            last = Some((key, id));
            ids.push(id);
        }
        Interned { tracebacks, ids }
    }

    /// The interning a loader computed, if it is one: an index per trace,
    /// each naming the very `Arc` of that trace, indices numbered in order
    /// of first appearance, every traceback used.
    pub(crate) fn checked<B: Block>(
        traces: &[B],
        tracebacks: Vec<Arc<Traceback>>,
        ids: Vec<u32>,
    ) -> Option<Self> {
        if ids.len() != traces.len() {
            return None;
        }
        let mut next = 0usize;
        for (trace, &id) in traces.iter().zip(&ids) {
            let id = id as usize;
            if !Arc::ptr_eq(tracebacks.get(id)?, trace.traceback()) || id > next {
                return None;
            }
            if id == next {
                next += 1;
            }
        }
        (next == tracebacks.len()).then_some(Interned { tracebacks, ids })
    }

    /// The interning of the traces `keep` accepts, numbered anew, and for
    /// each of its tracebacks the index it had here.
    pub(crate) fn subset(&self, keep: &[bool]) -> (Self, Vec<u32>) {
        let mut renumber: Vec<u32> = vec![NONE; self.tracebacks.len()];
        let mut tracebacks = Vec::new();
        let mut parents = Vec::new();
        let mut ids = Vec::new();
        for (&id, &kept) in self.ids.iter().zip(keep) {
            if !kept {
                continue;
            }
            let Some(slot) = renumber.get_mut(id as usize) else {
                continue;
            };
            if *slot == NONE {
                let Some(traceback) = self.tracebacks.get(id as usize) else {
                    continue;
                };
                *slot = u32::try_from(tracebacks.len()).unwrap_or(NONE);
                tracebacks.push(Arc::clone(traceback));
                parents.push(id);
            }
            ids.push(*slot);
        }
        (Interned { tracebacks, ids }, parents)
    }

    /// Each trace's traceback index.
    pub(crate) fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// How many distinct tracebacks.
    pub(crate) fn len(&self) -> usize {
        self.tracebacks.len()
    }
}
