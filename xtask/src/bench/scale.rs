//! The bench's scale part: one process holding 4,000,000 live blocks at
//! once (kernel memory per block, how fast they leave the map once it
//! exits), then a snapshot and statistics of a process holding 1,000,000.
use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::modes::{LISTEN, STOP_GRACE, bpf_map_memory, start_tracerd};
use crate::util::{cc::compile_c, paths::release_dir};
use tracer_testkit::{Client, Running};

/// How long one of the scale part's requests may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// Allocates N blocks, says `done`, holds them until stdin closes.
pub(super) const KEEP_C: &str = include_str!("../../workloads/keep.c");

/// Runs the keep-N fixture until it has allocated.
pub(super) fn keep_blocks(exe: &Path, n: u64) -> anyhow::Result<Running> {
    let mut child = Running::spawn(
        Command::new(exe)
            .arg(n.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    )?;
    let stdout = child.child().stdout.take().context("stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "done" {
        bail!("the keep fixture said {line:?}");
    }
    Ok(child)
}

/// The keep fixture compiled in `dir`, and the release tracerd of `root`
/// started (its state in `dir/state`) with room for `max_live_blocks`
/// blocks and no share limit per process: how the parts that hold
/// millions of blocks begin.
pub(super) fn keep_and_tracerd(
    root: &Path,
    dir: &Path,
    state: &str,
    max_live_blocks: u32,
) -> anyhow::Result<(PathBuf, Running)> {
    let exe = compile_c(dir, "keep", KEEP_C, super::workloads::CFLAGS)?;
    let tracer = start_tracerd(
        &release_dir(root).join("tracerd"),
        &dir.join(state),
        &[
            "--max-live-blocks",
            &max_live_blocks.to_string(),
            "--process-share",
            "100",
        ],
    )?;
    Ok((exe, tracer))
}

/// Lets the keep fixture exit (closes its stdin) and waits for it.
pub(super) fn finish(mut child: Running) {
    drop(child.child().stdin.take());
    let _ = child.wait();
}

/// 4,000,000 live blocks at once, and the time to snapshot 1,000,000.
pub fn scale_part(root: &Path, dir: &Path) -> anyhow::Result<serde_json::Value> {
    let (exe, tracer) = keep_and_tracerd(root, dir, "state", 8 << 20)?;
    let pid = tracer.pid();
    let addr: SocketAddr = LISTEN.parse()?;
    let http = Client::new(addr, REQUEST_TIMEOUT)?;
    let maps_before = bpf_map_memory(pid);
    let child = keep_blocks(&exe, 4_000_000)?;
    let maps: serde_json::Value = serde_json::from_str(&http.get("/maps")?.body)?;
    let blocks = maps["live_allocs_by_pid"][child.pid().to_string()]
        .as_u64()
        .unwrap_or(0);
    let entries = maps["maps"]["LIVE_ALLOCS"]["entries"].as_u64().unwrap_or(0);
    let in_table = maps["maps"]["LIVE_KEYS"]["entries"].as_u64().unwrap_or(0);
    // The fast table is allocated at start (in maps_before): its keys
    // (64-byte buckets of 7) and values (32 bytes) count for its blocks.
    let table_slots = maps["maps"]["LIVE_KEYS"]["capacity"].as_u64().unwrap_or(0);
    let table_bytes = table_slots / 7 * 64 + table_slots * 32;
    let maps_after = bpf_map_memory(pid);
    let per_block =
        (maps_after.saturating_sub(maps_before) + table_bytes) as f64 / blocks.max(1) as f64;
    let exited = Instant::now();
    finish(child);
    // The exited process's blocks leave the kernel map (one pass, batched).
    loop {
        let maps: serde_json::Value = serde_json::from_str(&http.get("/maps")?.body)?;
        if maps["live_allocs_by_pid"]
            .as_object()
            .is_some_and(|m| m.values().all(|v| v.as_u64() < Some(100_000)))
        {
            break;
        }
        if exited.elapsed() > Duration::from_secs(60) {
            bail!("the exited process's blocks are still in LIVE_ALLOCS after 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cleanup_ms = exited.elapsed().as_secs_f64() * 1000.0;
    let child = keep_blocks(&exe, 1_000_000)?;
    let start = Instant::now();
    let snapshot = http.post(&format!("/pid/{}/snapshots", child.pid()))?;
    let snapshot_ms = start.elapsed().as_secs_f64() * 1000.0;
    if snapshot.status != 201 {
        bail!("snapshot failed ({}): {}", snapshot.status, snapshot.body);
    }
    let summary: serde_json::Value = serde_json::from_str(&snapshot.body)?;
    let start = Instant::now();
    let status = http
        .get(&format!(
            "/pid/{}/statistics?group_by=lineno&limit=10",
            child.pid()
        ))?
        .status;
    let statistics_ms = start.elapsed().as_secs_f64() * 1000.0;
    finish(child);
    let _ = tracer.stop(STOP_GRACE);
    println!("\n### Scale\n");
    println!(
        "- live blocks of one process held at once: {blocks} ({in_table} in the fast table of {table_slots}; LIVE_ALLOCS entries in all: {entries})"
    );
    println!(
        "- kernel memory per live block: {per_block:.0} bytes (BPF maps' memlock, before/after, plus the preallocated table's {table_bytes} bytes)"
    );
    println!("- its 4,000,000 blocks left the kernel map {cleanup_ms:.0} ms after it exited");
    println!(
        "- POST /pid/N/snapshots of {} live blocks: {snapshot_ms:.0} ms; GET statistics (lineno) of them: {statistics_ms:.0} ms (status {status})",
        summary["traces"]
    );
    Ok(serde_json::json!({
        "blocks_held": blocks,
        "live_allocs_entries": entries,
        "live_table_entries": in_table,
        "live_table_bytes": table_bytes,
        "kernel_bytes_per_block": per_block,
        "exit_cleanup_ms": cleanup_ms,
        "snapshot_1m_ms": snapshot_ms,
        "snapshot_traces": summary["traces"],
        "statistics_1m_ms": statistics_ms,
    }))
}
