//! The errors of the store ([`StoreError`]), and how an I/O failure
//! becomes one.
use std::path::{Path, PathBuf};

use crate::sys::fsync::WriteError;

use super::quota::{self, Quota};

/// Errors of the store: file I/O and the rules on labels.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file or directory operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("writing", "renaming", ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// No stored snapshot has this id.
    #[error("no snapshot with id {id}")]
    NotFound {
        /// The id asked for.
        id: u64,
    },
    /// No stored snapshot has this label.
    #[error("no snapshot labelled {label:?}")]
    LabelNotFound {
        /// The label asked for.
        label: String,
    },
    /// The label is already used by another snapshot.
    #[error("label {label:?} is already used by {}", match id {
        Some(id) => format!("snapshot {id}"),
        None => "another snapshot".to_string(),
    })]
    LabelTaken {
        /// The label.
        label: String,
        /// The snapshot that has it; None when the caller may not see it
        /// (`service::access`).
        id: Option<u64>,
    },
    /// Storing the snapshot would exceed a quota, even with every
    /// automatic snapshot it may evict gone; nothing was stored or evicted.
    #[error("{}", quota::describe(*quota, *limit, *held, *need, *owner))]
    QuotaFull {
        /// The quota.
        quota: Quota,
        /// Its value (snapshots, or bytes).
        limit: u64,
        /// What is held that counts against it and is never evicted
        /// automatically (snapshots, or bytes).
        held: u64,
        /// What the snapshot needs (1 snapshot, or its bytes).
        need: u64,
        /// For a per-owner quota, the owner (uid).
        owner: Option<u32>,
    },
    /// The file of a stored snapshot no longer exists: it was removed
    /// behind tracerd's back.
    #[error(
        "the file of snapshot {id}, {}, was removed behind tracerd's back: its traces are gone",
        path.display()
    )]
    FileGone {
        /// The snapshot.
        id: u64,
        /// Its file.
        path: PathBuf,
    },
    /// The file of a stored snapshot is no longer the one tracerd wrote
    /// (or read at start): it was replaced or modified behind its back;
    /// it is not used.
    #[error("the file of snapshot {id}, {}, changed behind tracerd's back: {reason}", path.display())]
    FileChanged {
        /// The snapshot.
        id: u64,
        /// Its file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The label is not a valid one.
    #[error("invalid label {label:?}: {reason}")]
    InvalidLabel {
        /// The label given.
        label: String,
        /// Why.
        reason: &'static str,
    },
}

impl From<WriteError> for StoreError {
    fn from(err: WriteError) -> Self {
        StoreError::Io {
            action: err.action,
            path: err.path,
            source: err.source,
        }
    }
}

/// A write to the state directory that failed, logged (as an error, with
/// the file: a full disk must show in the log, not only in one client's
/// answer) and turned into [`StoreError::Io`].
pub(super) fn failed_write(err: WriteError) -> StoreError {
    tracing::error!(
        target = %err.path.display(),
        action = err.action,
        err = %err.source,
        "cannot write to the state directory: the snapshot is not stored"
    );
    err.into()
}

pub(super) fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}
