//! `cargo xtask bench-model`: the snapshot engine against CPython 3.11's
//! tracemalloc, side by side on the same data.
//!
//! 1. Python generates two snapshots (new and old) of `--traces` traces
//!    with deep tracebacks (16 to 32 frames from 80,000 distinct
//!    `file:line` frames, 200,000 distinct tracebacks shared the way
//!    `take_snapshot()` shares them) and writes them with
//!    `tracemalloc.Snapshot.dump()`.
//! 2. CPython loads both files and times `statistics()` and `compare_to()`
//!    for `filename`, `lineno` (each with and without `cumulative`) and
//!    `traceback`, once each, the cyclic GC off while timing (its best
//!    case).
//! 3. `tracer-model/examples/bench_model` loads the same files with
//!    tracer's pickle reader and times the same calls (median of `--runs`).
//!    With `--baseline REV`, REV's `bench_model` times them too: the two
//!    alternate, one process of each per round for `--runs` rounds (one
//!    run of each call per process), and each figure is the median of the
//!    rounds.
//! 4. Every result line (`str()` of every Statistic / StatisticDiff) of
//!    both sides is compared: the table is only printed if they are equal.
//!    (The baseline's lines are compared too, and a difference is noted.)
//!
//! Prints a markdown table (CPython seconds, tracer milliseconds, ratio;
//! with a baseline its milliseconds and new/baseline) and writes it with
//! the raw timings to `target/bench-model/`.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use super::baseline::Baseline;
use crate::util::{
    cmd::{cargo, stdout_of},
    paths::{release_dir, workspace_root},
    stats::median,
    tracers,
};

/// Options of `cargo xtask bench-model`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchModelArgs {
    /// Traces in the new snapshot (the old one has about as many).
    #[arg(long, default_value_t = 1_000_000)]
    pub traces: u64,
    /// Runs of each tracer operation (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub runs: u32,
    /// Python interpreter (3.11).
    #[arg(long, env = "TRACER_PYTHON", default_value = "python3")]
    pub python: String,
    /// Where the dump files, result lines and report go.
    #[arg(long, default_value = "target/bench-model")]
    pub out: PathBuf,
    /// Run even while a tracer (tracerd, heaptrack, bpftrace, valgrind) is
    /// running: probes on the allocator slow tracer's side (every malloc
    /// traps) far more than CPython's (pymalloc), so ratios are then wrong.
    #[arg(long)]
    pub force: bool,
    /// Also time the bench_model example of this git revision (`main`,
    /// `HEAD~3`, a hash), alternating with the current one; it is checked
    /// out and built under target/baseline/<short-rev>.
    #[arg(long, value_name = "REV")]
    pub baseline: Option<String>,
}

/// Writes `new.pickle` and `old.pickle`: argv = N, out dir.
const GENERATE: &str = r#"
import random, sys, tracemalloc
n, out = int(sys.argv[1]), sys.argv[2]
random.seed(20261121)
files = ["/srv/app/src/mod%03d/file%04d.c" % (i // 40, i) for i in range(2000)]
frames = [(f, line) for f in files for line in range(1, 41)]
limit = 32
tracebacks = []
for _ in range(200_000):
    depth = random.randint(16, limit)
    tracebacks.append((tuple(random.choice(frames) for _ in range(depth)), depth + random.randint(0, 8)))
weights = [1.0 / (i + 1) ** 0.6 for i in range(len(tracebacks))]
picks = random.choices(range(len(tracebacks)), weights=weights, k=n)
new = [(0, random.randint(1, 4096), tracebacks[i][0], tracebacks[i][1]) for i in picks]
old = [t for t in new if random.random() < 0.8]
old = [(d, s if random.random() < 0.9 else s + 16, tb, tot) for d, s, tb, tot in old]
extra = random.choices(range(len(tracebacks)), weights=weights, k=n // 5)
old += [(0, random.randint(1, 4096), tracebacks[i][0], tracebacks[i][1]) for i in extra]
tracemalloc.Snapshot(new, limit).dump(out + "/new.pickle")
tracemalloc.Snapshot(old, limit).dump(out + "/old.pickle")
"#;

/// Times the operations: argv = new, old, out dir. Prints `name\tseconds`.
const TIME: &str = r#"
import gc, sys, time, tracemalloc
new = tracemalloc.Snapshot.load(sys.argv[1])
old = tracemalloc.Snapshot.load(sys.argv[2])
out = sys.argv[3]
ops = [("statistics-filename", "filename", False, False),
       ("statistics-filename-cumulative", "filename", True, False),
       ("statistics-lineno", "lineno", False, False),
       ("statistics-lineno-cumulative", "lineno", True, False),
       ("statistics-traceback", "traceback", False, False),
       ("compare_to-filename", "filename", False, True),
       ("compare_to-filename-cumulative", "filename", True, True),
       ("compare_to-lineno", "lineno", False, True),
       ("compare_to-lineno-cumulative", "lineno", True, True),
       ("compare_to-traceback", "traceback", False, True)]
for name, key, cumulative, compare in ops:
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    if compare:
        result = new.compare_to(old, key, cumulative)
    else:
        result = new.statistics(key, cumulative)
    seconds = time.perf_counter() - start
    gc.enable()
    with open("%s/cpython-%s.txt" % (out, name), "w") as fp:
        fp.write("".join(str(s) + "\n" for s in result))
    print("%s\t%.6f" % (name, seconds), flush=True)
"#;

/// `name\tseconds[\t...]` lines into (name, seconds).
fn timings(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split('\t');
            let name = parts.next()?.to_string();
            let seconds = parts.next()?.parse().ok()?;
            Some((name, seconds))
        })
        .collect()
}

/// Builds the model's benchmark (and the baseline's) and runs it beside
/// CPython's tracemalloc.
pub fn task(args: &BenchModelArgs) -> anyhow::Result<()> {
    cargo(&[
        "build",
        "--release",
        "-p",
        "tracer-model",
        "--example",
        "bench_model",
    ])?;
    let root = workspace_root();
    let example = release_dir(&root).join("examples/bench_model");
    let baseline = match &args.baseline {
        Some(rev) => {
            let baseline = Baseline::prepare(&root, rev)?;
            let example = baseline.build_bench_model()?;
            Some((baseline, example))
        }
        None => None,
    };
    run(&root, &example, baseline.as_ref(), args)
}

/// One `bench_model` binary and the directory its result lines go to.
struct Side<'a> {
    example: &'a Path,
    out: PathBuf,
}

/// Times `sides` on the dump files: with one side, one process doing
/// `runs` runs of each call (its own medians); with two, `runs` rounds of
/// one process each, alternating which goes first, one run per call, and
/// the median of the rounds per call. Timings of each side, in its order.
fn time_sides(
    sides: &[Side],
    new: &str,
    old: &str,
    runs: u32,
) -> anyhow::Result<Vec<Vec<(String, f64)>>> {
    let invoke = |side: &Side, runs: u32| -> anyhow::Result<Vec<(String, f64)>> {
        fs::create_dir_all(&side.out)?;
        let out = side
            .out
            .to_str()
            .context("the output directory is not UTF-8")?;
        let text = stdout_of(
            Command::new(side.example).args([new, old, out, &runs.to_string()]),
            "bench_model",
        )?;
        Ok(timings(&text))
    };
    if let [side] = sides {
        return Ok(vec![invoke(side, runs)?]);
    }
    let mut rounds: Vec<Vec<Vec<(String, f64)>>> = vec![Vec::new(); sides.len()];
    for round in 0..runs.max(1) as usize {
        for i in 0..sides.len() {
            // Rotate who goes first, so that neither always follows the other.
            let i = (i + round) % sides.len();
            rounds[i].push(invoke(&sides[i], 1)?);
        }
    }
    Ok(rounds.iter().map(|r| medians(r)).collect())
}

/// Per name, the median over rounds of timings (names in the first round's
/// order).
fn medians(rounds: &[Vec<(String, f64)>]) -> Vec<(String, f64)> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|(name, _)| {
            let mut values: Vec<f64> = rounds
                .iter()
                .filter_map(|r| r.iter().find(|(n, _)| n == name).map(|(_, s)| *s))
                .collect();
            (name.clone(), median(&mut values))
        })
        .collect()
}

/// `statistics-lineno-cumulative` as `statistics(lineno, cumulative)`.
fn operation_label(name: &str) -> String {
    name.replacen('-', "(", 1)
        .replace("-cumulative", ", cumulative")
        + ")"
}

/// Runs the benchmark; `example` is the built `bench_model` binary, and
/// `baseline` the baseline's, if any.
fn run(
    root: &Path,
    example: &Path,
    baseline: Option<&(Baseline, PathBuf)>,
    args: &BenchModelArgs,
) -> anyhow::Result<()> {
    let others = tracers::running();
    if !others.is_empty() && !args.force {
        bail!(
            "tracers are running ({}): their allocator probes would slow the measured \
             code; wait for them to end, or pass --force",
            others.join(", ")
        );
    }
    let out = if args.out.is_absolute() {
        args.out.clone()
    } else {
        root.join(&args.out)
    };
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out_str = out.to_str().context("the output directory is not UTF-8")?;
    let (new, old) = (out.join("new.pickle"), out.join("old.pickle"));
    eprintln!(
        "bench-model: generating {} traces with {}",
        args.traces, args.python
    );
    stdout_of(
        Command::new(&args.python).args(["-c", GENERATE, &args.traces.to_string(), out_str]),
        "the generator",
    )?;
    let version = stdout_of(
        Command::new(&args.python).args(["-c", "import sys; print(sys.version.split()[0])"]),
        "python --version",
    )?;
    if !version.starts_with("3.11") {
        bail!(
            "the reference is CPython 3.11; {} is {}",
            args.python,
            version.trim()
        );
    }
    let (new_s, old_s) = (new.to_str().context("path")?, old.to_str().context("path")?);
    let mut sides = vec![Side {
        example,
        out: out.clone(),
    }];
    if let Some((baseline, example)) = baseline {
        sides.push(Side {
            example,
            out: out.join(format!("baseline-{}", baseline.short)),
        });
        eprintln!(
            "bench-model: tracer and the baseline {}, alternating, {} rounds",
            baseline.label(),
            args.runs
        );
    } else {
        eprintln!("bench-model: tracer ({} runs each)", args.runs);
    }
    let mut timed = time_sides(&sides, new_s, old_s, args.runs)?.into_iter();
    let ours = timed.next().unwrap_or_default();
    let base = timed.next();
    eprintln!("bench-model: CPython {} (minutes)", version.trim());
    let theirs = stdout_of(
        Command::new(&args.python).args(["-c", TIME, new_s, old_s, out_str]),
        "CPython",
    )?;
    let theirs = timings(&theirs);

    let mut table = String::new();
    let method = match baseline {
        Some((b, _)) => format!(
            "tracer and the baseline {}: median of {} rounds, one process of each per round, alternating",
            b.label(),
            args.runs
        ),
        None => format!("tracer: median of {} runs", args.runs),
    };
    table.push_str(&format!(
        "{} traces (new), {} bytes and {} bytes of tracemalloc dump files; CPython {}; {method}\n\n",
        args.traces,
        fs::metadata(&new).map(|m| m.len()).unwrap_or(0),
        fs::metadata(&old).map(|m| m.len()).unwrap_or(0),
        version.trim(),
    ));
    match baseline {
        Some((b, _)) => table.push_str(&format!(
            "| operation | CPython 3.11 | tracer | baseline {} | ratio | new/baseline | results equal |\n\
             |---|---:|---:|---:|---:|---:|---|\n",
            b.short
        )),
        None => table.push_str(
            "| operation | CPython 3.11 | tracer | ratio | results equal |\n|---|---:|---:|---:|---|\n",
        ),
    }
    let mut worst = f64::INFINITY;
    let mut against_baseline = Vec::new();
    for (name, cpython) in &theirs {
        let Some((_, tracer)) = ours.iter().find(|(n, _)| n == name) else {
            bail!("tracer did not time {name}");
        };
        let a = fs::read(out.join(format!("cpython-{name}.txt")))?;
        let b = fs::read(out.join(format!("tracer-{name}.txt")))?;
        let lines = a.iter().filter(|&&c| c == b'\n').count();
        if a != b {
            bail!(
                "{name}: tracer's {} differs from CPython's {}",
                out.join(format!("tracer-{name}.txt")).display(),
                out.join(format!("cpython-{name}.txt")).display()
            );
        }
        let ratio = cpython / tracer.max(1e-9);
        worst = worst.min(ratio);
        let label = operation_label(name);
        match (&base, sides.get(1)) {
            (Some(base), Some(side)) => {
                let Some((_, theirs)) = base.iter().find(|(n, _)| n == name) else {
                    bail!("the baseline did not time {name}");
                };
                let same = fs::read(side.out.join(format!("tracer-{name}.txt")))
                    .is_ok_and(|lines| lines == a);
                let change = tracer / theirs.max(1e-9);
                against_baseline.push(change);
                table.push_str(&format!(
                    "| `{label}` | {cpython:.2} s | {:.1} ms | {:.1} ms | {ratio:.0}x | {change:.2} | yes ({lines} lines){} |\n",
                    tracer * 1000.0,
                    theirs * 1000.0,
                    if same { "" } else { "; the baseline's differ" }
                ));
            }
            _ => table.push_str(&format!(
                "| `{label}` | {cpython:.2} s | {:.1} ms | {ratio:.0}x | yes ({lines} lines) |\n",
                tracer * 1000.0,
            )),
        }
    }
    if let Some((_, load)) = ours.iter().find(|(n, _)| n == "load") {
        table.push_str(&format!(
            "\ntracer loaded both dump files (pickle parsing, no execution) in {:.2} s",
            load
        ));
        match base
            .as_ref()
            .and_then(|b| b.iter().find(|(n, _)| n == "load"))
        {
            Some((_, theirs)) => table.push_str(&format!("; the baseline in {theirs:.2} s.\n")),
            None => table.push_str(".\n"),
        }
    }
    table.push_str(&format!("\nSlowest ratio: {worst:.0}x.\n"));
    if !against_baseline.is_empty() {
        let n = against_baseline.len() as f64;
        let geomean = (against_baseline.iter().map(|r| r.ln()).sum::<f64>() / n).exp();
        let (low, high) = against_baseline
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
                (lo.min(*r), hi.max(*r))
            });
        table.push_str(&format!(
            "new/baseline (time; below 1 is faster): geometric mean {geomean:.2}, from {low:.2} to {high:.2}.\n"
        ));
    }
    println!("{table}");
    fs::write(out.join("report.md"), &table)?;
    let mut raw = serde_json::json!({"cpython": theirs, "tracer": ours, "traces": args.traces, "runs": args.runs});
    if let (Some((b, _)), Some(base)) = (baseline, &base) {
        raw["baseline"] = serde_json::json!({"rev": b.rev, "commit": b.commit, "timings": base});
    }
    fs::write(out.join("report.json"), raw.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_parse_tab_separated_lines() {
        let parsed = timings("load\t1.5\t1.4\nstatistics-lineno\t0.002\t0.001\nnoise\n");
        assert_eq!(
            parsed,
            vec![
                ("load".to_string(), 1.5),
                ("statistics-lineno".to_string(), 0.002)
            ]
        );
    }

    #[test]
    fn medians_are_per_name_over_rounds() {
        let round = |a: f64, b: f64| vec![("load".to_string(), a), ("x".to_string(), b)];
        let m = medians(&[round(1.0, 9.0), round(3.0, 7.0), round(2.0, 8.0)]);
        assert_eq!(m, vec![("load".to_string(), 2.0), ("x".to_string(), 8.0)]);
        assert!(medians(&[]).is_empty());
    }

    #[test]
    fn operation_labels_read_as_calls() {
        assert_eq!(
            operation_label("statistics-lineno-cumulative"),
            "statistics(lineno, cumulative)"
        );
        assert_eq!(
            operation_label("compare_to-traceback"),
            "compare_to(traceback)"
        );
    }
}
