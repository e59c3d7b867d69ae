//! Cut tracebacks are never hidden: a full stack map cuts the tracebacks of
//! the blocks whose stacks it cannot take, and the process says so
//! (`complete: false`, `cut_tracebacks`), as do the counters, `/metrics`
//! and a WARN in the log; once the map has room again (its unreferenced
//! stacks collected), new blocks are whole.

use serde_json::Value;

use crate::suite::support::{Fixture, Program, Tracerd, poll, u64_of};

/// Frames of a trace's traceback.
fn frames(trace: &Value) -> usize {
    trace["traceback"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_full_stack_map_cuts_tracebacks_says_so_and_new_blocks_are_whole_once_it_has_room() {
    let prog = Program::build("stackfill", &[]);
    // A map of 256 stacks, all of them this process's to take (its share
    // is the whole map), and nobody else's: the scope is this program
    // (its exec is held until its tables are there).
    let exe = prog.exe.to_str().expect("utf-8").to_string();
    let tracerd = Tracerd::start_logged(&[
        "--max-stacks",
        "256",
        "--process-share",
        "100",
        "--scope-exe",
        &exe,
    ]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    let pid = fx.pid();
    fx.step("full");
    let traces = || -> Vec<Value> {
        tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0"))["traces"]
            .as_array()
            .expect("traces")
            .clone()
    };
    let all = traces();
    // 600 call sites, 600 stacks: 256 stored whole, the 344 the full map
    // refused keep their call site alone.
    assert_eq!(all.len(), 600);
    assert_eq!(all.iter().filter(|t| frames(t) > 1).count(), 256);
    assert_eq!(all.iter().filter(|t| frames(t) == 1).count(), 344);
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?limit=0"));
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
    // An answer of its data says it too.
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
    let again = traces();
    // Ten sites again: each whole, down to main.
    assert_eq!(again.len(), 10);
    for trace in &again {
        assert!(frames(trace) > 1, "{trace}");
        assert!(
            trace["traceback"]
                .as_array()
                .expect("frames")
                .iter()
                .any(|f| f["function"] == "main"),
            "{trace}"
        );
    }
    // No traceback cut since: the count is the one of the full map.
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    assert_eq!(process["cut_tracebacks"], 344, "{process}");
    assert_eq!(process["blocks"], 10, "{process}");
    fx.end();
}
