//! The bench's real-services part (issue 35): what Debian's own servers
//! pay for tracerd. PostgreSQL 15 under pgbench, nginx (a master and its
//! forked workers) under `ab -k`, redis-server under redis-benchmark
//! ([`postgres`], [`nginx`], [`redis`]; what they share in [`server`]);
//! each started once, warmed up, and reused through every
//! round: tracerd attaches to the running processes, and those the load
//! makes (postgres's backends, one per client connection) are forks it
//! sees start.
//!
//! Every mode of [`MODES`] runs once per round, the round's order rotated;
//! one tracerd per mode and round serves every service's run. Per service,
//! metric and mode: the median throughput and its ratio to no tracerd, the
//! median p99 latency, and the allocations tracerd saw from the service's
//! processes per run (`GET /processes`: did the mode trace it at all);
//! every round's figures go to the JSON.
mod nginx;
mod postgres;
mod redis;
mod server;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::json;

use super::{
    BenchArgs,
    modes::{LISTEN, STOP_GRACE},
    wait_quiet,
};
use crate::util::{paths::release_dir, stats::median};
use server::{Figure, Server};
use tracer_testkit::{Client, Running, TracerdProcess};

/// A mode of the part: which tracerd runs while the services are loaded.
pub struct Mode {
    /// Its name in the report.
    pub name: &'static str,
    /// tracerd's flags after `--listen` and `--state-dir`, and no other
    /// (`modes::start_tracerd` would add `--exact all`); None: no tracerd.
    pub tracerd: Option<&'static [&'static str]>,
    /// Whether tracerd's scope is the services' executables, as a user
    /// traces a service: started with a `--scope-exe` of each service's
    /// (the others are idle while one is loaded; `--services` scopes one).
    /// Not one start per service, which would cost ten more starts at five
    /// rounds; not `PUT /scope?exe=` to move one tracerd's scope from
    /// service to service either: a process that enters the scope so is
    /// not traced through an allocator discovered in it (redis-server's
    /// jemalloc).
    pub scope_to_service: bool,
}

/// The part's modes, in the report's order.
pub const MODES: [Mode; 4] = [
    Mode {
        name: "none",
        tracerd: None,
        scope_to_service: false,
    },
    Mode {
        name: "default",
        tracerd: Some(&[]),
        scope_to_service: false,
    },
    Mode {
        name: "exact-all",
        tracerd: Some(&["--exact", "all"]),
        scope_to_service: false,
    },
    // The scope of the services' executables, as a user traces one
    // service: a scope is traced exactly whatever `--exact` says.
    Mode {
        name: "scoped",
        tracerd: Some(&[]),
        scope_to_service: true,
    },
];

/// Every server the part knows, in the report's order.
const ALL_SERVICES: [&str; 3] = ["postgres", "nginx", "redis"];

/// Starts the server `name` (one of [`ALL_SERVICES`]) and warms it up.
///
/// # Errors
/// It cannot be set up, started, or does not answer in time.
fn start_service(name: &str, seconds: u64) -> anyhow::Result<Box<dyn Server>> {
    let mut server: Box<dyn Server> = match name {
        "postgres" => Box::new(postgres::Postgres::start()?),
        "nginx" => Box::new(nginx::Nginx::start()?),
        "redis" => Box::new(redis::Redis::start()?),
        _ => bail!(
            "unknown service {name:?}; valid: {}",
            ALL_SERVICES.join(", ")
        ),
    };
    server.warm_up(seconds)?;
    Ok(server)
}

/// What one run of one service under one mode gave.
#[derive(Clone, Debug)]
struct Run {
    /// The load tool's figures, one per metric.
    figures: Vec<Figure>,
    /// Allocations tracerd counted from the service's processes during the
    /// run (None: no tracerd).
    traced_allocs: Option<u64>,
}

/// Runs of every round: `[service][mode]`, in round order.
type Runs = BTreeMap<&'static str, BTreeMap<&'static str, Vec<Run>>>;

/// The modes of round `round` (from 1): [`MODES`] rotated left by
/// `round - 1`, so that no mode always runs first or right after the same
/// one.
fn round_order(round: usize) -> Vec<&'static Mode> {
    let mut order: Vec<&Mode> = MODES.iter().collect();
    let len = order.len();
    order.rotate_left(round.saturating_sub(1) % len);
    order
}

/// The services asked for (all when none), in the report's order.
fn selected(asked: &[String]) -> anyhow::Result<Vec<&'static str>> {
    if let Some(bad) = asked.iter().find(|s| !ALL_SERVICES.contains(&s.as_str())) {
        bail!(
            "unknown service {bad:?}; valid: {}",
            ALL_SERVICES.join(", ")
        );
    }
    Ok(ALL_SERVICES
        .into_iter()
        .filter(|s| asked.is_empty() || asked.iter().any(|a| a == s))
        .collect())
}

/// The executable of a running process, as tracerd's scope names it
/// (`/proc/PID/exe`: symlinks resolved, redis-server is redis-check-rdb).
fn exe_of(pid: u32) -> anyhow::Result<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).with_context(|| format!("/proc/{pid}/exe"))
}

/// Allocations tracerd has counted from processes running `exe`, ended
/// ones it retains included (`GET /processes`).
fn allocs_of(http: &Client, exe: &Path) -> anyhow::Result<u64> {
    let body: serde_json::Value = serde_json::from_str(&http.get("/processes")?.body)?;
    let exe = exe.to_string_lossy();
    Ok(body["processes"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter(|p| p["exe"].as_str() == Some(exe.as_ref()))
                .filter_map(|p| p["allocs"].as_u64())
                .sum()
        })
        .unwrap_or(0))
}

/// tracerd on [`LISTEN`] with its state in `state` and `flags` alone,
/// ready once `/health` answers 200 (not `modes::start_tracerd`, which
/// traces every process exactly unless told otherwise: the default mode
/// is tracerd with no flag).
fn start_tracerd(tracerd: &Path, state: &Path, flags: &[&str]) -> anyhow::Result<Running> {
    let process = TracerdProcess::start_on(
        LISTEN.parse().context("LISTEN")?,
        tracerd,
        state,
        flags,
        Stdio::null(),
        Duration::from_secs(120),
    )
    .with_context(|| format!("starting {}", tracerd.display()))?;
    // Give the kernel a moment to finish installing breakpoints.
    std::thread::sleep(Duration::from_millis(300));
    Ok(process.into_running())
}

/// How long tracerd gets after a run to take in the exits of the
/// processes the load made (postgres's backends) before they are counted.
const SETTLE: Duration = Duration::from_millis(300);

/// Runs `service` once under the running tracerd (if any, asked at
/// `http`): the tool's figures and the allocations tracerd counted from
/// processes running `exe` meanwhile.
fn measure(
    service: &mut dyn Server,
    exe: &Path,
    mode: &Mode,
    http: Option<&Client>,
    seconds: u64,
) -> anyhow::Result<Run> {
    let before = http.map(|h| allocs_of(h, exe)).transpose()?;
    let figures = service.run(seconds, mode.name)?;
    let traced_allocs = match (http, before) {
        (Some(h), Some(before)) => {
            std::thread::sleep(SETTLE);
            Some(allocs_of(h, exe)?.saturating_sub(before))
        }
        _ => None,
    };
    Ok(Run {
        figures,
        traced_allocs,
    })
}

/// Runs the part: starts the services, measures every mode in every round,
/// prints the table; the JSON of its figures.
pub fn services_part(
    root: &Path,
    dir: &Path,
    args: &BenchArgs,
) -> anyhow::Result<serde_json::Value> {
    let started = Instant::now();
    let seconds = args.service_seconds;
    let mut services: Vec<Box<dyn Server>> = Vec::new();
    for name in selected(&args.services)? {
        eprintln!("bench: services: starting {name}");
        services.push(start_service(name, seconds)?);
    }
    let exes = services
        .iter()
        .map(|s| exe_of(s.pid()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let http = Client::new(LISTEN.parse::<SocketAddr>()?, Duration::from_secs(120))?;
    let tracerd = release_dir(root).join("tracerd");
    let mut runs: Runs = BTreeMap::new();
    for round in 1..=args.rounds.max(1) {
        eprintln!("bench: services: round {round}/{}", args.rounds);
        for mode in round_order(round) {
            let tracer = match mode.tracerd {
                Some(flags) => {
                    let mut flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
                    if mode.scope_to_service {
                        for exe in &exes {
                            flags.push("--scope-exe".into());
                            flags.push(exe.to_string_lossy().into_owned());
                        }
                    }
                    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                    Some(start_tracerd(
                        &tracerd,
                        &dir.join("state-services"),
                        &flags,
                    )?)
                }
                None => None,
            };
            // tracerd's start reads every process's mappings and builds
            // their unwind tables; the runs measure it settled.
            wait_quiet()?;
            let asked = tracer.as_ref().map(|_| &http);
            for (service, exe) in services.iter_mut().zip(&exes) {
                let run = measure(service.as_mut(), exe, mode, asked, seconds)?;
                runs.entry(service.name())
                    .or_default()
                    .entry(mode.name)
                    .or_default()
                    .push(run);
            }
            if let Some(t) = tracer {
                let _ = t.stop(STOP_GRACE);
            }
        }
    }
    let took_s = started.elapsed().as_secs_f64();
    let report = report(&services, &exes, &runs, args.rounds, seconds, took_s);
    // Each server is stopped by pid (its children too) as it drops here.
    drop(services);
    Ok(report)
}

/// The median of the figures of `metric` over `runs` (by `field`); None
/// when no run gave one.
fn median_of(runs: &[Run], metric: &str, field: fn(&Figure) -> Option<f64>) -> Option<f64> {
    let mut values: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.figures.iter())
        .filter(|f| f.metric == metric)
        .filter_map(field)
        .collect();
    (!values.is_empty()).then(|| median(&mut values))
}

/// A median and its ratio to `none`'s, as the table prints them.
fn cell(value: Option<f64>, none: Option<f64>, mode: &str, digits: usize) -> String {
    match (value, none) {
        (Some(v), _) if mode == "none" => format!("{v:.digits$}"),
        (Some(v), Some(n)) if n > 0.0 => format!("{v:.digits$} ({:.2})", v / n),
        (Some(v), _) => format!("{v:.digits$}"),
        (None, _) => "-".into(),
    }
}

/// Every run of one mode as JSON: each metric's figures and the
/// allocations traced.
fn runs_json(runs: &[Run]) -> serde_json::Value {
    let runs: Vec<_> = runs
        .iter()
        .map(|r| {
            let figures: serde_json::Map<_, _> = r
                .figures
                .iter()
                .map(|f| {
                    (
                        f.metric.clone(),
                        json!({"per_s": f.per_s, "p99_ms": f.p99_ms}),
                    )
                })
                .collect();
            json!({"figures": figures, "traced_allocs": r.traced_allocs})
        })
        .collect();
    json!(runs)
}

/// Prints one service's rows of the table (per metric: throughput and p99
/// with their ratios to `none`; the allocations traced per run); their
/// JSON, every round's runs included.
fn service_report(service: &dyn Server, by_mode: &BTreeMap<&str, Vec<Run>>) -> serde_json::Value {
    let empty = Vec::new();
    let of = |mode: &str| by_mode.get(mode).unwrap_or(&empty);
    let mut metrics: Vec<String> = Vec::new();
    for figure in of("none").iter().flat_map(|r| r.figures.iter()) {
        if !metrics.contains(&figure.metric) {
            metrics.push(figure.metric.clone());
        }
    }
    let mut metrics_json = serde_json::Map::new();
    for metric in &metrics {
        let throughput = |m: &str| median_of(of(m), metric, |f| Some(f.per_s));
        let p99 = |m: &str| median_of(of(m), metric, |f| f.p99_ms);
        let (none_tp, none_p99) = (throughput("none"), p99("none"));
        let row = |unit: &str, value: &dyn Fn(&str) -> Option<f64>, none, digits| {
            print!("| {} | {metric} | {unit} |", service.name());
            for mode in &MODES {
                print!(" {} |", cell(value(mode.name), none, mode.name, digits));
            }
            println!();
        };
        row(service.unit(), &throughput, none_tp, 0);
        row("p99 ms", &p99, none_p99, 2);
        let ratio = |v: Option<f64>, n: Option<f64>| Some(v? / n?);
        let modes_json: serde_json::Map<_, _> = MODES
            .iter()
            .map(|mode| {
                let (tp, lat) = (throughput(mode.name), p99(mode.name));
                let figures = json!({
                    "per_s_median": tp,
                    "ratio": ratio(tp, none_tp),
                    "p99_ms_median": lat,
                    "p99_ratio": ratio(lat, none_p99),
                });
                (mode.name.to_string(), figures)
            })
            .collect();
        metrics_json.insert(
            metric.clone(),
            json!({"unit": service.unit(), "modes": modes_json}),
        );
    }
    print!("| {} | allocations traced per run | |", service.name());
    let mut rounds_json = serde_json::Map::new();
    for mode in &MODES {
        let mut traced: Vec<f64> = of(mode.name)
            .iter()
            .filter_map(|r| r.traced_allocs.map(|a| a as f64))
            .collect();
        if traced.is_empty() {
            print!(" - |");
        } else {
            print!(" {:.0} |", median(&mut traced));
        }
        rounds_json.insert(mode.name.into(), runs_json(of(mode.name)));
    }
    println!();
    json!({
        "load": service.load(),
        "metrics": metrics_json,
        "rounds": rounds_json,
    })
}

/// Prints the part's table; the JSON of its figures (medians, ratios to
/// `none`, and every round's runs).
fn report(
    services: &[Box<dyn Server>],
    exes: &[PathBuf],
    runs: &Runs,
    rounds: usize,
    seconds: u64,
    took_s: f64,
) -> serde_json::Value {
    println!(
        "\n### Real services, median of {rounds} rounds of {seconds} s runs (ratio to no tracerd)\n"
    );
    print!("| service | metric | unit |");
    for mode in &MODES {
        print!(" {} |", mode.name);
    }
    println!();
    println!("|---|---|---|{}", "---:|".repeat(MODES.len()));
    let mut json = serde_json::Map::new();
    for (service, exe) in services.iter().zip(exes) {
        if let Some(by_mode) = runs.get(service.name()) {
            let mut figures = service_report(service.as_ref(), by_mode);
            figures["exe"] = json!(exe);
            json.insert(service.name().into(), figures);
        }
    }
    let modes: serde_json::Map<_, _> = MODES
        .iter()
        .map(|m| {
            (
                m.name.to_string(),
                json!({"tracerd": m.tracerd, "scope_to_service": m.scope_to_service}),
            )
        })
        .collect();
    println!();
    for service in services {
        println!("- {}: {}", service.name(), service.load());
    }
    println!("- the part took {took_s:.0} s");
    json!({
        "rounds": rounds,
        "seconds_per_run": seconds,
        "took_s": took_s,
        "modes": modes,
        "services": json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_leads_one_round_in_turn() {
        let names = |round| -> Vec<&str> { round_order(round).iter().map(|m| m.name).collect() };
        assert_eq!(names(1), ["none", "default", "exact-all", "scoped"]);
        assert_eq!(names(2), ["default", "exact-all", "scoped", "none"]);
        assert_eq!(names(4), ["scoped", "none", "default", "exact-all"]);
        assert_eq!(names(5), names(1));
    }

    #[test]
    fn services_are_chosen_in_the_reports_order_and_unknown_ones_refused() {
        let asked = ["redis".to_string(), "postgres".to_string()];
        assert_eq!(selected(&asked).unwrap(), ["postgres", "redis"]);
        assert_eq!(selected(&[]).unwrap(), ALL_SERVICES);
        let err = selected(&["mysql".to_string()]).unwrap_err();
        assert!(
            err.to_string().contains("valid: postgres, nginx, redis"),
            "{err}"
        );
    }

    #[test]
    fn a_cell_gives_the_median_and_its_ratio_to_none() {
        assert_eq!(cell(Some(950.0), Some(1000.0), "default", 0), "950 (0.95)");
        assert_eq!(cell(Some(1000.0), Some(1000.0), "none", 0), "1000");
        assert_eq!(cell(None, Some(1000.0), "scoped", 2), "-");
    }
}
