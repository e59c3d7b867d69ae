//! Exact expectations, each taken from CPython 3.11's tracemalloc run on the
//! same traces.

use super::*;
use crate::{Frame, FrameExtra};

/// `(domain, size in bytes, frames as (filename, lineno), most recent first)`.
type RawTrace<'a> = (u32, u64, &'a [(&'a str, u32)]);

/// A snapshot of raw traces, one `Arc` per trace (so stage 2 must merge
/// equal tracebacks).
fn snapshot(traces: &[RawTrace<'_>]) -> Snapshot {
    let traces = traces
        .iter()
        .map(|&(domain, size, frames)| Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain,
            size,
            traceback: Arc::new(Traceback::new(
                frames.iter().map(|&(f, l)| Frame::new(f, l)).collect(),
                u32::try_from(frames.len()).ok(),
            )),
        })
        .collect();
    Snapshot::new(traces, 5)
}

fn lines<T: ToString>(items: &[T]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

#[test]
fn statistics_ties_break_by_count_then_traceback_descending() {
    let snap = snapshot(&[
        (0, 100, &[("b.c", 1)]),
        (0, 100, &[("a.c", 2)]),
        (0, 50, &[("a.c", 1)]),
        (1, 50, &[("a.c", 1)]),
        (0, 100, &[("a.c", 10)]),
        (0, 200, &[("c.c", 5)]),
    ]);
    let stats = snap.statistics(GroupBy::Lineno, false).expect("lineno");
    assert_eq!(
        lines(&stats),
        [
            "c.c:5: size=200 B, count=1, average=200 B",
            "a.c:1: size=100 B, count=2, average=50 B",
            "b.c:1: size=100 B, count=1, average=100 B",
            "a.c:10: size=100 B, count=1, average=100 B",
            "a.c:2: size=100 B, count=1, average=100 B",
        ]
    );
    let stats = snap.statistics(GroupBy::Filename, false).expect("filename");
    assert_eq!(
        lines(&stats),
        [
            "a.c:0: size=300 B, count=4, average=75 B",
            "c.c:0: size=200 B, count=1, average=200 B",
            "b.c:0: size=100 B, count=1, average=100 B",
        ]
    );
    assert_eq!(stats[0].traceback.frames(), [Frame::new("a.c", 0)]);
}

#[test]
fn cumulative_counts_a_recursive_frame_once_per_occurrence_like_cpython() {
    // CPython 3.11 adds a trace to a frame's group for every occurrence of
    // the frame in the traceback: a.c:1 twice gives size 200, count 2.
    let snap = snapshot(&[
        (0, 100, &[("a.c", 1), ("b.c", 2), ("a.c", 1), ("a.c", 3)]),
        (0, 7, &[("b.c", 2)]),
    ]);
    let stats = snap.statistics(GroupBy::Lineno, true).expect("lineno");
    assert_eq!(
        lines(&stats),
        [
            "a.c:1: size=200 B, count=2, average=100 B",
            "b.c:2: size=107 B, count=2, average=54 B",
            "a.c:3: size=100 B, count=1, average=100 B",
        ]
    );
    let stats = snap.statistics(GroupBy::Filename, true).expect("filename");
    assert_eq!(
        lines(&stats),
        [
            "a.c:0: size=300 B, count=3, average=100 B",
            "b.c:0: size=107 B, count=2, average=54 B",
        ]
    );
    // Not cumulative: only the most recent frame, shown by its oldest frame.
    let stats = snap.statistics(GroupBy::Traceback, false).expect("tb");
    assert_eq!(
        lines(&stats),
        [
            "a.c:3: size=100 B, count=1, average=100 B",
            "b.c:2: size=7 B, count=1, average=7 B",
        ]
    );
}

#[test]
fn cumulative_with_traceback_is_cpythons_error() {
    let snap = snapshot(&[(0, 1, &[("a.c", 1)])]);
    let err = snap
        .statistics(GroupBy::Traceback, true)
        .expect_err("cumulative traceback");
    assert_eq!(err, ModelError::CumulativeTraceback);
    assert_eq!(
        err.to_string(),
        "cumulative mode cannot by used with key type 'traceback'"
    );
    let err = snap
        .compare_to(&Snapshot::default(), GroupBy::Traceback, true)
        .expect_err("cumulative traceback");
    assert_eq!(err, ModelError::CumulativeTraceback);
}

#[test]
fn compare_to_lists_groups_only_in_old_with_size_zero() {
    let old = snapshot(&[
        (0, 100, &[("a.c", 1)]),
        (0, 300, &[("d.c", 4)]),
        (0, 10, &[("f.c", 1)]),
    ]);
    let new = snapshot(&[
        (0, 150, &[("a.c", 1)]),
        (0, 300, &[("e.c", 5)]),
        (0, 10, &[("f.c", 1)]),
    ]);
    let diffs = new.compare_to(&old, GroupBy::Lineno, false).expect("diff");
    assert_eq!(
        lines(&diffs),
        [
            "e.c:5: size=300 B (+300 B), count=1 (+1), average=300 B",
            "d.c:4: size=0 B (-300 B), count=0 (-1)",
            "a.c:1: size=150 B (+50 B), count=1 (+0), average=150 B",
            "f.c:1: size=10 B (+0 B), count=1 (+0), average=10 B",
        ]
    );
    let gone = &diffs[1];
    assert_eq!(
        (gone.size, gone.size_diff, gone.count, gone.count_diff),
        (0, -300, 0, -1)
    );
    let diffs = old.compare_to(&new, GroupBy::Lineno, false).expect("diff");
    assert_eq!(
        lines(&diffs),
        [
            "d.c:4: size=300 B (+300 B), count=1 (+1), average=300 B",
            "e.c:5: size=0 B (-300 B), count=0 (-1)",
            "a.c:1: size=100 B (-50 B), count=1 (+0), average=100 B",
            "f.c:1: size=10 B (+0 B), count=1 (+0), average=10 B",
        ]
    );
}

#[test]
fn compare_to_ties_break_by_size_count_diff_count_then_traceback() {
    let x: &[(&str, u32)] = &[("x.c", 1)];
    let y: &[(&str, u32)] = &[("y.c", 1)];
    let old = snapshot(&[(0, 10, x), (0, 10, x), (0, 10, x), (0, 30, y)]);
    let mut new_traces = vec![
        (0, 60, x),
        (0, 30, &[("z.c", 1)][..]),
        (0, 30, &[("w.c", 1)][..]),
    ];
    new_traces.extend(std::iter::repeat_n((0, 10, y), 6));
    let new = snapshot(&new_traces);
    let diffs = new.compare_to(&old, GroupBy::Lineno, false).expect("diff");
    assert_eq!(
        lines(&diffs),
        [
            "y.c:1: size=60 B (+30 B), count=6 (+5), average=10 B",
            "x.c:1: size=60 B (+30 B), count=1 (-2), average=60 B",
            "z.c:1: size=30 B (+30 B), count=1 (+1), average=30 B",
            "w.c:1: size=30 B (+30 B), count=1 (+1), average=30 B",
        ]
    );
}

#[test]
fn traceback_groups_tie_break_on_oldest_frames_and_drop_total_nframe() {
    let snap = snapshot(&[
        (0, 10, &[("a.c", 1), ("m.c", 1)]),
        (0, 10, &[("a.c", 1)]),
        (0, 10, &[("b.c", 1), ("m.c", 1)]),
        (0, 10, &[("a.c", 2), ("l.c", 9)]),
    ]);
    let stats = snap.statistics(GroupBy::Traceback, false).expect("tb");
    let formatted: Vec<Vec<String>> = stats
        .iter()
        .map(|s| s.traceback.format(None, false))
        .collect();
    assert_eq!(
        formatted,
        [
            vec!["  File \"m.c\", line 1", "  File \"b.c\", line 1"],
            vec!["  File \"m.c\", line 1", "  File \"a.c\", line 1"],
            vec!["  File \"l.c\", line 9", "  File \"a.c\", line 2"],
            vec!["  File \"a.c\", line 1"],
        ]
    );
    assert_eq!(
        stats[0].to_string(),
        "m.c:1: size=10 B, count=1, average=10 B"
    );
    assert!(stats.iter().all(|s| s.traceback.total_nframe().is_none()));
    let stats = snap.statistics(GroupBy::Filename, true).expect("filename");
    assert_eq!(
        lines(&stats),
        [
            "a.c:0: size=30 B, count=3, average=10 B",
            "m.c:0: size=20 B, count=2, average=10 B",
            "l.c:0: size=10 B, count=1, average=10 B",
            "b.c:0: size=10 B, count=1, average=10 B",
        ]
    );
}

#[test]
fn equal_tracebacks_in_separate_arcs_form_one_group() {
    let shared = Arc::new(Traceback::new(
        vec![Frame::new("a.c", 1), Frame::new("m.c", 2)],
        None,
    ));
    let copy = Arc::new(Traceback::new(
        vec![Frame::new("a.c", 1), Frame::new("m.c", 2)],
        Some(40),
    ));
    let trace = |size, traceback: &Arc<Traceback>| Trace {
        source: crate::trace::AllocatorFamily::UNKNOWN,
        domain: 7,
        size,
        traceback: Arc::clone(traceback),
    };
    let snap = Snapshot::new(
        vec![
            trace(1, &shared),
            trace(2, &copy),
            trace(4, &shared),
            trace(8, &copy),
        ],
        2,
    );
    let stats = snap.statistics(GroupBy::Traceback, false).expect("tb");
    assert_eq!(stats.len(), 1);
    assert_eq!((stats[0].size, stats[0].count), (15, 4));
    assert_eq!(
        stats[0].traceback.frames().as_ptr(),
        shared.frames().as_ptr(),
        "shares the frames"
    );
    let diffs = snap
        .compare_to(&snap, GroupBy::Traceback, false)
        .expect("diff");
    assert_eq!(
        lines(&diffs),
        ["m.c:2: size=15 B (+0 B), count=4 (+0), average=4 B"]
    );
}

#[test]
fn lineno_groups_keep_the_first_frames_extra_and_filename_groups_none() {
    let extra = FrameExtra {
        function: Some("grow".into()),
        module: Some("/usr/bin/app".into()),
        address: Some(0x401000),
        build_id: None,
    };
    let first = Frame::new("a.c", 1).with_extra(extra.clone());
    let second = Frame::new("a.c", 1).with_extra(FrameExtra {
        address: Some(0x402000),
        ..extra.clone()
    });
    let trace = |frame: Frame| Trace {
        source: crate::trace::AllocatorFamily::UNKNOWN,
        domain: 1,
        size: 8,
        traceback: Arc::new(Traceback::new(vec![frame], None)),
    };
    let snap = Snapshot::new(vec![trace(first), trace(second)], 1);
    let stats = snap.statistics(GroupBy::Lineno, false).expect("lineno");
    assert_eq!(
        stats[0].traceback.frames()[0].extra.as_deref(),
        Some(&extra)
    );
    let stats = snap.statistics(GroupBy::Filename, false).expect("filename");
    assert_eq!(stats[0].traceback.frames()[0].extra, None);
}

#[test]
fn empty_snapshots_give_empty_results() {
    let empty = Snapshot::default();
    assert!(
        empty
            .statistics(GroupBy::Lineno, true)
            .expect("ok")
            .is_empty()
    );
    assert!(
        empty
            .compare_to(&Snapshot::default(), GroupBy::Traceback, false)
            .expect("ok")
            .is_empty()
    );
}

/// A frame with a function and module, as symbolization makes them.
fn rich(file: &str, lineno: u32, function: Option<&str>, module: Option<&str>) -> Frame {
    Frame::new(file, lineno).with_extra(FrameExtra {
        function: function.map(Arc::from),
        module: module.map(Arc::from),
        address: Some(0x1000 + u64::from(lineno)),
        build_id: None,
    })
}

fn rich_snapshot() -> Snapshot {
    let tb = |frames: Vec<Frame>| Arc::new(Traceback::new(frames, None));
    let alloc = rich("src/a.c", 10, Some("alloc_node"), Some("/usr/bin/app"));
    let alloc2 = rich("src/a.c", 12, Some("alloc_node"), Some("/usr/bin/app"));
    let main = rich("src/main.c", 5, Some("main"), Some("/usr/bin/app"));
    let dup = rich("lib/x.c", 3, Some("strdup_x"), Some("/lib/libx.so"));
    let recursive = tb(vec![alloc.clone(), alloc2.clone(), main.clone()]);
    let traces = vec![
        Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 1,
            size: 100,
            traceback: tb(vec![alloc.clone(), main.clone()]),
        },
        Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 1,
            size: 50,
            traceback: tb(vec![alloc2, main.clone()]),
        },
        Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 1,
            size: 70,
            traceback: tb(vec![dup, main.clone()]),
        },
        Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 1,
            size: 30,
            traceback: recursive,
        },
        Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 1,
            size: 20,
            traceback: tb(vec![Frame::unknown()]),
        },
        Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 1,
            size: 5,
            traceback: tb(vec![Frame::new("src/b.c", 1), main]),
        },
    ];
    Snapshot::new(traces, 5)
}

#[test]
fn group_by_function_sums_the_most_recent_frames_function() {
    let stats = rich_snapshot()
        .statistics(GroupBy::Function, false)
        .expect("function");
    assert_eq!(
        lines(&stats),
        [
            "alloc_node: size=180 B, count=3, average=60 B",
            "strdup_x: size=70 B, count=1, average=70 B",
            "<unknown>: size=25 B, count=2, average=12 B",
        ]
    );
    let json = serde_json::to_value(&stats[0]).expect("serializes");
    assert_eq!(
        json,
        serde_json::json!({
            "traceback": [{"filename": "src/a.c", "lineno": 0, "function": "alloc_node",
                           "module": "/usr/bin/app"}],
            "size": 180, "count": 3, "label": "alloc_node"
        })
    );
}

#[test]
fn group_by_function_cumulative_counts_every_occurrence() {
    let stats = rich_snapshot()
        .statistics(GroupBy::Function, true)
        .expect("function");
    assert_eq!(
        lines(&stats),
        [
            "main: size=255 B, count=5, average=51 B",
            "alloc_node: size=210 B, count=4, average=52 B",
            "strdup_x: size=70 B, count=1, average=70 B",
            "<unknown>: size=25 B, count=2, average=12 B",
        ]
    );
}

#[test]
fn group_by_module_and_its_compare_to() {
    let new = rich_snapshot();
    let stats = new.statistics(GroupBy::Module, false).expect("module");
    assert_eq!(
        lines(&stats),
        [
            "/usr/bin/app: size=180 B, count=3, average=60 B",
            "/lib/libx.so: size=70 B, count=1, average=70 B",
            "<unknown>: size=25 B, count=2, average=12 B",
        ]
    );
    assert_eq!(stats[1].traceback.frames()[0].to_string(), "/lib/libx.so:0");
    let old = Snapshot::new(new.traces()[2..].to_vec(), 5);
    let diffs = new.compare_to(&old, GroupBy::Module, true).expect("module");
    assert_eq!(
        lines(&diffs),
        [
            "/usr/bin/app: size=465 B (+300 B), count=9 (+4), average=52 B",
            "/lib/libx.so: size=70 B (+0 B), count=1 (+0), average=70 B",
            "<unknown>: size=25 B (+0 B), count=2 (+0), average=12 B",
        ]
    );
    let gone = old
        .compare_to(&new, GroupBy::Function, false)
        .expect("function");
    assert_eq!(
        lines(&gone),
        [
            "alloc_node: size=30 B (-150 B), count=1 (-2), average=30 B",
            "strdup_x: size=70 B (+0 B), count=1 (+0), average=70 B",
            "<unknown>: size=25 B (+0 B), count=2 (+0), average=12 B",
        ]
    );
    assert_eq!(gone[0].label.as_deref(), Some("alloc_node"));
}

#[test]
fn labelled_ties_break_by_label_descending() {
    let tb = |f: &str| Arc::new(Traceback::new(vec![rich("a.c", 1, Some(f), None)], None));
    let snap = Snapshot::new(
        ["b", "a", "c"]
            .iter()
            .map(|f| Trace {
                source: crate::trace::AllocatorFamily::UNKNOWN,
                domain: 0,
                size: 8,
                traceback: tb(f),
            })
            .collect(),
        1,
    );
    let stats = snap.statistics(GroupBy::Function, false).expect("function");
    assert_eq!(
        lines(&stats),
        [
            "c: size=8 B, count=1, average=8 B",
            "b: size=8 B, count=1, average=8 B",
            "a: size=8 B, count=1, average=8 B"
        ]
    );
}

/// Large enough for the threaded paths (stage 1 split by address, stage 2
/// by chunks, the sort by halves): the result must equal one sequential
/// pass, the representative's extra included.
#[test]
fn threaded_grouping_equals_one_sequential_pass() {
    use std::collections::HashMap;
    let names: Vec<Arc<str>> = (0..50).map(|i| Arc::from(format!("f{i}.c"))).collect();
    // A second allocation of some names: equal text, other address.
    let twins: Vec<Arc<str>> = (0..50).map(|i| Arc::from(format!("f{i}.c"))).collect();
    let mut random = crate::testing::lcg(12345);
    let mut next = move |n: u64| (random() >> 33) % n;
    let mut pool = Vec::new();
    for i in 0..6000u64 {
        let depth = 1 + next(6) as usize;
        let frames = (0..depth)
            .map(|_| {
                let n = next(50) as usize;
                let name = if next(4) == 0 { &twins[n] } else { &names[n] };
                Frame::new(Arc::clone(name), next(20) as u32).with_extra(FrameExtra {
                    function: Some(Arc::from(format!("fn{}", next(30)))),
                    module: None,
                    address: Some(i),
                    build_id: None,
                })
            })
            .collect();
        pool.push(Arc::new(Traceback::new(frames, None)));
    }
    let traces: Vec<Trace> = (0..120_000)
        .map(|_| Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 0,
            size: 1 + next(5000),
            traceback: Arc::clone(&pool[next(pool.len() as u64) as usize]),
        })
        .collect();
    let snapshot = Snapshot::new(traces, 6);
    for cumulative in [false, true] {
        // The reference: one pass in trace order.
        let mut expected: HashMap<(String, u32), (u64, u64, Option<u64>)> = HashMap::new();
        for trace in snapshot.traces() {
            let frames = trace.traceback.frames();
            let selected = if cumulative { frames } else { &frames[..1] };
            for frame in selected {
                let entry = expected
                    .entry((frame.filename.to_string(), frame.lineno))
                    .or_insert((0, 0, frame.extra.as_ref().and_then(|e| e.address)));
                entry.0 += trace.size;
                entry.1 += 1;
            }
        }
        let stats = snapshot
            .statistics(GroupBy::Lineno, cumulative)
            .expect("lineno");
        assert_eq!(stats.len(), expected.len());
        for s in &stats {
            let frame = &s.traceback.frames()[0];
            let want = expected[&(frame.filename.to_string(), frame.lineno)];
            let address = frame.extra.as_ref().and_then(|e| e.address);
            assert_eq!((s.size, s.count, address), want, "{frame}");
        }
        for pair in stats.windows(2) {
            let key = |s: &Statistic| (s.size, s.count);
            assert!(
                key(&pair[0]) > key(&pair[1])
                    || (key(&pair[0]) == key(&pair[1]) && pair[0].traceback > pair[1].traceback)
            );
        }
    }
    let by_traceback = snapshot
        .statistics(GroupBy::Traceback, false)
        .expect("traceback");
    let total: u64 = by_traceback.iter().map(|s| s.count).sum();
    assert_eq!(total, 120_000);
    let distinct: std::collections::HashSet<&Traceback> = pool.iter().map(|t| &**t).collect();
    assert!(by_traceback.len() <= distinct.len());
    let old = Snapshot::new(snapshot.traces()[..60_000].to_vec(), 6);
    let diffs = snapshot
        .compare_to(&old, GroupBy::Function, true)
        .expect("function");
    let count_diff: i64 = diffs.iter().map(|d| d.count_diff).sum();
    let new_count: u64 = snapshot
        .statistics(GroupBy::Function, true)
        .expect("f")
        .iter()
        .map(|s| s.count)
        .sum();
    let old_count: u64 = old
        .statistics(GroupBy::Function, true)
        .expect("f")
        .iter()
        .map(|s| s.count)
        .sum();
    assert_eq!(count_diff, new_count as i64 - old_count as i64);
}
