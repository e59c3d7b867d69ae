//! The bench's host-scale part: 10,000,000 live blocks
//! across 100 processes at once, with what the kernel and tracerd hold per
//! block, and what queries about one process cost beside them:
//!
//! 1. a 1,000-block process is started, then 100 processes of 100,000
//!    blocks each; the part waits until tracerd counts every block;
//! 2. kernel memory per block: the BPF maps' memlock after minus before,
//!    over the host's blocks (the fast table is preallocated, so its share
//!    is added); tracerd's memory per block: its RSS after minus before;
//! 3. median and max of [`RUNS`] of: statistics and compare of the small
//!    process, statistics of one 100,000-block process, `traced-memory`,
//!    `processes`, `health` and `metrics`; and `POST /pid/N/snapshots` of
//!    one 100,000-block process.
use std::{net::SocketAddr, path::Path, time::Duration, time::Instant};

use anyhow::bail;

use super::modes::{LISTEN, STOP_GRACE, bpf_map_memory};
use super::queries::{store, time_get};
use super::scale::{finish, keep_and_tracerd, keep_blocks};
use crate::util::daemon::status_kib;
use tracer_testkit::Client;

/// Processes holding blocks.
const PROCESSES: u64 = 100;
/// Blocks each of them holds.
const BLOCKS_EACH: u64 = 100_000;
/// Blocks of the small process the queries ask about.
const SMALL_BLOCKS: u64 = 1_000;
/// Runs of each query (the median and the slowest are reported).
const RUNS: usize = 15;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// Blocks tracerd counts now over every process (`GET /processes`).
fn blocks_counted(http: &Client) -> anyhow::Result<u64> {
    let body: serde_json::Value = serde_json::from_str(&http.get("/processes")?.body)?;
    Ok(body["processes"]
        .as_array()
        .map(|list| list.iter().filter_map(|p| p["blocks"].as_u64()).sum())
        .unwrap_or(0))
}

/// Runs the part and prints its table.
pub fn host_part(root: &Path, dir: &Path) -> anyhow::Result<serde_json::Value> {
    let (exe, tracer) = keep_and_tracerd(root, dir, "host-state", 12 << 20)?;
    let tracerd_pid = tracer.pid();
    let addr: SocketAddr = LISTEN.parse()?;
    let http = Client::new(addr, REQUEST_TIMEOUT)?;
    let small = keep_blocks(&exe, SMALL_BLOCKS)?;
    let small_pid = small.pid();
    let (small_base, _) = store(&http, small_pid)?;
    let maps_before = bpf_map_memory(tracerd_pid);
    let rss_before = status_kib(tracerd_pid, "VmRSS") * 1024;
    let started = Instant::now();
    let mut holders = Vec::new();
    for _ in 0..PROCESSES {
        holders.push(keep_blocks(&exe, BLOCKS_EACH)?);
    }
    let total = PROCESSES * BLOCKS_EACH + SMALL_BLOCKS;
    loop {
        let counted = blocks_counted(&http)?;
        if counted >= total {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("tracerd counts {counted} blocks of {total} after 600 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let allocated_s = started.elapsed().as_secs_f64();
    let maps: serde_json::Value = serde_json::from_str(&http.get("/maps")?.body)?;
    let table_slots = maps["maps"]["LIVE_KEYS"]["capacity"].as_u64().unwrap_or(0);
    let in_table = maps["maps"]["LIVE_KEYS"]["entries"].as_u64().unwrap_or(0);
    let in_spill = maps["maps"]["LIVE_ALLOCS"]["entries"].as_u64().unwrap_or(0);
    let in_own = maps["maps"]["OWN_LIVE"]["entries"].as_u64().unwrap_or(0);
    let own_capacity = maps["maps"]["OWN_LIVE"]["capacity"].as_u64().unwrap_or(0);
    let table_bytes = table_slots / 7 * 64 + table_slots * 32;
    // Per block of the host (the holders' and every other process's):
    // the maps hold them all.
    let host_blocks = (in_table + in_spill + in_own).max(1);
    let kernel_per_block = (bpf_map_memory(tracerd_pid).saturating_sub(maps_before) + table_bytes)
        as f64
        / host_blocks as f64;
    let daemon_per_block = (status_kib(tracerd_pid, "VmRSS") * 1024).saturating_sub(rss_before)
        as f64
        / host_blocks as f64;
    let big_pid = holders.first().map_or(0, |h| h.pid());
    let mut rows = Vec::new();
    for (name, path) in [
        (
            "statistics, the 1,000-block process",
            format!("/pid/{small_pid}/statistics?group_by=lineno"),
        ),
        (
            "compare, the 1,000-block process",
            format!("/pid/{small_pid}/compare?group_by=lineno&base={small_base}"),
        ),
        (
            "statistics, a 100,000-block process",
            format!("/pid/{big_pid}/statistics?group_by=lineno"),
        ),
        (
            "traced-memory, the 1,000-block process",
            format!("/pid/{small_pid}/traced-memory"),
        ),
        ("processes", "/processes".to_string()),
        ("health", "/health".to_string()),
        ("metrics", "/metrics".to_string()),
    ] {
        rows.push((name, time_get(&http, &path, RUNS)?));
    }
    let (_, big_snapshot_ms) = store(&http, big_pid)?;
    for holder in holders {
        finish(holder);
    }
    finish(small);
    let _ = tracer.stop(STOP_GRACE);
    println!("\n### Host scale\n");
    println!(
        "- {total} live blocks across {} processes, {host_blocks} on the host ({in_table} in the fast table of {table_slots}, {in_own} in the processes' own spill maps made for {own_capacity}, {in_spill} in LIVE_ALLOCS), counted by tracerd {allocated_s:.1} s after the first holder started",
        PROCESSES + 1
    );
    println!(
        "- kernel memory per live block: {kernel_per_block:.0} bytes (BPF maps' memlock after minus before, plus the preallocated fast table's {table_bytes} bytes); tracerd's: {daemon_per_block:.1} bytes (RSS after minus before)"
    );
    println!("\n| query beside 10,000,000 blocks | median ms | max ms |");
    println!("|---|---:|---:|");
    let mut json = serde_json::Map::new();
    for (name, (median, max)) in &rows {
        println!("| {name} | {median:.1} | {max:.1} |");
        json.insert(
            (*name).to_string(),
            serde_json::json!({"median_ms": median, "max_ms": max}),
        );
    }
    println!("| POST snapshot, a 100,000-block process | {big_snapshot_ms:.0} | |");
    Ok(serde_json::json!({
        "blocks": total,
        "host_blocks": host_blocks,
        "processes": PROCESSES + 1,
        "live_table_entries": in_table,
        "live_allocs_entries": in_spill,
        "own_spill_entries": in_own,
        "own_spill_capacity": own_capacity,
        "counted_after_s": allocated_s,
        "kernel_bytes_per_block": kernel_per_block,
        "daemon_bytes_per_block": daemon_per_block,
        "queries": json,
        "snapshot_100k_ms": big_snapshot_ms,
    }))
}
