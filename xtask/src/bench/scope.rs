//! The bench's scope part: churn of a process outside tracerd's scope while
//! another process is traced, against uninstrumented (the cost of being
//! out of scope): a scope of pids (probes of that process only) and a
//! scope of executables (probes of every process, filtered in the kernel);
//! and the same churn once it is in scope, for contrast; medians of the
//! rounds.
use std::{net::SocketAddr, path::Path, process::Command, time::Duration};

use anyhow::{Context as _, bail};

use super::{
    BenchArgs,
    modes::{LISTEN, STOP_GRACE, start_tracerd},
};
use crate::util::{paths::release_dir, stats::median};
use tracer_testkit::{Client, Running};

pub fn scope_part(root: &Path, dir: &Path, args: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let churn = dir.join("churn");
    let run = || -> anyhow::Result<f64> {
        let out = Command::new(&churn).arg(args.pairs.to_string()).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<f64>()
            .context("churn figure")
    };
    let http = Client::new(LISTEN.parse::<SocketAddr>()?, Duration::from_secs(300))?;
    let mut none = Vec::new();
    let mut scoped = Vec::new();
    let mut filtered = Vec::new();
    let mut traced = Vec::new();
    // The process in scope; stopped by pid when this function returns.
    let sleeper = Running::spawn(Command::new("sleep").arg("600"))?;
    run()?; // warm-up
    for _ in 0..args.rounds.max(1) {
        none.push(run()?);
        let tracer = start_tracerd(
            &release_dir(root).join("tracerd"),
            &dir.join("state"),
            &["--scope-pid", &sleeper.pid().to_string()],
        )?;
        scoped.push(run()?);
        // A scope of the sleeper's executable: the kernel's filter.
        let sleep = std::fs::read_link(format!("/proc/{}/exe", sleeper.pid()))
            .context("the sleeper's executable")?;
        let response = http.put(&format!("/scope?exe={}", sleep.display()))?;
        if response.status != 200 {
            bail!(
                "PUT /scope?exe failed ({}): {}",
                response.status,
                response.body
            );
        }
        filtered.push(run()?);
        // The same churn in scope, for contrast.
        let response = http.put("/scope")?;
        if response.status != 200 {
            bail!("PUT /scope failed ({}): {}", response.status, response.body);
        }
        traced.push(run()?);
        let _ = tracer.stop(STOP_GRACE);
    }
    drop(sleeper);
    let (none, scoped, traced) = (median(&mut none), median(&mut scoped), median(&mut traced));
    let filtered = median(&mut filtered);
    println!("\n### Scope\n");
    println!(
        "- churn outside the scope while another process is traced: {scoped:.1} ns/pair vs {none:.1} uninstrumented ({:.2}x); traced: {traced:.1} ns/pair",
        scoped / none
    );
    println!(
        "- churn outside a scope of executables (the kernel's filter): {filtered:.1} ns/pair ({:.2}x uninstrumented)",
        filtered / none
    );
    Ok(serde_json::json!({
        "uninstrumented_ns_per_pair": none,
        "out_of_scope_ns_per_pair": scoped,
        "ratio": scoped / none,
        "out_of_filtered_scope_ns_per_pair": filtered,
        "filtered_ratio": filtered / none,
        "traced_ns_per_pair": traced,
    }))
}
