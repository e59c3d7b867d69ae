//! Stopping: SIGTERM and SIGINT stop tracerd within 5 s with its last-stop
//! record written, and after SIGTERM, SIGINT or SIGKILL nothing it held
//! (program, map, link, uprobe event) is left in the kernel.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::Running;
use crate::suite::support::{bpf_ids, bpftool_shows};

/// The uprobe events tracerd `pid` registered (aya names them `aya_{pid}_...`).
fn our_uprobe_events(pid: u32) -> Vec<String> {
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events")
        .or_else(|_| std::fs::read_to_string("/sys/kernel/debug/tracing/uprobe_events"))
        .unwrap_or_default();
    events
        .lines()
        .filter(|l| l.contains(&format!("aya_{pid}_")))
        .map(str::to_string)
        .collect()
}

/// Starts tracerd, records what it holds in the kernel, stops it with
/// `signal`, and checks that every program, map and link is gone.
fn stop_leaves_nothing(signal: &str, expect_clean_exit: bool) {
    let mut running = Running::start(&[], &[]);
    let pid = running.pid();
    let held = bpf_ids(pid);
    let programs = held.iter().filter(|(kind, _)| *kind == "prog").count();
    assert!(
        programs >= tracer_common::TRACEPOINTS.len() + 2,
        "tracerd holds {held:?}"
    );
    for (kind, id) in &held {
        assert!(
            bpftool_shows(kind, *id),
            "bpftool does not show {kind} {id} while tracerd runs"
        );
    }
    let (clean, took) = running.stop(signal);
    assert_eq!(clean, expect_clean_exit, "exit after SIG{signal}");
    if expect_clean_exit {
        assert!(took < Duration::from_secs(5), "SIG{signal} took {took:?}");
    }
    // The kernel frees programs and maps once their last reference goes,
    // after an RCU grace period.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left: Vec<_> = held.clone();
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|(kind, id)| bpftool_shows(kind, *id));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(left, Vec::new(), "left in the kernel after SIG{signal}");
    assert_eq!(our_uprobe_events(pid), Vec::<String>::new());
    if expect_clean_exit {
        let record: Value = serde_json::from_slice(
            &std::fs::read(running.state.path().join("last-stop.json"))
                .expect("last-stop.json written"),
        )
        .expect("JSON");
        assert_eq!(record["drained"], true);
        assert!(record["counters"]["allocs"].as_u64().is_some(), "{record}");
    }
}

#[test]
fn sigterm_stops_within_5s_and_leaves_no_program_map_or_link() {
    stop_leaves_nothing("TERM", true);
}

#[test]
fn sigint_stops_within_5s_and_leaves_no_program_map_or_link() {
    stop_leaves_nothing("INT", true);
}

#[test]
fn sigkill_leaves_no_program_map_or_link() {
    stop_leaves_nothing("KILL", false);
}
