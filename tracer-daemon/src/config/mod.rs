//! tracerd's configuration, from four sources in this order of precedence:
//! command-line flags, then `TRACERD_*` environment variables, then the TOML
//! file (`/etc/tracer/tracerd.toml`, or `--config FILE`), then the defaults.
//!
//! [`Config`] is a struct of sections, one per consumer or concern
//! (`sections.rs`), each with its `Default`: the single source of default
//! values. The TOML file, the flags and `tracerd config default` know no
//! sections: one flat table whose keys are the sections' field names,
//! converted to and from [`Config`] in one place (`file.rs`). Every value,
//! whatever its source, goes through [`Config::validate`], section by
//! section, which refuses an invalid one with the range that is valid.
//!
//! Adding a setting: a field (with a doc comment: unit, range, default) in
//! its section and its default in the section's `Default`; one line in
//! `file.rs`'s list (key, type, section; a test checks that every field
//! has its line); an `Option` field of the same
//! name in [`Flags`] with `#[arg(long, env = "TRACERD_NAME")]`; the
//! consumer reads it from its section (in its `From<&Config>`). Flags are
//! merged by name (through serde), so no merge code needs to change; give
//! it a range check in its section's `validate` if not every value is
//! valid, and a commented line in `deploy/tracerd.toml` (a test checks
//! that the file holds exactly the defaults).
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod allocator_frames;
mod file;
mod flags;
mod sections;
mod validate;

pub use allocator_frames::{
    FrameName, FramePattern, MODULE_PREFIX, glob_to_fnmatch, parse_frame_patterns,
};
pub use flags::{Cli, Command, ConfigCommand, Flags};
pub use sections::{
    AllocatorsSection, ApiSection, CaptureSection, ExactMode, LoggingSection, MapsSection,
    MetricsSection, ProcessesSection, SnapshotsSection, StoreSection, UnwindSection,
};

use file::ConfigFile;

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

/// tracerd's settings, after merging every source, in sections: one per
/// consumer or concern. Each consumer takes its part with a `From<&Config>`
/// of its own settings type (`capture::CaptureConfig`, `lifecycle::Scope`,
/// `store::Quotas`, `service::AutoPolicy`, `metrics::MetricsOptions`,
/// `http::Limits`, `http::Connections`) or reads its section. A field's
/// name is its TOML key in the file's one flat table (sections do not show
/// there); its flag is the same name with `-` for `_`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// The HTTP API: listeners, token, operators, request and connection
    /// bounds.
    pub api: ApiSection,
    /// What a traceback records: frames, allocation machinery, sampling,
    /// anonymous mappings.
    pub capture: CaptureSection,
    /// The unwinder and its kernel tables.
    pub unwind: UnwindSection,
    /// Capacities of the kernel's maps and one process's share of them.
    pub maps: MapsSection,
    /// Which allocators are probed, and when.
    pub allocators: AllocatorsSection,
    /// The scope chosen at start and the retention of exited processes.
    pub processes: ProcessesSection,
    /// Automatic (triggered) snapshots.
    pub snapshots: SnapshotsSection,
    /// The state directory and the snapshot store's quotas.
    pub store: StoreSection,
    /// `/metrics`.
    pub metrics: MetricsSection,
    /// tracerd's own log.
    pub logging: LoggingSection,
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
        ConfigFile::deserialize(toml::Value::Table(table))
            .map(Self::from)
            .map_err(|e| ConfigError::Parse {
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
        toml::to_string(&ConfigFile::from(self)).map_err(|e| ConfigError::Parse {
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
