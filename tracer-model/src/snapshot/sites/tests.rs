//! Frames with no line info (a stripped program), named by their site: two
//! places in one module are two groups in every grouping, cumulative
//! included, and in `compare_to()`; `filename` groups them by module;
//! filter patterns match the module or the whole name; frames with lines
//! keep their groups. Expected lines follow tracemalloc's orders and
//! `str()` (`_format_size`: 600,000 B is 586 KiB).

use std::sync::Arc;

use super::*;
use crate::{Filter, Frame, FrameExtra, TraceFilter};

const APP: &str = "/usr/bin/app";

/// A frame of the stripped program at `offset`: in `function` when its
/// symbols name one, else at that offset in the module's file.
fn site(function: Option<&str>, offset: u64) -> Frame {
    Frame::without_line(APP, function, offset).with_extra(FrameExtra {
        function: function.map(Arc::from),
        module: Some(APP.into()),
        address: Some(0x5555_0000_0000 + offset),
        build_id: Some("8e1f".into()),
    })
}

/// The two call paths of the stripped program, most recent call first:
/// `alloc_a` and `alloc_b`, both called from `main`; `named` when the
/// functions are known (`.dynsym`), else module offsets only.
fn paths(named: bool) -> [Arc<Traceback>; 2] {
    let frame = |function: &str, offset: u64, module_offset: u64| {
        if named {
            site(Some(function), offset)
        } else {
            site(None, module_offset)
        }
    };
    [
        Arc::new(Traceback::new(
            vec![frame("alloc_a", 0x1f, 0x115f), frame("main", 0x40, 0x1090)],
            Some(2),
        )),
        Arc::new(Traceback::new(
            vec![frame("alloc_b", 0x13, 0x1183), frame("main", 0x52, 0x10a2)],
            Some(2),
        )),
    ]
}

/// `a` blocks of 300 B allocated on path a, then `b` on path b.
fn stripped(named: bool, a: usize, b: usize) -> Snapshot {
    let [path_a, path_b] = paths(named);
    let block = |traceback: &Arc<Traceback>| Trace {
        source: crate::trace::AllocatorFamily::UNKNOWN,
        domain: 1,
        size: 300,
        traceback: Arc::clone(traceback),
    };
    let mut traces: Vec<Trace> = (0..a).map(|_| block(&path_a)).collect();
    traces.extend((0..b).map(|_| block(&path_b)));
    Snapshot::new(traces, 16)
}

fn lines<T: ToString>(items: &[T]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

#[test]
fn two_call_paths_of_a_stripped_program_are_two_groups_by_line_and_traceback() {
    let snap = stripped(true, 2000, 700);
    let by_line = snap.statistics(GroupBy::Lineno, false).unwrap();
    assert_eq!(
        lines(&by_line),
        [
            "/usr/bin/app!alloc_a+0x1f:0: size=586 KiB, count=2000, average=300 B",
            "/usr/bin/app!alloc_b+0x13:0: size=205 KiB, count=700, average=300 B",
        ]
    );
    assert_eq!(
        by_line
            .iter()
            .map(|s| (s.size, s.count))
            .collect::<Vec<_>>(),
        [(600_000, 2000), (210_000, 700)]
    );
    let by_traceback = snap.statistics(GroupBy::Traceback, false).unwrap();
    // str() shows the oldest frame: main, at two places.
    assert_eq!(
        lines(&by_traceback),
        [
            "/usr/bin/app!main+0x40:0: size=586 KiB, count=2000, average=300 B",
            "/usr/bin/app!main+0x52:0: size=205 KiB, count=700, average=300 B",
        ]
    );
    assert_eq!(
        by_traceback[1].traceback.format(None, false),
        [
            "  File \"/usr/bin/app!main+0x52\", line 0",
            "  File \"/usr/bin/app!alloc_b+0x13\", line 0",
        ]
    );
    // The statistic's frames keep their details.
    let top = &by_line[0].traceback.frames()[0];
    assert_eq!(top.file(), APP);
    assert_eq!(
        top.extra.as_deref().and_then(|e| e.build_id.as_deref()),
        Some("8e1f")
    );
}

#[test]
fn module_offsets_tell_the_paths_apart_when_no_function_is_known() {
    let snap = stripped(false, 2000, 700);
    assert_eq!(
        lines(&snap.statistics(GroupBy::Lineno, false).unwrap()),
        [
            "/usr/bin/app+0x115f:0: size=586 KiB, count=2000, average=300 B",
            "/usr/bin/app+0x1183:0: size=205 KiB, count=700, average=300 B",
        ]
    );
    assert_eq!(
        lines(&snap.statistics(GroupBy::Traceback, false).unwrap()),
        [
            "/usr/bin/app+0x1090:0: size=586 KiB, count=2000, average=300 B",
            "/usr/bin/app+0x10a2:0: size=205 KiB, count=700, average=300 B",
        ]
    );
}

#[test]
fn cumulative_counts_every_site_and_filename_groups_by_module() {
    let snap = stripped(true, 2000, 700);
    // Ties (size, count) break by traceback, descending: main > alloc_a.
    assert_eq!(
        lines(&snap.statistics(GroupBy::Lineno, true).unwrap()),
        [
            "/usr/bin/app!main+0x40:0: size=586 KiB, count=2000, average=300 B",
            "/usr/bin/app!alloc_a+0x1f:0: size=586 KiB, count=2000, average=300 B",
            "/usr/bin/app!main+0x52:0: size=205 KiB, count=700, average=300 B",
            "/usr/bin/app!alloc_b+0x13:0: size=205 KiB, count=700, average=300 B",
        ]
    );
    assert_eq!(
        lines(&snap.statistics(GroupBy::Filename, false).unwrap()),
        ["/usr/bin/app:0: size=791 KiB, count=2700, average=300 B"]
    );
    // Each frame of a trace adds to its file, as tracemalloc counts.
    assert_eq!(
        lines(&snap.statistics(GroupBy::Filename, true).unwrap()),
        ["/usr/bin/app:0: size=1582 KiB, count=5400, average=300 B"]
    );
    // The function grouping reads the frames' functions.
    assert_eq!(
        lines(&snap.statistics(GroupBy::Function, false).unwrap()),
        [
            "alloc_a: size=586 KiB, count=2000, average=300 B",
            "alloc_b: size=205 KiB, count=700, average=300 B",
        ]
    );
}

#[test]
fn compare_to_matches_sites_and_keeps_the_ones_only_in_the_base() {
    let before = stripped(true, 1000, 0);
    let after = stripped(true, 2000, 700);
    assert_eq!(
        lines(&after.compare_to(&before, GroupBy::Lineno, false).unwrap()),
        [
            "/usr/bin/app!alloc_a+0x1f:0: size=586 KiB (+293 KiB), count=2000 (+1000), average=300 B",
            "/usr/bin/app!alloc_b+0x13:0: size=205 KiB (+205 KiB), count=700 (+700), average=300 B",
        ]
    );
    assert_eq!(
        lines(
            &before
                .compare_to(&after, GroupBy::Traceback, false)
                .unwrap()
        ),
        [
            "/usr/bin/app!main+0x40:0: size=293 KiB (-293 KiB), count=1000 (-1000), average=300 B",
            "/usr/bin/app!main+0x52:0: size=0 B (-205 KiB), count=0 (-700)",
        ]
    );
    assert_eq!(
        lines(&after.compare_to(&before, GroupBy::Lineno, true).unwrap()),
        [
            "/usr/bin/app!main+0x40:0: size=586 KiB (+293 KiB), count=2000 (+1000), average=300 B",
            "/usr/bin/app!alloc_a+0x1f:0: size=586 KiB (+293 KiB), count=2000 (+1000), average=300 B",
            "/usr/bin/app!main+0x52:0: size=205 KiB (+205 KiB), count=700 (+700), average=300 B",
            "/usr/bin/app!alloc_b+0x13:0: size=205 KiB (+205 KiB), count=700 (+700), average=300 B",
        ]
    );
    assert_eq!(
        lines(&after.compare_to(&before, GroupBy::Filename, false).unwrap()),
        ["/usr/bin/app:0: size=791 KiB (+498 KiB), count=2700 (+1700), average=300 B"]
    );
}

#[test]
fn patterns_match_a_sites_module_or_its_whole_name() {
    let snap = stripped(true, 2000, 700);
    let kept = |pattern: &str, inclusive: bool, all_frames: bool| -> (usize, u64) {
        let filter = Filter::new(inclusive, pattern, None, all_frames, None);
        let filtered = snap.filter_traces(&[TraceFilter::Filter(filter)]);
        let size = filtered.traces().iter().map(|t| t.size).sum();
        (filtered.traces().len(), size)
    };
    assert_eq!(kept(APP, true, false), (2700, 810_000), "the module path");
    assert_eq!(kept("*/app", true, false), (2700, 810_000));
    assert_eq!(
        kept("*!alloc_b+*", true, false),
        (700, 210_000),
        "a function"
    );
    assert_eq!(kept("*!alloc_b+*", false, false), (2000, 600_000));
    assert_eq!(
        kept("*!main+0x40", true, true),
        (2000, 600_000),
        "any frame"
    );
    assert_eq!(
        kept("*!main+0x40", true, false),
        (0, 0),
        "the top frame only"
    );
    let unnamed = stripped(false, 2000, 700);
    let filter = Filter::new(true, "/usr/bin/app+0x1183", Some(0), false, None);
    let filtered = unnamed.filter_traces(&[TraceFilter::Filter(filter)]);
    assert_eq!(filtered.traces().len(), 700, "a module offset, line 0");
}

#[test]
fn frames_with_lines_keep_their_groups_next_to_sites() {
    let [path_a, _] = paths(true);
    let lined = Arc::new(Traceback::new(
        vec![Frame::new("src/a.c", 12), Frame::new("src/main.c", 3)],
        Some(2),
    ));
    let module_zero = Arc::new(Traceback::new(vec![Frame::new(APP, 0)], Some(1)));
    let traces = [
        (&path_a, 100),
        (&lined, 50),
        (&lined, 50),
        (&module_zero, 7),
    ]
    .into_iter()
    .map(|(traceback, size)| Trace {
        source: crate::trace::AllocatorFamily::UNKNOWN,
        domain: 1,
        size,
        traceback: Arc::clone(traceback),
    })
    .collect();
    let snap = Snapshot::new(traces, 16);
    assert_eq!(
        lines(&snap.statistics(GroupBy::Lineno, false).unwrap()),
        [
            "src/a.c:12: size=100 B, count=2, average=50 B",
            "/usr/bin/app!alloc_a+0x1f:0: size=100 B, count=1, average=100 B",
            "/usr/bin/app:0: size=7 B, count=1, average=7 B",
        ]
    );
    assert_eq!(
        lines(&snap.statistics(GroupBy::Filename, false).unwrap()),
        [
            "/usr/bin/app:0: size=107 B, count=2, average=54 B",
            "src/a.c:0: size=100 B, count=2, average=50 B",
        ]
    );
}
