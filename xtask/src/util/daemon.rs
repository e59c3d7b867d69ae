//! A release `tracerd` for `load` and `soak`: on a free loopback port, its
//! state in a scratch directory, ready once `/health` answers 200, stopped
//! by pid (SIGTERM, then SIGKILL) when asked or dropped.
use std::{
    net::{SocketAddr, TcpListener},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{
    child::Running,
    http::Client,
    paths::{TempDir, release_dir},
};

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
    process: Running,
    client: Client,
    _state: TempDir,
}

impl Daemon {
    /// Starts `ROOT/target/release/tracerd` with `extra` flags and waits
    /// (at most 60 s) until it is healthy.
    pub fn start(root: &Path, extra: &[String]) -> anyhow::Result<Self> {
        let tracerd = release_dir(root).join("tracerd");
        let state = TempDir::new("state")?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = Running::spawn(
            Command::new(&tracerd)
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--state-dir")
                .arg(state.path())
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .with_context(|| format!("starting {}", tracerd.display()))?;
        let mut daemon = Self {
            process,
            client: Client::new(addr, REQUEST_TIMEOUT),
            _state: state,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while daemon.client.get("/health").map(|r| r.status).ok() != Some(200) {
            if let Some(status) = daemon.process.child().try_wait()? {
                bail!("tracerd exited at start: {status}");
            }
            if Instant::now() > deadline {
                bail!("tracerd not ready in 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(daemon)
    }

    pub fn client(&self) -> Client {
        self.client
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Resident memory of tracerd now, in KiB (0 if unknown).
    pub fn rss_kib(&self) -> u64 {
        status_kib(self.pid(), "VmRSS:")
    }

    /// SIGTERM; fails unless tracerd exits cleanly. Returns how long it
    /// took to exit.
    pub fn stop(self) -> anyhow::Result<Duration> {
        let (status, took) = self.process.stop(STOP_GRACE)?;
        if !status.success() {
            bail!("tracerd exited with {status} after SIGTERM");
        }
        Ok(took)
    }
}

/// A field of `/proc/PID/status` given in kB (`VmRSS:`, `VmHWM:`), in KiB
/// (0 if unknown).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
