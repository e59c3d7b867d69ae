//! A release `tracerd` for `load`, `soak` and `hostile`: the root suite's
//! runner (`tracer_testkit::TracerdProcess`: a free loopback port, ready
//! once `/health` answers 200, stopped by pid), with its state in a scratch
//! directory and the release binary of the workspace.
use std::{path::Path, process::Stdio, time::Duration};

use anyhow::{Context as _, bail};
use tracer_testkit::{Client, TracerdProcess};

use super::paths::{TempDir, release_dir};

/// The cargo arguments that build the release tracerd alone (in the
/// workspace, or in a baseline's worktree).
pub const BUILD_TRACERD: [&str; 6] = [
    "build",
    "--release",
    "-p",
    "tracer-daemon",
    "--bin",
    "tracerd",
];

/// How long a request to the daemon may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long tracerd gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(60);

pub struct Daemon {
    // Declared first: dropped (stopped) before its state directory goes.
    process: TracerdProcess,
    _state: TempDir,
}

impl Daemon {
    /// Starts `ROOT/target/release/tracerd` with `extra` flags and waits
    /// (at most 60 s) until it is healthy.
    pub fn start(root: &Path, extra: &[String]) -> anyhow::Result<Self> {
        let tracerd = release_dir(root).join("tracerd");
        let state = TempDir::try_new("state")?;
        // Every process traced exactly unless `extra` says otherwise: the
        // runs load processes they start after tracerd.
        let mut args = extra.to_vec();
        if !extra.iter().any(|a| a == "--exact") {
            args.extend(["--exact".to_string(), "all".to_string()]);
        }
        let process = TracerdProcess::start(
            &tracerd,
            state.path(),
            &args,
            Stdio::null(),
            REQUEST_TIMEOUT,
        )
        .with_context(|| format!("starting {}", tracerd.display()))?;
        Ok(Self {
            process,
            _state: state,
        })
    }

    pub fn client(&self) -> &Client {
        self.process.client()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Resident memory of tracerd now, in KiB (0 if unknown).
    pub fn rss_kib(&self) -> u64 {
        status_kib(self.pid(), "VmRSS")
    }

    /// SIGTERM; fails unless tracerd exits cleanly. Returns how long it
    /// took to exit.
    pub fn stop(mut self) -> anyhow::Result<Duration> {
        let (status, took) = self.process.terminate(STOP_GRACE)?;
        if !status.success() {
            bail!("tracerd exited with {status} after SIGTERM");
        }
        Ok(took)
    }
}

/// A field of `/proc/PID/status` given in kB (`VmRSS`, `VmHWM`), in KiB
/// (0 if unknown).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    tracer_testkit::status_kib(pid, field).unwrap_or(0)
}
