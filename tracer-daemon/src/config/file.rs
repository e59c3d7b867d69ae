//! The one place where the sectioned [`Config`] meets its flat form: the
//! TOML file, `tracerd config default|check` and the flags (merged by key)
//! are one table of `key = value` whose keys are the sections' field names.
//!
//! serde's `flatten` cannot be combined with `deny_unknown_fields`, so the
//! flat form is a struct of its own, [`ConfigFile`], generated with its two
//! conversions from the list below: one line per key, in the file's order
//! (the order `tracerd config default` prints and an unknown key's error
//! lists), naming its type and its section.
use std::{net::SocketAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::Config;

/// Declares [`ConfigFile`] (every key, in order) and its conversions from
/// and to [`Config`] (each key to the field of that name in its section).
macro_rules! flat_file {
    ($($key:ident: $ty:ty => $section:ident,)*) => {
        /// tracerd's settings as the TOML file spells them: one flat table;
        /// each field is documented in its section of [`Config`]. A key not
        /// given takes [`Config::default`]'s value; an unknown key is an
        /// error naming every valid one.
        #[derive(Debug, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub(super) struct ConfigFile {
            $($key: $ty,)*
        }

        impl From<ConfigFile> for Config {
            fn from(file: ConfigFile) -> Self {
                let mut config = Config::default();
                $(config.$section.$key = file.$key;)*
                config
            }
        }

        impl From<&Config> for ConfigFile {
            fn from(config: &Config) -> Self {
                ConfigFile {
                    $($key: config.$section.$key.clone(),)*
                }
            }
        }
    };
}

flat_file! {
    listen: SocketAddr => api,
    unix_socket: Option<PathBuf> => api,
    auth_token_file: Option<PathBuf> => api,
    nframe: u32 => capture,
    allocator_frames: Vec<String> => capture,
    allocator_frames_depth: u32 => capture,
    unwind: bool => unwind,
    unwind_table_rows: u32 => unwind,
    unwind_table_pages: u32 => unwind,
    unwind_processes: u32 => unwind,
    state_dir: PathBuf => store,
    exited_retention: u64 => processes,
    snapshot_interval: u64 => snapshots,
    snapshot_retention: u64 => snapshots,
    max_snapshots: u64 => store,
    max_snapshot_bytes: u64 => store,
    max_snapshots_per_owner: u64 => store,
    max_snapshot_bytes_per_owner: u64 => store,
    max_live_blocks: u32 => maps,
    live_table_blocks: u32 => maps,
    process_share: u32 => maps,
    max_stacks: u32 => maps,
    max_procs: u32 => maps,
    max_inflight: u32 => maps,
    inflight_slots: u32 => maps,
    events_ring_bytes: u32 => maps,
    sample_interval: u64 => capture,
    scope_pids: Vec<u32> => processes,
    scope_exes: Vec<PathBuf> => processes,
    scope_cgroups: Vec<String> => processes,
    exact: super::ExactMode => processes,
    watch_interval: u64 => processes,
    auto_exact: bool => processes,
    auto_exact_growth: u64 => processes,
    auto_exact_window: u64 => processes,
    auto_exact_max: u32 => processes,
    auto_exact_for: u64 => processes,
    libc: Vec<PathBuf> => allocators,
    discover_allocators: bool => allocators,
    probe_installed_allocators: bool => allocators,
    trace_mmap: bool => capture,
    hold_exec: bool => allocators,
    operators_group: String => api,
    metrics_public: bool => metrics,
    log: String => logging,
    metrics_top_processes: u32 => metrics,
    metrics_call_sites: u32 => metrics,
    bpf_stats: bool => metrics,
    request_timeout_secs: u64 => api,
    body_limit_bytes: u64 => api,
    max_expensive_requests: u32 => api,
    request_memory_budget: u64 => api,
    shutdown_grace_secs: u64 => api,
    request_read_timeout_secs: u64 => api,
    header_timeout_secs: u64 => api,
    idle_timeout_secs: u64 => api,
    max_connections: u32 => api,
}

impl Default for ConfigFile {
    /// [`Config::default`]'s values: the sections hold the only defaults.
    fn default() -> Self {
        Self::from(&Config::default())
    }
}
