//! Full kernel maps: tracing degrades with counted drops, the data says it is
//! incomplete (every answer and stored snapshot, restarts included), sizes
//! stay exact for what is traced, and a block whose allocation was dropped
//! never shows up as a leak.

use reqwest::Method;
use serde_json::{Value, json};

use super::support::{Fixture, Program, TempDir, Tracerd, u64_of};

/// Asserts `complete`, `drops` and `drops_by_pid` of a response or side.
fn assert_loss(body: &Value, pid: u32, drops: u64) {
    let by_pid = if drops == 0 {
        json!({})
    } else {
        json!({ pid.to_string(): drops })
    };
    assert_eq!(
        (&body["complete"], &body["drops"], &body["drops_by_pid"]),
        (&json!(drops == 0), &json!(drops), &by_pid),
        "{body}"
    );
}

/// A text response's completeness headers.
fn loss_headers(tracerd: &Tracerd, path: &str) -> Vec<(String, String)> {
    let response = tracerd.request(Method::GET, path);
    assert_eq!(response.status().as_u16(), 200, "{path}");
    let mut headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter(|(name, _)| {
            name.as_str().starts_with("x-tracer-") && name.as_str() != "x-tracer-base"
        })
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                value.to_str().expect("ascii").to_string(),
            )
        })
        .collect();
    headers.sort();
    headers
}

fn pair(name: &str, value: &str) -> (String, String) {
    (name.to_string(), value.to_string())
}

/// Live-block maps of 1038 blocks (1024 in `LIVE_ALLOCS`, 14 in the
/// table), all of them for one process if it takes them: full for
/// everyone, with no share that holds a process back first. A process's
/// own spill maps (at most 4 × 1024 blocks) are made from its first
/// allocation on, too late for a burst of allocations that makes it known.
const SMALL_MAPS: [&str; 6] = [
    "--max-live-blocks",
    "1024",
    "--live-table-blocks",
    "14",
    "--process-share",
    "100",
];

#[test]
fn a_full_live_map_counts_drops_says_incomplete_and_leaves_no_phantom_leak() {
    // More blocks than every place together: 14 in the table, 1024 in
    // LIVE_ALLOCS, and the process's own spill maps, made for at most
    // 4 × 1024 (some of them made only while the blocks come).
    const BLOCKS: u64 = 10_000;
    const ROOM: u64 = 14 + 1024 + 4 * 1024;
    let prog = Program::build("fivethousand", &["-DBLOCKS=10000"]);
    let tracerd = Tracerd::start(&SMALL_MAPS);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    fx.step("allocated");
    // Its first allocation is in the loop: only then is it known.
    tracerd.wait_traced(pid);

    let (status, process) = tracerd.get(&format!("/pid/{pid}"));
    assert_eq!(status, 200);
    let (allocs, drops) = (u64_of(&process, "allocs"), u64_of(&process, "drops"));
    assert_eq!(allocs + drops, BLOCKS, "{process}");
    assert!(drops >= BLOCKS - ROOM, "{process}");
    assert_eq!(process["complete"], false);
    assert_eq!(u64_of(&process, "blocks"), allocs);
    assert_eq!(u64_of(&process, "current"), allocs * 64);

    let (status, stats) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    assert_eq!(status, 200);
    assert_eq!(stats["process"]["complete"], false);
    assert_eq!(u64_of(&stats["process"], "drops"), drops);
    let traced: u64 = stats["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| u64_of(s, "size"))
        .sum();
    assert_eq!(
        traced,
        allocs * 64,
        "the snapshot holds exactly the recorded blocks"
    );

    fx.step("freed");
    let (_, process) = tracerd.get(&format!("/pid/{pid}"));
    // Every recorded block's free was seen; every dropped block's free is
    // an unknown free: nothing is left looking like a leak.
    assert_eq!(u64_of(&process, "current"), 0, "{process}");
    assert_eq!(u64_of(&process, "blocks"), 0, "{process}");
    assert_eq!(u64_of(&process, "frees"), allocs, "{process}");
    assert_eq!(u64_of(&process, "unknown_frees"), drops, "{process}");
    let (_, stats) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    assert_eq!(
        stats["statistics"].as_array().map(Vec::len),
        Some(0),
        "{stats}"
    );

    let live_full = tracerd.drops_total("live_map_full");
    assert!(live_full >= drops as f64, "{live_full} < {drops}");
    fx.end();
}

/// The text statistics and compare of `pid` (which lost 462 blocks, and
/// no traceback cut) say it in their headers.
fn assert_text_headers_say_the_loss(tracerd: &Tracerd, pid: u32) {
    let headers = loss_headers(tracerd, &format!("/pid/{pid}/statistics?format=text"));
    assert_eq!(
        headers,
        [
            pair("x-tracer-complete", "false"),
            pair("x-tracer-cut-tracebacks", "0"),
            pair("x-tracer-drops", "462")
        ]
    );
    let headers = loss_headers(tracerd, &format!("/pid/{pid}/compare?format=text"));
    assert_eq!(
        headers,
        [
            pair("x-tracer-base-drops", "0"),
            pair("x-tracer-complete", "false"),
            pair("x-tracer-new-cut-tracebacks", "0"),
            pair("x-tracer-new-drops", "462")
        ]
    );
}

#[test]
fn every_snapshot_and_answer_says_it_is_incomplete_and_the_drops_survive_a_restart() {
    let prog = Program::build("fifteenhundred", &[]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    // Only this process is traced, so the maps' 1038 entries are all its.
    let state = TempDir::new("lossstate");
    let pid_s = pid.to_string();
    let mut args = SMALL_MAPS.to_vec();
    args.extend(["--scope-pid", &pid_s]);
    let mut tracerd = Tracerd::start_at(state.path(), &args);
    fx.step("allocated");
    tracerd.wait_traced(pid);
    const RECORDED: u64 = 1024 + 14;
    const DROPS: u64 = 1500 - RECORDED;

    let (_, process) = tracerd.get(&format!("/pid/{pid}"));
    assert_eq!(
        (u64_of(&process, "allocs"), u64_of(&process, "drops")),
        (RECORDED, DROPS),
        "{process}"
    );
    assert_eq!(process["complete"], false);

    // Per process: statistics, traces, compare (against the empty state at
    // tracing start, which lost nothing).
    let stats = tracerd.get_ok(&format!("/pid/{pid}/statistics?limit=0"));
    assert_loss(&stats, pid, DROPS);
    assert_eq!(
        u64_of(&stats["statistics"][0], "size"),
        RECORDED * 64,
        "{stats}"
    );
    let (_, traces) = tracerd.get(&format!("/pid/{pid}/traces?limit=1"));
    assert_loss(&traces, pid, DROPS);
    let compare = tracerd.get_ok(&format!("/pid/{pid}/compare"));
    assert_eq!(compare["complete"], false);
    assert_eq!(compare["base"]["kind"], "tracing_start");
    assert_loss(&compare["base"], pid, 0);
    assert_loss(&compare["new"], pid, DROPS);

    // System-wide: every process of the answer, summed, and per pid.
    let system = tracerd.get_ok("/statistics?limit=1");
    assert_eq!(system["pids"], json!([pid]));
    assert_loss(&system, pid, DROPS);
    let (_, system) = tracerd.get("/traces?limit=1");
    assert_loss(&system, pid, DROPS);
    let (_, system) = tracerd.get("/compare?limit=1");
    assert_eq!(system["complete"], false);
    assert_loss(&system["new"], pid, DROPS);

    // Text keeps tracemalloc's lines and says it in headers.
    // The program ran before tracerd, in its scope: its tables were
    // compiled before tracerd said ready, and no traceback is cut (the
    // headers say 0).
    assert_text_headers_say_the_loss(&tracerd, pid);

    // A stored snapshot keeps the drops it was taken with.
    let (status, taken) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{taken}");
    assert_loss(&taken, pid, DROPS);
    let id = u64_of(&taken, "id");
    let (_, stats) = tracerd.get(&format!("/snapshots/{id}/statistics"));
    assert_loss(&stats, pid, DROPS);
    assert_loss(&stats["snapshot"], pid, DROPS);
    let (_, traces) = tracerd.get(&format!("/snapshots/{id}/traces?limit=1"));
    assert_loss(&traces, pid, DROPS);
    let (_, compare) = tracerd.get(&format!("/snapshots/{id}/compare?base={id}"));
    assert_eq!(compare["complete"], false);
    assert_loss(&compare["base"], pid, DROPS);
    assert_loss(&compare["new"], pid, DROPS);
    // Its own base now: the compare's sides are both that snapshot.
    let (_, compare) = tracerd.get(&format!("/pid/{pid}/compare"));
    assert_loss(&compare["base"], pid, DROPS);
    let (status, system_taken) = tracerd.send(Method::POST, "/snapshots", None);
    assert_eq!(status, 201, "{system_taken}");
    assert_loss(&system_taken, pid, DROPS);
    let system_id = u64_of(&system_taken, "id");
    // A dump loaded back keeps them; a tracemalloc file knows no loss.
    let (_, file) = tracerd.get_bytes(&format!("/snapshots/{id}/dump"));
    let (status, loaded) = tracerd.send(Method::POST, "/snapshots", Some(file));
    assert_eq!(status, 201, "{loaded}");
    assert_loss(&loaded, pid, DROPS);
    let (_, pickle) = tracerd.get_bytes(&format!("/snapshots/{id}/dump?format=tracemalloc"));
    let (status, loaded) =
        tracerd.send(Method::POST, "/snapshots?format=tracemalloc", Some(pickle));
    assert_eq!(status, 201, "{loaded}");
    assert_loss(&loaded, pid, 0);

    // After a restart the stored snapshots still say so.
    let (clean, _) = tracerd.terminate();
    assert!(clean, "tracerd did not stop cleanly");
    drop(tracerd);
    let tracerd = Tracerd::start_at(state.path(), &args);
    for stored in [id, system_id] {
        let summary = tracerd.get_ok(&format!("/snapshots/{stored}"));
        assert_eq!(summary["this_run"], false);
        assert_loss(&summary, pid, DROPS);
        let (_, stats) = tracerd.get(&format!("/snapshots/{stored}/statistics"));
        assert_loss(&stats, pid, DROPS);
    }
    let (_, list) = tracerd.get("/snapshots");
    let listed = list["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .find(|s| s["id"] == id)
        .expect("the snapshot is listed");
    assert_loss(listed, pid, DROPS);
    fx.end();
}

#[test]
fn a_full_stack_store_is_counted_and_keeps_sizes_and_lines_exact() {
    let prog = Program::build("manysites", &[]);
    let tracerd = Tracerd::start(&["--max-stacks", "256", "--process-share", "100"]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    fx.step("done");
    tracerd.wait_traced(pid);

    let stats = tracerd.get_ok(&format!("/pid/{pid}/statistics?limit=0&group_by=lineno"));
    let process = &stats["process"];
    assert_eq!(u64_of(process, "blocks"), 600);
    assert_eq!(u64_of(process, "current"), 60_000);
    // A block whose stack found no room keeps its frame 0: every call site
    // is its own line with exactly one block of 100 bytes.
    let list = stats["statistics"].as_array().expect("statistics");
    assert_eq!(list.len(), 600, "{stats}");
    let file = &prog.source;
    for s in list {
        assert_eq!((u64_of(s, "size"), u64_of(s, "count")), (100, 1), "{s}");
        assert_eq!(s["traceback"][0]["filename"].as_str(), file.to_str(), "{s}");
    }
    let stack_drops = tracerd.drops_total("stack_store_full");
    assert!(stack_drops >= f64::from(600 - 256), "{stack_drops}");
    fx.end();
}
