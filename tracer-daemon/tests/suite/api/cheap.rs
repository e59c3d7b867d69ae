//! No route waits on another's work: while a process
//! of 1.5 M live blocks is queried whole (its traces, a
//! stored snapshot) and the orphan sweep passes over every block, the
//! cheap routes (`/health`, `/processes`, `GET /pid/N/traced-memory`,
//! `/metrics`) answer at once, with the kernel's exact totals, and the
//! long work runs on threads at a lower priority than theirs. Before, a
//! process's traced memory waited for the kernel lock that a whole-table
//! scan held (measured in `docs/design/0011-measured-figures.md`), and
//! `/metrics` waited for it to read the counters and the maps' use.
use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime},
};

use reqwest::blocking::Client;
use serde_json::{Value, json};

use crate::suite::support::{Fixture, Program, Tracerd, poll, sample, u64_of};

/// Blocks of 16 bytes the big process holds.
const BLOCKS: u64 = 1_500_000;

/// How long the cheap routes are asked, at least: more than one sweep
/// interval (10 s), so that a sweep runs meanwhile.
const MEASURE: Duration = Duration::from_secs(14);

/// The bound of 99 % of the cheap answers while the long work runs.
const CHEAP_P99: Duration = Duration::from_millis(100);

/// The bound of every cheap answer: on a loaded 2-CPU host a thread can
/// wait a few hundred ms for a CPU (243 ms seen once), but never as long
/// as the long work (before, the cheap routes waited for its scans).
const CHEAP_MAX: Duration = Duration::from_secs(1);

/// The slowest long query takes longer than this (0.6 to 0.9 s for the
/// release tracerd on a quiet host, seconds for the debug one): three
/// times the cheap answers' p99 bound, so that a cheap answer that waited
/// for a long query would fail that bound.
const LONG_AT_LEAST: Duration = Duration::from_millis(300);

/// `millions` holding `blocks` blocks of 16 bytes, traced by `tracerd`.
fn holder(tracerd: &Tracerd, blocks: u64) -> Fixture {
    let prog = Program::build("millions", &[]);
    let mut fx = Fixture::spawn_traced(tracerd, &prog.exe, &[&blocks.to_string()]);
    fx.step("done");
    let pid = fx.pid();
    poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let process = tracerd.get_ok(&format!("/pid/{pid}"));
        match process["blocks"].as_u64() {
            Some(b) if b >= blocks => Ok(()),
            other => Err(format!("{other:?} blocks of {blocks} yet")),
        }
    });
    fx
}

/// (current, peak, blocks) of a `traced-memory` answer.
fn figures(memory: &Value) -> (u64, u64, u64) {
    (
        u64_of(memory, "current"),
        u64_of(memory, "peak"),
        u64_of(memory, "blocks"),
    )
}

fn unix_secs(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[test]
fn cheap_routes_answer_at_once_with_exact_totals_while_a_big_process_is_queried_and_swept() {
    let tracerd = Tracerd::start(&["--max-expensive-requests", "4"]);
    let big = holder(&tracerd, BLOCKS);
    let keepn = Program::build("keepn", &[]);
    let mut small = Fixture::spawn_traced(&tracerd, &keepn.exe, &["100"]);
    small.step("done");
    let (big_pid, small_pid) = (big.pid(), small.pid());

    // The small process's exact totals at rest: every block it holds, as
    // its snapshot has them (100 of 4096 bytes from one line, the few of
    // its start), equal to its traced memory.
    let stats = tracerd.get_ok(&format!("/pid/{small_pid}/statistics?limit=0"));
    let stats = stats["statistics"].as_array().expect("statistics");
    let size: u64 = stats.iter().map(|s| u64_of(s, "size")).sum();
    let count: u64 = stats.iter().map(|s| u64_of(s, "count")).sum();
    assert!(
        stats
            .iter()
            .any(|s| s["size"] == json!(409_600) && s["count"] == json!(100)),
        "{stats:?}"
    );
    let small_path = format!("/pid/{small_pid}/traced-memory");
    let big_path = format!("/pid/{big_pid}/traced-memory");
    let small_rest = figures(&tracerd.get_ok(&small_path));
    assert_eq!((small_rest.0, small_rest.2), (size, count));
    let big_rest = figures(&tracerd.get_ok(&big_path));
    // Its 1.5 M blocks of 16 bytes and its array of pointers (8 bytes
    // each), and the few of its start.
    assert!(
        big_rest.2 >= BLOCKS && big_rest.2 < BLOCKS + 10,
        "{big_rest:?}"
    );
    assert!(big_rest.0 >= BLOCKS * 24, "{big_rest:?}");

    let sweeps_before = tracerd.metric("tracer_orphan_sweeps_total");
    let done = AtomicBool::new(false);
    let client = Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .expect("client");
    let began = SystemTime::now();
    let (long, cheap) = std::thread::scope(|scope| {
        // The long work, one query after another until the cheap routes
        // were asked for MEASURE: every trace (statistics come from the
        // totals per stack now, in milliseconds; the traces still read
        // every block), then a stored snapshot.
        let long = scope.spawn(|| long_work(&tracerd, &client, big_pid, &done));
        // Meanwhile, each cheap route in turn: its status, how long it
        // took, and traced memory's figures.
        let cheap = scope.spawn(|| cheap_answers(&tracerd, &small_path, &big_path, &done));
        (
            long.join().expect("long queries"),
            cheap.join().expect("cheap queries"),
        )
    });
    let ended = SystemTime::now();

    // The long work ran, and its queries took long.
    assert!(long.len() >= 2, "{long:?}");
    for (method, status, expected, _) in &long {
        assert_eq!(status, expected, "{method}");
    }
    let slowest = long.iter().map(|l| l.3).max().unwrap_or_default();
    assert!(slowest > LONG_AT_LEAST, "{long:?}");
    let sweep_took = assert_a_sweep_overlapped(&tracerd, sweeps_before, began, ended);
    // Every cheap answer: 200, far under the long queries, with traced
    // memory's exact figures.
    let mut took: Vec<Duration> = cheap.iter().map(|(_, _, took, _)| *took).collect();
    took.sort_unstable();
    eprintln!(
        "{} cheap answers: p50 {:?}, p99 {:?}, slowest {:?}; long queries: {:?}; last sweep {sweep_took} s",
        cheap.len(),
        took[took.len() / 2],
        took[took.len() * 99 / 100],
        &took[took.len().saturating_sub(8)..],
        long.iter().map(|l| l.3).collect::<Vec<_>>()
    );
    assert!(cheap.len() >= 40, "{} answers", cheap.len());
    assert!(
        took[took.len() * 99 / 100] < CHEAP_P99,
        "{:?}",
        &took[took.len().saturating_sub(20)..]
    );
    for (path, status, took, body) in &cheap {
        assert_eq!(*status, 200, "{path}: {body}");
        assert!(*took < CHEAP_MAX, "{path} took {took:?}");
        if path == "/metrics" {
            assert!(body.as_f64().is_some(), "{path}: {body}");
        } else if *path == small_path {
            assert_eq!(figures(body), small_rest, "{path}: {body}");
        } else if *path == big_path {
            assert_eq!(figures(body), big_rest, "{path}: {body}");
        }
    }
    // The long work ran on threads of its own at nice 10, and no thread
    // of the cheap routes was lowered (Linux's nice is per thread, and
    // tracerd never raises one back).
    assert_expensive_threads_alone_are_lowered(&tracerd);
    drop(small);
    drop(big);
}

/// A sweep ran while the cheap routes were asked, from `began` to `ended`
/// (`sweeps_before`: the sweeps counted before): how long the last one
/// took, in seconds.
fn assert_a_sweep_overlapped(
    tracerd: &Tracerd,
    sweeps_before: f64,
    began: SystemTime,
    ended: SystemTime,
) -> f64 {
    // A sweep ran while the cheap routes were asked. The first to end
    // after the window began may have begun in the window and still run
    // (`/metrics` does not wait for it): its run overlaps the window.
    poll(Duration::from_secs(120), Duration::from_millis(100), || {
        let end = tracerd.metric("tracer_orphan_sweep_last_end_seconds");
        if end > unix_secs(began) {
            Ok(())
        } else {
            Err(format!("the last sweep ended at {end}"))
        }
    });
    let sweeps = tracerd.metric("tracer_orphan_sweeps_total");
    assert!(
        sweeps > sweeps_before,
        "{sweeps} sweeps, {sweeps_before} before"
    );
    let sweep_end = tracerd.metric("tracer_orphan_sweep_last_end_seconds");
    let sweep_took = tracerd.metric("tracer_orphan_sweep_last_seconds");
    assert!(
        sweep_end - sweep_took < unix_secs(ended) && sweep_end > unix_secs(began),
        "the last sweep ({sweep_took} s, ended at {sweep_end}) ran from {} to {}",
        unix_secs(began),
        unix_secs(ended)
    );
    sweep_took
}

/// The long work on `big_pid`, one query after another (with `client`)
/// until `done`: each query's method, status, expected status and time.
fn long_work(
    tracerd: &Tracerd,
    client: &Client,
    big_pid: u32,
    done: &AtomicBool,
) -> Vec<(&'static str, u16, u16, Duration)> {
    let mut took = Vec::new();
    while !done.load(Ordering::Acquire) {
        for (method, path, expected) in [
            ("GET", format!("/pid/{big_pid}/traces?limit=1"), 200),
            ("POST", format!("/pid/{big_pid}/snapshots"), 201),
        ] {
            let start = Instant::now();
            let url = format!("{}{path}", tracerd.base());
            let request = match method {
                "GET" => client.get(&url),
                _ => client.post(&url),
            };
            let response = request.send().expect("long query");
            let status = response.status().as_u16();
            let _ = response.bytes().expect("long answer");
            took.push((method, status, expected, start.elapsed()));
        }
    }
    took
}

/// Each cheap route in turn (the traced memory of `small_path` and
/// `big_path` among them) for [`MEASURE`], then `done` raised: each
/// answer's path, status, time and body (`/metrics`: its sweep count).
fn cheap_answers(
    tracerd: &Tracerd,
    small_path: &str,
    big_path: &str,
    done: &AtomicBool,
) -> Vec<(String, u16, Duration, Value)> {
    let cheap_client = Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let mut answers = Vec::new();
    // Let the first long query begin.
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    while start.elapsed() < MEASURE {
        for path in [small_path, big_path, "/processes", "/health", "/metrics"] {
            let asked = Instant::now();
            let response = cheap_client
                .get(format!("{}{path}", tracerd.base()))
                .send()
                .expect("cheap query");
            let status = response.status().as_u16();
            let body: Value = if path == "/metrics" {
                // Its counters, read without the kernel lock.
                let text = response.text().expect("text");
                json!(sample(&text, "tracer_orphan_sweeps_total", &[]))
            } else {
                response.json().expect("json")
            };
            answers.push((path.to_string(), status, asked.elapsed(), body));
        }
    }
    done.store(true, Ordering::Release);
    answers
}

/// tracerd's expensive threads run at nice 10, and its tokio threads at 0.
fn assert_expensive_threads_alone_are_lowered(tracerd: &Tracerd) {
    let threads = thread_nices(tracerd.pid());
    let expensive: Vec<_> = threads
        .iter()
        .filter(|(comm, _)| comm == "tracerd-expensi")
        .collect();
    assert!(!expensive.is_empty(), "{threads:?}");
    assert!(expensive.iter().all(|(_, nice)| *nice == 10), "{threads:?}");
    let tokio: Vec<_> = threads
        .iter()
        .filter(|(comm, _)| comm.starts_with("tokio-"))
        .collect();
    assert!(tokio.len() >= 2, "{threads:?}");
    assert!(tokio.iter().all(|(_, nice)| *nice == 0), "{threads:?}");
}

/// (comm, nice) of every thread of `pid`, from `/proc/PID/task/TID/stat`
/// (the nice value is its 19th field).
fn thread_nices(pid: u32) -> Vec<(String, i64)> {
    let mut threads = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let Ok(stat) = std::fs::read_to_string(entry.expect("task").path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            panic!("stat: {stat}");
        };
        let comm = stat[open + 1..close].to_string();
        // The fields after the comm start at the 3rd (state).
        let nice = stat[close + 1..]
            .split_whitespace()
            .nth(19 - 3)
            .and_then(|field| field.parse().ok())
            .unwrap_or_else(|| panic!("stat: {stat}"));
        threads.push((comm, nice));
    }
    threads
}
