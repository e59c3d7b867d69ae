//! Frames with no line info, named by their site (`FILE!FUNCTION+0xOFFSET`,
//! `FILE+0xOFFSET`, line 0), against CPython 3.11's tracemalloc, on random
//! snapshots that mix them with frames with lines:
//! - CPython given the same traces, the names as file names, prints our
//!   statistics (`lineno`, cumulative or not, `traceback`), our compare_to
//!   and our `Traceback.format()` line for line;
//! - our pickle, read by `tracemalloc.Snapshot.load()`, prints the same;
//! - CPython's pickle, read here, is the same snapshot, its sites read
//!   back as sites (same files);
//! - `filename` groups a site by its module: our `filename` statistics are
//!   CPython's for the same traces with each frame's file as file name.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tracer_model::{Frame, Snapshot, Trace, Traceback, dump_tracemalloc, load_tracemalloc};

use crate::common;
use crate::interop::{assert_same, our_stats, raw};
use crate::oracle;

/// The frames the snapshots draw from: sites of two modules (one
/// function at two offsets, a C++ name with `!` in it, module offsets
/// only), the module's own line 0, frames with lines, `<unknown>`.
fn pool() -> Vec<Frame> {
    let app = "/usr/bin/app";
    let mut frames = Vec::new();
    for function in ["alloc_a", "alloc_b", "main", "operator!=(A const&)"] {
        for offset in [0x1f, 0x20, 0x1a2] {
            frames.push(Frame::without_line(app, Some(function), offset));
        }
    }
    for offset in [0x1100, 0x1183, 0xa] {
        frames.push(Frame::without_line(app, None, offset));
    }
    frames.push(Frame::without_line(
        "/lib/x86_64-linux-gnu/libc.so.6",
        Some("__libc_start_call_main"),
        0x7a,
    ));
    frames.push(Frame::without_line("/usr/bin/app.so", None, 0x10));
    frames.push(Frame::new(app, 0));
    frames.push(Frame::new("/usr/bin/app.c", 3));
    frames.push(Frame::new("src/a.c", 1));
    frames.push(Frame::new("src/a.c", 2));
    frames.push(Frame::unknown());
    frames
}

fn random_snapshot(seed: u64) -> Snapshot {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = pool();
    let limit = rng.random_range(1..=6);
    let mut tracebacks: Vec<Arc<Traceback>> = Vec::new();
    let mut traces = Vec::new();
    for _ in 0..rng.random_range(1..150) {
        let traceback = if !tracebacks.is_empty() && rng.random_bool(0.5) {
            Arc::clone(&tracebacks[rng.random_range(0..tracebacks.len())])
        } else {
            let depth = rng.random_range(1..=limit) as usize;
            let frames: Vec<Frame> = (0..depth)
                .map(|_| pool[rng.random_range(0..pool.len())].clone())
                .collect();
            let tb = Arc::new(Traceback::new(frames, Some(depth as u32)));
            tracebacks.push(Arc::clone(&tb));
            tb
        };
        traces.push(Trace {
            source: tracer_model::AllocatorFamily::UNKNOWN,
            domain: rng.random_range(0..2),
            // Few sizes: many ties, broken by the frames' order.
            size: 100 * rng.random_range(1..4),
            traceback,
        });
    }
    Snapshot::new(traces, limit)
}

/// The raw traces with each frame's file as its file name (a site's
/// module), for CPython's `filename` grouping.
fn raw_files(snapshot: &Snapshot) -> Value {
    snapshot
        .traces()
        .iter()
        .map(|t| {
            let frames: Vec<Value> = t
                .traceback
                .frames()
                .iter()
                .map(|f| json!([f.file(), f.lineno]))
                .collect();
            json!([t.domain, t.size, frames, t.traceback.total_nframe()])
        })
        .collect()
}

/// The keys of `stats` (an `our_stats` answer) whose label starts with
/// one of `groupings`, plus the traceback formats when asked.
fn select(stats: &Value, groupings: &[&str], formats: bool) -> Value {
    let mut out = serde_json::Map::new();
    for (key, value) in stats.as_object().expect("an object") {
        let grouping = key.split_once(' ').map_or("", |(_, rest)| rest);
        if groupings.iter().any(|g| grouping.starts_with(g))
            || (formats && key == "traceback format")
        {
            out.insert(key.clone(), value.clone());
        }
    }
    Value::Object(out)
}

#[test]
fn sites_print_and_group_as_cpython_prints_their_names() {
    let dir = common::TempDir::new("sites");
    let snapshots: Vec<Snapshot> = (0..40).map(random_snapshot).collect();
    let mut cases = Vec::new();
    for (i, snapshot) in snapshots.iter().enumerate() {
        let ours = dir.path().join(format!("ours-{i}.pickle"));
        std::fs::write(&ours, dump_tracemalloc(snapshot)).expect("write our pickle");
        cases.push(
            json!({"raw": raw(snapshot), "limit": snapshot.traceback_limit(),
            "protocol": 2 + i % 4, "ours": ours}),
        );
    }
    for snapshot in &snapshots {
        cases.push(
            json!({"raw": raw_files(snapshot), "limit": snapshot.traceback_limit(),
            "protocol": 4, "ours": null}),
        );
    }
    let answer = oracle::run(
        "interop_oracle.py",
        &json!({"dir": dir.path(), "cases": cases}),
    );
    let by_site = ["lineno", "traceback"];
    let mut lines = 0;
    for (i, snapshot) in snapshots.iter().enumerate() {
        let ours = our_stats(snapshot);
        let python = &answer["cases"][i];
        assert_same(
            &format!("case {i}: CPython on the names"),
            &select(&python["python"], &by_site, true),
            &select(&ours, &by_site, true),
        );
        assert_eq!(python["ours_traces_equal"], true, "case {i}");
        assert_same(
            &format!("case {i}: our pickle in CPython"),
            &select(&python["ours"], &by_site, true),
            &select(&ours, &by_site, true),
        );
        let files = &answer["cases"][snapshots.len() + i]["python"];
        assert_same(
            &format!("case {i}: filename by module"),
            &select(files, &["filename"], false),
            &select(&ours, &["filename"], false),
        );
        // CPython's pickle, read here: the same frames, sites again.
        let file = dir.path().join(format!("python-{i}.pickle"));
        let loaded = load_tracemalloc(&std::fs::read(&file).expect("Python wrote its pickle"))
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(&loaded, snapshot, "case {i}");
        for (a, b) in loaded.traces().iter().zip(snapshot.traces()) {
            let files = |t: &Trace| -> Vec<String> {
                t.traceback
                    .frames()
                    .iter()
                    .map(|f| format!("{} {:?}", f.file(), f.site()))
                    .collect()
            };
            assert_eq!(files(a), files(b), "case {i}");
        }
        lines += ours["statistics lineno True"]
            .as_array()
            .map_or(0, Vec::len);
    }
    assert!(lines > 300, "only {lines} statistics lines compared");
}
