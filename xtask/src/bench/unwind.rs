//! The bench's unwind part: what the kernel's stack walk costs, the
//! unwinder (`.eh_frame` tables) against the frame-pointer walk (`--unwind
//! false`), in one run, medians of the rounds.
//!
//! - Per frame: a malloc+free loop at the bottom of an 80-deep recursion,
//!   built with and without frame pointers, timed uninstrumented, under
//!   tracer-floor, and under each walker at `nframe` 1, 16 and 64 (with
//!   `--allocator-frames-depth 0`, so that the walk is exactly `nframe`
//!   frames). A frame costs (ns/pair at 64 − ns/pair at 1) / 63. The
//!   frame-pointer walk of the build without frame pointers stops after a
//!   frame or two (its figures show what it does not walk, not a cost).
//! - Churn (64-byte malloc+free, shallow) under the floor and both walkers
//!   at the default `nframe`: the goal is tracerd within 1.5x the floor.
//! - The real workloads (python, sqlite, gcc) under both walkers.
//! - Table memory: `unwind.bytes` of `GET /tracing/memory` for one
//!   process's files (tracerd scoped to it) per MiB of their executable
//!   mappings (`/proc/PID/maps`).
use std::{
    collections::BTreeMap,
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{
    BenchArgs,
    modes::{LISTEN, STOP_GRACE, start_tracerd, start_until},
    workloads::{self, Workload},
};
use crate::util::{cc::compile_c, paths::release_dir, stats::median};
use tracer_testkit::{Client, Running};

/// Recursion depth under the allocating loop: deeper than the most frames
/// walked (64), so every walk goes the whole `nframe`.
const DEPTH: u32 = 80;

/// malloc+free pairs per run of the deep loop.
const DEEP_PAIRS: u64 = 50_000;

/// The `nframe` values measured.
const NFRAMES: [u32; 3] = [1, 16, 64];

/// The walkers: (name, tracerd's `--unwind`).
const WALKERS: [(&str, &str); 2] = [("frame pointers", "false"), ("unwinder", "true")];

const DEEP_C: &str = include_str!("../../workloads/deep.c");

/// The two builds of the deep loop: (name, executable, flags).
const BUILDS: [(&str, &str, &[&str]); 2] = [
    (
        "with frame pointers",
        "deep-fp",
        &["-O2", "-fno-omit-frame-pointer"],
    ),
    (
        "without frame pointers",
        "deep-nofp",
        &["-O2", "-fomit-frame-pointer"],
    ),
];

/// Runs a self-timed program (it prints ns per pair).
fn timed(program: &Path, args: &[String]) -> anyhow::Result<f64> {
    let out = Command::new(program).args(args).output()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<f64>()
        .with_context(|| format!("{} printed no figure", program.display()))
}

/// Figures of one round or their medians, by row and column.
type Table = BTreeMap<String, BTreeMap<String, Vec<f64>>>;

fn push(table: &mut Table, row: &str, column: &str, value: f64) {
    table
        .entry(row.to_string())
        .or_default()
        .entry(column.to_string())
        .or_default()
        .push(value);
}

fn medians(table: &mut Table) -> BTreeMap<String, BTreeMap<String, f64>> {
    table
        .iter_mut()
        .map(|(row, columns)| {
            (
                row.clone(),
                columns
                    .iter_mut()
                    .map(|(c, v)| (c.clone(), median(v)))
                    .collect(),
            )
        })
        .collect()
}

pub fn unwind_part(
    root: &Path,
    dir: &Path,
    args: &BenchArgs,
    workloads: &[Workload],
) -> anyhow::Result<serde_json::Value> {
    let release = release_dir(root);
    let tracerd = release.join("tracerd");
    let builds: Vec<(&str, PathBuf)> = BUILDS
        .iter()
        .map(|(name, file, flags)| compile_c(dir, file, DEEP_C, flags).map(|p| (*name, p)))
        .collect::<anyhow::Result<_>>()?;
    let churn = dir.join("churn");
    let deep_args = vec![DEEP_PAIRS.to_string(), DEPTH.to_string()];
    let churn_args = vec![args.pairs.to_string()];
    let reals: Vec<&Workload> = workloads.iter().filter(|w| !w.self_timed()).collect();

    // deep[build][column], churn[""][column], real[workload][column].
    let mut deep = Table::new();
    let mut shallow = Table::new();
    let mut real = Table::new();
    for round in 1..=args.rounds.max(1) {
        eprintln!("bench: unwind round {round}/{}", args.rounds);
        for (build, exe) in &builds {
            push(&mut deep, build, "none", timed(exe, &deep_args)?);
        }
        shallow_and_real(
            &mut shallow,
            &mut real,
            "none",
            &churn,
            &churn_args,
            &reals,
            dir,
        )?;
        let floor = start_until(Command::new(release.join("tracer-floor")), "ready", false)?;
        for (build, exe) in &builds {
            push(&mut deep, build, "floor", timed(exe, &deep_args)?);
        }
        push(&mut shallow, "churn", "floor", timed(&churn, &churn_args)?);
        let _ = floor.stop(STOP_GRACE);
        for (walker, unwind) in WALKERS {
            for nframe in NFRAMES {
                let n = nframe.to_string();
                let tracer = start_tracerd(
                    &tracerd,
                    &dir.join("state-unwind"),
                    &[
                        "--unwind",
                        unwind,
                        "--nframe",
                        &n,
                        "--allocator-frames-depth",
                        "0",
                    ],
                )?;
                let column = format!("{walker} nframe {nframe}");
                for (build, exe) in &builds {
                    push(&mut deep, build, &column, timed(exe, &deep_args)?);
                }
                if nframe == 16 {
                    shallow_and_real(
                        &mut shallow,
                        &mut real,
                        walker,
                        &churn,
                        &churn_args,
                        &reals,
                        dir,
                    )?;
                }
                let _ = tracer.stop(STOP_GRACE);
            }
        }
    }
    let deep = medians(&mut deep);
    let shallow = medians(&mut shallow);
    let real = medians(&mut real);
    let memory = table_memory(&tracerd, dir)?;
    Ok(report(&deep, &shallow, &real, &memory))
}

/// Churn and the real workloads under the tracer running now (`column`).
fn shallow_and_real(
    shallow: &mut Table,
    real: &mut Table,
    column: &str,
    churn: &Path,
    churn_args: &[String],
    reals: &[&Workload],
    dir: &Path,
) -> anyhow::Result<()> {
    push(shallow, "churn", column, timed(churn, churn_args)?);
    for workload in reals {
        push(
            real,
            workload.name,
            column,
            workloads::run_once("none", workload, dir)?,
        );
    }
    Ok(())
}

/// Per frame, ns: (figure at nframe 64 − at nframe 1) / 63.
fn per_frame(row: &BTreeMap<String, f64>, walker: &str) -> Option<f64> {
    let at = |n: u32| row.get(&format!("{walker} nframe {n}")).copied();
    Some((at(64)? - at(1)?) / 63.0)
}

/// Table memory of one process's files, for each program measured.
struct Memory {
    /// (program, bytes of tables, bytes of executable mappings).
    programs: Vec<(String, u64, u64)>,
}

/// Starts `argv` waiting on its stdin, scopes a tracerd to it, makes it
/// allocate, waits until the unwinder has its mappings, and reads the
/// table bytes and the executable mappings' size.
fn table_memory(tracerd: &Path, dir: &Path) -> anyhow::Result<Memory> {
    let python = workloads::real_python();
    let programs: Vec<(String, Vec<String>, &str)> = vec![
        (
            "python3".into(),
            vec![
                python,
                "-c".into(),
                "import json, sys\nfor line in sys.stdin: json.dumps(line)".into(),
            ],
            "x\n",
        ),
        ("sqlite3".into(), vec!["sqlite3".into()], ".print x\n"),
        (
            "gdb".into(),
            vec!["gdb".into(), "-nx".into(), "-q".into()],
            "echo x\\n\n",
        ),
    ];
    let http = Client::new(LISTEN.parse::<SocketAddr>()?, Duration::from_secs(60))?;
    let mut measured = Vec::new();
    for (name, argv, line) in programs {
        let mut command = Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut program = Running::spawn(&mut command)?;
        let pid = program.pid();
        let tracer = start_tracerd(
            tracerd,
            &dir.join("state-unwind"),
            &["--scope-pid", &pid.to_string()],
        )?;
        let mut stdin = program.child().stdin.take().context("stdin")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let bytes = loop {
            stdin.write_all(line.as_bytes())?;
            stdin.flush()?;
            std::thread::sleep(Duration::from_millis(200));
            let maps = http.get("/maps")?;
            let value: serde_json::Value = serde_json::from_str(&maps.body)?;
            let known = value["unwind_pids"]
                .as_array()
                .is_some_and(|p| p.iter().any(|v| v.as_u64() == Some(u64::from(pid))));
            if known {
                // One refresh later: libraries it loaded since are in.
                std::thread::sleep(Duration::from_millis(1200));
                let memory = http.get("/tracing/memory")?;
                let value: serde_json::Value = serde_json::from_str(&memory.body)?;
                break value["unwind"]["bytes"].as_u64().context("unwind.bytes")?;
            }
            if Instant::now() > deadline {
                bail!("the unwinder never had the mappings of {name} ({pid})");
            }
        };
        let text = executable_bytes(pid)?;
        drop(stdin);
        let _ = tracer.stop(STOP_GRACE);
        let _ = program.stop(STOP_GRACE);
        measured.push((name, bytes, text));
    }
    Ok(Memory { programs: measured })
}

/// The bytes of a process's file-backed executable mappings.
fn executable_bytes(pid: u32) -> anyhow::Result<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(maps
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (start, end) = fields.first()?.split_once('-')?;
            let file = fields.get(5).is_some_and(|p| p.starts_with('/'));
            (fields.get(1)?.contains('x') && file).then(|| {
                u64::from_str_radix(end, 16).unwrap_or(0)
                    - u64::from_str_radix(start, 16).unwrap_or(0)
            })
        })
        .sum())
}

/// Prints the part's tables and returns its JSON.
fn report(
    deep: &BTreeMap<String, BTreeMap<String, f64>>,
    shallow: &BTreeMap<String, BTreeMap<String, f64>>,
    real: &BTreeMap<String, BTreeMap<String, f64>>,
    memory: &Memory,
) -> serde_json::Value {
    println!("\n### Unwind\n");
    println!(
        "malloc+free at the bottom of a {DEPTH}-deep recursion, ns/pair (medians); \
         `--allocator-frames-depth 0`, so a walk is `nframe` frames\n"
    );
    let mut columns = vec!["none".to_string(), "floor".to_string()];
    for (walker, _) in WALKERS {
        for n in NFRAMES {
            columns.push(format!("{walker} nframe {n}"));
        }
    }
    println!("| build | {} |", columns.join(" | "));
    println!("|---|{}", "---:|".repeat(columns.len()));
    let mut frames = serde_json::Map::new();
    for (build, row) in deep {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| row.get(c).map_or("-".into(), |v| format!("{v:.0}")))
            .collect();
        println!("| {build} | {} |", cells.join(" | "));
        let fp = per_frame(row, WALKERS[0].0);
        let unwinder = per_frame(row, WALKERS[1].0);
        frames.insert(
            build.clone(),
            serde_json::json!({
                "ns_per_pair": row,
                "frame_pointer_ns_per_frame": fp,
                "unwinder_ns_per_frame": unwinder,
            }),
        );
    }
    println!();
    for (build, row) in deep {
        let fp = per_frame(row, WALKERS[0].0);
        let unwinder = per_frame(row, WALKERS[1].0);
        match (fp, unwinder) {
            (Some(fp), Some(u)) if build == BUILDS[0].0 => println!(
                "- per frame, {build}: unwinder {u:.0} ns, frame pointers {fp:.0} ns: {:.2}x (goal: at most 2x)",
                u / fp
            ),
            (_, Some(u)) => println!(
                "- per frame, {build}: unwinder {u:.0} ns (the frame-pointer walk stops within a frame or two here)"
            ),
            _ => {}
        }
    }
    let churn = shallow.get("churn").cloned().unwrap_or_default();
    let ratio = |walker: &str| Some(churn.get(walker)? / churn.get("floor")?);
    if let (Some(fp), Some(u)) = (ratio(WALKERS[0].0), ratio(WALKERS[1].0)) {
        println!(
            "- churn (64 B malloc+free, nframe 16): floor {:.0} ns/pair, frame pointers {:.2}x the floor, unwinder {u:.2}x (goal: at most 1.5x)",
            churn.get("floor").copied().unwrap_or(0.0),
            fp
        );
    }
    for (workload, row) in real {
        let (Some(none), Some(fp), Some(u)) = (
            row.get("none"),
            row.get(WALKERS[0].0),
            row.get(WALKERS[1].0),
        ) else {
            continue;
        };
        println!(
            "- {workload}: {none:.0} ms uninstrumented, frame pointers {fp:.0} ms ({:.2}x), unwinder {u:.0} ms ({:.2}x)",
            fp / none,
            u / none
        );
    }
    let mut tables = serde_json::Map::new();
    for (name, bytes, text) in &memory.programs {
        let per_mib = *bytes as f64 / (*text as f64 / (1024.0 * 1024.0));
        println!(
            "- tables of {name}'s files: {:.0} KiB for {:.1} MiB of executable mappings: {:.0} KiB per MiB",
            *bytes as f64 / 1024.0,
            *text as f64 / (1024.0 * 1024.0),
            per_mib / 1024.0
        );
        tables.insert(
            name.clone(),
            serde_json::json!({"table_bytes": bytes, "text_bytes": text, "bytes_per_mib": per_mib}),
        );
    }
    serde_json::json!({
        "depth": DEPTH,
        "deep": frames,
        "churn_ns_per_pair": churn,
        "churn_ratio_to_floor": {
            "frame_pointers": ratio(WALKERS[0].0),
            "unwinder": ratio(WALKERS[1].0),
        },
        "real_ms": real,
        "tables": tables,
    })
}
