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
//! 4. Every result line (`str()` of every Statistic / StatisticDiff) of
//!    both sides is compared: the table is only printed if they are equal.
//!
//! Prints a markdown table (CPython seconds, tracer milliseconds, ratio)
//! and writes it with the raw timings to `target/bench-model/`.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::util::{
    cmd::{cargo, stdout_of},
    paths::{release_dir, workspace_root},
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

/// Builds the model's benchmark and runs it beside CPython's tracemalloc.
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
    run(&root, &example, args)
}

/// Runs the benchmark; `example` is the built `bench_model` binary.
fn run(root: &Path, example: &Path, args: &BenchModelArgs) -> anyhow::Result<()> {
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
    eprintln!("bench-model: tracer ({} runs each)", args.runs);
    let ours = stdout_of(
        Command::new(example).args([new_s, old_s, out_str, &args.runs.to_string()]),
        "bench_model",
    )?;
    eprintln!("bench-model: CPython {} (minutes)", version.trim());
    let theirs = stdout_of(
        Command::new(&args.python).args(["-c", TIME, new_s, old_s, out_str]),
        "CPython",
    )?;
    let ours = timings(&ours);
    let theirs = timings(&theirs);

    let mut table = String::new();
    table.push_str(&format!(
        "{} traces (new), {} bytes and {} bytes of tracemalloc dump files; CPython {}; tracer: median of {} runs\n\n",
        args.traces,
        fs::metadata(&new).map(|m| m.len()).unwrap_or(0),
        fs::metadata(&old).map(|m| m.len()).unwrap_or(0),
        version.trim(),
        args.runs
    ));
    table.push_str(
        "| operation | CPython 3.11 | tracer | ratio | results equal |\n|---|---:|---:|---:|---|\n",
    );
    let mut worst = f64::INFINITY;
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
        table.push_str(&format!(
            "| `{}` | {:.2} s | {:.1} ms | {:.0}x | yes ({} lines) |\n",
            name.replacen('-', "(", 1)
                .replace("-cumulative", ", cumulative")
                + ")",
            cpython,
            tracer * 1000.0,
            ratio,
            lines
        ));
    }
    if let Some((_, load)) = ours.iter().find(|(n, _)| n == "load") {
        table.push_str(&format!(
            "\ntracer loaded both dump files (pickle parsing, no execution) in {:.2} s.\n",
            load
        ));
    }
    table.push_str(&format!("\nSlowest ratio: {worst:.0}x.\n"));
    println!("{table}");
    fs::write(out.join("report.md"), &table)?;
    let raw = serde_json::json!({"cpython": theirs, "tracer": ours, "traces": args.traces, "runs": args.runs});
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
}
