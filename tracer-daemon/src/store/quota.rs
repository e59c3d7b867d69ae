//! The store's quotas ([`Quotas`]): how many snapshots, and how many bytes
//! of them, it holds in total and per owner, and which one a refused
//! snapshot would have exceeded ([`Quota`]).
use serde::Serialize;

use crate::config::Config;

/// The limits of the store (the settings `max_snapshots`,
/// `max_snapshot_bytes`, `max_snapshots_per_owner`,
/// `max_snapshot_bytes_per_owner`). A snapshot's bytes are its file's size
/// when it is kept in the state directory, else the bytes of its compact
/// form in memory (automatic snapshots, see `store::compact`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Quotas {
    /// Snapshots of every kind, automatic ones included.
    pub snapshots: u64,
    /// Bytes of every snapshot together.
    pub bytes: u64,
    /// Snapshots one unprivileged user (uid) stores. The operators'
    /// snapshots and automatic ones count in the totals only.
    pub snapshots_per_owner: u64,
    /// Bytes of the snapshots one unprivileged user stores.
    pub bytes_per_owner: u64,
}

impl From<&Config> for Quotas {
    fn from(config: &Config) -> Self {
        Quotas {
            snapshots: config.store.max_snapshots,
            bytes: config.store.max_snapshot_bytes,
            snapshots_per_owner: config.store.max_snapshots_per_owner,
            bytes_per_owner: config.store.max_snapshot_bytes_per_owner,
        }
    }
}

impl Quotas {
    /// No limit at all (a store without settings: the unit tests').
    pub const UNLIMITED: Quotas = Quotas {
        snapshots: u64::MAX,
        bytes: u64::MAX,
        snapshots_per_owner: u64::MAX,
        bytes_per_owner: u64::MAX,
    };
}

impl Default for Quotas {
    fn default() -> Self {
        Self::UNLIMITED
    }
}

/// One of the quotas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quota {
    /// `max_snapshots`.
    Snapshots,
    /// `max_snapshot_bytes`.
    Bytes,
    /// `max_snapshots_per_owner`.
    SnapshotsPerOwner,
    /// `max_snapshot_bytes_per_owner`.
    BytesPerOwner,
}

impl Quota {
    /// Its setting (TOML key; the flag is `--` and the key with `-` for
    /// `_`, the variable `TRACERD_` and the key in capitals).
    #[must_use]
    pub fn setting(self) -> &'static str {
        match self {
            Quota::Snapshots => "max_snapshots",
            Quota::Bytes => "max_snapshot_bytes",
            Quota::SnapshotsPerOwner => "max_snapshots_per_owner",
            Quota::BytesPerOwner => "max_snapshot_bytes_per_owner",
        }
    }

    /// Its flag, `--max-snapshots`...
    #[must_use]
    pub fn flag(self) -> String {
        format!("--{}", self.setting().replace('_', "-"))
    }

    /// Its environment variable, `TRACERD_MAX_SNAPSHOTS`...
    #[must_use]
    pub fn env(self) -> String {
        format!("TRACERD_{}", self.setting().to_ascii_uppercase())
    }

    /// Whether it counts bytes (else snapshots).
    #[must_use]
    pub fn is_bytes(self) -> bool {
        matches!(self, Quota::Bytes | Quota::BytesPerOwner)
    }

    /// Its value in `quotas`.
    #[must_use]
    pub fn of(self, quotas: &Quotas) -> u64 {
        match self {
            Quota::Snapshots => quotas.snapshots,
            Quota::Bytes => quotas.bytes,
            Quota::SnapshotsPerOwner => quotas.snapshots_per_owner,
            Quota::BytesPerOwner => quotas.bytes_per_owner,
        }
    }
}

/// The message of a snapshot refused by `quota` (see
/// `StoreError::QuotaFull`): what is held that is never evicted, and what
/// the snapshot needs.
pub(super) fn describe(
    quota: Quota,
    limit: u64,
    held: u64,
    need: u64,
    owner: Option<u32>,
) -> String {
    let setting = quota.setting();
    let whose = match owner {
        Some(uid) => format!("the snapshots of uid {uid}"),
        None => "the snapshots that are never evicted automatically (taken, loaded, labelled)"
            .to_string(),
    };
    if quota.is_bytes() {
        format!(
            "snapshot quota reached: {setting} is {limit} bytes, {whose} hold {held} bytes, and this snapshot takes {need} bytes"
        )
    } else {
        format!("snapshot quota reached: {setting} is {limit}, and {whose} number {held}")
    }
}
