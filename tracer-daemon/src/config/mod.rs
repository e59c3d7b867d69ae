//! tracerd's configuration, from four sources in this order of precedence:
//! command-line flags, then `TRACERD_*` environment variables, then the TOML
//! file (`/etc/tracer/tracerd.toml`, or `--config FILE`), then the defaults.
//!
//! [`Config`]'s `Default` impl is the single source of default values; the
//! TOML file and `tracerd config default` use [`Config`]'s field names.
//! Every value, whatever its source, goes through [`Config::validate`], which
//! refuses an invalid one with the range that is valid.
//!
//! Adding a setting takes three lines: a field (with a doc comment) in
//! [`Config`], its default in `Default`, and an `Option` field of the same
//! name in [`Flags`] with `#[arg(long, env = "TRACERD_NAME")]`. Flags are
//! merged by name (through serde), so no merge code needs to change; give it
//! a range check in [`Config::validate`] if not every value is valid, and a
//! commented line in `deploy/tracerd.toml` (a test checks that the file
//! holds exactly the defaults).
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

mod allocator_frames;
mod flags;
mod validate;

pub use allocator_frames::{
    FrameName, FramePattern, MODULE_PREFIX, glob_to_fnmatch, parse_frame_patterns,
};
pub use flags::{Cli, Command, ConfigCommand, Flags};

/// Where tracerd looks for its configuration file when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/tracer/tracerd.toml";

/// Errors of reading or checking the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or has an unknown key or a value of the
    /// wrong type.
    #[error("{origin}: {message}")]
    Parse {
        /// The file, or what the values came from.
        origin: String,
        /// What the TOML parser said (with the line).
        message: String,
    },
    /// A value is outside its valid range.
    #[error("{field} = {value} is out of range; valid: {valid}")]
    OutOfRange {
        /// The setting (TOML key; flag `--{field}` with `-` for `_`).
        field: &'static str,
        /// The value given.
        value: String,
        /// The valid range or values.
        valid: std::borrow::Cow<'static, str>,
    },
    /// A value is malformed.
    #[error("{field} = {value:?} is invalid: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is valid.
        reason: String,
    },
}

/// tracerd's settings, after merging every source. Field names are the TOML
/// keys; flags are the same names with `-` for `_`. Each consumer takes its
/// part with a `From<&Config>` of its own settings type:
/// `capture::CaptureConfig`, `lifecycle::Scope`, `store::Quotas`,
/// `service::AutoPolicy`, `metrics::MetricsOptions`, `http::Limits` and
/// `http::Connections`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// TCP address of the HTTP API. A loopback address (127.0.0.1, ::1)
    /// unless `auth_token_file` is set.
    pub listen: SocketAddr,
    /// Also serve the API on this Unix socket (created with mode 0666: any
    /// local user may connect; only operators change anything), if set.
    pub unix_socket: Option<PathBuf>,
    /// File holding the bearer token that TCP clients must send
    /// (`Authorization: Bearer TOKEN`). Required for a non-loopback `listen`.
    pub auth_token_file: Option<PathBuf>,
    /// Frames kept per traceback (tracemalloc's nframe), 1 to 64.
    pub nframe: u32,
    /// The allocation machinery: glob patterns of the frames that a
    /// traceback's leading run drops (before `nframe` is counted), so that
    /// frame 0 is the first frame outside allocators and their wrappers.
    /// `module:GLOB` matches a frame's module path, any other pattern its
    /// demangled function name; `*` is any run of characters, `?` one,
    /// `\` escapes `*`, `?` and `\`. A query keeps them with
    /// `allocator_frames=keep`.
    pub allocator_frames: Vec<String>,
    /// Most leading frames of the allocation machinery the kernel walks
    /// beyond `nframe`, so that `nframe` frames remain after they are
    /// dropped, 0 to 64: the kernel walks `min(nframe + this, 96)` frames.
    /// Physical frames: an inlined call costs none, so 8 holds `operator
    /// new`, Rust's alloc shims and `RawVec`, CPython's and glib's layers;
    /// each frame walked costs every allocation with a deep stack.
    pub allocator_frames_depth: u32,
    /// Unwind with the tables compiled from each mapped file's `.eh_frame`
    /// (or `.debug_frame`): whole stacks without frame pointers. false:
    /// frame pointers only, as `bpf_get_stack` walks.
    pub unwind: bool,
    /// Rows of the kernel's unwind table (`UNWIND_ROWS`), all files
    /// together: 8 bytes each, allocated at start (16 MiB by default; a
    /// file needs about 20,000 rows per MiB of text). A file that does not
    /// fit is walked with frame pointers (counted in `/maps` and
    /// `/metrics`). 1024 to 67108864.
    pub unwind_table_rows: u32,
    /// Pages (64 KiB of a file's offsets) of the unwind tables
    /// (`UNWIND_PAGES`), all files together: about 64 bytes each,
    /// allocated at start. 64 to 4194304.
    pub unwind_table_pages: u32,
    /// Processes whose executable mappings the kernel keeps for the
    /// unwinder (`PROC_MAPS`): 8 KiB each, allocated only for the processes
    /// traced. A process beyond them is walked with frame pointers. 16 to
    /// 1048576.
    pub unwind_processes: u32,
    /// Directory for tracerd's state (created if missing).
    pub state_dir: PathBuf,
    /// Seconds an exited process's last state stays queryable.
    pub exited_retention: u64,
    // Triggered snapshots (`service::triggers::AutoPolicy`).
    /// Seconds between automatic snapshots of every traced process (what
    /// `compare?since=` compares against); 0 turns them off.
    pub snapshot_interval: u64,
    /// Seconds an automatic snapshot is kept (the longest `since=` that
    /// finds one).
    pub snapshot_retention: u64,
    /// Snapshots the store holds at most, of every kind (automatic ones
    /// included), 1 to 10,000,000. When full, a new snapshot evicts the
    /// oldest unlabelled automatic ones; if that is not enough, a `POST`
    /// is answered 507 naming this setting.
    pub max_snapshots: u64,
    /// Bytes the stored snapshots take at most, together, 1024 to 2^50: a
    /// snapshot kept in the state directory counts its file's size, an
    /// automatic one its compact form in memory. Full: as `max_snapshots`.
    pub max_snapshot_bytes: u64,
    /// Snapshots one unprivileged user (uid) stores at most, 1 to
    /// 10,000,000: a `POST` beyond it is answered 507 (nothing of others is
    /// evicted for it). The operators' and automatic snapshots count in the
    /// totals only.
    pub max_snapshots_per_owner: u64,
    /// Bytes of the snapshots one unprivileged user stores at most, 1024 to
    /// 2^50, counted as `max_snapshot_bytes` counts them.
    pub max_snapshot_bytes_per_owner: u64,
    /// Capacity of the kernel's live-block map (`LIVE_ALLOCS`) in blocks,
    /// all processes together.
    pub max_live_blocks: u32,
    /// Blocks of the kernel's preallocated fast live-block table
    /// (`LIVE_KEYS`, `LIVE_VALUES`), rounded up to 7 times a power of two;
    /// 0 turns it off. 42 bytes each, allocated at start. A block claims a
    /// slot there by one compare-and-swap instead of a hash insert; blocks
    /// beyond it (or in a full bucket of 7) go to `LIVE_ALLOCS`.
    pub live_table_blocks: u32,
    /// The share of the live-block maps (`max_live_blocks` and
    /// `live_table_blocks` together), and of the stack map
    /// (`max_stacks`), one process may hold, in percent (1..=100; 100: no
    /// limit): a process past it has its new blocks dropped (or, past its
    /// stacks, recorded with frame 0 only), counted in its `drops`, so
    /// that the others stay complete.
    pub process_share: u32,
    /// Capacity of the kernel's stack map (`STACKS`) in distinct stacks.
    pub max_stacks: u32,
    /// Capacity of the kernel's per-process map (`PROCS`) in processes.
    pub max_procs: u32,
    /// Capacity of the kernel's in-flight spill map (`INFLIGHT`) in calls:
    /// allocator calls in progress whose thread's slot in `INFLIGHT_SLOTS`
    /// is taken by another thread. 1 to 4194304.
    pub max_inflight: u32,
    /// Slots of the kernel's in-flight array (`INFLIGHT_SLOTS`), one call in
    /// progress each, indexed by thread id modulo their number: a power of
    /// two, 1 to 4194304 (the kernel's largest pid_max: a slot per thread).
    /// 32 bytes each, allocated at start.
    pub inflight_slots: u32,
    /// Size of the kernel's process-event ring buffer (`EVENTS`) in bytes: a
    /// power of two multiple of the page size, up to 1 GiB. 104-byte events
    /// plus an 8-byte header each; events that find it full are lost
    /// (counted), and the blocks of an exited process whose end was lost are
    /// removed by the orphan sweep (every 10 s) instead.
    pub events_ring_bytes: u32,
    /// Mean sampling interval in bytes: byte-weighted Poisson sampling as
    /// tcmalloc does it, with unbiased estimates in statistics and compare;
    /// 0 records every allocation (exact, the default).
    pub sample_interval: u64,
    /// Trace only these pids (with `scope_exes` and `scope_cgroups`; all
    /// empty: every process). Probes are registered for those processes only.
    pub scope_pids: Vec<u32>,
    /// Trace only processes running these executables (absolute paths,
    /// matched with their symlinks resolved).
    pub scope_exes: Vec<PathBuf>,
    /// Trace only processes in these cgroup v2 paths (or below them).
    pub scope_cgroups: Vec<String>,
    /// glibc files to probe; empty: every libc.so.6 the dynamic loader resolves.
    pub libc: Vec<PathBuf>,
    /// Find the allocators of the processes in scope in the objects they
    /// map (`/proc/PID/maps`: their symbols, `.dynsym` and `.symtab`) and
    /// probe each object that defines one: another libc (musl, a
    /// container's glibc), a static binary's, jemalloc, tcmalloc,
    /// mimalloc. Off: only the glibc of `libc` is probed.
    pub discover_allocators: bool,
    /// With `discover_allocators`, also probe the allocator libraries
    /// installed on the host (jemalloc, tcmalloc, mimalloc, glibc, musl in
    /// `/lib`, `/usr/lib`, `/usr/local/lib` and their multiarch
    /// directories) at start, before any process maps them: a program that
    /// links one is traced from its first allocation. Off by default: some
    /// hundreds of uprobes more. A stop detaches them in about 0.6 s as
    /// uprobe_multi links (Linux 6.6+), but took 18 to 41 s here as perf
    /// events, where the kernel has no such links (the goal is 5 s).
    pub probe_installed_allocators: bool,
    /// Trace each traced process's own anonymous mappings (`mmap`,
    /// `munmap`, `mremap` outside any allocator call) as blocks of source
    /// `mmap`, with their stacks: three syscall tracepoints.
    pub trace_mmap: bool,
    /// Hold each exec of a process in scope (fanotify's
    /// `FAN_OPEN_EXEC_PERM` on every filesystem) until the allocators its
    /// new image runs on are probed and, when scoped, its probes attached,
    /// for 500 ms at most: a program is traced from its first allocation,
    /// the dynamic loader's and its constructors' included. Needs
    /// CAP_SYS_ADMIN; off, a program whose allocator is new to tracerd is
    /// traced from a moment after its start.
    pub hold_exec: bool,
    /// The operators' group: besides root and holders of the token, its
    /// members see every process and may change tracing (start, stop,
    /// clear, the scope, others' snapshots, loaded files). Everyone else
    /// sees only their own processes (those they could ptrace) and the
    /// snapshots they stored, and gets 403 for other changes. The peer's
    /// user comes from the kernel (`SO_PEERCRED`, inet_diag for loopback
    /// TCP).
    pub operators_group: String,
    /// `/metrics`: give the per-process series (pid, comm, call sites) to
    /// every caller, not only to operators. Off, others get the host's
    /// totals (every process summed under `pid="other"`) and tracer's own
    /// health.
    pub metrics_public: bool,
    /// Log filter (tracing's EnvFilter syntax), e.g. `info` or `tracer_daemon=debug`.
    pub log: String,
    /// `/metrics`: processes labelled by pid and comm, the largest by
    /// current bytes; the rest are summed under `comm="other"`.
    pub metrics_top_processes: u32,
    /// `/metrics`: call sites (file:line) per labelled process exported as
    /// gauges, the largest by current bytes; 0 turns them off. Each scrape
    /// then takes a snapshot of every labelled process.
    pub metrics_call_sites: u32,
    /// Turn on the kernel's BPF run-time statistics (`BPF_ENABLE_STATS`) for
    /// `tracer_bpf_program_*` metrics; costs two clock reads per probe hit
    /// (about 150 ns per malloc+free pair on a KVM guest), so off by default.
    pub bpf_stats: bool,
    /// Seconds a request may take before it is answered 503.
    pub request_timeout_secs: u64,
    /// Largest request body accepted, in bytes (larger: 413).
    pub body_limit_bytes: u64,
    /// Expensive requests (statistics, compare, snapshots, traces) served at
    /// once; more are answered 429 at once. Their kernel-map reads take turns
    /// on one lock, so more than about the number of cores only queues (a
    /// load test with 64 clients: 2 gives p99 0.8 s, 8 gives p99 24 s).
    pub max_expensive_requests: u32,
    /// Bytes the work of one request may hold at once (what it allocated
    /// and has not freed: the snapshot it builds, the groups it makes, the
    /// answer it holds); a request past it stops and is answered 413 with
    /// a hint to ask for less (`limit`/`offset`, filters, `format=`). With
    /// `max_expensive_requests`, it bounds what requests add to tracerd's
    /// memory. Streamed answers (traces) hold a few chunks of 64 KiB
    /// whatever their length.
    pub request_memory_budget: u64,
    /// Seconds the API gets to finish its requests after SIGTERM/SIGINT
    /// before they are cut.
    pub shutdown_grace_secs: u64,
    /// Seconds a request body may pause (no byte arriving) before the
    /// request is answered 408.
    pub request_read_timeout_secs: u64,
    /// Seconds from a request's first byte to the end of its head (request
    /// line and headers); past it the connection is closed.
    pub header_timeout_secs: u64,
    /// Seconds a connection may stay open with no request in progress and
    /// no byte received or sent (a new one before its first request, a
    /// kept-alive one between requests, one whose client does not read its
    /// answer); past it the connection is closed.
    pub idle_timeout_secs: u64,
    /// Connections open at once on each listener (TCP, the Unix socket);
    /// more wait in the kernel's backlog until one closes. Each is a file
    /// descriptor: the systemd unit's `LimitNOFILE` is above twice this.
    pub max_connections: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7466)),
            unix_socket: None,
            auth_token_file: None,
            nframe: 16,
            allocator_frames: allocator_frames::defaults(),
            allocator_frames_depth: 8,
            unwind: true,
            unwind_table_rows: 1 << 21,
            unwind_table_pages: 1 << 16,
            unwind_processes: 8192,
            state_dir: PathBuf::from("/var/lib/tracer"),
            exited_retention: 600,
            snapshot_interval: 60,
            snapshot_retention: 3600,
            max_snapshots: 10_000,
            max_snapshot_bytes: 1 << 30,
            max_snapshots_per_owner: 100,
            max_snapshot_bytes_per_owner: 128 << 20,
            max_live_blocks: 4 * 1024 * 1024,
            live_table_blocks: 7 << 16,
            process_share: 50,
            max_stacks: 65536,
            max_procs: 65536,
            max_inflight: 65536,
            inflight_slots: 65536,
            events_ring_bytes: 1 << 18,
            sample_interval: 0,
            scope_pids: Vec::new(),
            scope_exes: Vec::new(),
            scope_cgroups: Vec::new(),
            libc: Vec::new(),
            discover_allocators: true,
            probe_installed_allocators: false,
            trace_mmap: true,
            hold_exec: true,
            operators_group: "tracer".to_string(),
            metrics_public: false,
            log: "info".to_string(),
            metrics_top_processes: 20,
            metrics_call_sites: 0,
            bpf_stats: false,
            request_timeout_secs: 30,
            body_limit_bytes: 64 * 1024 * 1024,
            max_expensive_requests: 2,
            request_memory_budget: 1 << 30,
            shutdown_grace_secs: 3,
            request_read_timeout_secs: 10,
            header_timeout_secs: 10,
            idle_timeout_secs: 60,
            max_connections: 4096,
        }
    }
}

impl Config {
    /// Merges the sources: `flags` (already CLI over environment, as clap
    /// reads them) over the TOML file over the defaults, then validates.
    /// The file is `flags.config`, else [`DEFAULT_CONFIG_FILE`] if it exists.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, key or value at fault.
    pub fn load(flags: &Flags) -> Result<Self, ConfigError> {
        let file = match &flags.config {
            Some(path) => Some(path.clone()),
            None => Some(PathBuf::from(DEFAULT_CONFIG_FILE)).filter(|p| p.exists()),
        };
        let mut table = match &file {
            Some(path) => read_table(path)?,
            None => toml::Table::new(),
        };
        let overrides = toml::Table::try_from(flags).map_err(|e| ConfigError::Parse {
            origin: "flags".into(),
            message: e.to_string(),
        })?;
        table.extend(overrides);
        let origin = match &file {
            Some(path) => format!("{} with flags and TRACERD_* variables", path.display()),
            None => "flags and TRACERD_* variables".to_string(),
        };
        let config = Self::from_table(table, &origin)?;
        config.validate()?;
        Ok(config)
    }

    /// True when no scope is chosen (`scope_pids`, `scope_exes` and
    /// `scope_cgroups` all empty): every process is traced.
    #[must_use]
    pub fn traces_every_process(&self) -> bool {
        self.scope_pids.is_empty() && self.scope_exes.is_empty() && self.scope_cgroups.is_empty()
    }

    /// Reads and validates a TOML file alone (over the defaults), as
    /// `tracerd config check` does.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key or value at fault.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let config = Self::from_table(read_table(path)?, &path.display().to_string())?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML text (over the defaults) and validates it.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] for bad TOML, an unknown key or a wrong type;
    /// the other variants for bad values.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let table = text
            .parse::<toml::Table>()
            .map_err(|e| ConfigError::Parse {
                origin: origin.to_string(),
                message: e.to_string(),
            })?;
        let config = Self::from_table(table, origin)?;
        config.validate()?;
        Ok(config)
    }

    fn from_table(table: toml::Table, origin: &str) -> Result<Self, ConfigError> {
        Self::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        })
    }

    /// The configuration as TOML (what `tracerd config default` prints).
    ///
    /// # Errors
    /// [`ConfigError::Parse`] if a value has no TOML form (never for a
    /// validated config).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Parse {
            origin: "config".into(),
            message: e.to_string(),
        })
    }
}

fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse {
        origin: path.display().to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
