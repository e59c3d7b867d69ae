//! The command line: `tracerd [OPTIONS]`, `tracerd config check FILE`,
//! `tracerd config default`. Every flag is an `Option` named as the TOML
//! key it sets (a field of a section of [`Config`](super::Config)), with
//! its `TRACERD_*` variable.
use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

/// tracerd: Python's tracemalloc for every native process on this host.
///
/// Traces glibc allocations of every process with eBPF uprobes and serves
/// tracemalloc's statistics, snapshots and diffs over HTTP, and Prometheus
/// metrics at /metrics. Settings come from flags, then TRACERD_* environment
/// variables, then the TOML file, then the defaults (`tracerd config default`).
#[derive(Debug, Parser)]
#[command(
    name = "tracerd",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// A maintenance command instead of running the daemon.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings of the daemon.
    #[command(flatten)]
    pub flags: Flags,
}

/// tracerd's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check or print configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
}

/// `tracerd config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check a TOML configuration file: exit 0 and print the settings it
    /// gives, or exit 1 naming the bad value and its valid range.
    Check {
        /// The file to check.
        file: PathBuf,
    },
    /// Print the default configuration as TOML.
    Default,
}

/// Flags of the daemon; each is also read from its `TRACERD_*` variable.
/// A flag not given leaves the file's value (or the default) in force.
#[derive(Clone, Debug, Default, Args, Serialize)]
pub struct Flags {
    /// TOML configuration file [default: /etc/tracer/tracerd.toml, if it exists].
    #[arg(long, env = "TRACERD_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// TCP address of the HTTP API (ADDR:PORT); non-loopback needs --auth-token-file.
    #[arg(long, env = "TRACERD_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Also serve the API on this Unix socket path (mode 0666; only operators change anything).
    #[arg(long, env = "TRACERD_UNIX_SOCKET")]
    pub unix_socket: Option<PathBuf>,
    /// File with the bearer token TCP clients must send.
    #[arg(long, env = "TRACERD_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Frames kept per traceback (tracemalloc's nframe), 1 to 64.
    #[arg(long, env = "TRACERD_NFRAME")]
    pub nframe: Option<u32>,
    /// Allocation machinery: a glob of the function names (or module:GLOB of
    /// the module paths) of leading frames to drop (repeatable, replaces the
    /// defaults; `|` separates patterns in one value and in the variable).
    #[arg(long, env = "TRACERD_ALLOCATOR_FRAMES", value_delimiter = '|')]
    pub allocator_frames: Option<Vec<String>>,
    /// Most allocator frames walked beyond nframe (dropped before nframe counts), 0 to 64.
    #[arg(long, env = "TRACERD_ALLOCATOR_FRAMES_DEPTH")]
    pub allocator_frames_depth: Option<u32>,
    /// Unwind with the files' .eh_frame tables (true) or frame pointers only (false).
    #[arg(long, env = "TRACERD_UNWIND")]
    pub unwind: Option<bool>,
    /// Rows of the kernel's unwind table, all files together (8 bytes each).
    #[arg(long, env = "TRACERD_UNWIND_TABLE_ROWS")]
    pub unwind_table_rows: Option<u32>,
    /// Pages (64 KiB of file offsets) of the unwind tables, all files together.
    #[arg(long, env = "TRACERD_UNWIND_TABLE_PAGES")]
    pub unwind_table_pages: Option<u32>,
    /// Processes whose executable mappings the kernel keeps for the unwinder.
    #[arg(long, env = "TRACERD_UNWIND_PROCESSES")]
    pub unwind_processes: Option<u32>,
    /// Directory for tracerd's state (created if missing).
    #[arg(long, env = "TRACERD_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Seconds an exited process's last state stays queryable.
    #[arg(long, env = "TRACERD_EXITED_RETENTION")]
    pub exited_retention: Option<u64>,
    /// Seconds between automatic snapshots (for compare?since=); 0: none.
    #[arg(long, env = "TRACERD_SNAPSHOT_INTERVAL")]
    pub snapshot_interval: Option<u64>,
    /// Seconds an automatic snapshot is kept.
    #[arg(long, env = "TRACERD_SNAPSHOT_RETENTION")]
    pub snapshot_retention: Option<u64>,
    /// Snapshots stored at most, automatic ones included (full: oldest automatic evicted, else 507).
    #[arg(long, env = "TRACERD_MAX_SNAPSHOTS")]
    pub max_snapshots: Option<u64>,
    /// Bytes of stored snapshots at most (files' sizes; automatic ones: their compact form).
    #[arg(long, env = "TRACERD_MAX_SNAPSHOT_BYTES")]
    pub max_snapshot_bytes: Option<u64>,
    /// Snapshots one unprivileged user stores at most (beyond: 507).
    #[arg(long, env = "TRACERD_MAX_SNAPSHOTS_PER_OWNER")]
    pub max_snapshots_per_owner: Option<u64>,
    /// Bytes of the snapshots one unprivileged user stores at most (beyond: 507).
    #[arg(long, env = "TRACERD_MAX_SNAPSHOT_BYTES_PER_OWNER")]
    pub max_snapshot_bytes_per_owner: Option<u64>,
    /// Capacity of the kernel's live-block map in blocks, all processes together.
    #[arg(long, env = "TRACERD_MAX_LIVE_BLOCKS")]
    pub max_live_blocks: Option<u32>,
    /// Blocks of the kernel's preallocated fast live-block table (7 x a power of two); 0: off.
    #[arg(long, env = "TRACERD_LIVE_TABLE_BLOCKS")]
    pub live_table_blocks: Option<u32>,
    /// Share of the live-block and stack maps one process may hold, in percent (100: no limit, and no reserve of the stack map's last quarter for processes with few stacks).
    #[arg(long, env = "TRACERD_PROCESS_SHARE")]
    pub process_share: Option<u32>,
    /// Capacity of the kernel's stack map in distinct stacks.
    #[arg(long, env = "TRACERD_MAX_STACKS")]
    pub max_stacks: Option<u32>,
    /// Capacity of the kernel's per-process map in processes.
    #[arg(long, env = "TRACERD_MAX_PROCS")]
    pub max_procs: Option<u32>,
    /// Capacity of the kernel's in-flight spill map in calls (threads whose slot is taken).
    #[arg(long, env = "TRACERD_MAX_INFLIGHT")]
    pub max_inflight: Option<u32>,
    /// Slots of the kernel's in-flight array (a power of two; a thread uses slot tid % slots).
    #[arg(long, env = "TRACERD_INFLIGHT_SLOTS")]
    pub inflight_slots: Option<u32>,
    /// Size of the kernel's process-event ring buffer in bytes (a power of two multiple of the page size).
    #[arg(long, env = "TRACERD_EVENTS_RING_BYTES")]
    pub events_ring_bytes: Option<u32>,
    /// Mean sampling interval in bytes (e.g. 524288); 0: exact (every allocation).
    #[arg(long, env = "TRACERD_SAMPLE_INTERVAL")]
    pub sample_interval: Option<u64>,
    /// Trace only this pid (repeatable; the variable takes a `,`-separated list).
    #[arg(long = "scope-pid", env = "TRACERD_SCOPE_PIDS", value_delimiter = ',')]
    pub scope_pids: Option<Vec<u32>>,
    /// Trace only processes running this executable (repeatable, absolute path; symlinks resolved).
    #[arg(long = "scope-exe", env = "TRACERD_SCOPE_EXES", value_delimiter = ':')]
    pub scope_exes: Option<Vec<PathBuf>>,
    /// Trace only processes in this cgroup v2 path or below (repeatable).
    #[arg(
        long = "scope-cgroup",
        env = "TRACERD_SCOPE_CGROUPS",
        value_delimiter = ','
    )]
    pub scope_cgroups: Option<Vec<String>>,
    /// Which processes are traced exactly with no scope: demand (watched, traced when asked or growing) or all.
    #[arg(long, env = "TRACERD_EXACT", value_enum)]
    pub exact: Option<super::ExactMode>,
    /// Seconds between reads of every process's memory (the watch); 0: off.
    #[arg(long, env = "TRACERD_WATCH_INTERVAL")]
    pub watch_interval: Option<u64>,
    /// Trace exactly a process the watch sees growing steadily (true or false).
    #[arg(long, env = "TRACERD_AUTO_EXACT")]
    pub auto_exact: Option<bool>,
    /// Bytes of anonymous memory gained over the window that make the watch trace a process.
    #[arg(long, env = "TRACERD_AUTO_EXACT_GROWTH")]
    pub auto_exact_growth: Option<u64>,
    /// Seconds of the watch's window.
    #[arg(long, env = "TRACERD_AUTO_EXACT_WINDOW")]
    pub auto_exact_window: Option<u64>,
    /// Processes the watch traces exactly at once.
    #[arg(long, env = "TRACERD_AUTO_EXACT_MAX")]
    pub auto_exact_max: Option<u32>,
    /// Seconds a process picked by the watch stays traced before it is let go (unless it still grows).
    #[arg(long, env = "TRACERD_AUTO_EXACT_FOR")]
    pub auto_exact_for: Option<u64>,
    /// glibc to probe (repeatable; the variable takes a `:`-separated list).
    #[arg(long, env = "TRACERD_LIBC", value_delimiter = ':')]
    pub libc: Option<Vec<PathBuf>>,
    /// Find and probe the allocators (musl, static, jemalloc, tcmalloc, mimalloc ...) in the objects traced processes map.
    #[arg(long, env = "TRACERD_DISCOVER_ALLOCATORS")]
    pub discover_allocators: Option<bool>,
    /// Also probe the allocator libraries installed on the host at start (programs linking one are traced from their first allocation).
    #[arg(long, env = "TRACERD_PROBE_INSTALLED_ALLOCATORS")]
    pub probe_installed_allocators: Option<bool>,
    /// Trace traced processes' own anonymous mmap/munmap/mremap as blocks of source mmap.
    #[arg(long, env = "TRACERD_TRACE_MMAP")]
    pub trace_mmap: Option<bool>,
    /// Hold each exec in scope until its allocators are probed (at most 500 ms): programs are traced from their first allocation.
    #[arg(long, env = "TRACERD_HOLD_EXEC")]
    pub hold_exec: Option<bool>,
    /// Members of this group may change tracing, like root and token holders (others get 403).
    #[arg(long, env = "TRACERD_OPERATORS_GROUP")]
    pub operators_group: Option<String>,
    /// Per-process series in /metrics for every caller, not only operators (true or false).
    #[arg(long, env = "TRACERD_METRICS_PUBLIC")]
    pub metrics_public: Option<bool>,
    /// Log filter (tracing's EnvFilter syntax), e.g. info or tracer_daemon=debug.
    #[arg(long, env = "TRACERD_LOG")]
    pub log: Option<String>,
    /// Processes labelled by pid and comm in /metrics (the rest: comm="other").
    #[arg(long, env = "TRACERD_METRICS_TOP_PROCESSES")]
    pub metrics_top_processes: Option<u32>,
    /// Call-site gauges per labelled process in /metrics; 0 turns them off.
    #[arg(long, env = "TRACERD_METRICS_CALL_SITES")]
    pub metrics_call_sites: Option<u32>,
    /// Kernel BPF run-time statistics for /metrics (true or false).
    #[arg(long, env = "TRACERD_BPF_STATS")]
    pub bpf_stats: Option<bool>,
    /// Seconds a request may take before it is answered 503.
    #[arg(long, env = "TRACERD_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "TRACERD_BODY_LIMIT_BYTES")]
    pub body_limit_bytes: Option<u64>,
    /// Expensive requests served at once; more are answered 429.
    #[arg(long, env = "TRACERD_MAX_EXPENSIVE_REQUESTS")]
    pub max_expensive_requests: Option<u32>,
    /// Bytes the work of one request may hold; beyond it the request is answered 413.
    #[arg(long, env = "TRACERD_REQUEST_MEMORY_BUDGET")]
    pub request_memory_budget: Option<u64>,
    /// Seconds the API gets to finish its requests after SIGTERM/SIGINT.
    #[arg(long, env = "TRACERD_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,
    /// Seconds a request body may pause before the request is answered 408.
    #[arg(long, env = "TRACERD_REQUEST_READ_TIMEOUT_SECS")]
    pub request_read_timeout_secs: Option<u64>,
    /// Seconds from a request's first byte to the end of its headers; then the connection is closed.
    #[arg(long, env = "TRACERD_HEADER_TIMEOUT_SECS")]
    pub header_timeout_secs: Option<u64>,
    /// Seconds a connection may sit with no request in progress and no byte moved; then it is closed.
    #[arg(long, env = "TRACERD_IDLE_TIMEOUT_SECS")]
    pub idle_timeout_secs: Option<u64>,
    /// Connections open at once per listener (TCP, Unix socket); more wait to be accepted.
    #[arg(long, env = "TRACERD_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,
}
