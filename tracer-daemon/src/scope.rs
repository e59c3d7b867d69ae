//! Scope: which processes are traced. Every process (the default), or only
//! chosen pids, executables and cgroups. A scoped tracerd registers its
//! probes with the kernel for the matching processes only (one perf event
//! per probe and process), so the breakpoints exist only in their memory and
//! every other process runs at full speed.
//!
//! Matching happens when the scope is set (a pass over `/proc`) and on the
//! exec and fork events the kernel sends while scoped; a process whose pid
//! is gone is detached at the next sweep.
use std::{collections::BTreeSet, fs, path::PathBuf};

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{RawQuery, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::json;

use crate::sys::procfs;
use crate::{
    api::ApiError,
    daemon::{Daemon, lock},
};

/// Which processes are traced. All sets empty: every process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    /// Process ids.
    #[serde(default)]
    pub pids: BTreeSet<u32>,
    /// Executables: a process matches when `/proc/PID/exe` is this path.
    #[serde(default)]
    pub exes: BTreeSet<PathBuf>,
    /// cgroup v2 paths (as in `/proc/PID/cgroup`, e.g. `/system.slice/nginx.service`):
    /// a process matches when it is in that cgroup or below it.
    #[serde(default)]
    pub cgroups: BTreeSet<String>,
}

impl Scope {
    /// True when nothing is chosen: every process is traced.
    pub fn is_all(&self) -> bool {
        self.pids.is_empty() && self.exes.is_empty() && self.cgroups.is_empty()
    }

    /// Whether process `pid` matches, read from `/proc/PID/exe` and
    /// `/proc/PID/cgroup` now. A process that is gone matches nothing.
    pub fn matches(&self, pid: u32) -> bool {
        if self.is_all() || self.pids.contains(&pid) {
            return true;
        }
        if !self.exes.is_empty()
            && let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe"))
            && self.exes.contains(&exe)
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

impl Daemon {
    /// The scope in force.
    pub fn scope(&self) -> Scope {
        lock(&self.scope).clone()
    }

    /// Sets which processes are traced and attaches accordingly: all sets
    /// empty traces every process; otherwise the probes are registered for
    /// each matching process only. Returns the processes now attached one by
    /// one (empty when every process is traced).
    ///
    /// # Errors
    /// A message when the scope is invalid (see [`Scope::validate`]) or the
    /// system-wide probes cannot be attached again.
    pub fn set_scope(&self, scope: Scope) -> Result<Vec<u32>, String> {
        scope.validate()?;
        let mut capture = self.capture();
        let mut current = lock(&self.scope);
        let previous: Vec<Option<u32>> = capture.attached();
        if scope.is_all() {
            capture.attach(None).map_err(|e| e.to_string())?;
            for key in previous.into_iter().flatten() {
                capture.detach(Some(key));
            }
            capture.set_switches(0);
            *current = scope;
            return Ok(Vec::new());
        }
        // Exec and fork events from here on, so nothing starting meanwhile
        // is missed; then one pass over /proc.
        capture.set_switches(tracer_common::SWITCH_SCOPED);
        let own = std::process::id();
        let mut attached = Vec::new();
        for pid in procfs::all_pids() {
            if pid == own || !scope.matches(pid) {
                continue;
            }
            match capture.attach(Some(pid)) {
                Ok(()) => attached.push(pid),
                // A process can end between the listing and the attach.
                Err(err) => tracing::debug!(pid, %err, "could not attach to a process in scope"),
            }
        }
        for key in previous {
            match key {
                None => capture.detach(None),
                Some(pid) if !attached.contains(&pid) => capture.detach(Some(pid)),
                Some(_) => {}
            }
        }
        tracing::info!(processes = attached.len(), "tracing scoped");
        *current = scope;
        Ok(attached)
    }

    /// An exec or fork seen while scoped: attach `pid` if it now matches,
    /// detach it if it no longer does (it exec'd something else).
    pub(crate) fn scope_candidate(&self, pid: u32, is_fork: bool) {
        let scope = self.scope();
        if scope.is_all() || pid == std::process::id() {
            return;
        }
        if is_fork && !procfs::is_process(pid) {
            return;
        }
        let mut capture = self.capture();
        if scope.matches(pid) {
            if let Err(err) = capture.attach(Some(pid)) {
                tracing::debug!(pid, %err, "could not attach to a process in scope");
            }
        } else {
            capture.detach(Some(pid));
        }
    }

    /// Detaches the probes of processes that are gone.
    pub(crate) fn prune_scope(&self) {
        let mut capture = self.capture();
        for pid in capture.attached().into_iter().flatten() {
            if !procfs::exists(pid) {
                capture.detach(Some(pid));
            }
        }
    }
}

/// `GET /scope` and `PUT /scope?pid=N&exe=PATH&cgroup=PATH` (each
/// repeatable; none: trace every process).
pub fn routes() -> Router<Arc<Daemon>> {
    Router::new().route("/scope", get(get_scope).put(put_scope))
}

async fn get_scope(State(daemon): State<Arc<Daemon>>) -> Response {
    let attached = daemon.capture().attached();
    let all = attached.contains(&None);
    let pids: Vec<u32> = attached.into_iter().flatten().collect();
    Json(json!({"scope": daemon.scope(), "all_processes": all, "attached_pids": pids}))
        .into_response()
}

/// Parses `pid=`, `exe=`, `cgroup=` (each repeatable) into a scope.
///
/// # Errors
/// 400 naming the valid parameters and values.
pub fn parse_scope(query: Option<&str>) -> Result<Scope, ApiError> {
    let bad = |error: String, hint: &str| ApiError {
        status: StatusCode::BAD_REQUEST,
        error,
        hint: hint.to_string(),
    };
    let mut scope = Scope::default();
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match name.as_ref() {
            "pid" => match value.parse::<u32>() {
                Ok(pid) if pid > 0 => {
                    scope.pids.insert(pid);
                }
                _ => {
                    return Err(bad(
                        format!("invalid pid {value:?}"),
                        "pid is a positive integer",
                    ));
                }
            },
            "exe" => {
                scope.exes.insert(PathBuf::from(value.as_ref()));
            }
            "cgroup" => {
                scope.cgroups.insert(value.into_owned());
            }
            other => {
                return Err(bad(
                    format!("unknown parameter {other:?}"),
                    "valid parameters: pid, exe, cgroup (each repeatable; none traces every process)",
                ));
            }
        }
    }
    scope.validate().map_err(|e| {
        bad(e, "exe is an absolute path; cgroup an absolute cgroup v2 path such as /system.slice/app.service")
    })?;
    Ok(scope)
}

async fn put_scope(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let scope = parse_scope(query.as_deref())?;
    let result = tokio::task::spawn_blocking(move || daemon.set_scope(scope)).await;
    match result {
        Ok(Ok(pids)) => Ok(
            Json(json!({"attached_pids": pids, "all_processes": pids.is_empty()})).into_response(),
        ),
        Ok(Err(error)) => Err(ApiError {
            status: StatusCode::CONFLICT,
            error,
            hint: "see tracerd's log".into(),
        }),
        Err(err) => Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: format!("internal error: {err}"),
            hint: "see tracerd's log".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_queries_parse_and_refuse_bad_values() {
        let scope =
            parse_scope(Some("pid=12&pid=13&exe=/usr/bin/app&cgroup=/system.slice")).unwrap();
        assert_eq!(scope.pids, BTreeSet::from([12, 13]));
        assert_eq!(scope.exes, BTreeSet::from([PathBuf::from("/usr/bin/app")]));
        assert!(parse_scope(None).unwrap().is_all());
        let err = parse_scope(Some("process=1")).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(
            err.hint.starts_with("valid parameters: pid, exe, cgroup"),
            "{}",
            err.hint
        );
        assert_eq!(
            parse_scope(Some("pid=-1")).unwrap_err().hint,
            "pid is a positive integer"
        );
        assert!(parse_scope(Some("exe=relative")).is_err());
    }

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
}
