//! A snapshot's traces aggregated per cell: per distinct
//! `Arc<Traceback>` ("arc"), domain and source, the bytes and blocks of
//! its traces. Every filter decides alike on the traces of one cell (a
//! filter looks at the traceback, the domain and the source only), so
//! `filter_traces()` decides per cell: O(cells), which is O(distinct
//! tracebacks) for the usual single domain and source, once the cells are
//! made (one pass over the traces, the first time a filter needs them).

use std::collections::hash_map::Entry;
use std::sync::Arc;

use crate::engine::index::{Interned, NONE};
use crate::hash::FxHashMap;
use crate::trace::{Trace, TracebackTotals};

/// The cells of a snapshot of traces.
#[derive(Debug, Default)]
pub(crate) struct Cells {
    /// One per cell, in order of first appearance among the traces (so
    /// their arcs come in the order the traces' arcs do).
    pub(crate) groups: Vec<TracebackTotals>,
    /// One per trace: its cell's index in `groups`.
    pub(crate) of_trace: Vec<u32>,
    /// The cells interned: the snapshot's arcs, and each cell's arc.
    pub(crate) interned: Interned,
}

impl Cells {
    /// The cells of `traces`, interned as `interned`: one table access per
    /// trace (none within a run of traces of one cell).
    pub(crate) fn of(interned: &Interned, traces: &[Trace]) -> Self {
        let mut table: FxHashMap<(u32, u32, u8), u32> = FxHashMap::default();
        let mut groups: Vec<TracebackTotals> = Vec::new();
        let mut of_trace = Vec::with_capacity(traces.len());
        let mut cell_arcs: Vec<u32> = Vec::new();
        let mut last: Option<((u32, u32, u8), u32)> = None;
        for (trace, &arc) in traces.iter().zip(interned.ids()) {
            let key = (arc, trace.domain, trace.source.0);
            let cell = match last {
                Some((previous, cell)) if previous == key => cell,
                _ => match table.entry(key) {
                    Entry::Occupied(entry) => *entry.get(),
                    Entry::Vacant(entry) => {
                        let cell = u32::try_from(groups.len()).unwrap_or(NONE);
                        groups.push(TracebackTotals {
                            traceback: Arc::clone(&trace.traceback),
                            domain: trace.domain,
                            source: trace.source,
                            count: 0,
                            size: 0,
                        });
                        cell_arcs.push(arc);
                        *entry.insert(cell)
                    }
                },
            };
            last = Some((key, cell));
            if let Some(group) = groups.get_mut(cell as usize) {
                group.count = group.count.saturating_add(1);
                group.size = group.size.saturating_add(trace.size);
            }
            of_trace.push(cell);
        }
        Cells {
            groups,
            of_trace,
            interned: Interned {
                tracebacks: interned.tracebacks.clone(),
                ids: cell_arcs,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::trace;
    use crate::trace::{AllocatorFamily, Frame, Traceback};

    #[test]
    fn cells_split_by_arc_domain_and_source_in_order_of_first_appearance() {
        let a = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], None));
        let b = Arc::new(Traceback::new(vec![Frame::new("b.c", 2)], None));
        let mut other_domain = trace(4, &a);
        other_domain.domain = 2;
        let mut mmap = trace(8, &a);
        mmap.source = AllocatorFamily::MMAP;
        let traces = [
            trace(1, &b),
            trace(2, &a),
            other_domain,
            mmap,
            trace(16, &a),
            trace(32, &b),
        ];
        let cells = Cells::of(&Interned::of(&traces), &traces);
        assert_eq!(cells.of_trace, [0, 1, 2, 3, 1, 0]);
        assert_eq!(cells.interned.ids(), [0, 1, 1, 1]);
        let seen: Vec<(*const Traceback, u32, AllocatorFamily, u64, u64)> = cells
            .groups
            .iter()
            .map(|g| {
                (
                    Arc::as_ptr(&g.traceback),
                    g.domain,
                    g.source,
                    g.count,
                    g.size,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (Arc::as_ptr(&b), 1, AllocatorFamily::UNKNOWN, 2, 33),
                (Arc::as_ptr(&a), 1, AllocatorFamily::UNKNOWN, 2, 18),
                (Arc::as_ptr(&a), 2, AllocatorFamily::UNKNOWN, 1, 4),
                (Arc::as_ptr(&a), 1, AllocatorFamily::MMAP, 1, 8),
            ]
        );
    }
}
