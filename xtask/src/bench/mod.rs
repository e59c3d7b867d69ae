//! `cargo xtask bench`: tracerd's overhead, side by side with the reference
//! tools, in one run; then the scope and scale parts and the snapshot
//! engine against CPython ([`model`], also `cargo xtask bench-model`).
//!
//! The unwind part ([`unwind`]) sets the unwinder against the
//! frame-pointer walk. The services part ([`services`]) loads Debian's
//! PostgreSQL, nginx and redis-server without tracerd, with its defaults,
//! tracing every process exactly, and tracing the services alone by scope.
//!
//! The overhead part runs every workload ([`workloads`]) under every mode
//! ([`modes`]), interleaved: every mode once per round, each figure the
//! median of the rounds. It prints markdown tables ([`report`]) and writes
//! JSON. With `--baseline REV`, tracerd built at REV ([`baseline`]) is one
//! more mode, measured in the same rounds, and the report compares the cost
//! each adds.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::bail;

pub mod baseline;
mod cheap;
mod host;
pub mod model;
mod modes;
mod queries;
mod report;
mod scale;
mod scope;
mod services;
mod unwind;
mod workloads;

use baseline::Baseline;
use modes::{ALL_MODES, DAEMON_MODES, STOP_GRACE, cpu_and_rss, round_order, start_mode};
use report::{DaemonCost, Rounds};
use workloads::ALL_WORKLOADS;

use crate::{
    setup::setup,
    util::{
        cmd::cargo,
        paths::{target_dir, workspace_root},
        tracers,
    },
};

/// Options of `cargo xtask bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Rounds; every figure is the median over them (at least 5 for the report).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// malloc+free pairs per churn run.
    #[arg(long, default_value_t = 200_000)]
    pub pairs: u64,
    /// Only these modes (comma-separated: none,floor,tracerd,tracerd-sampled,baseline,memleak,heaptrack,massif;
    /// baseline needs --baseline).
    #[arg(long, value_delimiter = ',')]
    pub modes: Vec<String>,
    /// Only these workloads (comma-separated: churn,threads,mmap,python,sqlite,gcc).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Skip the scale part (4,000,000 live blocks, a 1,000,000-block snapshot).
    #[arg(long)]
    pub no_scale: bool,
    /// Skip the host-scale queries part (statistics and compare of a
    /// 1,000-block process beside 4,000,000 blocks, and of the big one).
    #[arg(long)]
    pub no_queries: bool,
    /// Skip the host-scale part (10,000,000 live blocks across 100
    /// processes: kernel and tracerd memory per block, queries beside them).
    #[arg(long)]
    pub no_host: bool,
    /// Skip the cheap-routes part (traced-memory, processes and health:
    /// p50/p99 idle, during a 4,000,000-block snapshot, during the sweep).
    #[arg(long)]
    pub no_cheap: bool,
    /// Skip the scope part (an untraced process while another is traced).
    #[arg(long)]
    pub no_scope: bool,
    /// Skip the unwind part (the unwinder against the frame-pointer walk,
    /// per frame, on churn and the real workloads; table memory).
    #[arg(long)]
    pub no_unwind: bool,
    /// Skip the snapshot-engine part (statistics and compare_to of
    /// 1,000,000 traces against CPython's tracemalloc, `bench-model`).
    #[arg(long)]
    pub no_model: bool,
    /// Skip the real-services part (PostgreSQL under pgbench, nginx under
    /// ab, redis-server under redis-benchmark; without tracerd, with its
    /// defaults, tracing every process exactly, tracing the services by
    /// scope).
    #[arg(long)]
    pub no_services: bool,
    /// Only these services in the services part (comma-separated:
    /// postgres,nginx,redis).
    #[arg(long, value_delimiter = ',')]
    pub services: Vec<String>,
    /// Seconds of each load run of the services part (one per service,
    /// mode and round).
    #[arg(long, default_value_t = 3)]
    pub service_seconds: u64,
    /// Run only this part; the `--no-*` flags then do not matter.
    #[arg(long, value_name = "PART", value_parser = clap::builder::PossibleValuesParser::new(PARTS))]
    pub only: Option<String>,
    /// Traces per snapshot in the snapshot-engine part.
    #[arg(long, default_value_t = 1_000_000)]
    pub model_traces: u64,
    /// Run even while other tracers are attached (their cost is added to
    /// every mode, so differences stay meaningful but ratios do not).
    #[arg(long)]
    pub force: bool,
    /// Where the JSON report goes.
    #[arg(long, default_value = "target/bench/overhead.json")]
    pub json: PathBuf,
    /// Also measure tracerd built at this git revision (`main`, `HEAD~3`, a
    /// hash), as the mode `baseline` in the same rounds, and the snapshot
    /// engine of that revision; it is checked out and built under
    /// target/baseline/<short-rev>.
    #[arg(long, value_name = "REV")]
    pub baseline: Option<String>,
}

/// The parts of `cargo xtask bench`, as `--only` names them.
const PARTS: [&str; 9] = [
    "overhead", "scope", "unwind", "scale", "queries", "host", "cheap", "services", "model",
];

impl BenchArgs {
    /// Whether the part `part` (one of [`PARTS`]) runs: the one `--only`
    /// names, else every part whose `--no-*` flag (`skipped`) is not given.
    fn runs(&self, part: &str, skipped: bool) -> bool {
        match &self.only {
            Some(only) => only == part,
            None => !skipped,
        }
    }
}

/// Set up, build tracerd (and the baseline's), run every part.
pub fn task(args: &BenchArgs) -> anyhow::Result<()> {
    setup()?;
    cargo(&["build", "--release", "-p", "tracer-daemon", "--bins"])?;
    let root = workspace_root();
    let baseline = match &args.baseline {
        Some(rev) => {
            let baseline = Baseline::prepare(&root, rev)?;
            baseline.build_tracerd()?;
            Some(baseline)
        }
        None => None,
    };
    run(&root, args, baseline.as_ref())?;
    if !args.runs("model", args.no_model) {
        return Ok(());
    }
    // The snapshot engine against CPython, on a machine as quiet as the
    // overhead part needed.
    model::task(&model::BenchModelArgs {
        traces: args.model_traces,
        distinct: model::DEFAULT_DISTINCT.to_vec(),
        runs: u32::try_from(args.rounds).unwrap_or(u32::MAX),
        python: std::env::var("TRACER_PYTHON").unwrap_or_else(|_| "python3".into()),
        out: PathBuf::from("target/bench-model"),
        force: args.force,
        baseline: args.baseline.clone(),
    })
}

/// The modes to run: all (baseline only with `--baseline`) or those asked
/// for, in the table's order; `--baseline` adds baseline to those asked for.
fn selected_modes(asked: &[String], baseline: bool) -> anyhow::Result<Vec<&'static str>> {
    if let Some(bad) = asked.iter().find(|m| !ALL_MODES.contains(&m.as_str())) {
        bail!("unknown mode {bad:?}; valid: {}", ALL_MODES.join(", "));
    }
    if !baseline && asked.iter().any(|m| m == "baseline") {
        bail!("the mode baseline needs --baseline REV");
    }
    Ok(ALL_MODES
        .iter()
        .copied()
        .filter(|&m| {
            if m == "baseline" {
                baseline
            } else {
                asked.is_empty() || asked.iter().any(|x| x == m)
            }
        })
        .collect())
}

/// Runs the suite; `root` is the workspace root.
fn run(root: &Path, args: &BenchArgs, baseline: Option<&Baseline>) -> anyhow::Result<()> {
    let others = tracers::running();
    if !others.is_empty() && !args.force {
        bail!(
            "other tracers are running ({}): they would slow every mode; stop them first",
            others.join(", ")
        );
    }
    let modes = selected_modes(&args.modes, baseline.is_some())?;
    if let Some(bad) = args
        .workloads
        .iter()
        .find(|w| !ALL_WORKLOADS.contains(&w.as_str()))
    {
        bail!(
            "unknown workload {bad:?}; valid: {}",
            ALL_WORKLOADS.join(", ")
        );
    }
    let dir = target_dir(root).join("bench");
    let workloads: Vec<_> = workloads::prepare(&dir, args.pairs)?
        .into_iter()
        .filter(|w| args.workloads.is_empty() || args.workloads.iter().any(|x| x == w.name))
        .collect();
    if args.runs("overhead", false) {
        overhead(root, args, &dir, &modes, &workloads, baseline)?;
    }
    let mut extra = serde_json::Map::new();
    if args.runs("scope", args.no_scope) {
        extra.insert("scope".into(), scope::scope_part(root, &dir, args)?);
    }
    if args.runs("unwind", args.no_unwind) {
        extra.insert(
            "unwind".into(),
            unwind::unwind_part(root, &dir, args, &workloads)?,
        );
    }
    if args.runs("scale", args.no_scale) {
        wait_quiet()?;
        extra.insert("scale".into(), scale::scale_part(root, &dir)?);
    }
    if args.runs("queries", args.no_queries) {
        wait_quiet()?;
        extra.insert("queries".into(), queries::queries_part(root, &dir)?);
    }
    if args.runs("host", args.no_host) {
        wait_quiet()?;
        extra.insert("host".into(), host::host_part(root, &dir)?);
    }
    if args.runs("cheap", args.no_cheap) {
        wait_quiet()?;
        let tracerd = crate::util::paths::release_dir(root).join("tracerd");
        let baseline = baseline.map(|b| (b.label(), b.tracerd()));
        extra.insert(
            "cheap".into(),
            cheap::cheap_part(
                &tracerd,
                &dir,
                baseline
                    .as_ref()
                    .map(|(label, path)| (label.clone(), path.as_path())),
            )?,
        );
    }
    if args.runs("services", args.no_services) {
        wait_quiet()?;
        extra.insert(
            "services".into(),
            services::services_part(root, &dir, args)?,
        );
    }
    // The overhead part wrote the file; without it the others start one.
    let mut json: serde_json::Value = if args.runs("overhead", false) {
        serde_json::from_str(&fs::read_to_string(&args.json)?)?
    } else {
        serde_json::json!({})
    };
    if let Some(object) = json.as_object_mut() {
        object.extend(extra);
    }
    if let Some(parent) = args.json.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(&args.json, serde_json::to_string_pretty(&json)?)?;
    Ok(())
}

/// The overhead part: every workload under every mode, interleaved in
/// rounds; prints its tables and writes `args.json`.
fn overhead(
    root: &Path,
    args: &BenchArgs,
    dir: &Path,
    modes: &[&'static str],
    workloads: &[workloads::Workload],
    baseline: Option<&Baseline>,
) -> anyhow::Result<()> {
    let mut results: Rounds = BTreeMap::new();
    let mut costs: BTreeMap<&str, DaemonCost> = BTreeMap::new();
    for round in 1..=args.rounds.max(1) {
        eprintln!("bench: round {round}/{}", args.rounds);
        for mode in round_order(modes, round) {
            let tracer = start_mode(mode, root, dir, baseline)?;
            let before = tracer.as_ref().map(|t| cpu_and_rss(t.pid()));
            for workload in workloads {
                let figure = workloads::run_once(mode, workload, dir)?;
                results
                    .entry(workload.name)
                    .or_default()
                    .entry(mode)
                    .or_default()
                    .push(figure);
            }
            if let (Some(t), Some((ticks0, _))) = (&tracer, before)
                && DAEMON_MODES.contains(&mode)
            {
                let (ticks1, hwm) = cpu_and_rss(t.pid());
                let cost = costs.entry(mode).or_default();
                cost.cpu_ticks.push(ticks1.saturating_sub(ticks0));
                cost.rss_kib = cost.rss_kib.max(hwm);
                cost.map_bytes = cost.map_bytes.max(modes::bpf_map_memory(t.pid()));
            }
            if let Some(t) = tracer {
                let _ = t.stop(STOP_GRACE);
            }
        }
    }
    report::report(args, modes, workloads, &mut results, &costs, baseline)
}

/// The host's busy share of CPU time over `over` (every CPU together),
/// from `/proc/stat`'s first line (idle and iowait are not busy).
fn busy_share(over: std::time::Duration) -> anyhow::Result<f64> {
    fn times() -> anyhow::Result<(u64, u64)> {
        let stat = fs::read_to_string("/proc/stat")?;
        let line = stat.lines().next().unwrap_or_default();
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let total: u64 = fields.iter().sum();
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        Ok((total, idle))
    }
    let (total0, idle0) = times()?;
    std::thread::sleep(over);
    let (total1, idle1) = times()?;
    let total = total1.saturating_sub(total0).max(1);
    let idle = idle1.saturating_sub(idle0);
    Ok(1.0 - idle as f64 / total as f64)
}

/// Waits (at most a minute) until the host is quiet: the kernel frees a
/// stopped tracerd's maps of millions of entries on its own workers for
/// seconds after it exits, and a part measured meanwhile measures them.
fn wait_quiet() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut quiet = 0;
    while quiet < 2 && started.elapsed() < std::time::Duration::from_secs(60) {
        if busy_share(std::time::Duration::from_millis(500))? < 0.1 {
            quiet += 1;
        } else {
            quiet = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_mode_but_baseline_by_default() {
        assert_eq!(
            selected_modes(&[], false).unwrap(),
            [
                "none",
                "floor",
                "tracerd",
                "tracerd-sampled",
                "memleak",
                "heaptrack",
                "massif"
            ]
        );
    }

    #[test]
    fn baseline_joins_the_modes_with_its_flag() {
        assert_eq!(selected_modes(&[], true).unwrap(), ALL_MODES);
        assert_eq!(
            selected_modes(&strings(&["tracerd", "none"]), true).unwrap(),
            ["none", "tracerd", "baseline"]
        );
        assert_eq!(
            selected_modes(&strings(&["none", "tracerd", "baseline"]), true).unwrap(),
            ["none", "tracerd", "baseline"]
        );
    }

    #[test]
    fn only_runs_the_part_it_names_whatever_the_no_flags_say() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.bench);
        let every = parse(&["bench", "--no-scope"]).unwrap();
        assert!(every.runs("overhead", false) && every.runs("scale", every.no_scale));
        assert!(!every.runs("scope", every.no_scope));
        let only = parse(&["bench", "--only", "scope", "--no-scope"]).unwrap();
        assert!(only.runs("scope", only.no_scope));
        assert!(!only.runs("overhead", false) && !only.runs("model", only.no_model));
        assert!(parse(&["bench", "--only", "nothing"]).is_err());
    }

    #[test]
    fn baseline_without_its_flag_and_unknown_modes_are_refused() {
        assert!(selected_modes(&strings(&["baseline"]), false).is_err());
        let err = selected_modes(&strings(&["perf"]), false).unwrap_err();
        assert!(err.to_string().contains("valid: none, floor"), "{err}");
    }
}
