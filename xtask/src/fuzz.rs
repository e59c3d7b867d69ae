//! `cargo xtask fuzz`: every fuzz target in `fuzz/` (cargo fuzz, nightly)
//! for N seconds, a few side by side, each seeded from real inputs of its
//! kind; one table row per target (runs, coverage, corpus, result). A long
//! run, kept out of `cargo xtask test` (CI's time limit).
use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::{
    setup::setup,
    util::{cmd::run_checked, paths::workspace_root},
};
use tracer_testkit::Running;

/// `cargo xtask fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// Only these targets (default: every target in fuzz/Cargo.toml).
    pub targets: Vec<String>,
    /// Targets run side by side (each uses one core).
    #[arg(long, default_value_t = 2)]
    pub parallel: usize,
}

/// Set up, then fuzz.
pub fn task(args: &FuzzArgs) -> anyhow::Result<()> {
    setup()?;
    fuzz(&workspace_root(), args)
}

/// Runs every fuzz target for `seconds`, `parallel` at a time, seeded from
/// real inputs, and prints one line per target (runs, coverage, result).
fn fuzz(root: &Path, args: &FuzzArgs) -> anyhow::Result<()> {
    // `cargo`, not $CARGO: `+nightly` needs rustup's proxy.
    if Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!("xtask: installing cargo-fuzz");
        run_checked(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let dir = root.join("fuzz");
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).context("fuzz/Cargo.toml")?;
    let targets: Vec<String> = if args.targets.is_empty() {
        targets_of(&manifest)
    } else {
        args.targets.clone()
    };
    // The targets need no eBPF object: skip building it with sanitizers.
    let build = Command::new("cargo")
        .args(["+nightly", "fuzz", "build", "-O"])
        .env("AYA_BUILD_SKIP", "1")
        .current_dir(&dir)
        .status()
        .context("cargo fuzz build")?;
    if !build.success() {
        bail!("cargo fuzz build failed");
    }
    for target in &targets {
        seed_corpus(root, &dir.join("corpus").join(target), target)?;
    }
    let mut results = Vec::new();
    for chunk in targets.chunks(args.parallel.max(1)) {
        let children: Vec<(String, Running)> = chunk
            .iter()
            .map(|target| {
                let log = std::fs::File::create(dir.join(format!("{target}.log")))?;
                let child = Running::spawn(
                    Command::new("cargo")
                        .args(["+nightly", "fuzz", "run", "-O", target, "--"])
                        .arg(format!("-max_total_time={}", args.seconds))
                        .args(["-rss_limit_mb=4096", "-print_final_stats=1"])
                        .env("AYA_BUILD_SKIP", "1")
                        .current_dir(&dir)
                        .stdout(Stdio::null())
                        .stderr(log),
                )?;
                Ok((target.clone(), child))
            })
            .collect::<std::io::Result<_>>()
            .context("starting cargo fuzz run")?;
        for (target, child) in children {
            let status = child.wait().context("waiting for cargo fuzz")?;
            let log =
                std::fs::read_to_string(dir.join(format!("{target}.log"))).unwrap_or_default();
            results.push((target, status.success(), fuzz_summary(&log)));
        }
    }
    println!("| target | seconds | runs | coverage (edges) | corpus | result |");
    println!("|---|---|---|---|---|---|");
    let mut failed = Vec::new();
    for (target, ok, summary) in &results {
        println!(
            "| {target} | {} | {} | {} | {} | {} |",
            args.seconds,
            summary.get("runs").map_or("?", String::as_str),
            summary.get("cov").map_or("?", String::as_str),
            summary.get("corp").map_or("?", String::as_str),
            if *ok {
                "clean"
            } else {
                "CRASH (see fuzz/artifacts)"
            }
        );
        if !ok {
            failed.push(target.as_str());
        }
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The `[[bin]]` names of fuzz/Cargo.toml (the package's own name left out).
fn targets_of(manifest: &str) -> Vec<String> {
    manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|name| *name != "tracer-fuzz")
        .map(str::to_string)
        .collect()
}

/// Numbers from libFuzzer's last status line and final stats.
fn fuzz_summary(log: &str) -> BTreeMap<&'static str, String> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("stat::number_of_executed_units: ") {
            out.insert("runs", rest.trim().to_string());
        }
        if line.starts_with('#') && line.contains(" cov: ") {
            let mut words = line.split_whitespace();
            while let Some(word) = words.next() {
                match word {
                    "cov:" => {
                        out.insert("cov", words.next().unwrap_or("?").to_string());
                    }
                    "corp:" => {
                        out.insert("corp", words.next().unwrap_or("?").to_string());
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// Seeds a target's corpus with real inputs of its kind (once).
fn seed_corpus(root: &Path, corpus: &Path, target: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(corpus)?;
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    match target {
        "config_toml" => seeds.push(std::fs::read(root.join("deploy/tracerd.toml"))?),
        "ld_so_cache" => seeds.extend(std::fs::read("/etc/ld.so.cache").ok()),
        "proc_maps" => seeds.push(std::fs::read("/proc/self/maps")?),
        "proc_stat" => seeds.push(std::fs::read("/proc/self/stat")?),
        "query_params" => {
            for q in [
                "/pid/12/statistics?group_by=lineno&cumulative=true&limit=10&format=text",
                "/pid/12/compare?base=3&new=now&group_by=traceback",
                "/pid/%2e%2e/x?limit=-1",
            ] {
                seeds.push(q.as_bytes().to_vec());
            }
        }
        "token_file" => {
            seeds.push(b"0123456789abcdef-token\nBearer 0123456789abcdef-token".to_vec())
        }
        _ => {}
    }
    for (i, seed) in seeds.iter().enumerate() {
        let path = corpus.join(format!("seed-{i}"));
        if !path.exists() {
            std::fs::write(path, seed)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_the_bin_names_of_the_fuzz_manifest() {
        let manifest = std::fs::read_to_string(workspace_root().join("fuzz/Cargo.toml")).unwrap();
        let targets = targets_of(&manifest);
        assert!(targets.contains(&"query_params".to_string()), "{targets:?}");
        assert!(!targets.contains(&"tracer-fuzz".to_string()));
    }

    #[test]
    fn summary_reads_runs_coverage_and_corpus() {
        let log = "#1024\tpulse  cov: 77 ft: 90 corp: 12/1Kb exec/s: 0\n\
                   #2048\tpulse  cov: 80 ft: 95 corp: 14/2Kb exec/s: 0\n\
                   stat::number_of_executed_units: 9001\n";
        let summary = fuzz_summary(log);
        assert_eq!(summary["runs"], "9001");
        assert_eq!(summary["cov"], "80");
        assert_eq!(summary["corp"], "14/2Kb");
    }
}
