//! The process side of `tracer run`: tracer becomes a child subreaper
//! (`prctl(PR_SET_CHILD_SUBREAPER)`), so that a process of the command's
//! tree whose parent ended is re-parented to tracer instead of init; then
//! "the whole tree has ended" is "every child of tracer is a zombie"
//! (a live descendant is a child of tracer, or of a live descendant).
//! Children are waited for with `waitid(WEXITED | WNOWAIT)`, which leaves
//! them zombies: their pids cannot be given to another process while
//! tracer asks tracerd about them; they are reaped at the end.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use rustix::process::{Pid, WaitId, WaitIdOptions, WaitIdStatus, waitid};

use crate::error::CliError;

/// How often the children are looked at while tracer waits for them.
const POLL: Duration = Duration::from_millis(20);

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Ending {
    /// The exit status a shell gives for it: the status, or 128 + the
    /// signal (143 for SIGTERM).
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Code(code) => u8::try_from(code & 0xff).unwrap_or(1),
            Self::Signal(signal) => u8::try_from(128 + signal).unwrap_or(1),
        }
    }

    /// `exited with status N` or `was killed by signal N`.
    pub fn describe(self) -> String {
        match self {
            Self::Code(code) => format!("exited with status {code}"),
            Self::Signal(signal) => format!("was killed by signal {signal}"),
        }
    }

    fn of(status: &WaitIdStatus) -> Option<Self> {
        status
            .exit_status()
            .map(Self::Code)
            .or_else(|| status.terminating_signal().map(Self::Signal))
    }
}

/// Makes tracer the reaper of the orphans of its descendants.
///
/// # Errors
/// [`CliError::Io`] when the kernel refuses (it never does on Linux 3.4+).
pub fn become_subreaper() -> Result<(), CliError> {
    rustix::process::set_child_subreaper(rustix::process::getpid().into()).map_err(|e| {
        CliError::Io {
            what: "become the reaper of the command's orphans".into(),
            source: e.into(),
        }
    })
}

fn raw(pid: u32) -> Result<Pid, CliError> {
    i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| CliError::Run(format!("pid {pid} out of range")))
}

/// Waits until child `pid` has ended, leaving it unreaped; how it ended.
///
/// # Errors
/// [`CliError::Io`] when it is not tracer's child.
pub fn wait_unreaped(pid: u32) -> Result<Ending, CliError> {
    let id = raw(pid)?;
    loop {
        match waitid(
            WaitId::Pid(id),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Ok(Some(status)) => {
                if let Some(ending) = Ending::of(&status) {
                    return Ok(ending);
                }
            }
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(CliError::Io {
                    what: format!("wait for pid {pid}"),
                    source: e.into(),
                });
            }
        }
    }
}

/// How child `pid` ended if it has (a zombie, left unreaped); None while
/// it runs (or when it is not tracer's child).
fn ended(pid: u32) -> Option<Ending> {
    let status = waitid(
        WaitId::Pid(raw(pid).ok()?),
        WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG,
    )
    .ok()??;
    Ending::of(&status)
}

/// Reaps child `pid`, a zombie. Errors are ignored: it may be reaped
/// already.
pub fn reap(pid: u32) {
    if let Ok(id) = raw(pid) {
        let _ = waitid(WaitId::Pid(id), WaitIdOptions::EXITED);
    }
}

/// tracer's children now: the pids in `/proc/self/task/*/children` (a
/// child belongs to the thread that started it, and an adopted one to any).
pub fn children() -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        pids.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The children of tracer when it stopped waiting: those that ended (how),
/// and those still running.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Children {
    /// Zombies, with how they ended: reap them ([`reap`]) when done.
    pub ended: Vec<(u32, Ending)>,
    /// Still running.
    pub running: Vec<u32>,
}

/// Waits until every child of tracer has ended (the command's whole tree:
/// see the module's comment), for at most `bound`, or until `interrupted`
/// is raised (Ctrl-C); leaves them unreaped.
pub fn wait_tree(bound: Duration, interrupted: &AtomicBool) -> Children {
    let deadline = Instant::now() + bound;
    loop {
        let mut now = Children::default();
        for pid in children() {
            match ended(pid) {
                Some(ending) => now.ended.push((pid, ending)),
                None => now.running.push(pid),
            }
        }
        if now.running.is_empty()
            || Instant::now() >= deadline
            || interrupted.load(Ordering::Relaxed)
        {
            return now;
        }
        std::thread::sleep(POLL);
    }
}

/// The parent's pid and the command name of process `pid` (a zombie child
/// is still readable), from `/proc/PID/stat`; None when it is gone.
pub fn parent_and_comm(pid: u32) -> Option<(Option<u32>, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = text.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let ppid = rest
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<u32>().ok())
        .filter(|&p| p != 0);
    Some((ppid, comm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_status_is_the_shells() {
        assert_eq!(Ending::Code(0).exit_code(), 0);
        assert_eq!(Ending::Code(3).exit_code(), 3);
        assert_eq!(Ending::Signal(15).exit_code(), 143);
        assert_eq!(Ending::Signal(9).exit_code(), 137);
        assert_eq!(Ending::Signal(9).describe(), "was killed by signal 9");
        assert_eq!(Ending::Code(3).describe(), "exited with status 3");
    }

    #[test]
    fn a_child_is_seen_running_then_ended_unreaped_then_reaped() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read x; exit 5"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let pid = child.id();
        let never = AtomicBool::new(false);
        let waited = wait_tree(Duration::from_millis(50), &never);
        assert!(waited.running.contains(&pid), "{waited:?}");
        assert_eq!(
            parent_and_comm(pid),
            Some((Some(std::process::id()), "sh".to_string()))
        );
        drop(child.stdin.take());
        assert_eq!(wait_unreaped(pid).expect("wait"), Ending::Code(5));
        // Unreaped: still a child, and a second look says the same.
        assert!(children().contains(&pid));
        assert_eq!(ended(pid), Some(Ending::Code(5)));
        reap(pid);
        assert!(!children().contains(&pid));
        assert!(child.try_wait().is_err(), "reaped already");
    }
}
