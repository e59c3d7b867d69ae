//! Prompt, clean stops under load: SIGTERM during a
//! snapshot of a process holding 4,000,000 live blocks, during 64 clients
//! hammering the heavy routes, during a churn of 1,000 processes a second,
//! and with hundreds of probes attached (the installed allocators probed
//! for every process, and for each of a scope of pids). Each stop ends with
//! status 0 within 5 s of the signal, with this stop's last-stop record
//! written, no uprobe event, BPF program or link of tracerd left in the
//! kernel, and every snapshot stored before it read back whole by the next
//! tracerd on the same state directory.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use reqwest::blocking::Client;
use serde_json::Value;

use crate::suite::support::{
    Fixture, Program, TempDir, Tracerd, bpf_ids, left_after, poll, snapshot_ids, u64_of,
    uprobe_events_of,
};

/// The longest a stop may take (the goal, with the default grace
/// period of 3 s).
const STOP_LIMIT: Duration = Duration::from_secs(5);

/// What every tracerd here runs with, with allocator discovery on as by
/// default: each program's probes in an object are one uprobe_multi link,
/// so the allocators the host's other processes run (a jemalloc-linked
/// rustc adds 18 probes) no longer decide a stop's time. No automatic
/// snapshots: the stored ones are exactly those the test takes.
const ARGS: [&str; 2] = ["--snapshot-interval", "0"];

/// [`ARGS`] and `extra`.
fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    ARGS.iter().copied().chain(extra.iter().copied()).collect()
}

/// A stored snapshot as the API gave it before the stop: its summary and
/// its file (`GET /snapshots/{id}/dump`).
struct Kept {
    summary: Value,
    dump: Vec<u8>,
}

/// Stores a snapshot of `pid` labelled `label` and reads back its file.
fn store(tracerd: &Tracerd, pid: u32, label: &str) -> Kept {
    let (status, summary) = tracerd.post(&format!("/pid/{pid}/snapshots?label={label}"));
    assert_eq!(status, 201, "POST /pid/{pid}/snapshots: {summary}");
    let id = u64_of(&summary, "id");
    let (status, dump) = tracerd.get_bytes(&format!("/snapshots/{id}/dump"));
    assert_eq!(status, 200, "GET /snapshots/{id}/dump");
    Kept { summary, dump }
}

/// A small traced process holding 100 blocks of 4096 bytes from one line
/// (`keepn`), with two snapshots of it stored: what the stop must not lose.
fn kept_snapshots(tracerd: &Tracerd) -> (Fixture, Program, Vec<Kept>) {
    let prog = Program::build("keepn", &[]);
    let keeper = Fixture::spawn_traced(tracerd, &prog.exe, &["100"]);
    let kept = keep_snapshots_of(tracerd, keeper);
    (kept.0, prog, kept.1)
}

/// Lets `keeper` (`keepn 100`, traced) allocate its blocks and stores two
/// snapshots of it.
fn keep_snapshots_of(tracerd: &Tracerd, mut keeper: Fixture) -> (Fixture, Vec<Kept>) {
    keeper.step("done");
    let kept = vec![
        store(tracerd, keeper.pid(), "before-stop-1"),
        store(tracerd, keeper.pid(), "before-stop-2"),
    ];
    for k in &kept {
        // The 100 blocks, and the few of its start (stdio, its array).
        assert!(
            (100..110).contains(&u64_of(&k.summary, "traces")),
            "{}",
            k.summary
        );
    }
    (keeper, kept)
}

/// The uprobes tracerd attaches for every process, or for each process of
/// a scope of pids: at each probe point `GET /health` lists
/// (`symbol@offset` or `symbol+skip@offset`), an entry probe and, where
/// the symbol's programs have one, a return probe. Waits until the count
/// holds still (the installed allocators are probed just after start).
fn uprobes_per_process(tracerd: &Tracerd) -> usize {
    let count = || {
        let health = tracerd.get_ok("/health");
        let mut uprobes = 0;
        for library in health["libraries"].as_array().expect("libraries") {
            for point in library["probes"].as_array().expect("probes") {
                let point = point.as_str().expect("a probe point");
                let symbol = point.split(['@', '+']).next().expect("a symbol");
                let spec = tracer_common::PROBES
                    .iter()
                    .find(|spec| spec.symbol == symbol)
                    .unwrap_or_else(|| panic!("{point}: not a probed symbol"));
                uprobes += 1 + usize::from(spec.exit.is_some());
            }
        }
        uprobes
    };
    let mut last = count();
    poll(Duration::from_secs(30), Duration::from_millis(500), || {
        let now = count();
        let steady = now == last;
        last = now;
        if steady {
            Ok(())
        } else {
            Err(format!("{now} uprobes, still growing"))
        }
    });
    last
}

/// What perf events allowed: each costs about 0.09 s to detach, one after
/// another, so a stop within 5 s held fewer than about 50 probes.
const PERF_EVENT_PROBES: usize = 50;

/// A tracerd on a state directory of its own (`name`) that also probes
/// the installed allocators: jemalloc, tcmalloc and mimalloc (the suite's
/// allocator fixtures link them) besides glibc and musl, hundreds of
/// uprobes for each process it traces.
fn with_installed_allocators(name: &str) -> (TempDir, Tracerd) {
    let state = TempDir::new(name);
    let tracerd = Tracerd::start_at(
        state.path(),
        &args(&["--probe-installed-allocators", "true"]),
    );
    (state, tracerd)
}

/// The BPF links tracerd holds: one per program, object and process (or
/// all) where the kernel has uprobe_multi links, and the tracepoints'.
fn links_held(tracerd: &Tracerd) -> usize {
    bpf_ids(tracerd.pid())
        .iter()
        .filter(|(kind, _)| *kind == "link")
        .count()
}

/// Unix time now, in ms.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Stops `tracerd` (on `state`) with SIGTERM and checks the stop: exit
/// status 0 within [`STOP_LIMIT`], nothing of it left in the kernel, this
/// stop's record in `last-stop.json`, and every snapshot of `kept` read
/// back unchanged by a tracerd started again on `state`. Returns the time
/// the stop took.
fn stop_cleanly(tracerd: &mut Tracerd, state: &Path, kept: &[Kept]) -> Duration {
    let pid = tracerd.pid();
    let held = bpf_ids(pid);
    assert!(
        held.iter().filter(|(kind, _)| *kind == "prog").count()
            >= tracer_common::TRACEPOINTS.len() + 2,
        "tracerd holds {held:?}"
    );
    let signalled_ms = unix_ms();
    let (clean, took) = tracerd.terminate();
    eprintln!("SIGTERM to exit: {took:?}");
    assert!(
        clean,
        "tracerd exited with a failure after SIGTERM ({took:?})"
    );
    assert!(took < STOP_LIMIT, "SIGTERM took {took:?}");
    assert_eq!(
        left_after(&held, Duration::from_secs(10)),
        Vec::new(),
        "left in the kernel after SIGTERM"
    );
    assert_eq!(uprobe_events_of(pid), Vec::<String>::new());
    let record: Value = serde_json::from_slice(
        &std::fs::read(state.join("last-stop.json")).expect("last-stop.json written"),
    )
    .expect("JSON");
    let stopped_ms = u64_of(&record, "stopped_at_ms");
    assert!(
        (signalled_ms..signalled_ms + STOP_LIMIT.as_millis() as u64).contains(&stopped_ms),
        "this stop's record: signalled at {signalled_ms}, {record}"
    );
    assert!(record["counters"]["allocs"].as_u64().is_some(), "{record}");
    let again = Tracerd::start_at(state, &ARGS);
    let list = again.get_ok("/snapshots");
    assert_eq!(
        snapshot_ids(&list),
        kept.iter()
            .map(|k| u64_of(&k.summary, "id"))
            .collect::<Vec<_>>(),
        "every snapshot stored before the stop, and only those"
    );
    assert_eq!(list["unreadable"], Value::Array(Vec::new()));
    for k in kept {
        let id = u64_of(&k.summary, "id");
        let mut summary = again.get_ok(&format!("/snapshots/{id}"));
        assert_eq!(summary["this_run"], false, "{summary}");
        summary["this_run"] = Value::Bool(true);
        assert_eq!(summary, k.summary, "snapshot {id} after the restart");
        let (status, dump) = again.get_bytes(&format!("/snapshots/{id}/dump"));
        assert_eq!(status, 200, "GET /snapshots/{id}/dump after the restart");
        assert!(
            dump == k.dump,
            "snapshot {id}'s file changed across the stop"
        );
    }
    took
}

#[test]
fn sigterm_during_a_snapshot_of_4m_blocks_stops_within_5s_and_loses_nothing() {
    let state = TempDir::new("stop-snapshot");
    // One expensive request at a time: a second one answers 429 while the
    // snapshot runs, which tells the test that it is in flight. No grace
    // period: the snapshot of 4 M blocks takes about 1 s, less
    // than the default grace of 3 s, and the stop must find it reading.
    let mut tracerd = Tracerd::start_at(
        state.path(),
        &args(&[
            "--max-live-blocks",
            "8388608",
            "--process-share",
            "100",
            "--max-expensive-requests",
            "1",
            "--shutdown-grace-secs",
            "0",
        ]),
    );
    let (_keeper, _keepn, kept) = kept_snapshots(&tracerd);
    let prog = Program::build("millions", &["-pthread"]);
    let mut big = Fixture::spawn_traced(&tracerd, &prog.exe, &["4000000", "2"]);
    big.step("done");
    let process = tracerd.get_ok(&format!("/pid/{}", big.pid()));
    assert!(u64_of(&process, "blocks") >= 4_000_000, "{process}");
    let snapshot = std::thread::spawn({
        let client = Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let url = format!("{}/pid/{}/snapshots", tracerd.base(), big.pid());
        // The poll below takes the one permit for a moment at a time: a
        // POST that meets it gets 429 and is sent again.
        move || -> Result<u16, reqwest::Error> {
            for _ in 0..1000 {
                let status = client.post(&url).send()?.status().as_u16();
                if status != 429 {
                    return Ok(status);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(429)
        }
    });
    // A pid no process has: answered 404 at once when admitted, 429 while
    // the snapshot holds the one permit.
    poll(
        Duration::from_secs(20),
        Duration::from_millis(20),
        || match tracerd.get("/pid/4000000000/statistics").0 {
            429 => Ok(()),
            status => Err(format!("the snapshot is not in flight yet ({status})")),
        },
    );
    let took = stop_cleanly(&mut tracerd, state.path(), &kept);
    // The snapshot was cut: its connection closed or it answered 503
    // (never 201: what it read after the stop began is partial).
    match snapshot.join().expect("snapshot thread") {
        Ok(status) => assert_eq!(status, 503, "the snapshot in flight at the stop"),
        Err(err) => assert!(!err.is_timeout(), "the snapshot request: {err}"),
    }
    eprintln!("4 M blocks: stop took {took:?}");
}

#[test]
fn sigterm_during_64_clients_on_heavy_routes_stops_within_5s_and_loses_nothing() {
    let state = TempDir::new("stop-clients");
    let mut tracerd = Tracerd::start_at(state.path(), &args(&["--request-timeout-secs", "60"]));
    let (_keeper, _keepn, kept) = kept_snapshots(&tracerd);
    let prog = Program::build("millions", &[]);
    let mut heavy = Fixture::spawn_traced(&tracerd, &prog.exe, &["300000"]);
    heavy.step("done");
    let pid = heavy.pid();
    let routes = [
        ("GET", format!("/pid/{pid}/statistics?key_type=traceback")),
        ("GET", format!("/pid/{pid}/traces")),
        ("GET", format!("/pid/{pid}/statistics")),
        ("GET", "/maps".to_string()),
        ("GET", "/metrics".to_string()),
        ("GET", "/processes".to_string()),
    ];
    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let heavy_ok = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..64)
        .map(|i| {
            let (method, path) = routes[i % routes.len()].clone();
            let url = format!("{}{path}", tracerd.base());
            let (done, answered, heavy_ok) = (done.clone(), answered.clone(), heavy_ok.clone());
            std::thread::spawn(move || {
                let client = Client::builder()
                    .timeout(Duration::from_secs(30))
                    .build()
                    .expect("client");
                while !done.load(Ordering::Relaxed) {
                    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
                    match client.request(method, &url).send() {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let _ = response.bytes();
                            answered.fetch_add(1, Ordering::Relaxed);
                            if status == 200 && url.contains("/pid/") {
                                heavy_ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
        })
        .collect();
    poll(
        Duration::from_secs(60),
        Duration::from_millis(50),
        || match (
            answered.load(Ordering::Relaxed),
            heavy_ok.load(Ordering::Relaxed),
        ) {
            (a, h) if a >= 256 && h >= 4 => Ok(()),
            (a, h) => Err(format!("{a} answers, {h} heavy ones, so far")),
        },
    );
    let started = Instant::now();
    let took = stop_cleanly(&mut tracerd, state.path(), &kept);
    done.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("client thread");
    }
    eprintln!(
        "64 clients, {} answers: stop took {took:?} ({:?} with the restart)",
        answered.load(Ordering::Relaxed),
        started.elapsed()
    );
}

#[test]
fn sigterm_during_a_churn_of_1000_processes_a_second_stops_within_5s_and_loses_nothing() {
    let state = TempDir::new("stop-churn");
    let mut tracerd = Tracerd::start_at(state.path(), &ARGS);
    let (_keeper, _keepn, kept) = kept_snapshots(&tracerd);
    let prog = Program::build("churn", &[]);
    let mut churn = Fixture::spawn_traced(&tracerd, &prog.exe, &["1000"]);
    churn.go();
    let started = Instant::now();
    churn.expect_line("1000");
    churn.expect_line("2000");
    churn.expect_line("3000");
    let rate = 3000.0 / started.elapsed().as_secs_f64();
    // The children were traced: their ended images are listed.
    let processes = tracerd.get_ok("/processes");
    let children = processes["processes"]
        .as_array()
        .expect("process list")
        .iter()
        .filter(|p| p["comm"] == "churn" && p["pid"] != churn.pid())
        .count();
    assert!(children >= 100, "{children} churn children traced");
    let took = stop_cleanly(&mut tracerd, state.path(), &kept);
    eprintln!("churn at {rate:.0}/s, {children} children traced: stop took {took:?}");
}

#[test]
fn sigterm_with_the_installed_allocators_probed_stops_within_5s_and_leaves_nothing() {
    let (state, mut tracerd) = with_installed_allocators("stop-installed");
    let (_keeper, _keepn, kept) = kept_snapshots(&tracerd);
    let uprobes = uprobes_per_process(&tracerd);
    assert!(
        uprobes >= 3 * PERF_EVENT_PROBES,
        "{uprobes} uprobes: {}",
        tracerd.get_ok("/health")
    );
    // One link per program and object: far fewer links than uprobes.
    let links = links_held(&tracerd);
    assert!(links < uprobes, "{links} links for {uprobes} uprobes");
    let took = stop_cleanly(&mut tracerd, state.path(), &kept);
    eprintln!("{uprobes} uprobes in {links} links: stop took {took:?}");
}

#[test]
fn sigterm_with_a_scope_of_pids_probed_one_by_one_stops_within_5s_and_leaves_nothing() {
    let (state, mut tracerd) = with_installed_allocators("stop-scope-pids");
    let prog = Program::build("keepn", &[]);
    let fixtures: Vec<Fixture> = (0..4)
        .map(|_| Fixture::spawn_ready(&prog.exe, &["100"]))
        .collect();
    let pids: Vec<u32> = fixtures.iter().map(Fixture::pid).collect();
    let uprobes = uprobes_per_process(&tracerd);
    // A scope of pids alone: every probe is registered for each process of
    // it (its own links, with its pid), none for the others.
    let query: Vec<String> = pids.iter().map(|pid| format!("pid={pid}")).collect();
    let (status, body) = tracerd.put(&format!("/scope?{}", query.join("&")));
    assert_eq!(status, 200, "{body}");
    let mut attached: Vec<u64> = body["attached_pids"]
        .as_array()
        .expect("attached_pids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    attached.sort_unstable();
    let mut expected: Vec<u64> = pids.iter().map(|pid| u64::from(*pid)).collect();
    expected.sort_unstable();
    assert_eq!(attached, expected, "{body}");
    let total = uprobes * pids.len();
    assert!(total >= 12 * PERF_EVENT_PROBES, "{total} uprobes");
    let mut fixtures = fixtures.into_iter();
    let keeper = fixtures.next().expect("a fixture");
    tracerd.wait_traced(keeper.pid());
    let (_keeper, kept) = keep_snapshots_of(&tracerd, keeper);
    let links = links_held(&tracerd);
    assert!(links < total, "{links} links for {total} uprobes");
    let took = stop_cleanly(&mut tracerd, state.path(), &kept);
    eprintln!(
        "{} processes, {total} uprobes in {links} links: stop took {took:?}",
        pids.len()
    );
}
