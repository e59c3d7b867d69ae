//! The model's side of `cargo xtask bench-model`: loads two tracemalloc
//! dump files (written by Python's `Snapshot.dump()`), then times
//! `statistics()` and `compare_to()` for every tracemalloc `key_type`,
//! cumulative included, exactly as the CPython side does on the same files.
//!
//! Usage: `bench_model NEW.pickle OLD.pickle OUT_DIR RUNS [OPERATION]`
//! (only that operation, for profiling). It prints `load<TAB>seconds<TAB>
//! seconds<TAB>user-mode CPU seconds` for loading both files (and the
//! resident and peak resident memory after loading, on stderr); then for
//! each operation `name<TAB>median seconds<TAB>min seconds<TAB>median
//! user-mode CPU seconds`, and writes the `str()` of every result line of
//! its last run to `OUT_DIR/tracer-<name>.txt`, so the results can be
//! compared line for line with CPython's.
use std::{fs, path::PathBuf, time::Instant};

use anyhow::Context as _;
use tracer_model::{GroupBy, Snapshot, load_tracemalloc};

/// (name, key_type, cumulative, compare_to instead of statistics).
const OPS: [(&str, GroupBy, bool, bool); 10] = [
    ("statistics-filename", GroupBy::Filename, false, false),
    (
        "statistics-filename-cumulative",
        GroupBy::Filename,
        true,
        false,
    ),
    ("statistics-lineno", GroupBy::Lineno, false, false),
    ("statistics-lineno-cumulative", GroupBy::Lineno, true, false),
    ("statistics-traceback", GroupBy::Traceback, false, false),
    ("compare_to-filename", GroupBy::Filename, false, true),
    (
        "compare_to-filename-cumulative",
        GroupBy::Filename,
        true,
        true,
    ),
    ("compare_to-lineno", GroupBy::Lineno, false, true),
    ("compare_to-lineno-cumulative", GroupBy::Lineno, true, true),
    ("compare_to-traceback", GroupBy::Traceback, false, true),
];

/// User-mode CPU seconds of this process (diagnostics: immune to other
/// processes' load and to probes attached to the allocator).
fn user_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass; no other
    // precondition.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    usage.ru_utime.tv_sec as f64 + usage.ru_utime.tv_usec as f64 / 1e6
}

/// A size in KiB from `/proc/self/status`: `VmRSS` (resident now) or
/// `VmHWM` (peak resident so far).
fn status_kib(field: &str) -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn load(path: &str) -> anyhow::Result<Snapshot> {
    let bytes = fs::read(path).with_context(|| format!("reading {path}"))?;
    load_tracemalloc(&bytes).with_context(|| format!("parsing {path}"))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (new, old, out, runs, only) = match args.as_slice() {
        [_, new, old, out, runs] => (new, old, out, runs, None),
        [_, new, old, out, runs, only] => (new, old, out, runs, Some(only.as_str())),
        _ => anyhow::bail!("usage: bench_model NEW.pickle OLD.pickle OUT_DIR RUNS [OPERATION]"),
    };
    let runs: usize = runs.parse().context("RUNS is a whole number")?;
    let out = PathBuf::from(out);
    let started = Instant::now();
    let user_start = user_seconds();
    let new = load(new)?;
    let old = load(old)?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "load\t{seconds:.6}\t{seconds:.6}\t{:.6}",
        user_seconds() - user_start
    );
    // On stderr: stdout holds timings only, which `cargo xtask bench-model`
    // reads.
    eprintln!(
        "after load: resident {} KiB, peak resident {} KiB",
        status_kib("VmRSS:").unwrap_or(0),
        status_kib("VmHWM:").unwrap_or(0)
    );
    // What a snapshot made from traces (as the capture makes them: no
    // loader's interning) costs to index.
    let traces = new.traces().to_vec();
    let started = Instant::now();
    let user_start = user_seconds();
    let rebuilt = Snapshot::new(traces, new.traceback_limit());
    eprintln!(
        "Snapshot::new of the new file's traces: {:.6} s, user {:.6} s",
        started.elapsed().as_secs_f64(),
        user_seconds() - user_start
    );
    drop(rebuilt);
    for (name, group_by, cumulative, compare) in OPS {
        if only.is_some_and(|only| only != name) {
            continue;
        }
        let mut times = Vec::with_capacity(runs);
        let mut user = Vec::with_capacity(runs);
        let mut lines: Vec<String> = Vec::new();
        for run in 0..runs.max(1) {
            let last = run + 1 >= runs.max(1);
            let start = Instant::now();
            let user_start = user_seconds();
            // Only the last run's result is written out (formatting every
            // run would make profiles of the timed part mostly formatting).
            if compare {
                let diffs = new.compare_to(&old, group_by, cumulative)?;
                times.push(start.elapsed().as_secs_f64());
                user.push(user_seconds() - user_start);
                if last {
                    lines = diffs.iter().map(ToString::to_string).collect();
                }
            } else {
                let stats = new.statistics(group_by, cumulative)?;
                times.push(start.elapsed().as_secs_f64());
                user.push(user_seconds() - user_start);
                if last {
                    lines = stats.iter().map(ToString::to_string).collect();
                }
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
        let min = times.first().copied().unwrap_or(0.0);
        let mut text = lines.join("\n");
        text.push('\n');
        fs::write(out.join(format!("tracer-{name}.txt")), text)?;
        user.sort_by(f64::total_cmp);
        let user_median = user.get(user.len() / 2).copied().unwrap_or(0.0);
        println!("{name}\t{median:.6}\t{min:.6}\t{user_median:.6}");
    }
    Ok(())
}
