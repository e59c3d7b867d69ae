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

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

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
/// keys; flags are the same names with `-` for `_`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// TCP address of the HTTP API. A loopback address (127.0.0.1, ::1)
    /// unless `auth_token_file` is set.
    pub listen: SocketAddr,
    /// Also serve the API on this Unix socket (created with mode 0660), if set.
    pub unix_socket: Option<PathBuf>,
    /// File holding the bearer token that TCP clients must send
    /// (`Authorization: Bearer TOKEN`). Required for a non-loopback `listen`.
    pub auth_token_file: Option<PathBuf>,
    /// Frames kept per traceback (tracemalloc's nframe), 1 to 64.
    pub nframe: u32,
    /// Directory for tracerd's state (created if missing).
    pub state_dir: PathBuf,
    /// Seconds an exited process's last state stays queryable.
    pub exited_retention: u64,
    /// Seconds between automatic snapshots of every traced process (what
    /// `compare?since=` compares against); 0 turns them off.
    pub snapshot_interval: u64,
    /// Seconds an automatic snapshot is kept (the longest `since=` that
    /// finds one).
    pub snapshot_retention: u64,
    /// Capacity of the kernel's live-block map (`LIVE_ALLOCS`) in blocks,
    /// all processes together.
    pub max_live_blocks: u32,
    /// Blocks of the kernel's preallocated fast live-block table
    /// (`LIVE_KEYS`, `LIVE_VALUES`), rounded up to 7 times a power of two;
    /// 0 turns it off. 42 bytes each, allocated at start. A block claims a
    /// slot there by one compare-and-swap instead of a hash insert; blocks
    /// beyond it (or in a full bucket of 7) go to `LIVE_ALLOCS`.
    pub live_table_blocks: u32,
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
    /// Trace only processes running these executables (absolute paths).
    pub scope_exes: Vec<PathBuf>,
    /// Trace only processes in these cgroup v2 paths (or below them).
    pub scope_cgroups: Vec<String>,
    /// glibc files to probe; empty: every libc.so.6 the dynamic loader resolves.
    pub libc: Vec<PathBuf>,
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
    /// Seconds the API gets to finish its requests after SIGTERM/SIGINT
    /// before they are cut.
    pub shutdown_grace_secs: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7466)),
            unix_socket: None,
            auth_token_file: None,
            nframe: 16,
            state_dir: PathBuf::from("/var/lib/tracer"),
            exited_retention: 600,
            snapshot_interval: 60,
            snapshot_retention: 3600,
            max_live_blocks: 4 * 1024 * 1024,
            live_table_blocks: 7 << 16,
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
            log: "info".to_string(),
            metrics_top_processes: 20,
            metrics_call_sites: 0,
            bpf_stats: false,
            request_timeout_secs: 30,
            body_limit_bytes: 64 * 1024 * 1024,
            max_expensive_requests: 2,
            shutdown_grace_secs: 3,
        }
    }
}

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
    /// Also serve the API on this Unix socket path (mode 0660).
    #[arg(long, env = "TRACERD_UNIX_SOCKET")]
    pub unix_socket: Option<PathBuf>,
    /// File with the bearer token TCP clients must send.
    #[arg(long, env = "TRACERD_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Frames kept per traceback (tracemalloc's nframe), 1 to 64.
    #[arg(long, env = "TRACERD_NFRAME")]
    pub nframe: Option<u32>,
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
    /// Capacity of the kernel's live-block map in blocks, all processes together.
    #[arg(long, env = "TRACERD_MAX_LIVE_BLOCKS")]
    pub max_live_blocks: Option<u32>,
    /// Blocks of the kernel's preallocated fast live-block table (7 x a power of two); 0: off.
    #[arg(long, env = "TRACERD_LIVE_TABLE_BLOCKS")]
    pub live_table_blocks: Option<u32>,
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
    /// Trace only processes running this executable (repeatable, absolute path).
    #[arg(long = "scope-exe", env = "TRACERD_SCOPE_EXES", value_delimiter = ':')]
    pub scope_exes: Option<Vec<PathBuf>>,
    /// Trace only processes in this cgroup v2 path or below (repeatable).
    #[arg(
        long = "scope-cgroup",
        env = "TRACERD_SCOPE_CGROUPS",
        value_delimiter = ','
    )]
    pub scope_cgroups: Option<Vec<String>>,
    /// glibc to probe (repeatable; the variable takes a `:`-separated list).
    #[arg(long, env = "TRACERD_LIBC", value_delimiter = ':')]
    pub libc: Option<Vec<PathBuf>>,
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
    /// Seconds the API gets to finish its requests after SIGTERM/SIGINT.
    #[arg(long, env = "TRACERD_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,
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

    /// Refuses any value outside its valid range, naming the range.
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] or [`ConfigError::Invalid`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        range("nframe", self.nframe.into(), 1, 64, "1..=64")?;
        range(
            "max_live_blocks",
            self.max_live_blocks.into(),
            1024,
            1 << 26,
            "1024..=67108864",
        )?;
        range(
            "live_table_blocks",
            self.live_table_blocks.into(),
            0,
            1 << 26,
            "0..=67108864 (blocks; 0: off)",
        )?;
        range(
            "max_stacks",
            self.max_stacks.into(),
            256,
            1 << 22,
            "256..=4194304",
        )?;
        range(
            "max_procs",
            self.max_procs.into(),
            64,
            1 << 22,
            "64..=4194304",
        )?;
        range(
            "max_inflight",
            self.max_inflight.into(),
            1,
            1 << 22,
            "1..=4194304 (calls)",
        )?;
        power_of_two(
            "inflight_slots",
            self.inflight_slots.into(),
            1,
            1 << 22,
            "a power of two, 1..=4194304".into(),
        )?;
        let page = page_size();
        power_of_two(
            "events_ring_bytes",
            self.events_ring_bytes.into(),
            page,
            1 << 30,
            format!(
                "a power of two multiple of the page size ({page} bytes), {page}..=1073741824 (bytes)"
            )
            .into(),
        )?;
        range(
            "exited_retention",
            self.exited_retention,
            0,
            7 * 86400,
            "0..=604800 (seconds)",
        )?;
        range(
            "snapshot_interval",
            self.snapshot_interval,
            0,
            86_400,
            "0..=86400 (seconds; 0: off)",
        )?;
        if self.sample_interval != 0 {
            range(
                "sample_interval",
                self.sample_interval,
                64,
                1 << 30,
                "0 (exact) or 64..=1073741824 (bytes)",
            )?;
        }
        range(
            "snapshot_retention",
            self.snapshot_retention,
            0,
            30 * 86_400,
            "0..=2592000 (seconds)",
        )?;
        range(
            "metrics_top_processes",
            self.metrics_top_processes.into(),
            1,
            10_000,
            "1..=10000",
        )?;
        range(
            "metrics_call_sites",
            self.metrics_call_sites.into(),
            0,
            1000,
            "0..=1000",
        )?;
        range(
            "request_timeout_secs",
            self.request_timeout_secs,
            1,
            3600,
            "1..=3600",
        )?;
        range(
            "body_limit_bytes",
            self.body_limit_bytes,
            1024,
            1 << 32,
            "1024..=4294967296 (bytes)",
        )?;
        range(
            "max_expensive_requests",
            self.max_expensive_requests.into(),
            1,
            1024,
            "1..=1024",
        )?;
        range(
            "shutdown_grace_secs",
            self.shutdown_grace_secs,
            0,
            4,
            "0..=4 (stop within 5 s)",
        )?;
        if !self.listen.ip().is_loopback() && self.auth_token_file.is_none() {
            return Err(ConfigError::Invalid {
                field: "listen",
                value: self.listen.to_string(),
                reason: "a non-loopback address needs auth_token_file (--auth-token-file); \
                         without one, listen on 127.0.0.1 or ::1"
                    .into(),
            });
        }
        absolute("state_dir", &self.state_dir)?;
        if let Some(path) = &self.unix_socket {
            absolute("unix_socket", path)?;
        }
        if let Some(path) = &self.auth_token_file {
            absolute("auth_token_file", path)?;
        }
        for path in &self.libc {
            absolute("libc", path)?;
        }
        if let Err(err) = tracing_subscriber::EnvFilter::try_new(&self.log) {
            return Err(ConfigError::Invalid {
                field: "log",
                value: self.log.clone(),
                reason: format!("{err}; e.g. info, debug or tracer_daemon=debug"),
            });
        }
        Ok(())
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

fn range(
    field: &'static str,
    value: u64,
    low: u64,
    high: u64,
    valid: &'static str,
) -> Result<(), ConfigError> {
    if (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            value: value.to_string(),
            valid: valid.into(),
        })
    }
}

/// As [`range`], for a value that must also be a power of two (`low` is one).
fn power_of_two(
    field: &'static str,
    value: u64,
    low: u64,
    high: u64,
    valid: std::borrow::Cow<'static, str>,
) -> Result<(), ConfigError> {
    if (low..=high).contains(&value) && value.is_power_of_two() {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            value: value.to_string(),
            valid,
        })
    }
}

/// This host's page size in bytes (4096 if the kernel does not say).
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// A path setting must be absolute, free of `..` and NUL: the daemon runs
/// with its working directory anywhere, and a path must mean one place.
fn absolute(field: &'static str, path: &Path) -> Result<(), ConfigError> {
    let text = path.to_string_lossy();
    let bad = if !path.is_absolute() {
        Some("must be an absolute path")
    } else if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        Some("must not contain ..")
    } else if text.contains('\0') || text.len() > 4096 {
        Some("must be at most 4096 bytes, without NUL")
    } else {
        None
    };
    match bad {
        Some(reason) => Err(ConfigError::Invalid {
            field,
            value: text.into_owned(),
            reason: reason.into(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut argv = vec!["tracerd"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("must succeed").flags
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = Config::default();
        assert_eq!(config.listen.to_string(), "127.0.0.1:7466");
        assert_eq!(config.nframe, 16);
        assert_eq!(config.state_dir, PathBuf::from("/var/lib/tracer"));
        assert_eq!(config.metrics_top_processes, 20);
        assert_eq!(config.metrics_call_sites, 0);
        config.validate().expect("must succeed");
    }

    #[test]
    fn the_shipped_config_file_is_the_defaults() {
        let text = include_str!("../../deploy/tracerd.toml");
        let config = Config::from_toml_str(text, "deploy/tracerd.toml").expect("must succeed");
        assert_eq!(config, Config::default());
    }

    #[test]
    fn default_toml_round_trips() {
        let text = Config::default().to_toml().expect("must succeed");
        assert_eq!(
            Config::from_toml_str(&text, "default").expect("must succeed"),
            Config::default()
        );
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let dir = std::env::temp_dir().join(format!("tracer-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("must succeed");
        let file = dir.join("tracerd.toml");
        std::fs::write(&file, "nframe = 8\nmax_stacks = 1024\n").expect("must succeed");
        let path = file.to_str().expect("must succeed");
        let config =
            Config::load(&flags(&["--config", path, "--nframe", "20"])).expect("must succeed");
        assert_eq!(config.nframe, 20);
        assert_eq!(config.max_stacks, 1024);
        assert_eq!(config.max_procs, 65536);
        let config = Config::load(&flags(&["--config", path])).expect("must succeed");
        assert_eq!(config.nframe, 8);
        std::fs::remove_dir_all(&dir).expect("must succeed");
    }

    #[test]
    fn out_of_range_values_are_refused_with_the_range() {
        let err = Config::load(&flags(&["--nframe", "65"])).expect_err("must fail");
        assert_eq!(
            err.to_string(),
            "nframe = 65 is out of range; valid: 1..=64"
        );
        let err = Config::from_toml_str("max_live_blocks = 10", "t").expect_err("must fail");
        assert_eq!(
            err.to_string(),
            "max_live_blocks = 10 is out of range; valid: 1024..=67108864"
        );
        let err = Config::load(&flags(&["--listen", "0.0.0.0:7466"])).expect_err("must fail");
        assert!(err.to_string().contains("needs auth_token_file"), "{err}");
        let err = Config::load(&flags(&["--state-dir", "var/lib"])).expect_err("must fail");
        assert_eq!(
            err.to_string(),
            "state_dir = \"var/lib\" is invalid: must be an absolute path"
        );
    }

    #[test]
    fn in_flight_and_event_ring_sizes_outside_their_range_are_refused_with_it() {
        let page = page_size();
        let ring = format!(
            "a power of two multiple of the page size ({page} bytes), {page}..=1073741824 (bytes)"
        );
        let page_half = (page / 2).to_string();
        let not_power = (page * 3).to_string();
        let cases: [(&[&str], String); 8] = [
            (
                &["--max-inflight", "0"],
                "max_inflight = 0 is out of range; valid: 1..=4194304 (calls)".into(),
            ),
            (
                &["--max-inflight", "4194305"],
                "max_inflight = 4194305 is out of range; valid: 1..=4194304 (calls)".into(),
            ),
            (
                &["--inflight-slots", "0"],
                "inflight_slots = 0 is out of range; valid: a power of two, 1..=4194304".into(),
            ),
            (
                &["--inflight-slots", "3"],
                "inflight_slots = 3 is out of range; valid: a power of two, 1..=4194304".into(),
            ),
            (
                &["--inflight-slots", "8388608"],
                "inflight_slots = 8388608 is out of range; valid: a power of two, 1..=4194304"
                    .into(),
            ),
            (
                &["--events-ring-bytes", &page_half],
                format!("events_ring_bytes = {page_half} is out of range; valid: {ring}"),
            ),
            (
                &["--events-ring-bytes", &not_power],
                format!("events_ring_bytes = {not_power} is out of range; valid: {ring}"),
            ),
            (
                &["--events-ring-bytes", "2147483648"],
                format!("events_ring_bytes = 2147483648 is out of range; valid: {ring}"),
            ),
        ];
        for (args, message) in cases {
            let err = Config::load(&flags(args)).expect_err("must fail");
            assert_eq!(err.to_string(), message, "{args:?}");
        }
        let err = Config::from_toml_str("inflight_slots = 6", "t").expect_err("must fail");
        assert_eq!(
            err.to_string(),
            "inflight_slots = 6 is out of range; valid: a power of two, 1..=4194304"
        );
        // The edges are valid.
        let page = page.to_string();
        for args in [
            [
                "--max-inflight",
                "1",
                "--inflight-slots",
                "1",
                "--events-ring-bytes",
                &page,
            ],
            [
                "--max-inflight",
                "4194304",
                "--inflight-slots",
                "4194304",
                "--events-ring-bytes",
                "1073741824",
            ],
        ] {
            let config = Config::load(&flags(&args)).expect("must succeed");
            assert_eq!(config.max_inflight.to_string(), args[1]);
            assert_eq!(config.inflight_slots.to_string(), args[3]);
            assert_eq!(config.events_ring_bytes.to_string(), args[5]);
        }
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_refused() {
        let err = Config::from_toml_str("nframes = 8", "f.toml")
            .expect_err("must fail")
            .to_string();
        assert!(
            err.starts_with("f.toml: ") && err.contains("unknown field `nframes`"),
            "{err}"
        );
        let err = Config::from_toml_str("nframe = \"8\"", "f.toml")
            .expect_err("must fail")
            .to_string();
        assert!(err.contains("invalid type"), "{err}");
    }

    #[test]
    fn a_missing_explicit_file_is_an_error() {
        let err = Config::load(&flags(&["--config", "/nonexistent/tracerd.toml"]))
            .expect_err("must fail");
        assert!(
            err.to_string()
                .starts_with("reading /nonexistent/tracerd.toml"),
            "{err}"
        );
    }

    #[test]
    fn libc_flag_is_repeatable() {
        let config = Config::load(&flags(&["--libc", "/lib/a.so.6", "--libc", "/lib/b.so.6"]))
            .expect("must succeed");
        assert_eq!(
            config.libc,
            vec![PathBuf::from("/lib/a.so.6"), PathBuf::from("/lib/b.so.6")]
        );
    }
}
