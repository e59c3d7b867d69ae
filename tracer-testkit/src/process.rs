//! Child processes stopped by pid, free loopback ports, waiting with a
//! deadline, and what `/proc/PID/status` says of a process's memory.
use std::{
    io,
    net::TcpListener,
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

/// How long a child dropped on an error path gets between SIGTERM and
/// SIGKILL.
const DROP_GRACE: Duration = Duration::from_secs(5);

/// A child process (a tracer, a workload, a fixture) stopped by its pid
/// with SIGTERM, then SIGKILL once a grace period has passed; stopped the
/// same way when dropped, so that nothing is left running when the caller
/// fails.
#[derive(Debug)]
pub struct Running {
    child: Child,
    /// How long it gets between SIGTERM and SIGKILL when dropped.
    drop_grace: Duration,
}

impl Running {
    /// Spawns `command`.
    ///
    /// # Errors
    /// The command cannot be spawned.
    pub fn spawn(command: &mut Command) -> io::Result<Self> {
        command.spawn().map(Self::from)
    }

    /// The time it gets between SIGTERM and SIGKILL when dropped (5 s
    /// unless set here).
    #[must_use]
    pub fn with_drop_grace(mut self, grace: Duration) -> Self {
        self.drop_grace = grace;
        self
    }

    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child, for its pipes and `try_wait`.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// SIGTERM, up to `grace` for it to exit, then SIGKILL; its exit
    /// status and how long stopping took (nothing is sent to a child that
    /// already exited).
    ///
    /// # Errors
    /// Waiting for the child failed.
    pub fn terminate(&mut self, grace: Duration) -> io::Result<(ExitStatus, Duration)> {
        stop_child(&mut self.child, "TERM", grace)
    }

    /// [`Running::terminate`], consuming it.
    ///
    /// # Errors
    /// Waiting for the child failed.
    pub fn stop(mut self, grace: Duration) -> io::Result<(ExitStatus, Duration)> {
        self.terminate(grace)
    }

    /// SIGKILL (to this child's pid) and waits until it is gone.
    ///
    /// # Errors
    /// Waiting for the child failed.
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        kill_child(&mut self.child)
    }

    /// Waits for the child to exit by itself, with no signal.
    ///
    /// # Errors
    /// Waiting for the child failed.
    pub fn wait(mut self) -> io::Result<ExitStatus> {
        self.child.wait()
    }
}

impl From<Child> for Running {
    fn from(child: Child) -> Self {
        Self {
            child,
            drop_grace: DROP_GRACE,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.terminate(self.drop_grace);
    }
}

/// Sends `SIG{name}` to `child`, up to `grace` for it to exit, then
/// SIGKILL: its exit status and how long stopping took (nothing is sent to
/// a child that already exited). For a `Child` the caller keeps (its
/// pipes); [`Running`] does this on drop.
///
/// # Errors
/// Waiting for the child failed.
pub fn stop_child(
    child: &mut Child,
    name: &str,
    grace: Duration,
) -> io::Result<(ExitStatus, Duration)> {
    let start = Instant::now();
    if let Some(status) = child.try_wait()? {
        return Ok((status, start.elapsed()));
    }
    signal(child.id(), name);
    while start.elapsed() < grace {
        if let Some(status) = child.try_wait()? {
            return Ok((status, start.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = kill_child(child)?;
    Ok((status, start.elapsed()))
}

/// SIGKILL to `child` unless it exited, then reaps it: its exit status.
///
/// # Errors
/// Waiting for the child failed.
pub fn kill_child(child: &mut Child) -> io::Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    // Child::kill sends SIGKILL to this child's pid.
    let _ = child.kill();
    child.wait()
}

/// Sends `SIG{name}` to `pid`: only ever a process the caller started and
/// has not reaped.
pub fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status();
}

/// A loopback port that was free a moment ago.
///
/// # Errors
/// No ephemeral port could be bound.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Calls `attempt` every `every` until it returns `Ok`; once `within` has
/// passed, the last `Err` with how long it was waited for.
///
/// # Errors
/// The last attempt's error, `"{why} (after {within:?})"`.
pub fn poll<T>(
    within: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        match attempt() {
            Ok(value) => return Ok(value),
            Err(why) if Instant::now() >= deadline => {
                return Err(format!("{why} (after {within:?})"));
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}

/// A field of `/proc/PID/status` given in kB (`VmRSS`, `VmHWM`), in KiB;
/// `None` when the process or the field is not there.
#[must_use]
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;

    #[test]
    fn terminate_ends_a_child_with_sigterm() {
        let mut child = Running::spawn(Command::new("sleep").arg("60")).expect("sleep");
        let (status, took) = child.terminate(Duration::from_secs(10)).expect("stops");
        assert_eq!(status.signal(), Some(15));
        assert!(took < Duration::from_secs(10));
    }

    #[test]
    fn terminate_kills_a_child_that_ignores_sigterm() {
        let mut command = Command::new("sh");
        command.args([
            "-c",
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        ]);
        command.stdout(std::process::Stdio::piped());
        let mut child = Running::spawn(&mut command).expect("sh");
        // Wait until the trap is installed.
        let mut line = String::new();
        let stdout = child.child().stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("ready");
        let (status, _) = child.stop(Duration::from_millis(200)).expect("stops");
        assert_eq!(status.signal(), Some(9));
    }

    #[test]
    fn drop_stops_the_child() {
        let child = Running::spawn(Command::new("sleep").arg("60")).expect("sleep");
        let pid = child.pid();
        drop(child);
        // Reaped: no /proc entry, or one of another process.
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        assert_ne!(comm.trim(), "sleep");
    }

    #[test]
    fn poll_gives_the_value_or_the_last_reason_after_the_deadline() {
        let mut n = 0;
        let got = poll(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            if n == 3 {
                Ok(n)
            } else {
                Err(format!("{n} tries"))
            }
        });
        assert_eq!(got, Ok(3));
        let err = poll::<()>(Duration::from_millis(20), Duration::from_millis(5), || {
            Err("never".to_string())
        });
        assert_eq!(err, Err("never (after 20ms)".to_string()));
    }

    #[test]
    fn status_kib_reads_this_processs_resident_memory() {
        let rss = status_kib(std::process::id(), "VmRSS").expect("VmRSS");
        assert!(rss > 0);
        assert_eq!(status_kib(std::process::id(), "VmNothing"), None);
    }
}
