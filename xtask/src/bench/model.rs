//! `cargo xtask bench-model`: the snapshot engine against CPython 3.11's
//! tracemalloc, side by side on the same data.
//!
//! 1. For each data shape (`--distinct`: by default 200,000 distinct
//!    tracebacks, most traces of a traceback of their own, and 1,000, a
//!    loop allocating at a handful of places as real programs do), Python
//!    generates two snapshots (new and old) of `--traces` traces with deep
//!    tracebacks (16 to 32 frames from 80,000 distinct `file:line`
//!    frames, the distinct tracebacks shared the way `take_snapshot()`
//!    shares them) and writes them with `tracemalloc.Snapshot.dump()`.
//!    Steps 2 to 4 run per shape, and one table reports both.
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
//! Prints one markdown table, a row per operation and shape (CPython
//! seconds, tracer milliseconds, ratio; with a baseline its milliseconds,
//! its ratio and new/baseline), and writes it with the raw timings to
//! `target/bench-model/` (each shape's files in `distinct-N/`).
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

/// The data shapes measured by default: distinct tracebacks among the
/// traces.
pub const DEFAULT_DISTINCT: [u64; 2] = [200_000, 1_000];

/// Options of `cargo xtask bench-model`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchModelArgs {
    /// Traces in the new snapshot (the old one has about as many).
    #[arg(long, default_value_t = 1_000_000)]
    pub traces: u64,
    /// Distinct tracebacks of each data shape measured, comma-separated
    /// (at most as many occur among the traces).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_DISTINCT)]
    pub distinct: Vec<u64>,
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

/// Writes `new.pickle` and `old.pickle`: argv = N, out dir, distinct
/// tracebacks.
const GENERATE: &str = r#"
import random, sys, tracemalloc
n, out, distinct = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
random.seed(20261121)
files = ["/srv/app/src/mod%03d/file%04d.c" % (i // 40, i) for i in range(2000)]
frames = [(f, line) for f in files for line in range(1, 41)]
limit = 32
tracebacks = []
for _ in range(distinct):
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

/// The measurements of one data shape.
struct Shape {
    /// Distinct tracebacks asked of the generator.
    distinct: u64,
    /// Bytes of the new and old dump files.
    bytes: (u64, u64),
    /// tracer's timings, the baseline's (if any), CPython's.
    ours: Vec<(String, f64)>,
    base: Option<Vec<(String, f64)>>,
    theirs: Vec<(String, f64)>,
    /// Where the result lines are.
    out: PathBuf,
}

/// Generates the dump files of one shape under `out` and times tracer (and
/// the baseline) and CPython on them.
fn measure(
    args: &BenchModelArgs,
    example: &Path,
    baseline: Option<&(Baseline, PathBuf)>,
    out: &Path,
    distinct: u64,
) -> anyhow::Result<Shape> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let out_str = out.to_str().context("the output directory is not UTF-8")?;
    let (new, old) = (out.join("new.pickle"), out.join("old.pickle"));
    eprintln!(
        "bench-model: generating {} traces over {distinct} distinct tracebacks with {}",
        args.traces, args.python
    );
    stdout_of(
        Command::new(&args.python).args([
            "-c",
            GENERATE,
            &args.traces.to_string(),
            out_str,
            &distinct.to_string(),
        ]),
        "the generator",
    )?;
    let (new_s, old_s) = (new.to_str().context("path")?, old.to_str().context("path")?);
    let mut sides = vec![Side {
        example,
        out: out.to_path_buf(),
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
    eprintln!("bench-model: CPython (minutes)");
    let theirs = stdout_of(
        Command::new(&args.python).args(["-c", TIME, new_s, old_s, out_str]),
        "CPython",
    )?;
    Ok(Shape {
        distinct,
        bytes: (
            fs::metadata(&new).map(|m| m.len()).unwrap_or(0),
            fs::metadata(&old).map(|m| m.len()).unwrap_or(0),
        ),
        ours,
        base,
        theirs: timings(&theirs),
        out: out.to_path_buf(),
    })
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
    if args.distinct.is_empty() {
        bail!("--distinct names no data shape");
    }
    let out = if args.out.is_absolute() {
        args.out.clone()
    } else {
        root.join(&args.out)
    };
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
    let mut shapes = Vec::with_capacity(args.distinct.len());
    for &distinct in &args.distinct {
        let dir = out.join(format!("distinct-{distinct}"));
        shapes.push(measure(args, example, baseline, &dir, distinct)?);
    }

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
        "{} traces (new) per data shape; CPython {}; {method}\n\n",
        args.traces,
        version.trim(),
    ));
    for shape in &shapes {
        table.push_str(&format!(
            "- {} distinct tracebacks: {} bytes and {} bytes of tracemalloc dump files\n",
            shape.distinct, shape.bytes.0, shape.bytes.1
        ));
    }
    table.push('\n');
    match baseline {
        Some((b, _)) => table.push_str(&format!(
            "| operation | distinct tracebacks | CPython 3.11 | tracer | baseline {} | ratio | baseline ratio | new/baseline | results equal |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---|\n",
            b.short
        )),
        None => table.push_str(
            "| operation | distinct tracebacks | CPython 3.11 | tracer | ratio | results equal |\n\
             |---|---:|---:|---:|---:|---|\n",
        ),
    }
    let (worst, against_baseline) = rows(&mut table, &shapes, baseline)?;
    summary(&mut table, &shapes, &worst, &against_baseline);
    println!("{table}");
    fs::write(out.join("report.md"), &table)?;
    write_json(&out, args, &shapes, baseline)?;
    Ok(())
}

/// Adds the table's row of each operation and data shape, checking that
/// tracer's results are CPython's: the slowest ratio to CPython of each
/// shape, and each time against the baseline's (when there is one).
fn rows(
    table: &mut String,
    shapes: &[Shape],
    baseline: Option<&(Baseline, PathBuf)>,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut worst = vec![f64::INFINITY; shapes.len()];
    let mut against_baseline = Vec::new();
    let names: Vec<String> = shapes
        .first()
        .map(|s| s.theirs.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    for name in &names {
        for (k, shape) in shapes.iter().enumerate() {
            let Some((_, cpython)) = shape.theirs.iter().find(|(n, _)| n == name) else {
                bail!("CPython did not time {name} ({} distinct)", shape.distinct);
            };
            let Some((_, tracer)) = shape.ours.iter().find(|(n, _)| n == name) else {
                bail!("tracer did not time {name}");
            };
            let cpython_file = shape.out.join(format!("cpython-{name}.txt"));
            let tracer_file = shape.out.join(format!("tracer-{name}.txt"));
            let a = fs::read(&cpython_file)?;
            let b = fs::read(&tracer_file)?;
            let lines = a.iter().filter(|&&c| c == b'\n').count();
            if a != b {
                bail!(
                    "{name}: tracer's {} differs from CPython's {}",
                    tracer_file.display(),
                    cpython_file.display()
                );
            }
            let ratio = cpython / tracer.max(1e-9);
            if let Some(w) = worst.get_mut(k) {
                *w = w.min(ratio);
            }
            let label = operation_label(name);
            let distinct = shape.distinct;
            match (&shape.base, baseline) {
                (Some(base), Some((b, _))) => {
                    let Some((_, theirs)) = base.iter().find(|(n, _)| n == name) else {
                        bail!("the baseline did not time {name}");
                    };
                    let same = fs::read(
                        shape
                            .out
                            .join(format!("baseline-{}", b.short))
                            .join(format!("tracer-{name}.txt")),
                    )
                    .is_ok_and(|lines| lines == a);
                    let change = tracer / theirs.max(1e-9);
                    against_baseline.push(change);
                    table.push_str(&format!(
                        "| `{label}` | {distinct} | {cpython:.2} s | {:.1} ms | {:.1} ms | {ratio:.0}x | {:.0}x | {change:.2} | yes ({lines} lines){} |\n",
                        tracer * 1000.0,
                        theirs * 1000.0,
                        cpython / theirs.max(1e-9),
                        if same { "" } else { "; the baseline's differ" }
                    ));
                }
                _ => table.push_str(&format!(
                    "| `{label}` | {distinct} | {cpython:.2} s | {:.1} ms | {ratio:.0}x | yes ({lines} lines) |\n",
                    tracer * 1000.0,
                )),
            }
        }
    }
    Ok((worst, against_baseline))
}

/// Adds the load times, the slowest ratio of each shape (`worst`) and the
/// geometric mean of the times against the baseline's.
fn summary(table: &mut String, shapes: &[Shape], worst: &[f64], against_baseline: &[f64]) {
    table.push('\n');
    for shape in shapes {
        if let Some((_, load)) = shape.ours.iter().find(|(n, _)| n == "load") {
            table.push_str(&format!(
                "{} distinct tracebacks: tracer loaded both dump files (pickle parsing, no execution) in {load:.2} s",
                shape.distinct
            ));
            match shape
                .base
                .as_ref()
                .and_then(|b| b.iter().find(|(n, _)| n == "load"))
            {
                Some((_, theirs)) => table.push_str(&format!("; the baseline in {theirs:.2} s.\n")),
                None => table.push_str(".\n"),
            }
        }
    }
    table.push('\n');
    for (shape, worst) in shapes.iter().zip(worst) {
        table.push_str(&format!(
            "Slowest ratio, {} distinct tracebacks: {worst:.0}x.\n",
            shape.distinct
        ));
    }
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
}

/// Writes the timings of every shape to `out/report.json`.
fn write_json(
    out: &Path,
    args: &BenchModelArgs,
    shapes: &[Shape],
    baseline: Option<&(Baseline, PathBuf)>,
) -> anyhow::Result<()> {
    let raw: Vec<serde_json::Value> = shapes
        .iter()
        .map(|shape| {
            let mut raw = serde_json::json!({
                "distinct": shape.distinct,
                "cpython": shape.theirs,
                "tracer": shape.ours,
            });
            if let (Some((b, _)), Some(base)) = (baseline, &shape.base) {
                raw["baseline"] =
                    serde_json::json!({"rev": b.rev, "commit": b.commit, "timings": base});
            }
            raw
        })
        .collect();
    fs::write(
        out.join("report.json"),
        serde_json::json!({"traces": args.traces, "runs": args.runs, "shapes": raw}).to_string(),
    )?;
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
