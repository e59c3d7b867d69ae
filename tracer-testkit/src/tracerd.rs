//! A tracerd process under test.
use std::{
    ffi::OsStr,
    io,
    net::SocketAddr,
    path::Path,
    process::{Command, ExitStatus, Stdio},
    time::Duration,
};

use crate::{Client, Running, free_port, poll};

/// How long tracerd gets to answer `/health` after it was spawned: its
/// eBPF programs are verified first (about 4 s on a quiet 2-CPU host).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// How long a dropped tracerd gets between SIGTERM and SIGKILL: it stops
/// within 5 s by its own bound; a loaded host gets four times that, so
/// that it detaches its probes itself.
const DROP_GRACE: Duration = Duration::from_secs(20);

/// A tracerd on a free loopback port, with a client of its API; stopped by
/// pid (SIGTERM, then SIGKILL) when asked or dropped.
#[derive(Debug)]
pub struct TracerdProcess {
    // Declared first: stopped before the caller's state directory goes.
    process: Running,
    client: Client,
}

impl TracerdProcess {
    /// Spawns `EXE --listen 127.0.0.1:PORT --state-dir STATE EXTRA...` with
    /// its log (stderr) to `stderr`, and returns once `/health` answers
    /// 200; the client's requests give up after `timeout`.
    ///
    /// # Errors
    /// It cannot be spawned, exits before it is ready, or is not ready
    /// within 60 s (it is stopped then).
    pub fn start<A: AsRef<OsStr>>(
        exe: &Path,
        state: &Path,
        extra: &[A],
        stderr: Stdio,
        timeout: Duration,
    ) -> io::Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        Self::start_on(addr, exe, state, extra, stderr, timeout)
    }

    /// [`TracerdProcess::start`] on `addr` (a port the caller names).
    ///
    /// # Errors
    /// As [`TracerdProcess::start`].
    pub fn start_on<A: AsRef<OsStr>>(
        addr: SocketAddr,
        exe: &Path,
        state: &Path,
        extra: &[A],
        stderr: Stdio,
        timeout: Duration,
    ) -> io::Result<Self> {
        let process = Running::spawn(
            Command::new(exe)
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--state-dir")
                .arg(state)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(stderr),
        )
        .map_err(|e| io::Error::new(e.kind(), format!("spawning {}: {e}", exe.display())))?
        .with_drop_grace(DROP_GRACE);
        let mut tracerd = Self {
            process,
            client: Client::new(addr, timeout)?,
        };
        poll(READY_WITHIN, Duration::from_millis(50), || {
            if let Ok(Some(status)) = tracerd.process.child().try_wait() {
                return Ok(Err(format!("tracerd exited at start: {status}")));
            }
            match tracerd.client.get("/health") {
                Ok(r) if r.status == 200 => Ok(Ok(())),
                Ok(r) => Err(format!("tracerd not ready: {}", r.status)),
                Err(e) => Err(format!("tracerd not ready: {e}")),
            }
        })
        .and_then(|exited| exited)
        .map_err(io::Error::other)?;
        Ok(tracerd)
    }

    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    #[must_use]
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// SIGTERM, then SIGKILL after `grace`: its exit status and how long
    /// it took to exit.
    ///
    /// # Errors
    /// Waiting for it failed.
    pub fn terminate(&mut self, grace: Duration) -> io::Result<(ExitStatus, Duration)> {
        self.process.terminate(grace)
    }

    /// The process alone, without the client (kept with other tracers'
    /// processes; still stopped by pid on drop).
    #[must_use]
    pub fn into_running(self) -> Running {
        self.process
    }

    /// SIGKILL, and waits until it is gone.
    ///
    /// # Errors
    /// Waiting for it failed.
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        self.process.kill()
    }
}
