//! What the services part's servers share: the figures of a run, the
//! trait every server answers to, and how they are started, waited for and
//! stopped (by pid, their forked children too), as
//! `/work/shared/SERVICES.md` runs them. The root suite's
//! `tests/suite/support/services.rs` starts the same servers with panics
//! instead of errors.
use std::{
    fs,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};
use tracer_testkit::{poll, signal, stop_child};

/// How long a server gets to answer after it was started.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long a server gets between its stop signal and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// What the load tool measured of one metric in one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// The metric: `tpcb`, `get-4k`, `set`, `get`.
    pub metric: String,
    /// Throughput: transactions, requests or operations per second.
    pub per_s: f64,
    /// The 99th-percentile latency in ms (None when the tool gives none).
    pub p99_ms: Option<f64>,
}

/// A running server the part loads.
pub trait Server {
    /// Its name in the report and in `--services`.
    fn name(&self) -> &'static str;
    /// The unit of its throughput (`tx/s`, `req/s`, `ops/s`).
    fn unit(&self) -> &'static str;
    /// The load, in words, for the report.
    fn load(&self) -> String;
    /// The pid of its first process (the postmaster, nginx's master).
    fn pid(&self) -> u32;
    /// Loads it for about `seconds` s: the figures of its metrics. `mode`
    /// names the part's mode: a tool whose runs are sized by a count of
    /// requests sizes a mode's run by that mode's previous one.
    ///
    /// # Errors
    /// The tool failed, or its output has no figure.
    fn run(&mut self, seconds: u64, mode: &str) -> anyhow::Result<Vec<Figure>>;
    /// A first, unmeasured run (caches, the server's pools) before runs of
    /// `seconds` s each.
    ///
    /// # Errors
    /// As [`Server::run`].
    fn warm_up(&mut self, seconds: u64) -> anyhow::Result<()> {
        self.run(seconds.min(2), "warm-up").map(drop)
    }
}

/// `/proc/PID/stat`'s fields after the command (state is the first); empty
/// once the process is gone.
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // pid (comm) state ppid ...: comm may hold spaces and parentheses.
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The children of `pid` now, each with its start time (clock ticks after
/// boot, `/proc/PID/stat`): a pid with another start time later is another
/// process.
pub fn children_of(pid: u32) -> Vec<(u32, String)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: Vec<(u32, String)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|child| {
            let fields = stat_fields(child);
            if fields.get(1)?.parse::<u32>().ok()? != pid {
                return None;
            }
            Some((child, fields.get(19)?.clone()))
        })
        .collect();
    children.sort_unstable();
    children
}

/// Stops `parent` (a server this bench started) with `SIG{name}`, then
/// SIGKILL after [`STOP_GRACE`]; then SIGKILL to those of the children it
/// had that outlived it.
pub fn stop_with_children(parent: &mut Child, name: &str) {
    let children = children_of(parent.id());
    let _ = stop_child(parent, name, STOP_GRACE);
    for (pid, started) in children {
        if stat_fields(pid).get(19) == Some(&started) {
            signal(pid, "KILL");
        }
    }
}

/// Waits until `ready` says yes, or fails with what `what` is.
pub fn wait_ready(what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    poll(READY_WITHIN, Duration::from_millis(100), || {
        if ready() {
            Ok(())
        } else {
            Err(format!("{what} does not answer"))
        }
    })
    .map_err(anyhow::Error::msg)
}

/// Runs `command`; its stdout, or an error with its stderr.
pub fn output_ok(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {:?}", command.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            command.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The first number after `prefix` on a line that starts with it.
pub fn number_after(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_tps_and_ab_rate_are_read_from_their_lines() {
        let pgbench =
            "latency average = 3.216 ms\ntps = 1243.799133 (without initial connection time)\n";
        assert_eq!(number_after(pgbench, "tps = "), Some(1243.799133));
        let ab = "Failed requests:        0\nRequests per second:    28994.73 [#/sec] (mean)\n";
        assert_eq!(number_after(ab, "Requests per second:"), Some(28994.73));
        assert_eq!(number_after(ab, "Failed requests:"), Some(0.0));
        assert_eq!(number_after(ab, "Time taken"), None);
    }
}
