//! Stopping: SIGTERM and SIGINT stop tracerd within 5 s with its last-stop
//! record written, and after SIGTERM, SIGINT or SIGKILL nothing it held
//! (program, map, link, uprobe event) is left in the kernel.

use std::time::Duration;

use serde_json::Value;

use super::Running;
use crate::suite::support::{bpf_ids, bpftool_shows, left_after, uprobe_events_of};

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
    // Every object it holds is shown, but for those it let go of meanwhile:
    // the spill maps of short-lived processes, given as soon as they make
    // their first allocation and dropped at their end.
    let unseen: Vec<(&str, u32)> = held
        .iter()
        .filter(|(kind, id)| !bpftool_shows(kind, *id))
        .copied()
        .collect();
    let still = bpf_ids(pid);
    for (kind, id) in &unseen {
        assert!(
            !still.contains(&(*kind, *id)),
            "bpftool does not show {kind} {id} while tracerd holds it"
        );
        assert_ne!(*kind, "prog", "program {id} gone while tracerd runs");
    }
    let (clean, took) = running.stop(signal);
    assert_eq!(clean, expect_clean_exit, "exit after SIG{signal}");
    if expect_clean_exit {
        assert!(took < Duration::from_secs(5), "SIG{signal} took {took:?}");
    }
    assert_eq!(
        left_after(&held, Duration::from_secs(10)),
        Vec::new(),
        "left in the kernel after SIG{signal}"
    );
    assert_eq!(uprobe_events_of(pid), Vec::<String>::new());
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
