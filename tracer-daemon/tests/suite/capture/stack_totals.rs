//! Statistics of a live process read the kernel's totals per
//! (image, stack) (`STACK_TOTALS`), and give exactly what its blocks give
//! (a stored snapshot, built from the blocks themselves), through alloc,
//! free, realloc, `clear-traces`, exec and a full map.
use std::time::Duration;

use serde_json::Value;

use crate::suite::support::{Fixture, Program, Tracerd, poll, stat_at};

/// The groupings compared.
const GROUPINGS: [&str; 3] = ["lineno", "traceback", "filename"];

/// `/pid/PID/statistics` (from the totals per stack where they serve) and
/// the statistics of a snapshot of its blocks stored now, for `group_by`.
fn both(tracerd: &Tracerd, pid: u32, group_by: &str) -> (Value, Value) {
    let now = tracerd.get_ok(&format!(
        "/pid/{pid}/statistics?group_by={group_by}&limit=0"
    ));
    let (status, stored) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{stored}");
    let id = stored["id"].as_u64().expect("id");
    let blocks = tracerd.get_ok(&format!(
        "/snapshots/{id}/statistics?group_by={group_by}&limit=0"
    ));
    (now, blocks)
}

/// Asserts that every grouping of `pid` now equals that of its blocks,
/// and that the answer came from `totals` ("per_stack" or "per_block");
/// returns the statistics by line.
fn assert_same(tracerd: &Tracerd, pid: u32, totals: &str, phase: &str) -> Value {
    let mut by_line = Value::Null;
    for group_by in GROUPINGS {
        let (now, blocks) = both(tracerd, pid, group_by);
        assert_eq!(now["totals"], totals, "{phase}: {now}");
        assert_eq!(
            now["statistics"], blocks["statistics"],
            "{phase}: by {group_by}, the totals per stack and the blocks differ"
        );
        assert_eq!(now["traces"], blocks["traces"], "{phase}: {group_by}");
        if group_by == "lineno" {
            by_line = now["statistics"].clone();
        }
    }
    by_line
}

/// (count, size) at `marker` of the fixture in statistics by line.
fn at(prog: &Program, stats: &Value, marker: &str) -> Option<(u64, u64)> {
    let line = prog.line(&format!("/* {marker} */"));
    stat_at(stats, &prog.source, line).map(|s| {
        (
            s["count"].as_u64().expect("count"),
            s["size"].as_u64().expect("size"),
        )
    })
}

/// How tracerd read images' totals per stack since it loaded: (by the
/// image's keys, by a pass over every image's), from `GET /maps`.
fn reads(tracerd: &Tracerd) -> (u64, u64) {
    let reads = &tracerd.maps()["stack_totals_reads"];
    let field = |f: &str| {
        reads[f]
            .as_u64()
            .unwrap_or_else(|| panic!("{f} in {reads}"))
    };
    (field("by_keys"), field("passes"))
}

/// Asserts that since `before` (then `reads`) tracerd read by the
/// image's keys `by_keys` times and by a pass `passes` times; returns
/// the reads now.
fn assert_reads(
    tracerd: &Tracerd,
    before: (u64, u64),
    by_keys: u64,
    passes: u64,
    phase: &str,
) -> (u64, u64) {
    let now = reads(tracerd);
    assert_eq!(
        (now.0 - before.0, now.1 - before.1),
        (by_keys, passes),
        "{phase}: reads by keys and passes"
    );
    now
}

#[test]
fn statistics_from_the_totals_per_stack_equal_those_of_the_blocks_through_every_change() {
    let prog = Program::build("stacktotals", &[]);
    // 600 stacks of another process in STACK_TOTALS: the fixture's few
    // are read by their keys, not by a pass over the others', once a pass
    // read them and while it put no key in since.
    let others = Program::build("manycallers", &[]);
    let tracerd = Tracerd::start(&[]);
    let mut other = Fixture::spawn_traced(&tracerd, &others.exe, &[]);
    other.step("done");
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    let pid = fx.pid();

    fx.step("allocated");
    let before = reads(&tracerd);
    let stats = assert_same(&tracerd, pid, "per_stack", "allocated");
    // A pass for the new image, then its keys.
    let before = assert_reads(&tracerd, before, 2, 1, "allocated");
    let a_bytes: u64 = (0..1000u64).map(|i| 100 + i % 7).sum();
    assert_eq!(at(&prog, &stats, "SITE_A"), Some((1000, a_bytes)));
    assert_eq!(at(&prog, &stats, "SITE_B"), Some((300, 300 * 100)));

    fx.step("changed");
    let stats = assert_same(&tracerd, pid, "per_stack", "freed and grown");
    // realloc's site is a key the image put in since: a pass again.
    let before = assert_reads(&tracerd, before, 2, 1, "freed and grown");
    let odd: u64 = (0..1000u64)
        .filter(|i| i % 2 == 1)
        .map(|i| 100 + i % 7)
        .sum();
    assert_eq!(at(&prog, &stats, "SITE_A"), Some((500, odd)));
    assert_eq!(at(&prog, &stats, "SITE_B"), Some((200, 200 * 100)));
    assert_eq!(at(&prog, &stats, "SITE_GROW"), Some((100, 100 * 5000)));

    // clear_traces(): the kernel's totals still count the blocks tracerd
    // removed; tracerd subtracts them per stack.
    let (status, body) = tracerd.post(&format!("/pid/{pid}/clear-traces"));
    assert_eq!(status, 200, "{body}");
    let stats = assert_same(&tracerd, pid, "per_stack", "cleared");
    assert_eq!(at(&prog, &stats, "SITE_A"), None, "{stats}");
    assert_reads(&tracerd, before, 3, 0, "cleared");
    fx.step("after_clear");
    let stats = assert_same(&tracerd, pid, "per_stack", "after the clear");
    assert_eq!(at(&prog, &stats, "SITE_A"), Some((10, 640)));
    assert_eq!(at(&prog, &stats, "SITE_GROW"), None);

    // The exec'd image starts from nothing of the old one's. Its exe is
    // the old one's: it is told apart by when it was first seen.
    let old_image = tracerd.get_ok(&format!("/pid/{pid}"))["first_seen_ms"].clone();
    fx.step("execd");
    poll(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match tracerd.get(&format!("/pid/{pid}")) {
            (200, image) if image["first_seen_ms"] != old_image => Ok(()),
            (status, image) => Err(format!("not the exec'd image yet: {status} {image}")),
        },
    );
    let stats = assert_same(&tracerd, pid, "per_stack", "exec'd");
    assert_eq!(at(&prog, &stats, "SITE_A"), Some((7, 7 * 33)));
    assert_eq!(at(&prog, &stats, "SITE_B"), None);
    fx.end();
    other.end();
}

#[test]
fn a_full_stack_totals_map_falls_back_to_the_blocks_and_stays_exact() {
    // 600 distinct call sites against STACK_TOTALS of 512 entries (twice
    // --max-stacks): at least 88 keys are refused, so the image's totals
    // per stack are not exact and its statistics come from its blocks.
    let many = Program::build("manysites", &[]);
    let mut fx = Fixture::spawn_ready(&many.exe, &[]);
    let pid = fx.pid();
    let scope = pid.to_string();
    let tracerd = Tracerd::start(&["--max-stacks", "256", "--scope-pid", &scope]);
    fx.step("done");
    tracerd.wait_traced(pid);
    let refused = tracerd.counter("stack_totals_refused");
    assert!(refused >= 600 - 512, "{refused} keys refused");
    let stats = assert_same(&tracerd, pid, "per_block", "a full map");
    let blocks: u64 = stats
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| s["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(blocks, 600, "{stats}");
    fx.end();
}
