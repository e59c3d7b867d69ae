//! tracerd itself and its controls: `/health`, `/scope`, the tracing state
//! (`/tracing`, `/pid/{pid}/tracing`, `start`, `stop`), and every error's
//! body.
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// Every error's body (4xx and 5xx): what is wrong, and what would be
/// right (through a Value: keys sorted, which is this order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What is wrong.
    pub error: String,
    /// What would be right: the valid values, the route to ask.
    pub hint: String,
}

/// One probed object (a library or an executable) of [`Health`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Library {
    /// The object's path: the canonical host path of a glibc probed from
    /// the start, else the path `/proc/PID/maps` gave it in the process it
    /// was found in (a container's path is inside its root).
    pub path: String,
    /// Whose allocator it is: `glibc`, `musl`, `jemalloc`, `tcmalloc`,
    /// `mimalloc` or `malloc`.
    pub family: String,
    /// The process it was found in; null: probed from the start.
    pub found_in: Option<u32>,
    /// `symbol@file_offset` of each attached uprobe.
    pub probes: Vec<String>,
}

/// `GET /health`: readiness, the probes are attached (sent as this struct).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Always `ready` once tracerd answers.
    pub status: String,
    /// The traceback limit in frames (tracerd's `--nframe`).
    pub nframe: u32,
    /// The objects probed, with their probe points.
    pub libraries: Vec<Library>,
    /// Unix ms when tracing began.
    pub started_at_ms: u64,
}

/// `is_tracing()` and `get_traceback_limit()` of a process image or of the
/// whole host (`/tracing`, `/pid/{pid}/tracing`, their `start` and `stop`;
/// sent as this struct).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracingState {
    /// The process asked about; absent system-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// `is_tracing()`.
    pub is_tracing: bool,
    /// `get_traceback_limit()`, in frames.
    pub traceback_limit: u32,
    /// The most frames `start(nframe)` accepts (tracerd's `--nframe`).
    pub max_nframe: u32,
    /// System-wide: the images whose state differs from the host's, by pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<ProcessTracing>>,
    /// After `start()`: whether it started anything (false when tracing
    /// already, as tracemalloc does nothing then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<bool>,
}

/// One image whose tracing state differs from the host's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessTracing {
    /// Its pid.
    pub pid: u32,
    /// `is_tracing()`.
    pub is_tracing: bool,
    /// `get_traceback_limit()`, in frames.
    pub traceback_limit: u32,
}

/// Which processes are traced (`PUT /scope?pid=&exe=&cgroup=`). All sets
/// empty: every process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    /// Process ids.
    #[serde(default)]
    pub pids: BTreeSet<u32>,
    /// Executables, as given (a process matches by `/proc/PID/exe`), in
    /// the order of paths (component by component, as tracerd keeps them).
    #[serde(default)]
    pub exes: Vec<String>,
    /// cgroup v2 paths: a process matches in that cgroup or below it.
    #[serde(default)]
    pub cgroups: BTreeSet<String>,
}

/// `GET /scope` and `PUT /scope`: the scope in force and what is attached
/// for it (sent as this struct).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeView {
    /// The scope.
    pub scope: Scope,
    /// True when the probes are attached for every process.
    pub all_processes: bool,
    /// Processes with probes of their own (a scope of pids alone).
    pub attached_pids: Vec<u32>,
    /// True when the kernel records only the processes in scope, the
    /// probes attached for every process (a scope with executables or
    /// cgroups).
    pub filtered: bool,
    /// The processes the kernel records while `filtered`.
    pub filter_pids: Vec<u32>,
    /// `exact`: `demand` (outside the scope, processes are watched and
    /// traced exactly when asked or growing) or `all`.
    #[serde(default)]
    pub exact: String,
    /// The processes traced exactly on demand (by a query, or by the
    /// watch), with since when and why, by pid.
    #[serde(default)]
    pub on_demand: Vec<OnDemandProcess>,
}

/// A process traced exactly on demand (`GET /scope`'s `on_demand`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnDemandProcess {
    /// Process id.
    pub pid: u32,
    /// Unix ms its exact tracing began.
    pub since_ms: u64,
    /// Why: `query` or `watch`.
    pub reason: crate::ExactReason,
}
