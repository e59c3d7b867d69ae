//! Processes the tests start and wait for: the root check, free loopback
//! ports, signals by pid, stopping a child with a grace period, a
//! process's cgroup, and waiting for a condition with a deadline.

use std::{
    process::{Child, Command, Output},
    time::Duration,
};

pub use tracer_testkit::signal;

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
    tracer_testkit::free_port().expect("bind an ephemeral port")
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

/// Sends `SIG{name}` to `child` and waits for its exit; after `grace`,
/// SIGKILL. Returns (exited with status 0, time taken).
pub fn stop(child: &mut Child, name: &str, grace: Duration) -> (bool, Duration) {
    let (status, took) = tracer_testkit::stop_child(child, name, grace).expect("wait for a child");
    (status.success(), took)
}

/// Whether `child` has not exited yet (for the `Drop`s).
pub fn running(child: &mut Child) -> bool {
    child.try_wait().ok().flatten().is_none()
}

/// SIGKILL to `child` if it still runs, then reaps it (for the `Drop`s).
pub fn kill_if_running(child: &mut Child) {
    let _ = tracer_testkit::kill_child(child);
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
pub fn poll<T>(within: Duration, every: Duration, attempt: impl FnMut() -> Result<T, String>) -> T {
    tracer_testkit::poll(within, every, attempt).unwrap_or_else(|why| panic!("{why}"))
}
