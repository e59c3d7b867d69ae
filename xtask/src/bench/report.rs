//! The overhead part's report: a markdown table of the medians (slowdown
//! against uninstrumented), the added cost per churn pair against the
//! goals (memleak, floor, sampled against exact), tracerd's own CPU, memory and kernel maps; with
//! `--baseline`, tracerd's added cost against the baseline's per workload.
//! The same figures go to the JSON file.
use std::{collections::BTreeMap, fs};

use super::{BenchArgs, baseline::Baseline, workloads::Workload};
use crate::util::stats::median;

/// Figures of every round: `[workload][mode]`.
pub type Rounds<'a> = BTreeMap<&'a str, BTreeMap<&'a str, Vec<f64>>>;

/// What a tracerd (ours or the baseline's) cost itself over the rounds.
#[derive(Clone, Debug, Default)]
pub struct DaemonCost {
    /// CPU clock ticks per round (all workloads).
    pub cpu_ticks: Vec<u64>,
    /// Peak RSS, KiB.
    pub rss_kib: u64,
    /// Kernel memory of its BPF maps, bytes.
    pub map_bytes: u64,
}

impl DaemonCost {
    /// Median CPU per round in ms.
    fn cpu_median_ms(&self) -> f64 {
        let ticks_per_s = 100.0;
        let mut cpu = self.cpu_ticks.clone();
        cpu.sort_unstable();
        cpu.get(cpu.len() / 2)
            .map_or(0.0, |t| *t as f64 / ticks_per_s * 1000.0)
    }

    fn print(&self, name: &str) {
        println!(
            "{name}: {:.0} ms CPU per round of all workloads (median), peak RSS {} MiB, kernel maps {} MiB",
            self.cpu_median_ms(),
            self.rss_kib / 1024,
            self.map_bytes / (1024 * 1024)
        );
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "cpu_ms_per_round_median": self.cpu_median_ms(),
            "peak_rss_kib": self.rss_kib,
            "bpf_map_bytes": self.map_bytes,
        })
    }
}

/// Prints the tables and writes `args.json`.
pub fn report(
    args: &BenchArgs,
    modes: &[&str],
    workloads: &[Workload],
    results: &mut Rounds,
    costs: &BTreeMap<&str, DaemonCost>,
    baseline: Option<&Baseline>,
) -> anyhow::Result<()> {
    let mut medians: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (workload, by_mode) in results.iter_mut() {
        for (mode, figures) in by_mode.iter_mut() {
            medians
                .entry(workload.to_string())
                .or_default()
                .insert(mode.to_string(), median(figures));
        }
    }
    println!(
        "\n### Overhead, median of {} rounds (slowdown vs uninstrumented)\n",
        args.rounds
    );
    print!("| workload | unit |");
    for mode in modes {
        print!(" {mode} |");
    }
    println!();
    print!("|---|---|");
    for _ in modes {
        print!("---|");
    }
    println!();
    for workload in workloads {
        let Some(by_mode) = medians.get(workload.name) else {
            continue;
        };
        let base = by_mode.get("none").copied();
        print!("| {} | {} |", workload.name, workload.unit);
        for mode in modes {
            match (by_mode.get(*mode), base) {
                (Some(v), Some(b)) if *mode != "none" => print!(" {v:.1} ({:.2}x) |", v / b),
                (Some(v), _) => print!(" {v:.1} |"),
                _ => print!(" - |"),
            }
        }
        println!();
    }
    let goals = goals(&medians);
    let tracerd = costs.get("tracerd").cloned().unwrap_or_default();
    tracerd.print("tracerd");
    let mut json = serde_json::json!({
        "rounds": args.rounds,
        "pairs": args.pairs,
        "medians": medians,
        "goals": goals,
        "tracerd": tracerd.json(),
    });
    if let Some(baseline) = baseline {
        let cost = costs.get("baseline").cloned().unwrap_or_default();
        cost.print(&format!("baseline {}", baseline.label()));
        let added = against_baseline(baseline, workloads, &medians);
        let mut object = serde_json::json!({
            "rev": baseline.rev,
            "commit": baseline.commit,
            "added": added,
        });
        if let (Some(object), serde_json::Value::Object(cost)) =
            (object.as_object_mut(), cost.json())
        {
            object.extend(cost);
        }
        json["baseline"] = object;
    }
    if let Some(parent) = args.json.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(&args.json, serde_json::to_string_pretty(&json)?)?;
    println!("\nJSON: {}", args.json.display());
    Ok(())
}

/// The goals' figures from the churn medians (ns per malloc+free pair, by
/// workload and mode): what tracerd adds, against memleak-style bpftrace
/// and the floor (empty programs at the same points), printed as found.
fn goals(
    medians: &BTreeMap<String, BTreeMap<String, f64>>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut goals = serde_json::Map::new();
    if let Some(churn) = medians.get("churn")
        && let (Some(none), Some(ours)) = (churn.get("none"), churn.get("tracerd"))
    {
        let added = ours - none;
        println!("\nchurn: tracerd adds {added:.0} ns per malloc+free pair");
        goals.insert("tracerd_added_ns_per_pair".into(), added.into());
        if let Some(memleak) = churn.get("memleak") {
            let theirs = memleak - none;
            let ratio = added / theirs;
            println!(
                "  memleak-style bpftrace adds {theirs:.0} ns: tracerd/memleak = {ratio:.2} (goal <= 0.35)"
            );
            goals.insert("memleak_added_ns_per_pair".into(), theirs.into());
            goals.insert("ratio_vs_memleak".into(), ratio.into());
        }
        if let Some(sampled) = churn.get("tracerd-sampled") {
            let sampled_added = sampled - none;
            let ratio = sampled_added / added;
            println!(
                "  sampled ({} KiB) adds {sampled_added:.0} ns: sampled/exact = {ratio:.2} (goal <= 0.5)",
                super::modes::SAMPLE_INTERVAL / 1024
            );
            goals.insert("sampled_added_ns_per_pair".into(), sampled_added.into());
            goals.insert("ratio_sampled_vs_exact".into(), ratio.into());
        }
        if let Some(floor) = churn.get("floor") {
            let floor_added = floor - none;
            let ratio = added / floor_added;
            println!(
                "  empty programs at the same points add {floor_added:.0} ns: tracerd/floor = {ratio:.2} (goal <= 1.5)"
            );
            goals.insert("floor_added_ns_per_pair".into(), floor_added.into());
            goals.insert("ratio_vs_floor".into(), ratio.into());
        }
    }
    // Each allocator's churn: tracer's added cost per call against the
    // floor of the same probes on that allocator.
    for (name, _, _) in super::workloads::ALLOCATOR_CHURNS {
        if let Some(churn) = medians.get(name)
            && let (Some(none), Some(ours), Some(floor)) =
                (churn.get("none"), churn.get("tracerd"), churn.get("floor"))
        {
            let (added, floor_added) = (ours - none, floor - none);
            let ratio = added / floor_added;
            println!(
                "{name}: tracerd adds {added:.0} ns per malloc+free pair, empty programs {floor_added:.0} ns: tracerd/floor = {ratio:.2}"
            );
            goals.insert(format!("{name}_added_ns_per_pair"), added.into());
            goals.insert(
                format!("{name}_floor_added_ns_per_pair"),
                floor_added.into(),
            );
            goals.insert(format!("{name}_ratio_vs_floor"), ratio.into());
        }
    }
    goals
}

/// Added cost (mode minus uninstrumented) of tracerd and of the baseline
/// per workload, and their ratio: a table, and the same as JSON.
fn against_baseline(
    baseline: &Baseline,
    workloads: &[Workload],
    medians: &BTreeMap<String, BTreeMap<String, f64>>,
) -> serde_json::Value {
    println!(
        "\n### tracerd against the baseline {}: added cost (mode minus uninstrumented), medians\n",
        baseline.label()
    );
    println!(
        "| workload | unit | uninstrumented | tracerd adds | baseline adds | tracerd/baseline |"
    );
    println!("|---|---|---|---|---|---|");
    let mut json = serde_json::Map::new();
    for workload in workloads {
        let Some(by_mode) = medians.get(workload.name) else {
            continue;
        };
        let (Some(none), Some(ours), Some(theirs)) = (
            by_mode.get("none"),
            by_mode.get("tracerd"),
            by_mode.get("baseline"),
        ) else {
            continue;
        };
        let (ours, theirs) = (ours - none, theirs - none);
        let ratio = ours / theirs;
        println!(
            "| {} | {} | {none:.1} | {ours:.1} | {theirs:.1} | {ratio:.2} |",
            workload.name, workload.unit
        );
        json.insert(
            workload.name.to_string(),
            serde_json::json!({
                "unit": workload.unit,
                "tracerd_added": ours,
                "baseline_added": theirs,
                "ratio": ratio,
            }),
        );
    }
    if json.is_empty() {
        println!("(the modes none, tracerd and baseline are all needed for this table)");
    }
    serde_json::Value::Object(json)
}
