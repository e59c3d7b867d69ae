//! Stacks: the whole caller chain of a block, deep chains of large frames
//! walked to `main`, and what becomes of a block whose stack found no room
//! in the stack store or was collected by its sweep.

use std::{path::Path, time::Duration};

use serde_json::Value;

use super::build;
use crate::suite::support::{Fixture, Tracerd, poll, stat_at, u64_of};

/// Runs `exe` (a fixture that says ready, allocates on go, says done)
/// under `tracerd`, and returns it (waiting for its last go) with the
/// frames of its traceback of `size` bytes (statistics by traceback).
fn traceback_of_size(tracerd: &Tracerd, exe: &Path, size: u64) -> (Fixture, Vec<Value>) {
    let mut fx = Fixture::spawn_traced(tracerd, exe, &[]);
    let pid = fx.pid();
    fx.step("done");
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
    let stat = body["statistics"]
        .as_array()
        .expect("array")
        .iter()
        .find(|s| s["size"] == size)
        .unwrap_or_else(|| panic!("no {size}-byte block in {body}"));
    let frames = stat["traceback"].as_array().expect("frames").clone();
    (fx, frames)
}

#[test]
fn traceback_grouping_shows_the_whole_caller_chain() {
    let prog = build("chain");
    let tracerd = Tracerd::start(&[]);
    let (mut fx, frames) = traceback_of_size(&tracerd, &prog.exe, 2468);
    let got: Vec<(Option<&str>, u64, Option<&str>)> = frames
        .iter()
        .take(3)
        .map(|f| {
            (
                f["filename"].as_str(),
                f["lineno"].as_u64().unwrap_or(0),
                f["function"].as_str(),
            )
        })
        .collect();
    let file = prog.source.to_str();
    assert_eq!(
        got,
        vec![
            (file, u64::from(prog.line("MAKE_BLOCK")), Some("make_block")),
            (file, u64::from(prog.line("GROW */")), Some("grow")),
            (file, u64::from(prog.line("MAIN */")), Some("main")),
        ]
    );
    assert!(
        frames[0]["module"]
            .as_str()
            .is_some_and(|m| m.ends_with("/chain")),
        "{frames:?}"
    );
    assert!(frames[0]["address"].as_u64().is_some());
    fx.end();
}

#[test]
fn a_deep_chain_of_large_frames_is_walked_to_main() {
    let prog = build("deep");
    // The largest nframe: its programs load, and its walk goes to main.
    let tracerd = Tracerd::start(&["--nframe", "64"]);
    let (mut fx, frames) = traceback_of_size(&tracerd, &prog.exe, 4321);
    let got: Vec<(Option<&str>, u64)> = frames
        .iter()
        .take(26)
        .map(|f| (f["filename"].as_str(), f["lineno"].as_u64().unwrap_or(0)))
        .collect();
    let file = prog.source.to_str();
    let mut want = vec![(file, u64::from(prog.line("DEEP_ALLOC")))];
    want.extend([(file, u64::from(prog.line("DEEP_CALL"))); 24]);
    want.push((file, u64::from(prog.line("DEEP_MAIN"))));
    assert_eq!(got, want);
    fx.end();
}

#[test]
fn blocks_whose_stack_was_not_stored_keep_their_exact_call_site() {
    let prog = build("manycallers");
    let line = prog.line("MANY_SITE");
    // Room for 256 stacks only, all of them for one process: most of the
    // 600 cannot be stored.
    let tracerd = Tracerd::start(&["--max-stacks", "256", "--process-share", "100"]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    let pid = fx.pid();
    fx.step("done");
    let maps = tracerd.maps();
    let dropped = maps["counters"]["drop_stack"].as_u64().expect("drop_stack");
    assert!(
        dropped >= 600 - 256,
        "only {dropped} stacks dropped: {maps}"
    );
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    let stat = stat_at(&body["statistics"], &prog.source, line).expect("the allocation site");
    assert_eq!(stat["count"], 600, "{stat}");
    assert_eq!(stat["size"], 600 * 48);
    fx.end();
}

#[test]
fn a_stack_collected_by_the_sweep_is_stored_again_by_its_next_allocation() {
    let prog = build("gcstacks");
    let line = prog.line("GC_SITE");
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    // Only this process, and room for 256 stacks: the sweep collects
    // unreferenced stacks once more than 128 are stored.
    let scope = pid.to_string();
    let tracerd = Tracerd::start(&[
        "--scope-pid",
        &scope,
        "--max-stacks",
        "256",
        "--process-share",
        "100",
    ]);
    fx.step("freed");
    let stacks = |tracerd: &Tracerd| u64_of(&tracerd.maps()["maps"]["STACKS"], "entries");
    assert!(stacks(&tracerd) >= 150, "{}", stacks(&tracerd));
    // The sweep runs every 10 s.
    poll(Duration::from_secs(30), Duration::from_millis(200), || {
        if stacks(&tracerd) >= 150 {
            Err("no stack collected".to_string())
        } else {
            Ok(())
        }
    });
    fx.step("kept");
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
    let stat = stat_at(&body["statistics"], &prog.source, line).expect("the kept block");
    assert_eq!(stat["count"], 1, "{stat}");
    // alloc_here <- caller149 <- main: the whole stack, not the call site alone.
    let functions: Vec<&str> = stat["traceback"]
        .as_array()
        .expect("traceback")
        .iter()
        .take(3)
        .map(|f| f["function"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(functions, ["alloc_here", "caller149", "main"], "{stat}");
    fx.end();
}
