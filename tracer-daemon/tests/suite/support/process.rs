//! Processes the tests start and wait for: the root check, free loopback
//! ports, signals by pid, stopping a child with a grace period, a
//! process's cgroup, and waiting for a condition with a deadline.

use std::{
    net::TcpListener,
    process::{Child, Command, Output},
    time::{Duration, Instant},
};

/// Fails the test at once with a clear message when not root: these tests
/// load eBPF programs and must not be skipped where root is available.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "integration tests load eBPF: run them as root (cargo xtask test)"
    );
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// Runs `command` to its end and asserts that it exits 0 (with its stderr
/// in the message); returns its output.
pub fn output_ok(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Sends `SIG{name}` to `pid` (only ever a process the test started).
pub fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status();
}

/// Sends `SIG{name}` to `child` and waits for its exit; after `grace`,
/// SIGKILL. Returns (exited with status 0, time taken).
pub fn stop(child: &mut Child, name: &str, grace: Duration) -> (bool, Duration) {
    let start = Instant::now();
    signal(child.id(), name);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return (status.success(), start.elapsed());
        }
        if start.elapsed() > grace {
            signal(child.id(), "KILL");
            let _ = child.wait();
            return (false, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `child` has not exited yet (for the `Drop`s).
pub fn running(child: &mut Child) -> bool {
    child.try_wait().ok().flatten().is_none()
}

/// SIGKILL to `child` if it still runs, then reaps it (for the `Drop`s).
pub fn kill_if_running(child: &mut Child) {
    if running(child) {
        signal(child.id(), "KILL");
        let _ = child.wait();
    }
}

/// The cgroup v2 path of `pid`: the `0::` line of `/proc/{pid}/cgroup`.
pub fn cgroup_v2(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("read cgroup");
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup v2 line for {pid}: {text}"))
        .to_string()
}

/// Calls `attempt` every `every` until it returns `Ok`; fails the test with
/// the last `Err` once `within` has passed.
pub fn poll<T>(
    within: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match attempt() {
            Ok(value) => return value,
            Err(why) => assert!(Instant::now() < deadline, "{why} (after {within:?})"),
        }
        std::thread::sleep(every);
    }
}
