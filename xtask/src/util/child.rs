//! The one way xtask owns a long-running child (a tracer, a workload):
//! stopped by its pid with SIGTERM, then SIGKILL once a grace period has
//! passed, and stopped the same way when dropped on an error path, so no
//! task leaves a tracer or a workload behind.
use std::{
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

/// How long a child dropped on an error path gets between SIGTERM and
/// SIGKILL.
const DROP_GRACE: Duration = Duration::from_secs(5);

/// A child process stopped by pid (SIGTERM, then SIGKILL) when asked or
/// dropped.
pub struct Running {
    child: Child,
}

impl Running {
    /// Spawns `command`.
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        command.spawn().map(Self::from)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child, for its pipes and `try_wait`.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// SIGTERM, up to `grace` for it to exit, then SIGKILL; its exit status
    /// and how long stopping took.
    pub fn stop(mut self, grace: Duration) -> std::io::Result<(ExitStatus, Duration)> {
        let start = Instant::now();
        let status = self.terminate(grace)?;
        Ok((status, start.elapsed()))
    }

    /// Waits for the child to exit by itself, with no signal.
    pub fn wait(mut self) -> std::io::Result<ExitStatus> {
        self.child.wait()
    }

    fn terminate(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        signal(self.child.id(), "TERM");
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Child::kill sends SIGKILL to this child's pid.
        let _ = self.child.kill();
        self.child.wait()
    }
}

impl From<Child> for Running {
    fn from(child: Child) -> Self {
        Self { child }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.terminate(DROP_GRACE);
    }
}

/// Sends `SIG<name>` to `pid` (a child of ours that has not been reaped).
fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status();
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;

    #[test]
    fn stop_ends_a_child_with_sigterm() {
        let child = Running::spawn(Command::new("sleep").arg("60")).unwrap();
        let (status, took) = child.stop(Duration::from_secs(10)).unwrap();
        assert_eq!(status.signal(), Some(15));
        assert!(took < Duration::from_secs(10));
    }

    #[test]
    fn stop_kills_a_child_that_ignores_sigterm() {
        let mut command = Command::new("sh");
        command.args([
            "-c",
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        ]);
        command.stdout(std::process::Stdio::piped());
        let mut child = Running::spawn(&mut command).unwrap();
        // Wait until the trap is installed.
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.child().stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let (status, _) = child.stop(Duration::from_millis(200)).unwrap();
        assert_eq!(status.signal(), Some(9));
    }

    #[test]
    fn drop_stops_the_child() {
        let child = Running::spawn(Command::new("sleep").arg("60")).unwrap();
        let pid = child.pid();
        drop(child);
        // Reaped: no /proc entry, or one of another process.
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        assert_ne!(comm.trim(), "sleep");
    }
}
