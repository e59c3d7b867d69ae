//! Cut tracebacks are never hidden: a full stack map cuts the tracebacks of
//! the blocks whose stacks it cannot take, and the process says so
//! (`complete: false`, `cut_tracebacks`), as do the counters, `/metrics`
//! and a WARN in the log; once the map has room again (its unreferenced
//! stacks collected), new blocks are whole.

use serde_json::Value;

use crate::suite::support::{Fixture, Program, Tracerd, poll, u64_of};

/// Frames of a statistic's traceback.
fn frames(statistic: &Value) -> usize {
    statistic["traceback"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_full_stack_map_cuts_tracebacks_says_so_and_new_blocks_are_whole_once_it_has_room() {
    let prog = Program::build("stackfill", &[]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    // A map of 256 stacks, all of them this process's to take (its share
    // is the whole map), and nobody else's: the scope is this process.
    let tracerd = Tracerd::start_logged(&[
        "--max-stacks",
        "256",
        "--process-share",
        "100",
        "--scope-pid",
        &pid.to_string(),
    ]);
    fx.step("full");
    tracerd.wait_traced(pid);
    let by_traceback =
        || tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
    let body = by_traceback();
    let stats = body["statistics"].as_array().expect("statistics");
    // 600 call sites, 600 stacks: 256 stored whole, the 344 the full map
    // refused keep their call site alone, each a group of its own.
    assert_eq!(
        stats.iter().filter(|s| frames(s) > 1).count(),
        256,
        "{body}"
    );
    let cut: Vec<&Value> = stats.iter().filter(|s| frames(s) == 1).collect();
    assert_eq!(cut.len(), 344, "{body}");
    assert!(cut.iter().all(|s| s["count"] == 1 && s["size"] == 100));
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    assert_eq!(
        (
            &process["blocks"],
            &process["drops"],
            &process["cut_tracebacks"],
            &process["complete"]
        ),
        (&600.into(), &0.into(), &344.into(), &false.into()),
        "{process}"
    );
    // The answer says it too.
    assert_eq!(body["complete"], false, "{body}");
    assert_eq!(body["cut_tracebacks"], 344, "{body}");
    assert_eq!(
        body["cut_tracebacks_by_pid"][pid.to_string()],
        344,
        "{body}"
    );
    assert_eq!(tracerd.counter("drop_stack"), 344);
    assert_eq!(tracerd.counter("cut_tracebacks"), 344);
    assert_eq!(tracerd.drops_total("stack_store_full"), 344.0);
    assert_eq!(tracerd.metric("tracer_cut_tracebacks_total"), 344.0);
    // The log says so (at its next pass, every 10 s), once.
    poll(
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(200),
        || {
            let log = tracerd.log();
            let full = log.contains("the stack map is full") && log.contains("max_stacks");
            let process =
                log.contains("a process had tracebacks cut") && log.contains(&format!("pid={pid}"));
            (full && process)
                .then_some(())
                .ok_or_else(|| "no WARN yet".to_string())
        },
    );
    assert_eq!(tracerd.log().matches("the stack map is full").count(), 1);

    // Freed: no block names the stacks now, and the map's next collection
    // removes them.
    fx.step("freed");
    poll(
        std::time::Duration::from_secs(40),
        std::time::Duration::from_millis(200),
        || {
            let stored = u64_of(&tracerd.maps()["maps"]["STACKS"], "entries");
            (stored < 128)
                .then_some(())
                .ok_or_else(|| format!("{stored} stacks stored"))
        },
    );
    fx.step("again");
    let body = by_traceback();
    let stats = body["statistics"].as_array().expect("statistics");
    // Ten sites again: each whole, down to main.
    assert_eq!(stats.len(), 10, "{body}");
    for statistic in stats {
        assert!(frames(statistic) > 1, "{statistic}");
        assert!(
            statistic["traceback"]
                .as_array()
                .expect("frames")
                .iter()
                .any(|f| f["function"] == "main"),
            "{statistic}"
        );
    }
    // No traceback cut since: the count is the one of the full map.
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    assert_eq!(process["cut_tracebacks"], 344, "{process}");
    assert_eq!(process["blocks"], 10, "{process}");
    fx.end();
}
