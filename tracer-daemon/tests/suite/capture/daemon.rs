//! tracerd itself: it never traces itself, its own allocations do not
//! trap at its probes, it stops cleanly on SIGTERM, and it answers a bad
//! request with a 4xx whose hint names the valid values.

use std::time::Duration;

use crate::suite::support::{Fixture, Program, Tracerd};

#[test]
fn tracerd_never_traces_itself_and_stops_cleanly_on_sigterm() {
    let mut tracerd = Tracerd::start(&[]);
    // Make tracerd allocate a lot: symbolization and JSON of every process.
    for _ in 0..5 {
        let (status, _) = tracerd.get("/processes");
        assert_eq!(status, 200);
    }
    let (status, body) = tracerd.get(&format!("/pid/{}", tracerd.pid()));
    assert_eq!(status, 404, "{body}");
    let (clean, took) = tracerd.terminate();
    assert!(clean, "tracerd did not exit 0 on SIGTERM");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn bad_requests_get_a_4xx_that_names_the_valid_values() {
    let tracerd = Tracerd::start(&[]);
    let cases: [(&str, u16, &str); 8] = [
        ("/pid/abc/statistics", 400, "pid is a positive integer"),
        (
            "/pid/1/statistics?group_by=line",
            400,
            "group_by is one of: filename, lineno, traceback",
        ),
        (
            "/pid/1/statistics?cumulative=yes",
            400,
            "cumulative is one of: true, false, 1, 0",
        ),
        (
            "/pid/1/statistics?limit=-3",
            400,
            "limit is a whole number >= 0 (0 means all)",
        ),
        (
            "/pid/1/statistics?format=xml",
            400,
            "format is one of: json, text, pprof, collapsed, svg",
        ),
        (
            "/pid/1/statistics?bogus=1",
            400,
            "valid parameters: group_by, cumulative, limit, format",
        ),
        (
            "/pid/4000000/statistics",
            404,
            "GET /processes lists the traced pids",
        ),
        ("/nope", 404, "GET /health"),
    ];
    for (path, status, hint) in cases {
        let (got, body) = tracerd.get(path);
        assert_eq!(got, status, "{path}: {body}");
        assert!(
            body["hint"].as_str().is_some_and(|h| h.contains(hint)),
            "{path}: {body}"
        );
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{path}: {body}"
        );
    }
}

/// tracerd allocates through its own allocator (mimalloc), which nothing
/// probes: heavy requests (every trace of a 50,000-block process as JSON,
/// a snapshot, statistics by traceback) make it allocate hundreds of
/// thousands of times, and its calls into the probed allocators
/// (`tracerd_calls`, counted by the entry programs) stay at what C code in
/// libc allocates: fewer than one per 100 traces served.
#[test]
fn tracerd_s_own_allocations_do_not_trap_at_its_probes() {
    const BLOCKS: u64 = 50_000;
    let prog = Program::build("keepn", &[]);
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[&BLOCKS.to_string()]);
    let pid = fx.pid();
    fx.step("done");
    let before = tracerd.counter("tracerd_calls");
    let mut served = 0;
    for _ in 0..3 {
        let (status, body) = tracerd.get(&format!("/pid/{pid}/traces?limit=0"));
        assert_eq!(status, 200);
        let traces = body["traces"].as_array().map_or(0, Vec::len) as u64;
        assert!(traces >= BLOCKS, "{traces} traces");
        served += traces;
        let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
        assert_eq!(status, 201);
        let (status, _) = tracerd.get(&format!("/pid/{pid}/statistics?group_by=traceback"));
        assert_eq!(status, 200);
    }
    let calls = tracerd.counter("tracerd_calls") - before;
    eprintln!("tracerd's own allocator calls that trapped: {calls} for {served} traces served");
    assert!(
        calls * 100 < served,
        "{calls} calls of tracerd's trapped at its probes for {served} traces served"
    );
    fx.end();
}
