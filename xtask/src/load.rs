//! `cargo xtask load`: many loopback clients on tracerd's expensive routes
//! (statistics, compare) and `/metrics` for N seconds while a churning
//! workload is traced; a latency table per route, and a failure on any 5xx
//! or connection error. A long run, kept out of `cargo xtask test`.
use std::{
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::bail;

use tracer_testkit::Running;

use crate::{
    setup::setup,
    util::{
        cc::compile_c,
        cmd::cargo,
        daemon::{BUILD_TRACERD, Daemon},
        paths::{TempDir, workspace_root},
        stats::percentile,
    },
};

/// `cargo xtask load`.
#[derive(clap::Args)]
pub struct LoadArgs {
    /// Seconds of load.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Extra tracerd flags, e.g. `--max-expensive-requests 64`.
    #[arg(last = true)]
    pub tracerd_args: Vec<String>,
}

/// A long-running churn: a ring of 20000 live blocks from four call sites,
/// each new block replacing (freeing) the oldest, in bursts.
const CHURN: &str = include_str!("../workloads/load_churn.c");

/// Set up, build tracerd, run the load.
pub fn task(args: &LoadArgs) -> anyhow::Result<()> {
    setup()?;
    cargo(&BUILD_TRACERD)?;
    load(args)
}

/// `clients` threads on statistics, compare and metrics for `seconds`
/// while the churn workload is traced.
fn load(args: &LoadArgs) -> anyhow::Result<()> {
    let scratch = TempDir::try_new("load")?;
    let churn = compile_c(scratch.path(), "churn", CHURN, &["-O1"])?;
    let daemon = Daemon::start(&workspace_root(), &args.tracerd_args)?;
    // Stopped (by pid) when this function returns, on error paths too.
    let workload = Running::spawn(Command::new(&churn).stdout(Stdio::null()))?;
    let pid = workload.pid();
    let client = daemon.client().clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.get(&format!("/pid/{pid}"))?.status != 200 {
        if Instant::now() > deadline {
            bail!("the churn workload is not traced after 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let status = client.post(&format!("/pid/{pid}/snapshots"))?.status;
    if status != 201 {
        bail!("POST snapshots: {status}");
    }
    let routes = [
        format!("/pid/{pid}/statistics?group_by=lineno&limit=20"),
        format!("/pid/{pid}/compare?group_by=lineno&limit=20"),
        "/metrics".to_string(),
    ];
    let names = ["statistics", "compare", "metrics"];
    let stop_at = Instant::now() + Duration::from_secs(args.seconds);
    let errors = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..args.clients)
        .map(|first| {
            let routes = routes.clone();
            let errors = errors.clone();
            let client = client.clone();
            std::thread::spawn(move || {
                let mut samples: Vec<(usize, u16, u64)> = Vec::new();
                let mut i = first;
                while Instant::now() < stop_at {
                    let route = i % routes.len();
                    let start = Instant::now();
                    match client.get(&routes[route]) {
                        Ok(response) => samples.push((
                            route,
                            response.status,
                            start.elapsed().as_micros() as u64,
                        )),
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    i += 1;
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for thread in threads {
        samples.extend(
            thread
                .join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))?,
        );
    }
    let stop_took = daemon.stop()?;
    report_load(
        &samples,
        &names,
        errors.load(Ordering::Relaxed),
        args,
        stop_took,
    )
}

fn report_load(
    samples: &[(usize, u16, u64)],
    names: &[&str],
    connect_errors: u64,
    args: &LoadArgs,
    stop_took: Duration,
) -> anyhow::Result<()> {
    println!(
        "load: {} clients for {} s, tracerd flags {:?}; latency in ms (connect to last byte)",
        args.clients, args.seconds, args.tracerd_args
    );
    println!(
        "| route | requests | 200 | 429 | other 4xx | 5xx | p50 all | p99 all | p50 of 200 | p99 of 200 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut total_5xx = 0;
    let rows: Vec<Option<usize>> = (0..names.len()).map(Some).chain([None]).collect();
    for row in rows {
        let picked: Vec<&(usize, u16, u64)> = samples
            .iter()
            .filter(|s| row.is_none_or(|r| s.0 == r))
            .collect();
        let mut all: Vec<u64> = picked.iter().map(|s| s.2).collect();
        all.sort_unstable();
        let mut ok: Vec<u64> = picked.iter().filter(|s| s.1 == 200).map(|s| s.2).collect();
        ok.sort_unstable();
        let count = |f: &dyn Fn(u16) -> bool| picked.iter().filter(|s| f(s.1)).count();
        let fives = count(&|s| s >= 500);
        if row.is_none() {
            total_5xx = fives;
        }
        let ms = |us: u64| format!("{:.1}", us as f64 / 1000.0);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.map_or("all", |r| names[r]),
            picked.len(),
            count(&|s| s == 200),
            count(&|s| s == 429),
            count(&|s| (400..500).contains(&s) && s != 429),
            fives,
            ms(percentile(&all, 50.0)),
            ms(percentile(&all, 99.0)),
            ms(percentile(&ok, 50.0)),
            ms(percentile(&ok, 99.0)),
        );
    }
    println!("connection errors: {connect_errors}; SIGTERM to exit after the load: {stop_took:?}");
    if total_5xx > 0 || connect_errors > 0 {
        bail!("{total_5xx} responses were 5xx and {connect_errors} requests failed");
    }
    Ok(())
}
