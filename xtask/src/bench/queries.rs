//! The bench's host-scale queries part: what a query about a
//! process costs when another process holds 4,000,000 live blocks, and what
//! queries about that big process cost, in one run:
//!
//! 1. a 1,000-block process alone: `GET /pid/N/statistics?group_by=lineno`
//!    and `GET /pid/N/compare?group_by=lineno&base=ID` (a snapshot stored
//!    first), median and max of [`RUNS`];
//! 2. the same while a second process holds 4,000,000 blocks (goal: under
//!    20 ms, within 2x of alone);
//! 3. the same while four more processes hold 65,536 distinct stacks (the
//!    kernel's totals per stack then hold ~70,000 entries of other
//!    processes: the small process's are read by its keys alone);
//! 4. the 4,000,000-block process itself: statistics (goal under 100 ms),
//!    `POST /pid/N/snapshots` (goal under 1.5 s), compare with that stored
//!    snapshot (goal under 200 ms).
use std::{net::SocketAddr, path::Path, time::Duration, time::Instant};

use anyhow::bail;

use super::modes::{LISTEN, STOP_GRACE};
use super::scale::{finish, keep_and_tracerd, keep_blocks};
use crate::util::stats::median;
use tracer_testkit::Client;

/// Blocks of the big process.
const BIG_BLOCKS: u64 = 4_000_000;
/// Blocks of the small process.
const SMALL_BLOCKS: u64 = 1_000;
/// Runs of each query (the median and the slowest are reported).
const RUNS: usize = 15;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Processes holding distinct stacks.
const STACK_PROCESSES: usize = 4;
/// Each holds 2^STACK_DEPTH blocks, each at a stack of its own.
const STACK_DEPTH: u32 = 14;

/// Allocates 2^argv[1] blocks, each under a distinct stack (a binary
/// recursion whose branch at each depth is a bit of the block's index:
/// each call site is a return address of its own), says `done`, holds
/// them until stdin closes.
const STACKS_C: &str = include_str!("../../workloads/stacks.c");

/// tracerd's reads of images' totals per stack since it started, (by
/// keys, passes), and the entries of `STACK_TOTALS`, from `GET /maps`.
fn stack_totals_use(http: &Client) -> anyhow::Result<((u64, u64), u64)> {
    let maps: serde_json::Value = serde_json::from_str(&http.get("/maps")?.body)?;
    let reads = &maps["stack_totals_reads"];
    let field = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    Ok((
        (field(&reads["by_keys"]), field(&reads["passes"])),
        field(&maps["maps"]["STACK_TOTALS"]["entries"]),
    ))
}

/// Times `runs` GETs of `path` (each must answer 200): (median, max) in ms.
pub(super) fn time_get(http: &Client, path: &str, runs: usize) -> anyhow::Result<(f64, f64)> {
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let reply = http.get(path)?;
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
        if reply.status != 200 {
            bail!("GET {path}: {} {}", reply.status, reply.body);
        }
    }
    let max = ms.iter().copied().fold(0.0, f64::max);
    Ok((median(&mut ms), max))
}

/// Waits until tracerd knows `pid` (`GET /pid/N` answers 200): an image is
/// known once its first allocation's event was handled, milliseconds after
/// it.
pub(super) fn wait_known(http: &Client, pid: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = http.get(&format!("/pid/{pid}"))?;
        if reply.status == 200 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("GET /pid/{pid}: {} {}", reply.status, reply.body);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stores a snapshot of `pid`; returns its id and the time it took in ms.
pub(super) fn store(http: &Client, pid: u32) -> anyhow::Result<(u64, f64)> {
    wait_known(http, pid)?;
    let start = Instant::now();
    let reply = http.post(&format!("/pid/{pid}/snapshots"))?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if reply.status != 201 {
        bail!("POST /pid/{pid}/snapshots: {} {}", reply.status, reply.body);
    }
    let body: serde_json::Value = serde_json::from_str(&reply.body)?;
    match body["id"].as_u64() {
        Some(id) => Ok((id, ms)),
        None => bail!("no id in {body}"),
    }
}

/// Statistics and compare of `pid` (against snapshot `base`): the two
/// (median, max) in ms.
fn small_queries(http: &Client, pid: u32, base: u64) -> anyhow::Result<((f64, f64), (f64, f64))> {
    let statistics = time_get(
        http,
        &format!("/pid/{pid}/statistics?group_by=lineno"),
        RUNS,
    )?;
    let compare = time_get(
        http,
        &format!("/pid/{pid}/compare?group_by=lineno&base={base}"),
        RUNS,
    )?;
    Ok((statistics, compare))
}

/// Runs the part and prints its table.
pub fn queries_part(root: &Path, dir: &Path) -> anyhow::Result<serde_json::Value> {
    let (exe, tracer) = keep_and_tracerd(root, dir, "queries-state", 8 << 20)?;
    let addr: SocketAddr = LISTEN.parse()?;
    let http = Client::new(addr, REQUEST_TIMEOUT)?;
    let small = keep_blocks(&exe, SMALL_BLOCKS)?;
    let small_pid = small.pid();
    let (small_base, _) = store(&http, small_pid)?;
    let alone = small_queries(&http, small_pid, small_base)?;
    let big = keep_blocks(&exe, BIG_BLOCKS)?;
    let big_pid = big.pid();
    wait_known(&http, big_pid)?;
    let beside = small_queries(&http, small_pid, small_base)?;
    let BesideStacks {
        queries: beside_stacks,
        entries: stack_entries,
        by_keys,
        passes,
        first_pass_ms,
    } = beside_stacks(&http, dir, &exe, small_pid, small_base)?;
    let big_statistics = time_get(
        &http,
        &format!("/pid/{big_pid}/statistics?group_by=lineno"),
        5,
    )?;
    let (big_base, big_snapshot_ms) = store(&http, big_pid)?;
    let big_compare = time_get(
        &http,
        &format!("/pid/{big_pid}/compare?group_by=lineno&base={big_base}"),
        5,
    )?;
    finish(big);
    finish(small);
    let _ = tracer.stop(STOP_GRACE);
    let ratio = |beside: f64, alone: f64| beside / alone.max(0.001);
    println!("\n### Host-scale queries\n");
    println!(
        "| query | alone ms (median / max) | beside 4,000,000 blocks ms (median / max) | beside / alone | goal |"
    );
    println!("|---|---:|---:|---:|---|");
    for (name, a, b) in [
        ("statistics, 1,000-block process", alone.0, beside.0),
        ("compare, 1,000-block process", alone.1, beside.1),
    ] {
        println!(
            "| {name} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} | < 20 ms, < 2x |",
            a.0,
            a.1,
            b.0,
            b.1,
            ratio(b.0, a.0)
        );
    }
    println!(
        "| statistics, 1,000-block process, beside 4,000,000 blocks and {stack_entries} entries of totals per stack | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} | < 20 ms, < 2x |",
        alone.0.0,
        alone.0.1,
        beside_stacks.0.0,
        beside_stacks.0.1,
        ratio(beside_stacks.0.0, alone.0.0)
    );
    println!(
        "| compare, 1,000-block process, beside the same | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} | < 20 ms, < 2x |",
        alone.1.0,
        alone.1.1,
        beside_stacks.1.0,
        beside_stacks.1.1,
        ratio(beside_stacks.1.0, alone.1.0)
    );
    println!(
        "| statistics, the 4,000,000-block process | | {:.1} / {:.1} | | < 100 ms |",
        big_statistics.0, big_statistics.1
    );
    println!(
        "| POST snapshot, the 4,000,000-block process | | {big_snapshot_ms:.0} | | < 1,500 ms |"
    );
    println!(
        "| compare with that snapshot, the 4,000,000-block process | | {:.1} / {:.1} | | < 200 ms |",
        big_compare.0, big_compare.1
    );
    println!(
        "\nBeside the stacks, tracerd read the small process's totals per stack {by_keys} times by its keys and {passes} times by a pass over all {stack_entries} entries; the first statistics of a new 1,000-block process beside them (a pass) took {first_pass_ms:.1} ms."
    );
    Ok(serde_json::json!({
        "small_statistics_beside_stacks_ms": beside_stacks.0.0,
        "small_compare_beside_stacks_ms": beside_stacks.1.0,
        "stack_totals_entries_beside": stack_entries,
        "stack_totals_reads_by_keys": by_keys,
        "stack_totals_reads_passes": passes,
        "first_statistics_pass_beside_stacks_ms": first_pass_ms,
        "small_statistics_alone_ms": alone.0.0,
        "small_compare_alone_ms": alone.1.0,
        "small_statistics_beside_ms": beside.0.0,
        "small_compare_beside_ms": beside.1.0,
        "big_statistics_ms": big_statistics.0,
        "big_snapshot_ms": big_snapshot_ms,
        "big_compare_ms": big_compare.0,
    }))
}

/// The small process's queries beside processes with many distinct stacks,
/// and how tracerd read its totals per stack meanwhile.
struct BesideStacks {
    /// Statistics and compare (median, max ms), as [`small_queries`].
    queries: ((f64, f64), (f64, f64)),
    /// Entries of totals per stack beside the small process.
    entries: u64,
    /// Reads of its totals per stack by its keys, and by passes over all.
    by_keys: u64,
    passes: u64,
    /// The first statistics of a new process beside them (a pass), in ms.
    first_pass_ms: f64,
}

/// Starts the stack holders (programs `dir`'s stacks build), times the
/// small process `small_pid` (snapshot `small_base`) beside them and the
/// first statistics of a new `exe` process, and ends them.
fn beside_stacks(
    http: &Client,
    dir: &Path,
    exe: &Path,
    small_pid: u32,
    small_base: u64,
) -> anyhow::Result<BesideStacks> {
    let stacks_exe =
        crate::util::cc::compile_c(dir, "stacks", STACKS_C, &["-O2", "-fno-omit-frame-pointer"])?;
    let mut stack_holders = Vec::new();
    for _ in 0..STACK_PROCESSES {
        stack_holders.push(keep_blocks(&stacks_exe, u64::from(STACK_DEPTH))?);
    }
    for holder in &stack_holders {
        wait_known(http, holder.pid())?;
    }
    let (reads_before, stack_entries) = stack_totals_use(http)?;
    let beside_stacks = small_queries(http, small_pid, small_base)?;
    let (reads_after, _) = stack_totals_use(http)?;
    // What a pass over them costs: the first statistics of a new process
    // (its keys not read yet).
    let fresh = keep_blocks(exe, SMALL_BLOCKS)?;
    wait_known(http, fresh.pid())?;
    let (first_pass_ms, _) = time_get(
        http,
        &format!("/pid/{}/statistics?group_by=lineno", fresh.pid()),
        1,
    )?;
    finish(fresh);
    let (by_keys, passes) = (
        reads_after.0 - reads_before.0,
        reads_after.1 - reads_before.1,
    );
    for holder in stack_holders {
        finish(holder);
    }
    Ok(BesideStacks {
        queries: beside_stacks,
        entries: stack_entries,
        by_keys,
        passes,
        first_pass_ms,
    })
}
