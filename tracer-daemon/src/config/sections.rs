//! The sections of [`Config`](super::Config), one per consumer or concern,
//! each with its defaults (the only ones: the TOML file's and the flags'
//! come from here through [`Config::default`](super::Config)). A field's
//! name is its TOML key, in the file's one flat table; its flag is the same
//! name with `-` for `_`.
use std::{net::SocketAddr, path::PathBuf};

use serde::Serialize;

use super::allocator_frames;

/// The HTTP API: where it listens, who may change tracing, and the bounds
/// of requests and connections. Read by `app` (listeners, token,
/// operators, grace period), `http::Limits` and `http::Connections`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ApiSection {
    /// TCP address of the HTTP API. A loopback address (127.0.0.1, ::1)
    /// unless `auth_token_file` is set. Default 127.0.0.1:7466.
    pub listen: SocketAddr,
    /// Also serve the API on this Unix socket (created with mode 0666: any
    /// local user may connect; only operators change anything), if set.
    /// An absolute path; default none.
    pub unix_socket: Option<PathBuf>,
    /// File holding the bearer token that TCP clients must send
    /// (`Authorization: Bearer TOKEN`). Required for a non-loopback
    /// `listen`. An absolute path; default none.
    pub auth_token_file: Option<PathBuf>,
    /// The operators' group: besides root and holders of the token, its
    /// members see every process and may change tracing (start, stop,
    /// clear, the scope, others' snapshots, loaded files). Everyone else
    /// sees only their own processes (those they could ptrace) and the
    /// snapshots they stored, and gets 403 for other changes. The peer's
    /// user comes from the kernel (`SO_PEERCRED`, inet_diag for loopback
    /// TCP). Default `tracer`.
    pub operators_group: String,
    /// Seconds a request may take before it is answered 503, 1 to 3600.
    pub request_timeout_secs: u64,
    /// Largest request body accepted, in bytes (larger: 413), 1024 to 2^32.
    pub body_limit_bytes: u64,
    /// Expensive requests (statistics, compare, snapshots, traces) served at
    /// once, 1 to 1024; more are answered 429 at once. Their kernel-map
    /// reads take turns on one lock, so more than about the number of cores
    /// only queues (a load test with 64 clients: 2 gives p99 0.8 s, 8 gives
    /// p99 24 s).
    pub max_expensive_requests: u32,
    /// Bytes the work of one request may hold at once (what it allocated
    /// and has not freed: the snapshot it builds, the groups it makes, the
    /// answer it holds), 2^20 to 2^40; a request past it stops and is
    /// answered 413 with a hint to ask for less (`limit`/`offset`, filters,
    /// `format=`). With `max_expensive_requests`, it bounds what requests
    /// add to tracerd's memory. Streamed answers (traces) hold a few chunks
    /// of 64 KiB whatever their length.
    pub request_memory_budget: u64,
    /// Seconds the API gets to finish its requests after SIGTERM/SIGINT
    /// before they are cut, 0 to 4 (tracerd stops within 5 s).
    pub shutdown_grace_secs: u64,
    /// Seconds a request body may pause (no byte arriving) before the
    /// request is answered 408, 1 to 3600.
    pub request_read_timeout_secs: u64,
    /// Seconds from a request's first byte to the end of its head (request
    /// line and headers), 1 to 3600; past it the connection is closed.
    pub header_timeout_secs: u64,
    /// Seconds a connection may stay open with no request in progress and
    /// no byte received or sent (a new one before its first request, a
    /// kept-alive one between requests, one whose client does not read its
    /// answer), 1 to 86400; past it the connection is closed.
    pub idle_timeout_secs: u64,
    /// Connections open at once on each listener (TCP, the Unix socket), 1
    /// to 2^20; more wait in the kernel's backlog until one closes. Each is
    /// a file descriptor: the systemd unit's `LimitNOFILE` is above twice
    /// this.
    pub max_connections: u32,
}

impl Default for ApiSection {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7466)),
            unix_socket: None,
            auth_token_file: None,
            operators_group: "tracer".to_string(),
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

/// What a traceback records: its frames, the allocation machinery dropped
/// before them, sampling, anonymous mappings. Read by
/// `capture::CaptureConfig` (the kernel's walk) and, for
/// `allocator_frames`, by `app`, which compiles them into the service's
/// `snapshot::FramePatterns`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CaptureSection {
    /// Frames kept per traceback (tracemalloc's nframe), 1 to 64; default 16.
    pub nframe: u32,
    /// The allocation machinery: glob patterns of the frames that a
    /// traceback's leading run drops (before `nframe` is counted), so that
    /// frame 0 is the first frame outside allocators and their wrappers.
    /// `module:GLOB` matches a frame's module path, any other pattern its
    /// demangled function name; `*` is any run of characters, `?` one,
    /// `\` escapes `*`, `?` and `\`. A query keeps them with
    /// `allocator_frames=keep`. Default: the families of
    /// `config/allocator_frames/defaults.rs`.
    pub allocator_frames: Vec<String>,
    /// Most leading frames of the allocation machinery the kernel walks
    /// beyond `nframe`, so that `nframe` frames remain after they are
    /// dropped, 0 to 64 (default 8): the kernel walks `min(nframe + this,
    /// 96)` frames. Physical frames: an inlined call costs none, so 8 holds
    /// `operator new`, Rust's alloc shims and `RawVec`, CPython's and
    /// glib's layers; each frame walked costs every allocation with a deep
    /// stack.
    pub allocator_frames_depth: u32,
    /// Mean sampling interval in bytes: byte-weighted Poisson sampling as
    /// tcmalloc does it, with unbiased estimates in statistics and compare;
    /// 0 records every allocation (exact, the default), else 64 to 2^30.
    pub sample_interval: u64,
    /// Trace each traced process's own anonymous mappings (`mmap`,
    /// `munmap`, `mremap` outside any allocator call) as blocks of source
    /// `mmap`, with their stacks: three syscall tracepoints. Default on.
    pub trace_mmap: bool,
}

impl Default for CaptureSection {
    fn default() -> Self {
        Self {
            nframe: 16,
            allocator_frames: allocator_frames::defaults(),
            allocator_frames_depth: 8,
            sample_interval: 0,
            trace_mmap: true,
        }
    }
}

/// The unwinder: whole stacks without frame pointers, and the kernel's
/// tables for it (allocated at load). Read by `capture::CaptureConfig`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnwindSection {
    /// Unwind with the tables compiled from each mapped file's `.eh_frame`
    /// (or `.debug_frame`): whole stacks without frame pointers. false:
    /// frame pointers only, as `bpf_get_stack` walks. Default on.
    pub unwind: bool,
    /// Rows of the kernel's unwind table (`UNWIND_ROWS`), all files
    /// together: 8 bytes each, allocated at start (16 MiB by default; a
    /// file needs about 20,000 rows per MiB of text). A file that does not
    /// fit is walked with frame pointers (counted in `/maps` and
    /// `/metrics`). 1024 to 67108864.
    pub unwind_table_rows: u32,
    /// Pages (64 KiB of a file's offsets) of the unwind tables
    /// (`UNWIND_PAGES`), all files together: about 64 bytes each,
    /// allocated at start. 64 to 4194304; default 65536.
    pub unwind_table_pages: u32,
    /// Processes whose executable mappings the kernel keeps for the
    /// unwinder (`PROC_MAPS`): 8 KiB each, allocated only for the processes
    /// traced. A process beyond them is walked with frame pointers. 16 to
    /// 1048576; default 8192.
    pub unwind_processes: u32,
}

impl Default for UnwindSection {
    fn default() -> Self {
        Self {
            unwind: true,
            unwind_table_rows: 1 << 21,
            unwind_table_pages: 1 << 16,
            unwind_processes: 8192,
        }
    }
}

/// Capacities of the kernel's maps, allocated at load, and the share of
/// them one process may hold. Read by `capture::CaptureConfig`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MapsSection {
    /// Capacity of the kernel's live-block map (`LIVE_ALLOCS`) in blocks,
    /// all processes together, 1024 to 2^26; default 4194304.
    pub max_live_blocks: u32,
    /// Blocks of the kernel's preallocated fast live-block table
    /// (`LIVE_KEYS`, `LIVE_VALUES`), rounded up to 7 times a power of two;
    /// 0 turns it off, at most 2^26. 42 bytes each, allocated at start. A
    /// block claims a slot there by one compare-and-swap instead of a hash
    /// insert; blocks beyond it (or in a full bucket of 7) go to
    /// `LIVE_ALLOCS`.
    pub live_table_blocks: u32,
    /// The share of the live-block maps (`max_live_blocks` and
    /// `live_table_blocks` together), and of the stack map
    /// (`max_stacks`), one process may hold, in percent (1..=100; 100: no
    /// limit; default 50): a process past it has its new blocks dropped
    /// (or, past its stacks, recorded with frame 0 only), counted in its
    /// `drops`, so that the others stay complete. Below 100 the last
    /// quarter of the stack map is also a reserve: once three quarters of
    /// it are taken, a process stores a new stack only while it holds
    /// less than a quarter of the room left.
    pub process_share: u32,
    /// Capacity of the kernel's stack map (`STACKS`) in distinct stacks,
    /// 256 to 2^22; default 65536.
    pub max_stacks: u32,
    /// Capacity of the kernel's per-process map (`PROCS`) in processes, 64
    /// to 2^22; default 65536.
    pub max_procs: u32,
    /// Capacity of the kernel's in-flight spill map (`INFLIGHT`) in calls:
    /// allocator calls in progress whose thread's slot in `INFLIGHT_SLOTS`
    /// is taken by another thread. 1 to 4194304; default 65536.
    pub max_inflight: u32,
    /// Slots of the kernel's in-flight array (`INFLIGHT_SLOTS`), one call in
    /// progress each, indexed by thread id modulo their number: a power of
    /// two, 1 to 4194304 (the kernel's largest pid_max: a slot per thread).
    /// 32 bytes each, allocated at start; default 65536.
    pub inflight_slots: u32,
    /// Size of the kernel's process-event ring buffer (`EVENTS`) in bytes: a
    /// power of two multiple of the page size, up to 1 GiB (default 256
    /// KiB). 104-byte events plus an 8-byte header each; events that find
    /// it full are lost (counted), and the blocks of an exited process
    /// whose end was lost are removed by the orphan sweep (every 10 s)
    /// instead.
    pub events_ring_bytes: u32,
}

impl Default for MapsSection {
    fn default() -> Self {
        Self {
            max_live_blocks: 4 * 1024 * 1024,
            live_table_blocks: 7 << 16,
            process_share: 50,
            max_stacks: 65536,
            max_procs: 65536,
            max_inflight: 65536,
            inflight_slots: 65536,
            events_ring_bytes: 1 << 18,
        }
    }
}

/// Which allocators are probed, and when: the glibc files, discovery in
/// the objects processes map, the host's libraries at start, execs held
/// until their allocators are probed. Read by `capture::CaptureConfig`
/// (`libc`) and `app` (the service's discovery, the exec holds).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocatorsSection {
    /// glibc files to probe (absolute paths); empty (the default): every
    /// libc.so.6 the dynamic loader resolves.
    pub libc: Vec<PathBuf>,
    /// Find the allocators of the processes in scope in the objects they
    /// map (`/proc/PID/maps`: their symbols, `.dynsym` and `.symtab`) and
    /// probe each object that defines one: another libc (musl, a
    /// container's glibc), a static binary's, jemalloc, tcmalloc,
    /// mimalloc. Off: only the glibc of `libc` is probed. Default on.
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
    /// Hold each exec of a process in scope (fanotify's
    /// `FAN_OPEN_EXEC_PERM` on every filesystem) until the allocators its
    /// new image runs on are probed and, when scoped, its probes attached,
    /// for 500 ms at most: a program is traced from its first allocation,
    /// the dynamic loader's and its constructors' included. Needs
    /// CAP_SYS_ADMIN; off, a program whose allocator is new to tracerd is
    /// traced from a moment after its start. Default on.
    pub hold_exec: bool,
}

impl Default for AllocatorsSection {
    fn default() -> Self {
        Self {
            libc: Vec::new(),
            discover_allocators: true,
            probe_installed_allocators: false,
            hold_exec: true,
        }
    }
}

/// Which processes are traced (the scope chosen at start) and how long an
/// exited one stays queryable. Read by `lifecycle::Scope`,
/// `capture::CaptureConfig` (system-wide or not) and `app` (the service's
/// retention).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessesSection {
    /// Seconds an exited process's last state stays queryable, 0 to 604800;
    /// default 600.
    pub exited_retention: u64,
    /// Trace only these pids (with `scope_exes` and `scope_cgroups`; all
    /// empty, the default: every process). Probes are registered for those
    /// processes only.
    pub scope_pids: Vec<u32>,
    /// Trace only processes running these executables (absolute paths,
    /// matched with their symlinks resolved).
    pub scope_exes: Vec<PathBuf>,
    /// Trace only processes in these cgroup v2 paths (or below them).
    pub scope_cgroups: Vec<String>,
    /// Which processes are traced exactly (every allocation) when no scope
    /// is chosen: `demand` (the default) watches every process cheaply
    /// and traces one exactly when asked (a query of its pid,
    /// `tracing/start`, or the watch seeing it grow); `all` traces every
    /// process exactly from its first allocation, at the cost
    /// `docs/operations.md` gives.
    pub exact: ExactMode,
    /// Seconds between two reads of every process's resident and anonymous
    /// memory (`/proc/PID/statm`), 0 to 3600; 0 turns the watch off.
    /// Default 5.
    pub watch_interval: u64,
    /// Trace a process exactly, under `exact = "demand"`, when the watch
    /// sees it grow steadily (`auto_exact_growth` bytes of anonymous
    /// memory over `auto_exact_window`, rising in most intervals). Default
    /// true.
    pub auto_exact: bool,
    /// Bytes of anonymous memory a process must gain over
    /// `auto_exact_window` to be traced by the watch, 1 MiB to 1 TiB;
    /// default 64 MiB.
    pub auto_exact_growth: u64,
    /// Seconds of the watch's window, at least 3 intervals, at most 86400;
    /// default 300.
    pub auto_exact_window: u64,
    /// Processes the watch traces exactly at once, 0 to 64 (0: none);
    /// default 4.
    pub auto_exact_max: u32,
    /// Seconds a process picked by the watch stays traced exactly, 10 to
    /// 604800; then it is let go unless it still grows (its traces
    /// cleared, its probes detached). Default 1800.
    pub auto_exact_for: u64,
}

/// `exact`: which processes are traced exactly when no scope is chosen.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum ExactMode {
    /// Every process watched; traced exactly on demand.
    #[default]
    Demand,
    /// Every process traced exactly.
    All,
}

impl ExactMode {
    /// The word the settings and the API use: `demand` or `all`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ExactMode::Demand => "demand",
            ExactMode::All => "all",
        }
    }
}

impl Default for ProcessesSection {
    fn default() -> Self {
        Self {
            exited_retention: 600,
            scope_pids: Vec::new(),
            scope_exes: Vec::new(),
            scope_cgroups: Vec::new(),
            exact: ExactMode::Demand,
            watch_interval: 5,
            auto_exact: true,
            auto_exact_growth: 64 << 20,
            auto_exact_window: 300,
            auto_exact_max: 4,
            auto_exact_for: 1800,
        }
    }
}

impl ProcessesSection {
    /// True when no scope is chosen (`scope_pids`, `scope_exes` and
    /// `scope_cgroups` all empty) and `exact = "all"`: every process is
    /// traced exactly.
    #[must_use]
    pub fn traces_every_process(&self) -> bool {
        self.exact == ExactMode::All
            && self.scope_pids.is_empty()
            && self.scope_exes.is_empty()
            && self.scope_cgroups.is_empty()
    }
}

/// Automatic (triggered) snapshots: how often they are taken and how long
/// they are kept. Read by `service::AutoPolicy`, whose loop is
/// `tasks::automatic_snapshots`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotsSection {
    /// Seconds between automatic snapshots of every traced process (what
    /// `compare?since=` compares against), 0 to 86400; 0 turns them off.
    /// Default 60.
    pub snapshot_interval: u64,
    /// Seconds an automatic snapshot is kept (the longest `since=` that
    /// finds one), 0 to 2592000; default 3600.
    pub snapshot_retention: u64,
}

impl Default for SnapshotsSection {
    fn default() -> Self {
        Self {
            snapshot_interval: 60,
            snapshot_retention: 3600,
        }
    }
}

/// The state directory and the snapshot store's quotas. Read by
/// `store::Quotas` and `app` (the directory, the stop's record).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoreSection {
    /// Directory for tracerd's state (created if missing), an absolute
    /// path; default `/var/lib/tracer`.
    pub state_dir: PathBuf,
    /// Snapshots the store holds at most, of every kind (automatic ones
    /// included), 1 to 10,000,000 (default 10,000). When full, a new
    /// snapshot evicts the oldest unlabelled automatic ones; if that is not
    /// enough, a `POST` is answered 507 naming this setting.
    pub max_snapshots: u64,
    /// Bytes the stored snapshots take at most, together, 1024 to 2^50
    /// (default 1 GiB): a snapshot kept in the state directory counts its
    /// file's size, an automatic one its compact form in memory. Full: as
    /// `max_snapshots`.
    pub max_snapshot_bytes: u64,
    /// Snapshots one unprivileged user (uid) stores at most, 1 to
    /// 10,000,000 (default 100): a `POST` beyond it is answered 507
    /// (nothing of others is evicted for it). The operators' and automatic
    /// snapshots count in the totals only.
    pub max_snapshots_per_owner: u64,
    /// Bytes of the snapshots one unprivileged user stores at most, 1024 to
    /// 2^50 (default 128 MiB), counted as `max_snapshot_bytes` counts them.
    pub max_snapshot_bytes_per_owner: u64,
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/var/lib/tracer"),
            max_snapshots: 10_000,
            max_snapshot_bytes: 1 << 30,
            max_snapshots_per_owner: 100,
            max_snapshot_bytes_per_owner: 128 << 20,
        }
    }
}

/// `/metrics`: who sees what, how much is labelled, the kernel's BPF
/// statistics. Read by `metrics::MetricsOptions` and `app` (which holds
/// `BPF_ENABLE_STATS` on).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricsSection {
    /// Give the per-process series (pid, comm, call sites) to every caller,
    /// not only to operators. Off (the default), others get the host's
    /// totals (every process summed under `pid="other"`) and tracer's own
    /// health.
    pub metrics_public: bool,
    /// Processes labelled by pid and comm, the largest by current bytes,
    /// 1 to 10000 (default 20); the rest are summed under `comm="other"`.
    pub metrics_top_processes: u32,
    /// Call sites (file:line) per labelled process exported as gauges, the
    /// largest by current bytes, 0 to 1000; 0 (the default) turns them
    /// off. Each scrape then takes a snapshot of every labelled process.
    pub metrics_call_sites: u32,
    /// Turn on the kernel's BPF run-time statistics (`BPF_ENABLE_STATS`) for
    /// `tracer_bpf_program_*` metrics; costs two clock reads per probe hit
    /// (about 150 ns per malloc+free pair on a KVM guest), so off by
    /// default.
    pub bpf_stats: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            metrics_public: false,
            metrics_top_processes: 20,
            metrics_call_sites: 0,
            bpf_stats: false,
        }
    }
}

/// tracerd's own log. Read by `main.rs`, which sets up the subscriber.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoggingSection {
    /// Log filter (tracing's EnvFilter syntax), e.g. `info` (the default)
    /// or `tracer_daemon=debug`.
    pub log: String,
}

impl Default for LoggingSection {
    fn default() -> Self {
        Self {
            log: "info".to_string(),
        }
    }
}
