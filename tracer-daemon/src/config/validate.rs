//! Validation: every value, whatever its source, is checked here, section
//! by section, and an invalid one is refused with the range or form that is
//! valid.
use std::path::Path;

use super::{
    AllocatorsSection, ApiSection, CaptureSection, Config, ConfigError, LoggingSection,
    MapsSection, MetricsSection, ProcessesSection, SnapshotsSection, StoreSection, UnwindSection,
    parse_frame_patterns,
};
use crate::sys::procfs::page_size;

impl Config {
    /// Refuses any value outside its valid range, naming the range: each
    /// section in turn, the first bad value found.
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] or [`ConfigError::Invalid`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.capture.validate()?;
        self.unwind.validate()?;
        self.maps.validate()?;
        self.processes.validate()?;
        self.snapshots.validate()?;
        self.store.validate()?;
        self.metrics.validate()?;
        self.api.validate()?;
        self.allocators.validate()?;
        self.logging.validate()?;
        Ok(())
    }
}

impl CaptureSection {
    /// Frames, the allocation machinery's patterns and depth, sampling.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range("nframe", self.nframe.into(), 1, 64, "1..=64")?;
        parse_frame_patterns(&self.allocator_frames)?;
        range(
            "allocator_frames_depth",
            self.allocator_frames_depth.into(),
            0,
            64,
            "0..=64 (frames)",
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
        Ok(())
    }
}

impl UnwindSection {
    /// The unwinder's tables.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range(
            "unwind_table_rows",
            self.unwind_table_rows.into(),
            1024,
            1 << 26,
            "1024..=67108864 (rows of 8 bytes)",
        )?;
        range(
            "unwind_table_pages",
            self.unwind_table_pages.into(),
            64,
            1 << 22,
            "64..=4194304",
        )?;
        range(
            "unwind_processes",
            self.unwind_processes.into(),
            16,
            1 << 20,
            "16..=1048576",
        )?;
        Ok(())
    }
}

impl MapsSection {
    /// The kernel maps' capacities, one process's share, the events ring.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
            "process_share",
            self.process_share.into(),
            1,
            100,
            "1..=100 (percent; 100: no limit)",
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
        Ok(())
    }
}

impl ProcessesSection {
    /// The retention of exited processes.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range(
            "exited_retention",
            self.exited_retention,
            0,
            7 * 86400,
            "0..=604800 (seconds)",
        )?;
        range(
            "watch_interval",
            self.watch_interval,
            0,
            3600,
            "0..=3600 (seconds; 0: off)",
        )?;
        range(
            "auto_exact_growth",
            self.auto_exact_growth,
            1 << 20,
            1 << 40,
            "1048576..=1099511627776 (bytes)",
        )?;
        let least = (3 * self.watch_interval).max(1);
        range(
            "auto_exact_window",
            self.auto_exact_window,
            least,
            86_400,
            format!("{least}..=86400 (seconds: at least 3 watch intervals)"),
        )?;
        range(
            "auto_exact_max",
            self.auto_exact_max.into(),
            0,
            64,
            "0..=64 (processes)",
        )?;
        range(
            "auto_exact_for",
            self.auto_exact_for,
            10,
            7 * 86_400,
            "10..=604800 (seconds)",
        )?;
        Ok(())
    }
}

impl SnapshotsSection {
    /// The interval and retention of automatic snapshots.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range(
            "snapshot_interval",
            self.snapshot_interval,
            0,
            86_400,
            "0..=86400 (seconds; 0: off)",
        )?;
        range(
            "snapshot_retention",
            self.snapshot_retention,
            0,
            30 * 86_400,
            "0..=2592000 (seconds)",
        )?;
        Ok(())
    }
}

impl StoreSection {
    /// The state directory (absolute) and the store's quotas.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        absolute("state_dir", &self.state_dir)?;
        for (field, value) in [
            ("max_snapshots", self.max_snapshots),
            ("max_snapshots_per_owner", self.max_snapshots_per_owner),
        ] {
            range(field, value, 1, 10_000_000, "1..=10000000 (snapshots)")?;
        }
        for (field, value) in [
            ("max_snapshot_bytes", self.max_snapshot_bytes),
            (
                "max_snapshot_bytes_per_owner",
                self.max_snapshot_bytes_per_owner,
            ),
        ] {
            range(
                field,
                value,
                1024,
                1 << 50,
                "1024..=1125899906842624 (bytes)",
            )?;
        }
        Ok(())
    }
}

impl MetricsSection {
    /// How many processes and call sites are shown.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }
}

impl ApiSection {
    /// Request and connection bounds and timeouts, a listen address that
    /// is not loopback only with a token, and absolute paths.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
            "request_memory_budget",
            self.request_memory_budget,
            1 << 20,
            1 << 40,
            "1048576..=1099511627776 (bytes)",
        )?;
        range(
            "shutdown_grace_secs",
            self.shutdown_grace_secs,
            0,
            4,
            "0..=4 (stop within 5 s)",
        )?;
        range(
            "request_read_timeout_secs",
            self.request_read_timeout_secs,
            1,
            3600,
            "1..=3600",
        )?;
        range(
            "header_timeout_secs",
            self.header_timeout_secs,
            1,
            3600,
            "1..=3600",
        )?;
        range(
            "idle_timeout_secs",
            self.idle_timeout_secs,
            1,
            86_400,
            "1..=86400",
        )?;
        range(
            "max_connections",
            self.max_connections.into(),
            1,
            1 << 20,
            "1..=1048576 (per listener; each is a file descriptor)",
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
        if let Some(path) = &self.unix_socket {
            absolute("unix_socket", path)?;
        }
        if let Some(path) = &self.auth_token_file {
            absolute("auth_token_file", path)?;
        }
        Ok(())
    }
}

impl AllocatorsSection {
    /// The glibc files' paths (absolute).
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for path in &self.libc {
            absolute("libc", path)?;
        }
        Ok(())
    }
}

impl LoggingSection {
    /// The log filter.
    ///
    /// # Errors
    /// As [`Config::validate`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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

fn range(
    field: &'static str,
    value: u64,
    low: u64,
    high: u64,
    valid: impl Into<std::borrow::Cow<'static, str>>,
) -> Result<(), ConfigError> {
    let valid = valid.into();
    if (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            value: value.to_string(),
            valid,
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
