//! Differential test of the model against CPython's own `tracemalloc`.
//!
//! Random snapshots (seeded, so failures replay) are built twice: as
//! `tracer_model` values here, and as `tracemalloc.Snapshot(raw_traces,
//! traceback_limit)` by `support/tracemalloc_oracle.py` under `python3`
//! (3.11; override the interpreter with `TRACER_PYTHON`). Every output is
//! compared: `statistics()` and `compare_to()` for each `key_type`, with and
//! without `cumulative` (errors included), in order, every field, the `str()`
//! of every line, `Traceback.format()` under many limits, `str(Trace)`, the
//! ordering of tracebacks and frames, `_format_size`, and the texts of
//! statistics with extreme sizes.
//!
//! The alphabets of file names and line numbers are small so that every
//! sort key ties often; tracebacks recurse, hold `<unknown>` frames, vary in
//! depth, and equal tracebacks come both shared and as separate `Arc`s.

use std::sync::{Arc, OnceLock};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tracer_model::{
    Frame, GroupBy, ModelError, Snapshot, Statistic, StatisticDiff, Trace, Traceback, format_size,
};

use crate::oracle;

/// Seeds of the random cases; one snapshot pair each.
const SEEDS: std::ops::Range<u64> = 0..48;
/// `Traceback.format(limit)` limits tried on every formatted trace.
const LIMITS: [Option<i64>; 14] = [
    None,
    Some(0),
    Some(1),
    Some(2),
    Some(3),
    Some(7),
    Some(-1),
    Some(-2),
    Some(-3),
    Some(-7),
    Some(i64::MAX),
    Some(i64::MIN),
    Some(i64::MIN + 1),
    Some(-6),
];
/// How many traces of each case get the full per-trace comparison.
const FORMAT_TRACES: usize = 40;

const FILENAMES: [&str; 9] = [
    "a.c",
    "ab.c",
    "b.c",
    "B.c",
    "<unknown>",
    "/srv/app/src/cache.c",
    "lib/é.c",
    "lib/z.h",
    "a.c2",
];
const LINENOS: [u32; 6] = [0, 1, 2, 3, 10, 88];
const BOUNDARY_SIZES: [u64; 14] = [
    1,
    99,
    100,
    1023,
    1024,
    10_239,
    10_240,
    10_241,
    102_399,
    102_400,
    1 << 20,
    10 << 20,
    104_857_599,
    1 << 30,
];

/// One random snapshot pair.
struct Case {
    traceback_limit: u32,
    new: Snapshot,
    old: Snapshot,
}

struct Generator {
    rng: StdRng,
    /// One shared `Arc<str>` per file name, as the symbolizer interns them.
    names: Vec<Arc<str>>,
    limit: u32,
    pool: Vec<Arc<Traceback>>,
}

impl Generator {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let limit = rng.random_range(1..=6);
        Generator {
            rng,
            names: FILENAMES.iter().map(|&n| Arc::from(n)).collect(),
            limit,
            pool: Vec::new(),
        }
    }

    fn frame(&mut self) -> Frame {
        let index = self.rng.random_range(0..self.names.len());
        let filename = if self.rng.random_bool(0.2) {
            // An equal name in its own allocation.
            Arc::from(&*self.names[index])
        } else {
            Arc::clone(&self.names[index])
        };
        let lineno = if FILENAMES[index] == "<unknown>" {
            0
        } else {
            LINENOS[self.rng.random_range(0..LINENOS.len())]
        };
        Frame::new(filename, lineno)
    }

    fn traceback(&mut self) -> Traceback {
        let depth = self.rng.random_range(1..=self.limit) as usize;
        let mut frames: Vec<Frame> = Vec::with_capacity(depth);
        for _ in 0..depth {
            if !frames.is_empty() && self.rng.random_bool(0.3) {
                // Recursion: a frame already on this stack.
                let again = frames[self.rng.random_range(0..frames.len())].clone();
                frames.push(again);
            } else {
                frames.push(self.frame());
            }
        }
        let total_nframe = if self.rng.random_bool(0.2) {
            None
        } else {
            Some(depth as u32 + self.rng.random_range(0..3))
        };
        Traceback::new(frames, total_nframe)
    }

    fn size(&mut self) -> u64 {
        match self.rng.random_range(0..100) {
            0..10 => 0,
            10..40 => self.rng.random_range(1..100),
            40..60 => BOUNDARY_SIZES[self.rng.random_range(0..BOUNDARY_SIZES.len())],
            60..98 => self.rng.random_range(1..1 << 24),
            _ => self.rng.random_range(1..1 << 56),
        }
    }

    fn pick_traceback(&mut self) -> Arc<Traceback> {
        let roll = self.rng.random_range(0..100);
        if !self.pool.is_empty() && roll < 70 {
            let shared = Arc::clone(&self.pool[self.rng.random_range(0..self.pool.len())]);
            if roll < 10 {
                // Same frames, separate allocation, maybe another total_nframe.
                let total = shared.total_nframe().map(|n| n + 1);
                Arc::new(Traceback::new(shared.frames().to_vec(), total))
            } else {
                shared
            }
        } else {
            let fresh = Arc::new(self.traceback());
            if self.rng.random_bool(0.5) {
                self.pool.push(Arc::clone(&fresh));
            }
            fresh
        }
    }

    fn trace(&mut self) -> Trace {
        Trace {
            source: tracer_model::AllocatorFamily::UNKNOWN,
            domain: self.rng.random_range(0..3),
            size: self.size(),
            traceback: self.pick_traceback(),
        }
    }

    fn case(mut self) -> Case {
        for _ in 0..self.rng.random_range(0..12) {
            let tb = Arc::new(self.traceback());
            self.pool.push(tb);
        }
        let new_len = match self.rng.random_range(0..10) {
            0 => 0,
            1 => self.rng.random_range(1..4),
            _ => self.rng.random_range(4..120),
        };
        let new: Vec<Trace> = (0..new_len).map(|_| self.trace()).collect();
        let mut old: Vec<Trace> = Vec::new();
        if self.rng.random_range(0..10) != 0 {
            for trace in &new {
                match self.rng.random_range(0..10) {
                    // Kept unchanged, freed since, or resized.
                    0..5 => old.push(trace.clone()),
                    5..8 => {}
                    _ => old.push(Trace {
                        source: tracer_model::AllocatorFamily::UNKNOWN,
                        size: self.size(),
                        ..trace.clone()
                    }),
                }
            }
            for _ in 0..self.rng.random_range(0..40) {
                let trace = self.trace();
                old.push(trace);
            }
        }
        Case {
            traceback_limit: self.limit,
            new: Snapshot::new(new, self.limit),
            old: Snapshot::new(old, self.limit),
        }
    }
}

fn cases() -> Vec<Case> {
    SEEDS.map(|seed| Generator::new(seed).case()).collect()
}

fn raw_traces(snapshot: &Snapshot) -> Value {
    snapshot
        .traces()
        .iter()
        .map(|t| {
            json!([
                t.domain,
                t.size,
                frames_json(&t.traceback),
                t.traceback.total_nframe()
            ])
        })
        .collect()
}

fn frames_json(traceback: &Traceback) -> Value {
    traceback
        .frames()
        .iter()
        .map(|f| json!([&*f.filename, f.lineno]))
        .collect()
}

/// Sizes for `_format_size`: every unit boundary and its neighbours, both
/// signs, extremes, and a seeded random spread.
fn sizes() -> Vec<i64> {
    let mut sizes = vec![0, i64::MAX, i64::MIN, i64::MIN + 1];
    for unit in 0..5 {
        let scale = 1i64 << (10 * unit);
        for base in [1i64, 10, 99, 100, 1000, 1023, 1024, 10_239, 10_240] {
            let Some(center) = base.checked_mul(scale) else {
                continue;
            };
            for delta in [-1, 0, 1] {
                let size = center.saturating_add(delta);
                sizes.push(size);
                sizes.push(-size);
            }
            // Values that round across ".x5" and "99.95".
            sizes.push(center + scale / 20);
            sizes.push(center.saturating_mul(9995) / 10_000);
        }
    }
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..2000 {
        let bits = rng.random_range(0..63);
        let size: i64 = rng.random_range(0..=(1i64 << bits));
        sizes.push(if rng.random_bool(0.5) { -size } else { size });
    }
    sizes
}

/// `(size, count, size_diff, count_diff)` for Statistic and StatisticDiff
/// texts, with averages that round half-way and sizes past 2^53.
fn statistic_texts() -> Vec<(u64, u64, i64, i64)> {
    let mut texts = vec![
        (0, 0, 0, 0),
        (0, 1, -5, -1),
        (107, 2, 107, 2),
        (5, 2, -3, 0),
        (7, 2, 1, 1),
        (10_240, 1, -10_240, -1),
        (u64::MAX, 3, i64::MAX, i64::MIN),
        (u64::MAX, (1 << 53) + 1, i64::MIN, i64::MAX),
        ((1 << 60) + 1, 3, 1, -1),
        (12_345_678_901_234_567_891, 7, -7, 7),
    ];
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..500 {
        let size_bits = rng.random_range(0..64);
        let size = rng.random_range(0..=(1u64 << size_bits));
        let count_bits = rng.random_range(0..64);
        let count = rng.random_range(0..=(1u64 << count_bits));
        let diff_shift = rng.random_range(0..64);
        let size_diff = rng.random_range(i64::MIN..=i64::MAX) >> diff_shift;
        let count_diff = rng.random_range(-1000..1000);
        texts.push((size, count, size_diff, count_diff));
    }
    texts
}

/// The oracle's answer, computed once for all tests of this file.
struct Oracle {
    cases: Vec<Case>,
    sizes: Vec<i64>,
    statistic_texts: Vec<(u64, u64, i64, i64)>,
    response: Value,
}

fn oracle() -> &'static Oracle {
    static ORACLE: OnceLock<Oracle> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let cases = cases();
        let sizes = sizes();
        let statistic_texts = statistic_texts();
        let request = json!({
            "limits": LIMITS,
            "format_traces": FORMAT_TRACES,
            "cases": cases.iter().map(|c| json!({
                "traceback_limit": c.traceback_limit,
                "new": raw_traces(&c.new),
                "old": raw_traces(&c.old),
            })).collect::<Vec<_>>(),
            "sizes": sizes.iter().flat_map(|&s| [json!([s, false]), json!([s, true])]).collect::<Vec<_>>(),
            "statistic_texts": statistic_texts,
        });
        // Checks too that the answer came from CPython 3.11.
        let response = oracle::run("tracemalloc_oracle.py", &request);
        Oracle {
            cases,
            sizes,
            statistic_texts,
            response,
        }
    })
}

/// The first place where `actual` differs from `expected`, with both sides.
fn first_difference(path: &str, expected: &Value, actual: &Value) -> Option<String> {
    match (expected, actual) {
        (Value::Array(e), Value::Array(a)) => {
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                if let Some(d) = first_difference(&format!("{path}[{i}]"), ev, av) {
                    return Some(d);
                }
            }
            (e.len() != a.len()).then(|| {
                format!(
                    "{path}: CPython has {} items, the model {}",
                    e.len(),
                    a.len()
                )
            })
        }
        (Value::Object(e), Value::Object(a)) => {
            for (key, ev) in e {
                let av = a.get(key).unwrap_or(&Value::Null);
                if let Some(d) = first_difference(&format!("{path}.{key}"), ev, av) {
                    return Some(d);
                }
            }
            a.keys()
                .find(|k| !e.contains_key(*k))
                .map(|k| format!("{path}: the model has extra key {k}"))
        }
        _ => (expected != actual)
            .then(|| format!("{path}:\n  CPython:   {expected}\n  the model: {actual}")),
    }
}

fn assert_same(path: &str, expected: &Value, actual: &Value) {
    if let Some(difference) = first_difference(path, expected, actual) {
        panic!("the model diverges from CPython's tracemalloc at {difference}");
    }
}

fn traceback_json(traceback: &Traceback) -> Value {
    json!({
        "frames": frames_json(traceback),
        "total_nframe": traceback.total_nframe(),
        "str": traceback.to_string(),
        "format": traceback.format(None, false),
        "format_most_recent_first": traceback.format(None, true),
    })
}

fn statistic_json(stat: &Statistic) -> Value {
    json!({
        "traceback": traceback_json(&stat.traceback),
        "size": stat.size,
        "count": stat.count,
        "str": stat.to_string(),
    })
}

fn statistic_diff_json(stat: &StatisticDiff) -> Value {
    json!({
        "traceback": traceback_json(&stat.traceback),
        "size": stat.size,
        "size_diff": stat.size_diff,
        "count": stat.count,
        "count_diff": stat.count_diff,
        "str": stat.to_string(),
    })
}

fn result_json<T>(result: Result<Vec<T>, ModelError>, item: fn(&T) -> Value) -> Value {
    match result {
        Ok(items) => items.iter().map(item).collect(),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

const GROUPINGS: [(GroupBy, bool); 6] = [
    (GroupBy::Filename, false),
    (GroupBy::Filename, true),
    (GroupBy::Lineno, false),
    (GroupBy::Lineno, true),
    (GroupBy::Traceback, false),
    (GroupBy::Traceback, true),
];

/// Python's `str(bool)`, as the oracle's labels use it.
fn label(group_by: GroupBy, cumulative: bool) -> String {
    format!(
        "{group_by} cumulative={}",
        if cumulative { "True" } else { "False" }
    )
}

fn python_case(index: usize) -> &'static Value {
    &oracle().response["cases"][index]
}

#[test]
fn statistics_match_cpython_on_random_snapshots() {
    let oracle = oracle();
    let mut compared = 0;
    for (index, case) in oracle.cases.iter().enumerate() {
        for (group_by, cumulative) in GROUPINGS {
            let key = format!("statistics {}", label(group_by, cumulative));
            let expected = &python_case(index)[&key];
            let actual = result_json(case.new.statistics(group_by, cumulative), statistic_json);
            assert_same(&format!("seed {index} {key}"), expected, &actual);
            compared += expected.as_array().map_or(0, Vec::len);
        }
    }
    assert!(compared > 2500, "only {compared} statistics compared");
}

#[test]
fn compare_to_matches_cpython_on_random_snapshots() {
    let oracle = oracle();
    let mut compared = 0;
    let mut only_in_old = 0;
    for (index, case) in oracle.cases.iter().enumerate() {
        for (group_by, cumulative) in GROUPINGS {
            let key = format!("compare_to {}", label(group_by, cumulative));
            let expected = &python_case(index)[&key];
            let result = case.new.compare_to(&case.old, group_by, cumulative);
            if let Ok(diffs) = &result {
                only_in_old += diffs.iter().filter(|d| d.count == 0).count();
            }
            let actual = result_json(result, statistic_diff_json);
            assert_same(&format!("seed {index} {key}"), expected, &actual);
            compared += expected.as_array().map_or(0, Vec::len);
        }
    }
    assert!(compared > 3000, "only {compared} diffs compared");
    assert!(only_in_old > 100, "only {only_in_old} groups only in old");
}

#[test]
fn cumulative_traceback_errors_on_both_sides() {
    let oracle = oracle();
    for (index, case) in oracle.cases.iter().enumerate() {
        for method in ["statistics", "compare_to"] {
            let expected = &python_case(index)[&format!("{method} traceback cumulative=True")];
            assert_eq!(
                expected["error"], "cumulative mode cannot by used with key type 'traceback'",
                "seed {index} {method}"
            );
        }
        assert_eq!(
            case.new.statistics(GroupBy::Traceback, true),
            Err(ModelError::CumulativeTraceback)
        );
    }
}

#[test]
fn traces_and_traceback_format_match_cpython() {
    let oracle = oracle();
    for (index, case) in oracle.cases.iter().enumerate() {
        let actual: Value = case
            .new
            .traces()
            .iter()
            .take(FORMAT_TRACES)
            .map(|trace| {
                let formats: Vec<Vec<String>> = LIMITS
                    .iter()
                    .flat_map(|&limit| {
                        [false, true].map(|recent| trace.traceback.format(limit, recent))
                    })
                    .collect();
                json!({
                    "str": trace.to_string(),
                    "domain": trace.domain,
                    "size": trace.size,
                    "traceback": traceback_json(&trace.traceback),
                    "formats": formats,
                })
            })
            .collect();
        assert_same(
            &format!("seed {index} traces"),
            &python_case(index)["traces"],
            &actual,
        );
    }
}

#[test]
fn traceback_and_frame_order_match_cpython() {
    let oracle = oracle();
    for (index, case) in oracle.cases.iter().enumerate() {
        let traces = case.new.traces();
        let mut order: Vec<usize> = (0..traces.len()).collect();
        // Stable, like Python's sorted().
        order.sort_by(|&a, &b| traces[a].traceback.cmp(&traces[b].traceback));
        assert_same(
            &format!("seed {index} traceback_order"),
            &python_case(index)["traceback_order"],
            &json!(order),
        );
        let frames: Vec<&Frame> = traces
            .iter()
            .flat_map(|t| t.traceback.frames().iter().rev())
            .collect();
        let mut order: Vec<usize> = (0..frames.len()).collect();
        order.sort_by(|&a, &b| frames[a].cmp(frames[b]));
        assert_same(
            &format!("seed {index} frame_order"),
            &python_case(index)["frame_order"],
            &json!(order),
        );
    }
}

#[test]
fn format_size_matches_cpython() {
    let oracle = oracle();
    let actual: Value = oracle
        .sizes
        .iter()
        .flat_map(|&s| [format_size(s, false), format_size(s, true)])
        .collect();
    assert_same("sizes", &oracle.response["sizes"], &actual);
}

#[test]
fn statistic_texts_match_cpython_for_extreme_sizes() {
    let oracle = oracle();
    let traceback = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], None));
    let actual: Value = oracle
        .statistic_texts
        .iter()
        .map(|&(size, count, size_diff, count_diff)| {
            let stat = Statistic {
                traceback: Traceback::clone(&traceback),
                size,
                count,
                label: None,
            };
            let diff = StatisticDiff {
                traceback: Traceback::clone(&traceback),
                size,
                size_diff,
                count,
                count_diff,
                label: None,
            };
            json!([stat.to_string(), diff.to_string()])
        })
        .collect();
    assert_same(
        "statistic_texts",
        &oracle.response["statistic_texts"],
        &actual,
    );
}
