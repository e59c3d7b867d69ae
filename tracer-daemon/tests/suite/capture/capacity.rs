//! Fair capacity: one process that wants more live blocks than the kernel
//! maps hold (5 M, beyond the 4.65 M of the default maps) keeps only its
//! share (`process_share`, 50 % by default), its drops counted, while a
//! small process traced beside it stays complete and exact; the same for
//! the stack map, whose last quarter is kept for processes with few stacks.

use serde_json::Value;

use super::allocators::{C_API, expect};
use crate::suite::support::{Fixture, Program, Tracerd};

/// Blocks the hoarding process allocates.
const HOARD: u64 = 5_000_000;

fn u64_at(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

#[test]
fn a_process_past_its_share_leaves_the_others_complete() {
    let tracerd = Tracerd::start(&[]);
    let share = u64_at(&tracerd.maps(), "process_max_blocks");
    // (4194304 + 458752) blocks of the default maps, halved.
    assert_eq!(share, 2_326_528);
    let hoard = Program::build("hoard", &[]);
    let mut big = Fixture::spawn_traced(&tracerd, &hoard.exe, &[&HOARD.to_string()]);
    let big_pid = big.pid();
    let before = tracerd.get_ok(&format!("/pid/{big_pid}"));
    let blocks_before = u64_at(&before, "blocks");
    assert_eq!(u64_at(&before, "drops"), 0, "{before}");
    big.step("done");
    // It holds exactly its share; every block past it is a drop, counted
    // for it and flagged.
    let after = tracerd.get_ok(&format!("/pid/{big_pid}"));
    assert_eq!(u64_at(&after, "blocks"), share, "{after}");
    assert_eq!(
        u64_at(&after, "drops"),
        blocks_before + HOARD - share,
        "{after}"
    );
    assert_eq!(after["complete"], false, "{after}");
    assert_eq!(tracerd.counter("drop_share"), blocks_before + HOARD - share);
    assert_eq!(
        tracerd.drops_total("process_share"),
        (blocks_before + HOARD - share) as f64
    );
    // A small process beside it: every block, exact at its lines.
    let small = Program::build("allocator_libs", &[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &small.exe, &[]);
    let pid = fx.pid();
    fx.step("done");
    let stats = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    assert_eq!(stats["complete"], true, "{}", stats["drops"]);
    expect(&small, &stats["statistics"], "beside the hoard", C_API);
    let view = tracerd.get_ok(&format!("/pid/{pid}"));
    assert_eq!(
        (view["drops"].as_u64(), view["complete"].as_bool()),
        (Some(0), Some(true))
    );
    fx.end();
    big.end();
}

#[test]
fn processes_past_their_share_of_stacks_leave_the_others_their_tracebacks() {
    // 600 distinct stacks each, two processes, against a 1024-stack map:
    // the first keeps its share (512); the second stores until the map is
    // three quarters full (768) and its reserve (the last 256) is kept for
    // processes with fewer than 64 stacks; the rest of their blocks keep
    // their frame 0. A small process beside them has every traceback whole.
    let many = Program::build("manysites", &[]);
    let small = Program::build("allocator_libs", &[]);
    let mut first = Fixture::spawn_ready(&many.exe, &[]);
    let mut second = Fixture::spawn_ready(&many.exe, &[]);
    let mut fx = Fixture::spawn_ready(&small.exe, &[]);
    let pids = [first.pid(), second.pid(), fx.pid()];
    let scope = format!("{},{},{}", pids[0], pids[1], pids[2]);
    let tracerd = Tracerd::start(&["--max-stacks", "1024", "--scope-pid", &scope]);
    let by_traceback =
        |pid: u32| tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
    let frames = |s: &Value| s["traceback"].as_array().map_or(0, Vec::len);
    // Whole stacks and frame-0 blocks of each big process, in turn.
    for (fixture, whole) in [(&mut first, 512), (&mut second, 256)] {
        fixture.step("done");
        tracerd.wait_traced(fixture.pid());
        let body = by_traceback(fixture.pid());
        let stats = body["statistics"].as_array().expect("statistics");
        assert_eq!(u64_at(&body["process"], "blocks"), 600, "{body}");
        assert_eq!(stats.iter().filter(|s| frames(s) > 1).count(), whole);
        assert_eq!(stats.iter().filter(|s| frames(s) == 1).count(), 600 - whole);
        assert_eq!(u64_at(&body["process"], "drops"), 600 - whole as u64);
    }
    assert_eq!(tracerd.counter("drop_stack_share"), 88 + 344);
    assert_eq!(tracerd.drops_total("process_stack_share"), 432.0);
    assert_eq!(tracerd.counter("drop_stack"), 0);
    fx.step("done");
    tracerd.wait_traced(pids[2]);
    let body = by_traceback(pids[2]);
    assert_eq!(body["complete"], true, "{body}");
    let stats = body["statistics"].as_array().expect("statistics");
    assert!(!stats.is_empty());
    assert!(stats.iter().all(|s| frames(s) > 1), "{body}");
    let lines = tracerd.get_ok(&format!(
        "/pid/{}/statistics?group_by=lineno&limit=0",
        pids[2]
    ));
    expect(
        &small,
        &lines["statistics"],
        "beside the stack hoards",
        C_API,
    );
    fx.end();
    first.end();
    second.end();
}
