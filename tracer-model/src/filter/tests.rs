//! `Filter`, `DomainFilter` and `normalize_filename` on a small snapshot,
//! through `Snapshot.filter_traces()`.

use std::sync::Arc;

use super::*;
use crate::{Snapshot, Trace};

fn tb(frames: &[(&str, u32)]) -> Arc<Traceback> {
    Arc::new(Traceback::new(
        frames.iter().map(|&(f, l)| Frame::new(f, l)).collect(),
        None,
    ))
}

fn snapshot() -> Snapshot {
    let a = tb(&[("a.c", 1), ("main.c", 9)]);
    let b = tb(&[("b.c", 2), ("a.c", 5)]);
    let py = tb(&[("x.pyc", 3)]);
    Snapshot::new(
        vec![
            Trace {
                source: crate::trace::AllocatorFamily::UNKNOWN,
                domain: 1,
                size: 10,
                traceback: a.clone(),
            },
            Trace {
                source: crate::trace::AllocatorFamily::UNKNOWN,
                domain: 2,
                size: 20,
                traceback: b.clone(),
            },
            Trace {
                source: crate::trace::AllocatorFamily::UNKNOWN,
                domain: 1,
                size: 40,
                traceback: b,
            },
            Trace {
                source: crate::trace::AllocatorFamily::UNKNOWN,
                domain: 3,
                size: 80,
                traceback: py,
            },
            Trace {
                source: crate::trace::AllocatorFamily::UNKNOWN,
                domain: 2,
                size: 160,
                traceback: a,
            },
        ],
        4,
    )
}

fn sizes(snapshot: &Snapshot) -> Vec<u64> {
    snapshot.traces().iter().map(|t| t.size).collect()
}

#[test]
fn normalize_strips_the_c_of_pyc_only() {
    assert_eq!(normalize_filename("x.pyc"), "x.py");
    assert_eq!(normalize_filename("x.py"), "x.py");
    assert_eq!(normalize_filename("x.c"), "x.c");
    assert_eq!(normalize_filename(".pyc"), ".py");
}

#[test]
fn include_looks_at_the_most_recent_frame_unless_all_frames() {
    let s = snapshot();
    let include = |p, all| vec![TraceFilter::from(Filter::new(true, p, None, all, None))];
    assert_eq!(sizes(&s.filter_traces(&include("a.c", false))), [10, 160]);
    assert_eq!(
        sizes(&s.filter_traces(&include("a.c", true))),
        [10, 20, 40, 160]
    );
    assert_eq!(sizes(&s.filter_traces(&include("x.py", false))), [80]);
    assert_eq!(sizes(&s.filter_traces(&include("x.pyc", false))), [80]);
}

#[test]
fn exclude_with_lineno_and_domain() {
    let s = snapshot();
    let f = [TraceFilter::from(Filter::new(
        false,
        "a.c",
        Some(5),
        true,
        None,
    ))];
    assert_eq!(sizes(&s.filter_traces(&f)), [10, 80, 160]);
    let f = [TraceFilter::from(Filter::new(
        false,
        "*",
        None,
        false,
        Some(2),
    ))];
    assert_eq!(sizes(&s.filter_traces(&f)), [10, 40, 80]);
    let f = [TraceFilter::from(Filter::new(
        true,
        "*.c",
        None,
        false,
        Some(1),
    ))];
    assert_eq!(sizes(&s.filter_traces(&f)), [10, 40]);
}

#[test]
fn domain_filters_and_combinations() {
    let s = snapshot();
    let keep = |d| {
        TraceFilter::from(DomainFilter {
            inclusive: true,
            domain: d,
        })
    };
    let drop = |d| {
        TraceFilter::from(DomainFilter {
            inclusive: false,
            domain: d,
        })
    };
    assert_eq!(sizes(&s.filter_traces(&[keep(1), keep(3)])), [10, 40, 80]);
    assert_eq!(sizes(&s.filter_traces(&[drop(1), drop(3)])), [20, 160]);
    assert_eq!(
        sizes(&s.filter_traces(&[keep(2), drop(2)])),
        Vec::<u64>::new()
    );
    assert_eq!(sizes(&s.filter_traces(&[])), [10, 20, 40, 80, 160]);
}
