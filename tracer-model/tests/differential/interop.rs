//! Dump interop with CPython 3.11's tracemalloc, both ways, on random
//! snapshots (ties in every sort key, recursion, `<unknown>` frames, sizes
//! past 2**32 and 2**63, shared and separate tracebacks):
//! - files Python writes with `pickle.dump(snapshot, f, protocol)` for
//!   protocols 2 to 5 (`Snapshot.dump()` uses 5) load here into an equal
//!   snapshot whose statistics equal Python's, line for line;
//! - files written here by `dump_tracemalloc` load in Python with
//!   `tracemalloc.Snapshot.load()` into a `tracemalloc.Snapshot` whose
//!   traces equal the originals and whose statistics equal ours;
//! - tracer's own format round-trips every case exactly.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tracer_model::{
    Frame, GroupBy, Snapshot, Trace, Traceback, decode, dump_tracemalloc, encode, load_tracemalloc,
};

use crate::common;
use crate::oracle;

const FILENAMES: [&str; 7] = [
    "a.c",
    "b.c",
    "<unknown>",
    "/srv/app/src/cache.c",
    "lib/é.c",
    "x.py",
    "日本.c",
];
const GROUPINGS: [(GroupBy, bool); 5] = [
    (GroupBy::Filename, false),
    (GroupBy::Filename, true),
    (GroupBy::Lineno, false),
    (GroupBy::Lineno, true),
    (GroupBy::Traceback, false),
];

fn random_snapshot(seed: u64) -> Snapshot {
    let mut rng = StdRng::seed_from_u64(seed);
    let limit = rng.random_range(1..=8);
    let names: Vec<Arc<str>> = FILENAMES.iter().map(|&n| Arc::from(n)).collect();
    let mut pool: Vec<Arc<Traceback>> = Vec::new();
    let mut traces = Vec::new();
    let n = if seed.is_multiple_of(7) {
        0
    } else {
        rng.random_range(1..200)
    };
    for _ in 0..n {
        let traceback = if !pool.is_empty() && rng.random_bool(0.6) {
            Arc::clone(&pool[rng.random_range(0..pool.len())])
        } else {
            let depth = rng.random_range(1..=limit) as usize;
            let mut frames: Vec<Frame> = Vec::new();
            for _ in 0..depth {
                if !frames.is_empty() && rng.random_bool(0.3) {
                    let again = frames[rng.random_range(0..frames.len())].clone();
                    frames.push(again);
                } else {
                    let i = rng.random_range(0..names.len());
                    let lineno = if FILENAMES[i] == "<unknown>" {
                        0
                    } else {
                        rng.random_range(0..4)
                    };
                    frames.push(Frame::new(Arc::clone(&names[i]), lineno));
                }
            }
            let total = if rng.random_bool(0.2) {
                None
            } else {
                Some(depth as u32 + rng.random_range(0..3))
            };
            let tb = Arc::new(Traceback::new(frames, total));
            pool.push(Arc::clone(&tb));
            tb
        };
        // Large, but no sum passes 2**64 (the model's totals are u64).
        let size = match rng.random_range(0..10) {
            0 => 0,
            1 => (1 << 55) - rng.random_range(0..3),
            2 => (1 << 32) + rng.random_range(0..3),
            3 => 0x7fff_ffff + rng.random_range(0..3),
            _ => rng.random_range(1..300),
        };
        let domain = if rng.random_bool(0.1) {
            u32::MAX
        } else {
            rng.random_range(0..3)
        };
        traces.push(Trace {
            source: tracer_model::AllocatorFamily::UNKNOWN,
            domain,
            size,
            traceback,
        });
    }
    Snapshot::new(traces, limit)
}

pub(crate) fn raw(snapshot: &Snapshot) -> Value {
    snapshot
        .traces()
        .iter()
        .map(|t| {
            let frames: Vec<Value> = t
                .traceback
                .frames()
                .iter()
                .map(|f| json!([&*f.filename, f.lineno]))
                .collect();
            json!([t.domain, t.size, frames, t.traceback.total_nframe()])
        })
        .collect()
}

/// The first place where `actual` differs from `expected`, both shown.
fn first_difference(path: &str, expected: &Value, actual: &Value) -> Option<String> {
    match (expected, actual) {
        (Value::Array(e), Value::Array(a)) => e
            .iter()
            .zip(a)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(&format!("{path}[{i}]"), x, y))
            .or_else(|| {
                (e.len() != a.len()).then(|| format!("{path}: {} vs {} items", e.len(), a.len()))
            }),
        (Value::Object(e), Value::Object(a)) => e
            .iter()
            .find_map(|(k, x)| {
                first_difference(&format!("{path}.{k}"), x, a.get(k).unwrap_or(&Value::Null))
            })
            .or_else(|| (e.len() != a.len()).then(|| format!("{path}: keys differ"))),
        _ => (expected != actual)
            .then(|| format!("{path}:\n  CPython: {expected}\n  tracer:  {actual}")),
    }
}

pub(crate) fn assert_same(path: &str, expected: &Value, actual: &Value) {
    if let Some(difference) = first_difference(path, expected, actual) {
        panic!("differs at {difference}");
    }
}

pub(crate) fn our_stats(snapshot: &Snapshot) -> Value {
    let mut out = serde_json::Map::new();
    let empty = Snapshot::new(Vec::new(), snapshot.traceback_limit());
    for (group_by, cumulative) in GROUPINGS {
        let label = format!("{group_by} {}", if cumulative { "True" } else { "False" });
        let stats: Vec<String> = snapshot
            .statistics(group_by, cumulative)
            .expect("grouping")
            .iter()
            .map(ToString::to_string)
            .collect();
        out.insert(format!("statistics {label}"), json!(stats));
        let diffs: Vec<String> = snapshot
            .compare_to(&empty, group_by, cumulative)
            .expect("grouping")
            .iter()
            .map(ToString::to_string)
            .collect();
        out.insert(format!("compare_to {label}"), json!(diffs));
    }
    let formats: Vec<Vec<String>> = snapshot
        .traces()
        .iter()
        .map(|t| t.traceback.format(None, false))
        .collect();
    out.insert("traceback format".into(), json!(formats));
    Value::Object(out)
}

#[test]
fn dump_files_interoperate_with_cpython_both_ways() {
    let dir = common::TempDir::new("interop");
    let snapshots: Vec<Snapshot> = (0..60).map(random_snapshot).collect();
    let mut cases = Vec::new();
    for (i, snapshot) in snapshots.iter().enumerate() {
        let ours = dir.path().join(format!("ours-{i}.pickle"));
        std::fs::write(&ours, dump_tracemalloc(snapshot)).expect("write our pickle");
        cases.push(json!({
            "raw": raw(snapshot),
            "limit": snapshot.traceback_limit(),
            "protocol": 2 + i % 4,
            "ours": ours,
        }));
    }
    let answer = oracle::run(
        "interop_oracle.py",
        &json!({"dir": dir.path(), "cases": cases}),
    );
    let mut lines = 0;
    for (i, snapshot) in snapshots.iter().enumerate() {
        let python = &answer["cases"][i];
        let ours = our_stats(snapshot);
        // Python's statistics of the same traces equal ours.
        assert_same(&format!("case {i} raw traces"), &python["python"], &ours);
        // Our pickle, read by Python.
        assert_eq!(python["ours_class"], "tracemalloc.Snapshot", "case {i}");
        assert_eq!(
            python["ours_traces_equal"], true,
            "case {i}: Python read other traces"
        );
        assert_eq!(python["ours_limit"], snapshot.traceback_limit(), "case {i}");
        assert_same(
            &format!("case {i} our pickle in Python"),
            &python["ours"],
            &ours,
        );
        // Python's pickle, read here.
        let file = dir.path().join(format!("python-{i}.pickle"));
        let bytes = std::fs::read(&file).expect("Python wrote its pickle");
        let loaded = load_tracemalloc(&bytes).unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(
            &loaded,
            snapshot,
            "case {i}: traces of Python's pickle (protocol {})",
            2 + i % 4
        );
        assert_eq!(loaded.traceback_limit(), snapshot.traceback_limit());
        for (a, b) in loaded.traces().iter().zip(snapshot.traces()) {
            assert_eq!(
                a.traceback.total_nframe(),
                b.traceback.total_nframe(),
                "case {i}"
            );
        }
        assert_same(
            &format!("case {i} Python's pickle here"),
            &python["python"],
            &our_stats(&loaded),
        );
        // tracer's own format.
        let decoded = decode(&encode(snapshot, &json!({"case": i}))).expect("own format");
        assert_eq!(&decoded.snapshot, snapshot);
        assert_eq!(decoded.meta, json!({"case": i}));
        lines += ours["statistics lineno True"]
            .as_array()
            .map_or(0, Vec::len);
    }
    assert!(lines > 500, "only {lines} statistics lines compared");
}

#[test]
fn the_largest_sizes_domains_and_lines_cross_both_ways() {
    let dir = common::TempDir::new("interop-extremes");
    let tb = Arc::new(Traceback::new(
        vec![Frame::new("a.c", u32::MAX)],
        Some(u32::MAX),
    ));
    let traces = vec![Trace {
        source: tracer_model::AllocatorFamily::UNKNOWN,
        domain: u32::MAX,
        size: u64::MAX,
        traceback: Arc::clone(&tb),
    }];
    let snapshot = Snapshot::new(traces, u32::MAX);
    let ours = dir.path().join("ours.pickle");
    std::fs::write(&ours, dump_tracemalloc(&snapshot)).expect("write");
    let cases = json!([{"raw": raw(&snapshot), "limit": u32::MAX, "protocol": 5, "ours": ours}]);
    let answer = oracle::run(
        "interop_oracle.py",
        &json!({"dir": dir.path(), "cases": cases}),
    );
    assert_eq!(answer["cases"][0]["ours_traces_equal"], true);
    assert_eq!(answer["cases"][0]["ours_limit"], u32::MAX);
    // size_diff of a u64::MAX block passes i64 (the model's diff type):
    // compare the statistics, not compare_to.
    for (key, lines) in answer["cases"][0]["python"].as_object().expect("object") {
        if key.starts_with("statistics") {
            assert_same(key, lines, &our_stats(&snapshot)[key]);
        }
    }
    let bytes = std::fs::read(dir.path().join("python-0.pickle")).expect("pickle");
    assert_eq!(load_tracemalloc(&bytes).expect("loads"), snapshot);
}

#[test]
fn python_shares_equal_tracebacks_and_so_do_we() {
    let dir = common::TempDir::new("interop-share");
    let tb = Arc::new(Traceback::new(
        vec![Frame::new("a.c", 1), Frame::new("main.c", 2)],
        Some(2),
    ));
    let traces = (0..1000)
        .map(|i| Trace {
            source: tracer_model::AllocatorFamily::UNKNOWN,
            domain: 0,
            size: i,
            traceback: Arc::clone(&tb),
        })
        .collect();
    let snapshot = Snapshot::new(traces, 2);
    let cases = json!([{"raw": raw(&snapshot), "limit": 2, "protocol": 5, "ours": null}]);
    oracle::run(
        "interop_oracle.py",
        &json!({"dir": dir.path(), "cases": cases}),
    );
    let bytes = std::fs::read(dir.path().join("python-0.pickle")).expect("pickle");
    let loaded = load_tracemalloc(&bytes).expect("loads");
    let first = &loaded.traces()[0].traceback;
    assert!(
        loaded
            .traces()
            .iter()
            .all(|t| Arc::ptr_eq(&t.traceback, first)),
        "one Arc per distinct traceback, though Python wrote 1000 equal tuples"
    );
    // Our pickle of it is smaller than Python's: each traceback is written once.
    let ours = dump_tracemalloc(&loaded);
    assert!(
        ours.len() <= bytes.len(),
        "ours {} bytes, Python's {}",
        ours.len(),
        bytes.len()
    );
}
