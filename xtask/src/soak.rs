//! `cargo xtask soak`: short-lived processes back to back for N seconds
//! while tracerd traces them; tracerd's memory, every kernel map's entries
//! and the blocks of exited processes before and after. A long run, kept
//! out of `cargo xtask test`.
use std::{
    collections::BTreeMap,
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::bail;

use crate::{
    setup::setup,
    util::{
        cc::compile_c,
        cmd::cargo,
        daemon::{BUILD_TRACERD, Daemon},
        paths::{TempDir, workspace_root},
    },
};

/// `cargo xtask soak`.
#[derive(clap::Args)]
pub struct SoakArgs {
    /// Seconds of process churn.
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// Threads spawning short-lived processes.
    #[arg(long, default_value_t = 2)]
    pub spawners: usize,
    /// Milliseconds each spawner waits between processes (0: back to back;
    /// 4 spawners back to back reach about 600 processes a second here,
    /// more than tracerd's exit handling keeps up with: see
    /// docs/operations.md).
    #[arg(long, default_value_t = 20)]
    pub pause_ms: u64,
    /// Extra tracerd flags, e.g. `--snapshot-interval 0`.
    #[arg(last = true)]
    pub tracerd_args: Vec<String>,
}

/// A short-lived process: 200 allocations from two sites, half freed, the
/// rest still live when it exits (tracerd must drop them with it).
const SHORT_LIVED: &str = include_str!("../workloads/soak_short_lived.c");

/// What the soak measures at one moment.
#[derive(Clone, Debug, Default)]
struct Gauges {
    rss_kib: u64,
    maps: BTreeMap<String, u64>,
    processes: BTreeMap<String, u64>,
    /// LIVE_ALLOCS entries of processes that no longer exist: what exit
    /// handling failed to remove (the rest of the map belongs to live
    /// processes of a shared host).
    dead_blocks: u64,
}

/// Set up, build tracerd, soak.
pub fn task(args: &SoakArgs) -> anyhow::Result<()> {
    setup()?;
    cargo(&BUILD_TRACERD)?;
    soak(args)
}

fn gauges(daemon: &Daemon) -> anyhow::Result<Gauges> {
    let client = daemon.client();
    let metrics = client.get("/metrics")?;
    if metrics.status != 200 {
        bail!("GET /metrics: {}", metrics.status);
    }
    let mut out = Gauges {
        rss_kib: daemon.rss_kib(),
        ..Gauges::default()
    };
    let maps = client.get("/maps")?;
    if maps.status == 200 {
        out.dead_blocks = dead_blocks(&maps.body, |pid| {
            Path::new(&format!("/proc/{pid}")).exists()
        });
    }
    for line in metrics.body.lines() {
        if let Some(rest) = line.strip_prefix("tracer_bpf_map_entries{map=\"")
            && let Some((map, value)) = rest.split_once("\"} ")
        {
            out.maps
                .insert(map.to_string(), value.trim().parse().unwrap_or(0));
        }
        if let Some(rest) = line.strip_prefix("tracer_processes{state=\"")
            && let Some((state, value)) = rest.split_once("\"} ")
        {
            out.processes
                .insert(state.to_string(), value.trim().parse().unwrap_or(0));
        }
    }
    Ok(out)
}

/// The blocks in `/maps`'s `"live_allocs_by_pid":{"12":3,...}` of pids
/// for which `alive` is false.
fn dead_blocks(maps: &str, alive: impl Fn(&str) -> bool) -> u64 {
    let mut dead = 0;
    if let Some(rest) = maps.split("\"live_allocs_by_pid\":{").nth(1)
        && let Some(body) = rest.split('}').next()
    {
        for pair in body.split(',') {
            let Some((pid, count)) = pair.split_once(':') else {
                continue;
            };
            if !alive(pid.trim_matches('"')) {
                dead += count.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    dead
}

/// `spawners` threads run the short-lived program back to back for
/// `seconds`; tracerd's RSS and every map's entries are compared before and
/// after.
fn soak(args: &SoakArgs) -> anyhow::Result<()> {
    let scratch = TempDir::try_new("soak")?;
    let exe = compile_c(scratch.path(), "shortlived", SHORT_LIVED, &["-O1"])?;
    // Ended images are kept for exited_retention: 5 s, so "after" is
    // measured with every ended process expired.
    let mut flags = vec!["--exited-retention".to_string(), "5".to_string()];
    flags.extend(args.tracerd_args.iter().cloned());
    let daemon = Daemon::start(&workspace_root(), &flags)?;
    std::thread::sleep(Duration::from_secs(15));
    let before = gauges(&daemon)?;
    let stop_at = Instant::now() + Duration::from_secs(args.seconds);
    let spawned = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..args.spawners)
        .map(|_| {
            let exe = exe.clone();
            let spawned = spawned.clone();
            let failed = failed.clone();
            let pause_ms = args.pause_ms;
            std::thread::spawn(move || {
                while Instant::now() < stop_at {
                    match Command::new(&exe).status() {
                        Ok(status) if status.success() => {
                            spawned.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => failed.store(true, Ordering::Relaxed),
                    }
                    std::thread::sleep(Duration::from_millis(pause_ms));
                }
            })
        })
        .collect();
    let mut minute = 0;
    while Instant::now() < stop_at {
        std::thread::sleep(
            Duration::from_secs(1).min(stop_at.saturating_duration_since(Instant::now())),
        );
        let elapsed = args
            .seconds
            .saturating_sub(stop_at.saturating_duration_since(Instant::now()).as_secs());
        if elapsed / 60 > minute {
            minute = elapsed / 60;
            let now = gauges(&daemon)?;
            println!(
                "soak: {minute} min, {} processes, tracerd RSS {} KiB, maps {:?}, blocks of exited processes {}",
                spawned.load(Ordering::Relaxed),
                now.rss_kib,
                now.maps,
                now.dead_blocks
            );
        }
    }
    for thread in threads {
        let _ = thread.join();
    }
    // Let exits be handled, retention expire and the orphan sweep pass:
    // settled once no exited process has a block left (at most 120 s; the
    // host's own processes keep exiting too).
    let settle = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let mut after = gauges(&daemon)?;
    while after.dead_blocks > 0 && settle.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_secs(5));
        after = gauges(&daemon)?;
    }
    println!(
        "soak: settled {:.0} s after the churn",
        settle.elapsed().as_secs_f64()
    );
    let stop_took = daemon.stop()?;
    println!(
        "soak: {} s, tracerd flags {:?}, {} spawners pausing {} ms: {} short-lived processes (each 200 allocations, 100 left live at exit)",
        args.seconds,
        flags,
        args.spawners,
        args.pause_ms,
        spawned.load(Ordering::Relaxed)
    );
    println!("| measure | before | after |");
    println!("|---|---|---|");
    println!(
        "| tracerd RSS (KiB) | {} | {} |",
        before.rss_kib, after.rss_kib
    );
    for (map, value) in &before.maps {
        println!(
            "| {map} entries | {value} | {} |",
            after.maps.get(map).copied().unwrap_or(0)
        );
    }
    println!(
        "| LIVE_ALLOCS entries of exited processes | {} | {} |",
        before.dead_blocks, after.dead_blocks
    );
    for (state, value) in &before.processes {
        println!(
            "| processes {state} | {value} | {} |",
            after.processes.get(state).copied().unwrap_or(0)
        );
    }
    println!("SIGTERM to exit: {stop_took:?}");
    if failed.load(Ordering::Relaxed) {
        bail!("a short-lived process failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_blocks_sums_the_blocks_of_gone_pids() {
        let maps = r#"{"maps":{},"live_allocs_by_pid":{"12":3,"13":40,"14":500},"x":1}"#;
        assert_eq!(dead_blocks(maps, |pid| pid == "13"), 503);
        assert_eq!(dead_blocks("{}", |_| false), 0);
    }
}
