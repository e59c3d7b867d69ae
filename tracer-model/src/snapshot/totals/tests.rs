//! Snapshots of totals (`Snapshot::from_totals`) answer exactly as the
//! snapshots of traces they add up, and filtered snapshots (decided per
//! cell, traces copied out lazily) hold exactly the traces a per-trace
//! filter keeps.

use std::collections::HashMap;

use super::*;
use crate::filter::{AllocatorFamilyFilter, DomainFilter, Filter};
use crate::trace::{AllocatorFamily, Frame, FrameExtra};
use crate::{dump_tracemalloc, load_tracemalloc};

const GROUPINGS: [GroupBy; 5] = [
    GroupBy::Filename,
    GroupBy::Lineno,
    GroupBy::Traceback,
    GroupBy::Function,
    GroupBy::Module,
];

/// `traces` added up per (traceback `Arc`, domain, source), in order of
/// first appearance: what the kernel's totals per stack are.
fn aggregate(traces: &[Trace]) -> Vec<TracebackTotals> {
    let mut at: HashMap<(*const Traceback, u32, AllocatorFamily), usize> = HashMap::new();
    let mut groups: Vec<TracebackTotals> = Vec::new();
    for trace in traces {
        let key = (Arc::as_ptr(&trace.traceback), trace.domain, trace.source);
        let i = *at.entry(key).or_insert_with(|| {
            groups.push(TracebackTotals {
                traceback: Arc::clone(&trace.traceback),
                domain: trace.domain,
                source: trace.source,
                count: 0,
                size: 0,
            });
            groups.len() - 1
        });
        groups[i].count += 1;
        groups[i].size += trace.size;
    }
    groups
}

/// `n` traces over `tracebacks` distinct stacks (some stacks repeated in a
/// second `Arc`), in 3 domains and 2 sources, with functions and modules on
/// most frames: random-ish from `seed`.
fn random_traces(seed: u64, n: usize, tracebacks: usize) -> Vec<Trace> {
    let mut random = crate::testing::lcg(seed);
    let mut next = move |n: u64| (random() >> 33) % n;
    let mut pool: Vec<Arc<Traceback>> = Vec::new();
    for _ in 0..tracebacks {
        let depth = 1 + next(5) as usize;
        let frames: Vec<Frame> = (0..depth)
            .map(|_| {
                let file = next(12);
                let frame = Frame::new(format!("src/f{file}.c"), next(6) as u32);
                match next(4) {
                    0 => frame,
                    _ => frame.with_extra(FrameExtra {
                        function: Some(Arc::from(format!("fn{}", next(7)))),
                        module: Some(Arc::from(format!("/lib/m{}.so", file % 3))),
                        address: Some(next(1 << 20)),
                        build_id: None,
                    }),
                }
            })
            .collect();
        pool.push(Arc::new(Traceback::new(frames, Some(depth as u32 + 2))));
        if next(5) == 0 {
            // The same stack in an `Arc` of its own.
            let copy = Traceback::new(pool[pool.len() - 1].frames().to_vec(), None);
            pool.push(Arc::new(copy));
        }
    }
    (0..n)
        .map(|_| Trace {
            domain: 100 + next(3) as u32,
            size: 1 + next(3000),
            traceback: Arc::clone(&pool[next(pool.len() as u64) as usize]),
            source: if next(6) == 0 {
                AllocatorFamily::MMAP
            } else {
                AllocatorFamily::UNKNOWN
            },
        })
        .collect()
}

fn lines<T: ToString>(items: &[T]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

/// Every grouping, cumulative both ways, of `got` equals that of `want`:
/// the same values and the same `str()` lines, in the same order (or the
/// same error).
fn assert_same_statistics(got: &Snapshot, want: &Snapshot) {
    for group_by in GROUPINGS {
        for cumulative in [false, true] {
            let g = got.statistics(group_by, cumulative);
            let w = want.statistics(group_by, cumulative);
            assert_eq!(g, w, "{group_by:?} cumulative={cumulative}");
            if let Ok(w) = &w {
                assert!(!w.is_empty() || want.blocks() == 0);
                assert_eq!(lines(g.as_deref().unwrap_or(&[])), lines(w));
            }
        }
    }
}

/// Every grouping of `new.compare_to(old)`, cumulative both ways, equals
/// that of `want_new.compare_to(want_old)`.
fn assert_same_diffs(new: &Snapshot, old: &Snapshot, want_new: &Snapshot, want_old: &Snapshot) {
    for group_by in GROUPINGS {
        for cumulative in [false, true] {
            let g = new.compare_to(old, group_by, cumulative);
            let w = want_new.compare_to(want_old, group_by, cumulative);
            assert_eq!(g, w, "{group_by:?} cumulative={cumulative}");
            if let (Ok(g), Ok(w)) = (&g, &w) {
                assert_eq!(lines(g), lines(w));
            }
        }
    }
}

#[test]
fn from_totals_of_the_aggregated_traces_answers_exactly_as_the_traces() {
    for (seed, n, tracebacks) in [(1, 3000, 40), (2, 20_000, 600), (3, 70_000, 900)] {
        let traces = random_traces(seed, n, tracebacks);
        let groups = aggregate(&traces);
        assert!(groups.len() < n / 4, "few groups: {}", groups.len());
        let of_traces = Snapshot::new(traces.clone(), 8);
        let of_totals = Snapshot::from_totals(groups.clone(), 8);
        assert!(of_totals.is_totals() && !of_traces.is_totals());
        assert_eq!(of_totals.blocks(), n as u64);
        assert_eq!(of_traces.blocks(), n as u64);
        assert!(of_totals.traces().is_empty());
        assert_eq!(of_totals.traceback_totals(), &groups[..]);
        // The traces' own totals are the same groups.
        assert_eq!(of_traces.traceback_totals(), &groups[..]);
        assert_same_statistics(&of_totals, &of_traces);

        // An older snapshot: most of the traces, other sizes, some new ones.
        let mut older: Vec<Trace> = traces
            .iter()
            .step_by(3)
            .map(|t| Trace {
                size: t.size + 8,
                ..t.clone()
            })
            .collect();
        older.extend(random_traces(seed + 10, n / 4, tracebacks / 2));
        let old_traces = Snapshot::new(older.clone(), 8);
        let old_totals = Snapshot::from_totals(aggregate(&older), 8);
        assert_same_diffs(&of_totals, &old_totals, &of_traces, &old_traces);
        assert_same_diffs(&of_totals, &old_traces, &of_traces, &old_traces);
        assert_same_diffs(&of_traces, &old_totals, &of_traces, &old_traces);
        assert_same_diffs(&old_totals, &of_traces, &old_traces, &of_traces);
    }
}

/// The filters the tests apply: patterns on the most recent frame and on
/// every frame, with a line and with a domain, exclusive ones, and domain
/// and source filters.
fn filter_sets() -> Vec<Vec<TraceFilter>> {
    vec![
        vec![Filter::new(true, "src/f1*.c", None, false, None).into()],
        vec![Filter::new(false, "src/f3.c", None, true, None).into()],
        vec![
            Filter::new(true, "src/f2.c", Some(3), true, None).into(),
            Filter::new(true, "src/f4.c", None, false, Some(101)).into(),
        ],
        vec![
            Filter::new(false, "src/f5.c", None, false, Some(102)).into(),
            DomainFilter {
                inclusive: false,
                domain: 100,
            }
            .into(),
        ],
        vec![
            AllocatorFamilyFilter {
                inclusive: true,
                source: AllocatorFamily::MMAP,
            }
            .into(),
        ],
        vec![Filter::new(true, "nothing*", None, true, None).into()],
    ]
}

#[test]
fn filter_traces_of_totals_answers_as_the_filtered_traces() {
    let traces = random_traces(7, 30_000, 300);
    let of_traces = Snapshot::new(traces.clone(), 8);
    let of_totals = Snapshot::from_totals(aggregate(&traces), 8);
    for filters in filter_sets() {
        let want = of_traces.filter_traces(&filters);
        let got = of_totals.filter_traces(&filters);
        assert!(got.is_totals());
        assert_eq!(got.blocks(), want.traces().len() as u64);
        assert_eq!(got.traceback_totals(), aggregate(want.traces()));
        assert_same_statistics(&got, &want);
        // A snapshot made anew of the kept traces answers the same too.
        assert_same_statistics(&want, &Snapshot::new(want.traces().to_vec(), 8));
    }
}

/// tracemalloc's `_filter_trace` per trace: the reference for the kept
/// traces.
fn kept_by_hand(traces: &[Trace], filters: &[TraceFilter]) -> Vec<Trace> {
    let matches = |filter: &TraceFilter, trace: &Trace| -> bool {
        match filter {
            TraceFilter::Domain(d) => (trace.domain == d.domain) == d.inclusive,
            TraceFilter::AllocatorFamily(s) => (trace.source == s.source) == s.inclusive,
            TraceFilter::Filter(f) => {
                if let Some(domain) = f.domain
                    && domain != trace.domain
                {
                    return !f.inclusive;
                }
                let frame_matches = |frame: &Frame| {
                    f.lineno.is_none_or(|l| l == frame.lineno)
                        && Pattern::new(f.filename_pattern())
                            .matches(crate::filter::normalize_filename(&frame.filename))
                };
                let frames = trace.traceback.frames();
                let hit = if f.all_frames {
                    frames.iter().any(frame_matches)
                } else {
                    frames.first().is_some_and(frame_matches)
                };
                hit == f.inclusive
            }
        }
    };
    let any_inclusive = filters.iter().any(TraceFilter::inclusive);
    traces
        .iter()
        .filter(|trace| {
            (!any_inclusive || filters.iter().any(|f| f.inclusive() && matches(f, trace)))
                && !filters.iter().any(|f| !f.inclusive() && !matches(f, trace))
        })
        .cloned()
        .collect()
}

use crate::filter::Pattern;

#[test]
fn filtered_traces_are_the_traces_each_filter_keeps_in_order_even_filtered_twice() {
    let traces = random_traces(11, 20_000, 250);
    let snapshot = Snapshot::new(traces.clone(), 8);
    let sets = filter_sets();
    for (i, filters) in sets.iter().enumerate() {
        let want = kept_by_hand(&traces, filters);
        let filtered = snapshot.filter_traces(filters);
        assert!(!filtered.is_totals());
        // Statistics first: they need no trace copied.
        assert_same_statistics(&filtered, &Snapshot::new(want.clone(), 8));
        assert_eq!(filtered.blocks(), want.len() as u64);
        assert_eq!(filtered.traces(), &want[..], "filters {i}");
        // Filtered again with the next set: as if by hand, twice.
        let then = &sets[(i + 1) % sets.len()];
        let twice = filtered.filter_traces(then);
        let want_twice = kept_by_hand(&want, then);
        assert_same_statistics(&twice, &Snapshot::new(want_twice.clone(), 8));
        assert_eq!(
            twice.clone().into_traces(),
            want_twice,
            "filters {i} then next"
        );
        assert_eq!(twice, Snapshot::new(want_twice, 8));
    }
    assert_eq!(snapshot.filter_traces(&[]), snapshot);
}

#[test]
fn a_snapshot_of_totals_dumps_count_traces_summing_to_size() {
    let stack = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], Some(1)));
    let other = Arc::new(Traceback::new(vec![Frame::new("b.c", 2)], Some(1)));
    let group = |traceback: &Arc<Traceback>, count, size| TracebackTotals {
        traceback: Arc::clone(traceback),
        domain: 9,
        source: AllocatorFamily::UNKNOWN,
        count,
        size,
    };
    let snapshot = Snapshot::from_totals(
        vec![
            group(&stack, 3, 10),
            group(&other, 0, 0),
            group(&other, 2, 4),
        ],
        1,
    );
    assert_eq!(snapshot.blocks(), 5);
    assert_eq!(snapshot.traceback_totals().len(), 2, "count 0 dropped");
    assert!(snapshot.traces().is_empty());
    assert!(snapshot.clone().into_traces().is_empty());
    assert_eq!(
        lines(&snapshot.statistics(GroupBy::Lineno, false).expect("lineno")),
        [
            "a.c:1: size=10 B, count=3, average=3 B",
            "b.c:2: size=4 B, count=2, average=2 B",
        ]
    );
    let loaded = load_tracemalloc(&dump_tracemalloc(&snapshot)).expect("loads");
    let sizes: Vec<(String, u64)> = loaded
        .traces()
        .iter()
        .map(|t| (t.traceback.to_string(), t.size))
        .collect();
    assert_eq!(
        sizes,
        [
            ("a.c:1".to_string(), 4),
            ("a.c:1".to_string(), 3),
            ("a.c:1".to_string(), 3),
            ("b.c:2".to_string(), 2),
            ("b.c:2".to_string(), 2),
        ]
    );
    assert_same_statistics(&loaded, &snapshot);
    let decoded = crate::decode(&crate::encode(&snapshot, &serde_json::json!({})))
        .expect("decodes")
        .snapshot;
    assert_eq!(decoded.traces().len(), 5);
    assert_same_statistics(&decoded, &snapshot);
    assert_eq!(Snapshot::from_totals(Vec::new(), 0), Snapshot::default());
}
