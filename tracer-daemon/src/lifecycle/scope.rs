//! Scope: which processes are traced. Every process (the default), or only
//! chosen pids, executables and cgroups.
//!
//! - A scope of pids alone registers the probes with the kernel for those
//!   processes only (a uprobe_multi link per program, object and process,
//!   or a perf event per probe and process), so the
//!   breakpoints exist only in their memory and every other process runs
//!   at full speed.
//! - A scope with executables or cgroups keeps the probes of every
//!   process (as the default does) and has the kernel record only the
//!   processes in `SCOPE_TGIDS` (the scope filter): such processes start
//!   all the time, and one process's own probes take the kernel long to
//!   detach as perf events (each waits a grace period under a global lock;
//!   measured in `docs/design/0011-measured-figures.md`), which a program started often would
//!   outrun (uprobe_multi links cost less, a grace period each with their
//!   waits overlapping, but a map update costs none). A
//!   process enters the filter before it runs (its exec is held,
//!   `service::exec_hold`), and a child of one in scope at its fork.
//!
//! Matching happens when the scope is set (a pass over `/proc`, [`apply`]),
//! at each exec held, and on the exec and fork events the kernel sends
//! while scoped ([`on_exec_or_fork`]); a process whose pid is gone is
//! detached, or taken out of the filter, at the next sweep ([`prune`]).
use std::{collections::BTreeSet, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::capture::KernelMaps;
use crate::config::Config;
use crate::sys::procfs::{self, FileKey};

/// Which processes are traced. All sets empty: every process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    /// Process ids.
    #[serde(default)]
    pub pids: BTreeSet<u32>,
    /// Executables: a process matches when `/proc/PID/exe` (the kernel's
    /// path of the file it runs, symlinks resolved) is this path with its
    /// symlinks resolved (`/usr/bin/python3` matches a process of
    /// `/usr/bin/python3.11`), or this path itself when it cannot be
    /// resolved (a file that does not exist yet).
    #[serde(default)]
    pub exes: BTreeSet<PathBuf>,
    /// cgroup v2 paths (as in `/proc/PID/cgroup`, e.g. `/system.slice/nginx.service`):
    /// a process matches when it is in that cgroup or below it.
    #[serde(default)]
    pub cgroups: BTreeSet<String>,
    /// tracerd's default (`exact = "demand"`): with no pid, executable or
    /// cgroup chosen, no process is traced exactly (each is watched only)
    /// rather than every one. The pids traced on demand are in `pids`.
    #[serde(skip)]
    pub on_demand: bool,
    /// Processes traced with their descendants (`tracing/start?descendants=true`,
    /// as `tracer run` asks): in the kernel's scope filter, which adds a
    /// child at its fork, so every descendant is traced from its first
    /// allocation; a process matches when one of its ancestors is here.
    #[serde(skip)]
    pub trees: BTreeSet<u32>,
}

impl From<&Config> for Scope {
    /// The scope chosen at start (`scope_pids`, `scope_exes`,
    /// `scope_cgroups`).
    fn from(config: &Config) -> Self {
        Scope {
            pids: config.processes.scope_pids.iter().copied().collect(),
            exes: config.processes.scope_exes.iter().cloned().collect(),
            cgroups: config.processes.scope_cgroups.iter().cloned().collect(),
            on_demand: config.processes.exact == crate::config::ExactMode::Demand,
            trees: BTreeSet::new(),
        }
    }
}

impl Scope {
    /// True when nothing is chosen and not [`Scope::on_demand`]: every
    /// process is traced.
    pub fn is_all(&self) -> bool {
        !self.on_demand
            && self.pids.is_empty()
            && self.exes.is_empty()
            && self.cgroups.is_empty()
            && self.trees.is_empty()
    }

    /// True when executables or cgroups are chosen: the probes are then
    /// attached for every process and the kernel records only the
    /// processes in scope (the scope filter, `SCOPE_TGIDS`), since such
    /// processes start all the time. A scope of pids alone registers the
    /// probes for those processes only.
    pub fn is_filtered(&self) -> bool {
        !self.exes.is_empty() || !self.cgroups.is_empty() || !self.trees.is_empty()
    }

    /// Whether `pid` or one of its ancestors (`/proc/PID/stat`'s parent,
    /// at most 64 up) is one of [`Scope::trees`].
    fn in_tree(&self, pid: u32) -> bool {
        if self.trees.is_empty() {
            return false;
        }
        let mut at = pid;
        for _ in 0..64 {
            if self.trees.contains(&at) {
                return true;
            }
            match procfs::read_start_time_and_ppid(at) {
                Ok((_, Some(parent))) if parent != at => at = parent,
                _ => return false,
            }
        }
        false
    }

    /// Whether process `pid` matches, read from `/proc/PID/exe` and
    /// `/proc/PID/cgroup` now. A process that is gone matches nothing.
    pub fn matches(&self, pid: u32) -> bool {
        if self.is_all() || self.pids.contains(&pid) || self.in_tree(pid) {
            return true;
        }
        if !self.exes.is_empty()
            && let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe"))
            && self.exes.iter().any(|want| {
                *want == exe || std::fs::canonicalize(want).is_ok_and(|real| real == exe)
            })
        {
            return true;
        }
        if !self.cgroups.is_empty()
            && let Some(cgroup) = procfs::read_cgroup(pid)
        {
            return self
                .cgroups
                .iter()
                .any(|want| cgroup_contains(want, &cgroup));
        }
        false
    }

    /// Whether process `pid`, about to exec the file `exe` (its device and
    /// inode: the program, or its interpreter), matches: by pid, by `exe`
    /// being one of the executables (each `stat`ed now, symlinks
    /// resolved), or by the process's cgroup, which an exec keeps.
    pub fn matches_exec(&self, pid: u32, exe: FileKey) -> bool {
        if self.is_all() || self.pids.contains(&pid) || self.in_tree(pid) {
            return true;
        }
        if self
            .exes
            .iter()
            .any(|want| FileKey::of_path(want) == Some(exe))
        {
            return true;
        }
        !self.cgroups.is_empty()
            && procfs::read_cgroup(pid).is_some_and(|cgroup| {
                self.cgroups
                    .iter()
                    .any(|want| cgroup_contains(want, &cgroup))
            })
    }

    /// Checks the scope's values.
    ///
    /// # Errors
    /// A message naming what is wrong: executables must be absolute paths,
    /// cgroups absolute cgroup paths (`/...`), pids positive.
    pub fn validate(&self) -> Result<(), String> {
        if self.pids.contains(&0) {
            return Err("pid 0 is not a process; pids are positive integers".into());
        }
        if let Some(exe) = self.exes.iter().find(|e| !e.is_absolute()) {
            return Err(format!("exe {} is not an absolute path", exe.display()));
        }
        if let Some(cgroup) = self
            .cgroups
            .iter()
            .find(|c| !c.starts_with('/') || c.contains("/../"))
        {
            return Err(format!(
                "cgroup {cgroup:?} is not an absolute cgroup path such as /system.slice/app.service"
            ));
        }
        Ok(())
    }
}

/// Whether cgroup `path` is `want` or below it (whole path components).
pub fn cgroup_contains(want: &str, path: &str) -> bool {
    let want = want.trim_end_matches('/');
    want.is_empty()
        || path == want
        || path
            .strip_prefix(want)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Sets `scope` on the kernel side: all sets empty attaches the probes for
/// every process; otherwise they are registered for each matching process
/// (tracerd itself excepted) and the programs are told to report exec and
/// fork events. What was attached before and is out of scope now is
/// detached. Returns the processes now attached one by one (empty when
/// every process is traced).
///
/// # Errors
/// A message when the scope is invalid (see [`Scope::validate`]) or the
/// system-wide probes cannot be attached again.
pub fn apply(kernel: &mut dyn KernelMaps, scope: &Scope) -> Result<Vec<u32>, String> {
    scope.validate()?;
    let previous: Vec<Option<u32>> = kernel.attached();
    if scope.is_all() {
        kernel.attach(None).map_err(|e| e.to_string())?;
        for key in previous.into_iter().flatten() {
            kernel.detach(Some(key));
        }
        kernel.set_switches(0);
        for pid in kernel.in_scope() {
            kernel.set_in_scope(pid, false);
        }
        return Ok(Vec::new());
    }
    if scope.is_filtered() {
        return apply_filtered(kernel, scope, &previous);
    }
    for pid in kernel.in_scope() {
        kernel.set_in_scope(pid, false);
    }
    // Exec and fork events from here on, so nothing starting meanwhile
    // is missed; then one pass over /proc.
    kernel.set_switches(tracer_common::SWITCH_SCOPED);
    let own = std::process::id();
    let mut attached = Vec::new();
    // Kernel threads run no allocator: a scope that matches them (a
    // cgroup of /) attaches to the user processes only.
    for pid in procfs::user_pids() {
        if pid == own || !scope.matches(pid) {
            continue;
        }
        match kernel.attach(Some(pid)) {
            Ok(()) => attached.push(pid),
            // A process can end between the listing and the attach.
            Err(err) => tracing::debug!(pid, %err, "could not attach to a process in scope"),
        }
    }
    for key in previous {
        match key {
            None => kernel.detach(None),
            Some(pid) if !attached.contains(&pid) => kernel.detach(Some(pid)),
            Some(_) => {}
        }
    }
    tracing::info!(processes = attached.len(), "tracing scoped");
    Ok(attached)
}

/// [`apply`] for a scope of executables or cgroups: the filter on, the
/// matching processes in `SCOPE_TGIDS` and no others, the probes attached
/// for every process (and no more per process). Returns the processes in
/// scope.
fn apply_filtered(
    kernel: &mut dyn KernelMaps,
    scope: &Scope,
    previous: &[Option<u32>],
) -> Result<Vec<u32>, String> {
    // The filter first: from here on only the processes in the map are
    // recorded, and every exec and fork is reported.
    kernel.set_switches(tracer_common::SWITCH_SCOPED | tracer_common::SWITCH_SCOPE_FILTER);
    let own = std::process::id();
    let matching: Vec<u32> = procfs::user_pids()
        .into_iter()
        .filter(|&pid| pid != own && scope.matches(pid))
        .collect();
    for pid in kernel.in_scope() {
        if !matching.contains(&pid) {
            kernel.set_in_scope(pid, false);
        }
    }
    for &pid in &matching {
        kernel.set_in_scope(pid, true);
    }
    kernel.attach(None).map_err(|e| e.to_string())?;
    for key in previous.iter().flatten() {
        kernel.detach(Some(*key));
    }
    tracing::info!(
        processes = matching.len(),
        "tracing scoped: filtered in the kernel"
    );
    Ok(matching)
}

/// An exec or fork seen while scoped: attach `pid` (or put it in the scope
/// filter) if it now matches, detach it (take it out) if it no longer does
/// (it exec'd something else). A forked thread (not a process) and
/// tracerd itself are left alone.
pub fn on_exec_or_fork(kernel: &mut dyn KernelMaps, scope: &Scope, pid: u32, is_fork: bool) {
    if scope.is_all() || pid == std::process::id() {
        return;
    }
    if is_fork && !procfs::is_process(pid) {
        return;
    }
    if scope.is_filtered() {
        // A fork's event can come after the child's exec was held and put
        // in: /proc may still show the parent's program then. Only an
        // exec takes a process out.
        let matches = scope.matches(pid);
        if matches || !is_fork {
            kernel.set_in_scope(pid, matches);
        }
        return;
    }
    if scope.matches(pid) {
        if let Err(err) = kernel.attach(Some(pid)) {
            tracing::debug!(pid, %err, "could not attach to a process in scope");
        }
    } else {
        kernel.detach(Some(pid));
    }
}

/// Detaches the probes of processes that are gone, and takes them out of
/// the scope filter.
pub fn prune(kernel: &mut dyn KernelMaps) {
    for pid in kernel.attached().into_iter().flatten() {
        if !procfs::exists(pid) {
            kernel.detach(Some(pid));
        }
    }
    for pid in kernel.in_scope() {
        if !procfs::exists(pid) {
            kernel.set_in_scope(pid, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn cgroup_matching_is_by_whole_components() {
        assert!(cgroup_contains(
            "/system.slice",
            "/system.slice/nginx.service"
        ));
        assert!(cgroup_contains("/system.slice/", "/system.slice"));
        assert!(!cgroup_contains("/system.slice", "/system.slicex/a"));
        assert!(cgroup_contains("/", "/anything"));
        assert_eq!(
            procfs::cgroup_v2_path("0::/user.slice/session-1.scope\n"),
            Some("/user.slice/session-1.scope")
        );
        assert_eq!(procfs::cgroup_v2_path("1:name=systemd:/x\n"), None);
    }

    #[test]
    fn invalid_scopes_say_what_is_valid() {
        let bad_exe = Scope {
            exes: BTreeSet::from([PathBuf::from("bin/app")]),
            ..Scope::default()
        };
        assert_eq!(
            bad_exe.validate().unwrap_err(),
            "exe bin/app is not an absolute path"
        );
        let bad_cgroup = Scope {
            cgroups: BTreeSet::from(["app.service".to_string()]),
            ..Scope::default()
        };
        assert!(
            bad_cgroup
                .validate()
                .unwrap_err()
                .contains("not an absolute cgroup path")
        );
        let bad_pid = Scope {
            pids: BTreeSet::from([0]),
            ..Scope::default()
        };
        assert!(bad_pid.validate().is_err());
        assert!(Scope::default().validate().is_ok());
    }

    #[test]
    fn this_process_matches_its_own_pid_exe_and_cgroup() {
        let pid = std::process::id();
        let exe = fs::read_link("/proc/self/exe").expect("exe");
        let cgroup = fs::read_to_string("/proc/self/cgroup").expect("cgroup");
        assert!(
            Scope {
                pids: BTreeSet::from([pid]),
                ..Scope::default()
            }
            .matches(pid)
        );
        assert!(
            Scope {
                exes: BTreeSet::from([exe]),
                ..Scope::default()
            }
            .matches(pid)
        );
        if let Some(path) = procfs::cgroup_v2_path(&cgroup) {
            let scope = Scope {
                cgroups: BTreeSet::from([path.to_string()]),
                ..Scope::default()
            };
            assert!(scope.matches(pid));
        }
        let other = Scope {
            exes: BTreeSet::from([PathBuf::from("/nonexistent/app")]),
            ..Scope::default()
        };
        assert!(!other.matches(pid));
        assert!(procfs::is_process(pid));
    }

    #[test]
    fn an_exe_named_through_symlinks_matches_the_file_it_names() {
        // A symlink to this test binary, and a symlink to a directory on
        // the way: /proc/PID/exe names the file itself.
        let pid = std::process::id();
        let exe = fs::read_link("/proc/self/exe").expect("exe");
        let dir = std::env::temp_dir().join(format!("scope-symlink-{pid}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("dir");
        std::os::unix::fs::symlink(&exe, dir.join("link")).expect("symlink");
        std::os::unix::fs::symlink(exe.parent().expect("parent"), dir.join("bin"))
            .expect("dir symlink");
        let via_dir = dir.join("bin").join(exe.file_name().expect("name"));
        for named in [dir.join("link"), via_dir] {
            let scope = Scope {
                exes: BTreeSet::from([named.clone()]),
                ..Scope::default()
            };
            assert!(scope.matches(pid), "{} does not match", named.display());
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
