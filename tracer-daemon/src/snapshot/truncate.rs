//! Cutting a snapshot's tracebacks to a smaller traceback limit, as
//! `tracemalloc.start(nframe)` with a smaller nframe than tracerd's.
use std::{collections::HashMap, sync::Arc};

use tracer_model::{Snapshot, Trace, Traceback};

/// Cuts every traceback of `snapshot` to `limit` frames (one new `Arc` per
/// distinct traceback); `traceback_limit` becomes `limit`.
pub fn truncate(snapshot: Snapshot, limit: u32) -> Snapshot {
    let limit_usize = limit as usize;
    if snapshot
        .traces()
        .iter()
        .all(|t| t.traceback.frames().len() <= limit_usize)
    {
        // Nothing to cut: the snapshot and its index stay as they are.
        let mut snapshot = snapshot;
        snapshot.traceback_limit = limit;
        return snapshot;
    }
    let mut cut: HashMap<*const Traceback, Arc<Traceback>> = HashMap::new();
    let traces = snapshot
        .into_traces()
        .into_iter()
        .map(|t| {
            let traceback = if t.traceback.frames().len() <= limit_usize {
                t.traceback
            } else {
                Arc::clone(
                    cut.entry(Arc::as_ptr(&t.traceback))
                        .or_insert_with(|| cut_traceback(&t.traceback, limit)),
                )
            };
            Trace {
                source: t.source,
                domain: t.domain,
                size: t.size,
                traceback,
            }
        })
        .collect();
    Snapshot::new(traces, limit)
}

/// `traceback` cut to its first `limit` frames, its `total_nframe` kept.
pub fn cut_traceback(traceback: &Arc<Traceback>, limit: u32) -> Arc<Traceback> {
    if traceback.frames().len() <= limit as usize {
        return Arc::clone(traceback);
    }
    let frames = traceback
        .frames()
        .iter()
        .take(limit as usize)
        .cloned()
        .collect();
    Arc::new(Traceback::new(frames, traceback.total_nframe()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_model::Frame;

    #[test]
    fn truncate_cuts_each_distinct_traceback_once_and_keeps_total_nframe() {
        let deep = Arc::new(Traceback::new(
            (0..5).map(|i| Frame::new("a.c", i)).collect(),
            Some(9),
        ));
        let short = Arc::new(Traceback::new(vec![Frame::new("b.c", 1)], Some(1)));
        let traces = vec![
            Trace {
                source: tracer_model::AllocatorFamily::UNKNOWN,
                domain: 1,
                size: 1,
                traceback: Arc::clone(&deep),
            },
            Trace {
                source: tracer_model::AllocatorFamily::UNKNOWN,
                domain: 1,
                size: 2,
                traceback: Arc::clone(&short),
            },
            Trace {
                source: tracer_model::AllocatorFamily::UNKNOWN,
                domain: 1,
                size: 3,
                traceback: deep,
            },
        ];
        let cut = truncate(Snapshot::new(traces, 16), 2);
        assert_eq!(cut.traceback_limit(), 2);
        let t = cut.traces();
        assert_eq!(
            t[0].traceback
                .frames()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["a.c:0", "a.c:1"]
        );
        assert_eq!(t[0].traceback.total_nframe(), Some(9));
        assert!(Arc::ptr_eq(&t[0].traceback, &t[2].traceback));
        assert!(Arc::ptr_eq(&t[1].traceback, &short));
    }
}
