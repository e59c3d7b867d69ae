//! The bench's cheap-routes part: how long `GET
//! /pid/N/traced-memory` (of a small process), `GET /processes`, `GET
//! /health` and `GET /metrics` take idle, while a 4,000,000-block
//! process's snapshot is taken (`POST /pid/N/snapshots`), and while the orphan sweep passes over its
//! blocks: p50 and p99 of each, side by side, in one run (the goal: p99
//! under 10 ms under either load). Beside them, a `POST` snapshot of the
//! small process every 200 ms: it reads the kernel maps as the big
//! snapshot and the sweep do, and must not wait for either. Each route is asked from a thread of
//! its own at a steady pace (one request every 3 ms), each request timed
//! from when it was due, so that a wait counts for every request due
//! meanwhile. With `--baseline`, the same
//! for the baseline's tracerd.
use std::{
    net::SocketAddr,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime},
};

use anyhow::bail;

use super::modes::{LISTEN, STOP_GRACE, start_tracerd};
use super::scale::{KEEP_C, finish, keep_blocks};
use crate::util::{cc::compile_c, stats::percentile};
use tracer_testkit::Client;

/// Blocks the big process holds.
const BIG_BLOCKS: u64 = 4_000_000;

/// Blocks the small process (whose traced memory is asked) holds.
const SMALL_BLOCKS: u64 = 100;

/// Answers of each route measured idle.
const IDLE_ANSWERS: usize = 300;

/// How long the cheap routes are asked while waiting for a sweep: two of
/// tracerd's sweep periods (every 10 s of housekeeping, which a sweep of
/// 2 s and a busy tick delay), so that one whole sweep is in it.
const SWEEP_WATCH: Duration = Duration::from_secs(25);

/// How long one request may take (the snapshot of 4,000,000 blocks).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// The label of the small process's `POST` snapshot among the routes.
const SMALL_SNAPSHOT: &str = "POST snapshot, the small process";

/// The routes measured, by label.
fn routes(small: u32) -> [(&'static str, String); 5] {
    [
        ("traced-memory", format!("/pid/{small}/traced-memory")),
        ("processes", "/processes".to_string()),
        ("health", "/health".to_string()),
        ("metrics", "/metrics".to_string()),
        (SMALL_SNAPSHOT, format!("/pid/{small}/snapshots")),
    ]
}

/// One answer: when it was due (wall clock), the route's index, and how
/// long it took from when it was due, in µs.
type Answer = (SystemTime, usize, u64);

/// The pace of each route's requests: one every this long.
const PACE: Duration = Duration::from_millis(3);

/// The pace of `/metrics` (about 1 ms of tracerd's CPU each): a scraper
/// 40 times a second, not one that takes a CPU of this 2-core host from
/// the routes measured beside it.
const METRICS_PACE: Duration = Duration::from_millis(25);

/// The pace of the small process's `POST` snapshot (each one stored).
const SNAPSHOT_PACE: Duration = Duration::from_millis(200);

/// Asks each route from a thread of its own, one request every [`PACE`]
/// ([`METRICS_PACE`] for `/metrics`, [`SNAPSHOT_PACE`] for the snapshot),
/// until `stop` (given how many answers that route has) says so; every
/// answer must be 200 (201 for the snapshot). A request is due at its slot of the pace, and its
/// time counts from then: when one waits, those of its route due
/// meanwhile wait too (sent as soon as it answers), as a steady stream of
/// clients would, so a wait of 300 ms counts 100 times, not once; a
/// route's waits never delay another's requests.
fn ask(
    http: &Client,
    paths: &[(usize, &'static str, String)],
    stop: &(dyn Fn(usize) -> bool + Sync),
) -> anyhow::Result<Vec<Answer>> {
    let wall = SystemTime::now();
    let start = Instant::now();
    let per_route = |index: usize, label: &str, path: &str| -> anyhow::Result<Vec<Answer>> {
        let mut answers = Vec::new();
        let mut slot: u32 = 0;
        let post = label == SMALL_SNAPSHOT;
        let pace = if post {
            SNAPSHOT_PACE
        } else if path == "/metrics" {
            METRICS_PACE
        } else {
            PACE
        };
        // The snapshot's answers count 20 each: the idle part's count of
        // answers then takes it 3 s, as long as it takes the others.
        let weight = if post { 20 } else { 1 };
        while !stop(answers.len() * weight) {
            let due = pace * slot;
            slot += 1;
            if let Some(ahead) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(ahead);
            }
            let response = if post {
                http.post(path)?
            } else {
                http.get(path)?
            };
            let took = start.elapsed().saturating_sub(due);
            if response.status != if post { 201 } else { 200 } {
                bail!("{label}: {} {}", response.status, response.body);
            }
            answers.push((
                wall + due,
                index,
                u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            ));
        }
        Ok(answers)
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = paths
            .iter()
            .map(|(index, label, path)| scope.spawn(move || per_route(*index, label, path)))
            .collect();
        let mut answers = Vec::new();
        for thread in threads {
            let mine = thread
                .join()
                .map_err(|_| anyhow::anyhow!("a route's thread panicked"))??;
            answers.extend(mine);
        }
        Ok(answers)
    })
}

/// (p50, p99, max, answers) in ms of route `index` among `answers`.
fn summary(answers: &[Answer], index: usize) -> (f64, f64, f64, usize) {
    let mut took: Vec<u64> = answers
        .iter()
        .filter(|(_, i, _)| *i == index)
        .map(|(_, _, t)| *t)
        .collect();
    took.sort_unstable();
    (
        percentile(&took, 50.0) as f64 / 1000.0,
        percentile(&took, 99.0) as f64 / 1000.0,
        took.last().copied().unwrap_or(0) as f64 / 1000.0,
        took.len(),
    )
}

/// A metric of `/metrics` without labels; None when tracerd has none of
/// that name (a baseline older than the sweep's metrics).
fn metric(http: &Client, name: &str) -> anyhow::Result<Option<f64>> {
    let text = http.get("/metrics")?.body;
    Ok(text
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok()))
}

fn unix_secs(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The three loads' answers, and what the loads were.
struct Measured {
    idle: Vec<Answer>,
    snapshot: Vec<Answer>,
    snapshot_ms: f64,
    sweep: Vec<Answer>,
    /// How long the sweep took; None when tracerd does not tell (a
    /// baseline older than its metrics): then `sweep` is every answer of
    /// [`SWEEP_WATCH`], which held one sweep.
    sweep_ms: Option<f64>,
}

/// Measures the routes under `tracerd`: idle (between two sweeps), while
/// the big process's snapshot is taken, and while a sweep runs; the cheap
/// routes under one set of loads, the small process's POST under another.
fn measure(tracerd: &Path, dir: &Path, exe: &Path) -> anyhow::Result<(Measured, Measured)> {
    let tracer = start_tracerd(
        tracerd,
        &dir.join("state-cheap"),
        &[
            "--max-live-blocks",
            &(8u32 << 20).to_string(),
            "--process-share",
            "100",
            // No automatic snapshot of the big process in the idle part.
            "--snapshot-interval",
            "0",
            // The snapshot of 4,000,000 blocks is taken whole, and stored.
            "--request-timeout-secs",
            "600",
            "--request-memory-budget",
            &(16u64 << 30).to_string(),
            "--max-snapshot-bytes",
            &(16u64 << 30).to_string(),
        ],
    )?;
    let addr: SocketAddr = LISTEN.parse()?;
    let http = Client::new(addr, REQUEST_TIMEOUT)?;
    let small = keep_blocks(exe, SMALL_BLOCKS)?;
    let big = keep_blocks(exe, BIG_BLOCKS)?;
    let big_pid = big.pid();
    // Every block of the big process is in the maps.
    let waited = Instant::now();
    loop {
        let body = http.get(&format!("/pid/{big_pid}"))?.body;
        let process: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if process["blocks"].as_u64() >= Some(BIG_BLOCKS) {
            break;
        }
        if waited.elapsed() > Duration::from_secs(60) {
            bail!("the big process is not traced whole after 60 s: {body}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // The cheap routes under each load, then the small process's POST
    // under loads of their own: run beside them, its work (which waited
    // for the kernel lock before) would be part of their load.
    let all: Vec<(usize, &'static str, String)> = routes(small.pid())
        .into_iter()
        .enumerate()
        .map(|(index, (label, path))| (index, label, path))
        .collect();
    let (posts, cheap): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(_, label, _)| *label == SMALL_SNAPSHOT);
    let cheap = phases(&http, big_pid, &cheap)?;
    let posts = phases(&http, big_pid, &posts)?;
    finish(small);
    finish(big);
    let _ = tracer.stop(STOP_GRACE);
    Ok((cheap, posts))
}

/// The answers of the routes `paths` idle, while the big process's
/// snapshot is taken (one more stored), and while a sweep runs.
fn phases(
    http: &Client,
    big_pid: u32,
    paths: &[(usize, &'static str, String)],
) -> anyhow::Result<Measured> {
    // Idle: between two sweeps (none ended meanwhile).
    let mut idle = Vec::new();
    for _ in 0..5 {
        let before = metric(http, "tracer_orphan_sweeps_total")?;
        idle = ask(http, paths, &|n| n >= IDLE_ANSWERS)?;
        if metric(http, "tracer_orphan_sweeps_total")? == before {
            break;
        }
        idle.clear();
    }
    if idle.is_empty() {
        bail!("every idle measure met a sweep");
    }

    // While the big process's snapshot is taken.
    let done = AtomicBool::new(false);
    let (snapshot, taken) = std::thread::scope(|scope| {
        let taker = scope.spawn(|| {
            let start = Instant::now();
            let response = http.post(&format!("/pid/{big_pid}/snapshots"));
            done.store(true, Ordering::Release);
            response.map(|r| (r, start.elapsed()))
        });
        let answers = ask(http, paths, &|_| done.load(Ordering::Acquire));
        (answers, taker.join())
    });
    let snapshot = snapshot?;
    let (response, took) = taken.map_err(|_| anyhow::anyhow!("the snapshot's thread"))??;
    if response.status != 201 {
        bail!("snapshot: {} {}", response.status, response.body);
    }
    let snapshot_ms = took.as_secs_f64() * 1000.0;

    // While a sweep runs: the answers asked between its start and end.
    let mut sweep = Vec::new();
    let mut sweep_ms = None;
    for _ in 0..4 {
        let watch = Instant::now();
        let began = SystemTime::now();
        let answers = ask(http, paths, &|_| watch.elapsed() >= SWEEP_WATCH)?;
        // The last sweep that `/metrics` reports must have run while the
        // routes were asked (else the window is watched again).
        let watched = unix_secs(SystemTime::now());
        let end = metric(http, "tracer_orphan_sweep_last_end_seconds")?;
        let took = metric(http, "tracer_orphan_sweep_last_seconds")?;
        let (Some(end), Some(took)) = (end, took) else {
            sweep = answers;
            break;
        };
        if end - took >= unix_secs(began) && end <= watched {
            sweep = answers
                .into_iter()
                .filter(|(at, _, _)| (end - took..=end).contains(&unix_secs(*at)))
                .collect();
            sweep_ms = Some(took * 1000.0);
            break;
        }
    }
    if sweep.is_empty() {
        bail!("no sweep ran while the routes were asked");
    }
    Ok(Measured {
        idle,
        snapshot,
        snapshot_ms,
        sweep,
        sweep_ms,
    })
}

/// How long a load of `measured` took, for the table's title.
fn loads(measured: &Measured) -> String {
    format!(
        "snapshot of {BIG_BLOCKS} blocks {:.0} ms, {}",
        measured.snapshot_ms,
        measured.sweep_ms.map_or_else(
            || format!(
                "sweep not timed (no sweep metrics): every answer of {} s that held one",
                SWEEP_WATCH.as_secs()
            ),
            |ms| format!("sweep {ms:.0} ms"),
        )
    )
}

/// Prints one table row per route (the small process's POST from its
/// own loads), and returns them as JSON.
fn report(name: &str, (cheap, posts): &(Measured, Measured)) -> serde_json::Value {
    println!(
        "\n#### {name}: {}; the POST's: {}\n",
        loads(cheap),
        loads(posts)
    );
    println!(
        "| route | idle p50 / p99 / max ms | during snapshot p50 / p99 / max ms | during sweep p50 / p99 / max ms | answers (idle/snapshot/sweep) |"
    );
    println!("|---|---|---|---|---|");
    let mut rows = serde_json::Map::new();
    let cell = |s: (f64, f64, f64, usize)| format!("{:.2} / {:.2} / {:.2}", s.0, s.1, s.2);
    let json = |s: (f64, f64, f64, usize)| serde_json::json!({"p50_ms": s.0, "p99_ms": s.1, "max_ms": s.2, "answers": s.3});
    for (index, (label, _)) in routes(0).iter().enumerate() {
        let measured = if *label == SMALL_SNAPSHOT {
            posts
        } else {
            cheap
        };
        let idle = summary(&measured.idle, index);
        let snapshot = summary(&measured.snapshot, index);
        let sweep = summary(&measured.sweep, index);
        println!(
            "| {label} | {} | {} | {} | {}/{}/{} |",
            cell(idle),
            cell(snapshot),
            cell(sweep),
            idle.3,
            snapshot.3,
            sweep.3
        );
        rows.insert(
            (*label).to_string(),
            serde_json::json!({
                "idle": json(idle),
                "snapshot": json(snapshot),
                "sweep": json(sweep),
            }),
        );
    }
    serde_json::json!({
        "snapshot_ms": cheap.snapshot_ms,
        "sweep_ms": cheap.sweep_ms,
        "post_loads": {"snapshot_ms": posts.snapshot_ms, "sweep_ms": posts.sweep_ms},
        "routes": rows,
    })
}

/// The cheap routes under load, for `tracerd` (and `baseline`'s, named
/// by its label, when given).
pub fn cheap_part(
    tracerd: &Path,
    dir: &Path,
    baseline: Option<(String, &Path)>,
) -> anyhow::Result<serde_json::Value> {
    let exe = compile_c(dir, "keep", KEEP_C, super::workloads::CFLAGS)?;
    println!(
        "\n### Cheap routes under load (traced-memory of a {SMALL_BLOCKS}-block process, processes, health)"
    );
    let mut json = serde_json::Map::new();
    let measured = measure(tracerd, dir, &exe)?;
    json.insert("tracerd".into(), report("tracerd", &measured));
    if let Some((label, path)) = baseline {
        let measured = measure(path, dir, &exe)?;
        json.insert("baseline".into(), report(&label, &measured));
    }
    Ok(serde_json::Value::Object(json))
}
