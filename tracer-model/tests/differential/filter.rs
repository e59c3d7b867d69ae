//! Differential test of `fnmatch` and `Snapshot.filter_traces()` against
//! CPython 3.11 (`support/filter_oracle.py`): random patterns over an
//! alphabet full of fnmatch's special characters, and random snapshots
//! filtered by random `Filter`s (inclusive and exclusive, with and without
//! `lineno`, `all_frames` and `domain`) and `DomainFilter`s.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tracer_model::{DomainFilter, Filter, Frame, Pattern, Snapshot, Trace, TraceFilter, Traceback};

use crate::oracle;

const PATTERN_CHARS: [char; 18] = [
    'a', 'b', 'z', '-', '!', ']', '[', '\\', '^', '*', '?', '.', '&', '~', '|', 'é', '/', '\n',
];
const NAME_CHARS: [char; 15] = [
    'a', 'b', 'z', '-', '!', ']', '[', '\\', '^', '.', '&', 'é', '/', '\n', 'c',
];

const FILENAMES: [&str; 11] = [
    "a.c",
    "ab.c",
    "b.c",
    "B.c",
    "<unknown>",
    "/srv/app/src/cache.c",
    "lib/é.c",
    "x.py",
    "x.pyc",
    "dir/[x].c",
    "a.c\nb",
];
const PATTERNS: [&str; 20] = [
    "*",
    "a.c",
    "*.c",
    "a*",
    "?.c",
    "[ab].c",
    "[!a].c",
    "x.pyc",
    "x.py",
    "*.py",
    "/srv/*",
    "*/é.c",
    "B.c",
    "b.c",
    "<unknown>",
    "dir/[[]x].c",
    "*[",
    "",
    "[a-b].c",
    "a.c*",
];

fn random_string(rng: &mut StdRng, alphabet: &[char], max: usize) -> String {
    (0..rng.random_range(0..=max))
        .map(|_| alphabet[rng.random_range(0..alphabet.len())])
        .collect()
}

fn fnmatch_pairs() -> Vec<(String, String)> {
    let mut rng = StdRng::seed_from_u64(21);
    let mut pairs = Vec::new();
    for _ in 0..30_000 {
        let pattern = random_string(&mut rng, &PATTERN_CHARS, 8);
        // Names built from the pattern's own characters match more often.
        let name = if rng.random_bool(0.5) {
            pattern
                .chars()
                .filter(|c| !matches!(c, '*' | '?'))
                .collect()
        } else {
            random_string(&mut rng, &NAME_CHARS, 6)
        };
        pairs.push((name, pattern));
    }
    for (name, pattern) in [
        ("b", "[z-a]"),
        ("b", "[!z-a]"),
        ("!", "[z-a!]"),
        ("x", "[z-a!x]"),
        ("-", "[--a]"),
        ("]", "[]-a]"),
        ("-", "[a-]"),
        ("d", "[a-c-e]"),
        ("\\", "[\\-a]"),
        ("&", "[&&]"),
        ("", "[]"),
        ("[]", "[]"),
    ] {
        pairs.push((name.to_owned(), pattern.to_owned()));
    }
    pairs
}

struct FilterCase {
    snapshot: Snapshot,
    raw: Value,
    filters: Vec<TraceFilter>,
    specs: Value,
}

fn filter_case(rng: &mut StdRng) -> FilterCase {
    let names: Vec<Arc<str>> = FILENAMES.iter().map(|&n| Arc::from(n)).collect();
    let mut pool: Vec<Arc<Traceback>> = Vec::new();
    let mut traces = Vec::new();
    let mut raw = Vec::new();
    for index in 0..rng.random_range(0..60u64) {
        let traceback = if !pool.is_empty() && rng.random_bool(0.5) {
            Arc::clone(&pool[rng.random_range(0..pool.len())])
        } else {
            let depth = rng.random_range(1..=4);
            let frames: Vec<Frame> = (0..depth)
                .map(|_| {
                    Frame::new(
                        Arc::clone(&names[rng.random_range(0..names.len())]),
                        rng.random_range(0..4),
                    )
                })
                .collect();
            let tb = Arc::new(Traceback::new(frames, None));
            pool.push(Arc::clone(&tb));
            tb
        };
        let domain = rng.random_range(0..4);
        let frames: Vec<Value> = traceback
            .frames()
            .iter()
            .map(|f| json!([&*f.filename, f.lineno]))
            .collect();
        raw.push(json!([domain, index, frames, null]));
        traces.push(Trace {
            source: tracer_model::AllocatorFamily::UNKNOWN,
            domain,
            size: index,
            traceback,
        });
    }
    let mut filters = Vec::new();
    let mut specs = Vec::new();
    for _ in 0..rng.random_range(0..5) {
        let inclusive = rng.random_bool(0.5);
        if rng.random_bool(0.25) {
            let domain = rng.random_range(0..4);
            filters.push(TraceFilter::from(DomainFilter { inclusive, domain }));
            specs.push(json!({"kind": "domain", "inclusive": inclusive, "domain": domain}));
        } else {
            let pattern = PATTERNS[rng.random_range(0..PATTERNS.len())];
            let lineno = rng.random_bool(0.3).then(|| rng.random_range(0..4u32));
            let all_frames = rng.random_bool(0.5);
            let domain = rng.random_bool(0.3).then(|| rng.random_range(0..4u32));
            filters.push(TraceFilter::from(Filter::new(
                inclusive, pattern, lineno, all_frames, domain,
            )));
            specs.push(
                json!({"kind": "filter", "inclusive": inclusive, "pattern": pattern,
                              "lineno": lineno, "all_frames": all_frames, "domain": domain}),
            );
        }
    }
    FilterCase {
        snapshot: Snapshot::new(traces, 8),
        raw: Value::Array(raw),
        filters,
        specs: Value::Array(specs),
    }
}

#[test]
fn fnmatch_and_filter_traces_match_cpython() {
    let pairs = fnmatch_pairs();
    let mut rng = StdRng::seed_from_u64(77);
    let cases: Vec<FilterCase> = (0..600).map(|_| filter_case(&mut rng)).collect();
    let request = json!({
        "fnmatch": pairs,
        "filter_cases": cases.iter().map(|c| json!({"traces": c.raw, "filters": c.specs})).collect::<Vec<_>>(),
    });
    let answer = oracle::run("filter_oracle.py", &request);

    let mut matched = 0;
    for (i, (name, pattern)) in pairs.iter().enumerate() {
        let expected = &answer["fnmatch"][i];
        let ours = Pattern::new(pattern).matches(name);
        assert_eq!(
            expected,
            &json!(ours),
            "fnmatch({name:?}, {pattern:?}): CPython says {expected}, tracer says {ours}"
        );
        matched += usize::from(ours);
    }
    assert!(
        matched > 3000,
        "only {matched} of {} pairs match: the test is too weak",
        pairs.len()
    );

    let mut kept_total = 0;
    let mut dropped_total = 0;
    for (i, case) in cases.iter().enumerate() {
        let expected = &answer["filter_cases"][i];
        let kept: Vec<u64> = case
            .snapshot
            .filter_traces(&case.filters)
            .traces()
            .iter()
            .map(|t| t.size)
            .collect();
        assert_eq!(
            expected["kept"],
            json!(kept),
            "case {i}: filters {} on traces {}",
            case.specs,
            case.raw
        );
        let patterns: Vec<&str> = case
            .filters
            .iter()
            .filter_map(|f| match f {
                TraceFilter::Filter(f) => Some(f.filename_pattern()),
                TraceFilter::Domain(_) | TraceFilter::AllocatorFamily(_) => None,
            })
            .collect();
        assert_eq!(
            expected["patterns"],
            json!(patterns),
            "case {i}: normalized patterns"
        );
        kept_total += kept.len();
        dropped_total += case.snapshot.traces().len() - kept.len();
    }
    assert!(
        kept_total > 2000 && dropped_total > 2000,
        "kept {kept_total}, dropped {dropped_total}"
    );
}
