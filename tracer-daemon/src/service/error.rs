//! [`ServiceError`]: every way a request to the service can fail. The HTTP
//! layer maps each to a status in one place (`http::error`).
use tracer_model::{DumpError, ModelError, PickleError};

use crate::lifecycle::ImageState;
use crate::snapshot::AllocatorFrames;
use crate::store::StoreError;

/// Why a pid is not traced ([`ServiceError::NotTraced`]), from `/proc`,
/// the scope and the files tracerd probes, when the request was answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotTracedWhy {
    /// No process has this pid.
    #[error("no such process")]
    NoProcess,
    /// The process exited (a zombie its parent has not reaped yet) and
    /// tracerd keeps no image of it.
    #[error("it has exited (its parent has not reaped it yet), and tracerd keeps no image of it")]
    Exited,
    /// The pid is tracerd's.
    #[error("it is tracerd, which never traces itself")]
    Tracerd,
    /// tracerd traces a scope, and the process is outside it.
    #[error("it is outside tracerd's scope (GET /scope shows it, PUT /scope changes it)")]
    OutOfScope,
    /// The process maps none of the objects tracerd probes: none it maps
    /// defines an allocator entry point tracer knows by its symbols, or
    /// its objects are still being examined (within milliseconds of its
    /// exec or `dlopen`).
    #[error(
        "it maps none of the allocators tracerd probes ({probed}): none of its objects defines malloc and free or a jemalloc, tcmalloc or mimalloc entry point in its symbols (a stripped static binary, Go's own heap), or it started a moment ago and its objects are still being examined"
    )]
    NoProbedAllocator {
        /// The probed files, `, `-separated.
        probed: String,
    },
    /// It maps a probed allocator and has not called it since tracerd
    /// started (or since its last exec).
    #[error("no allocation seen from it since tracerd started")]
    NoAllocationSeen,
}

/// Errors of the service's operations.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No allocation of this pid was seen since tracerd started, and no
    /// ended image of it is retained; `why` says what tracerd found of it.
    #[error("pid {pid} is not traced: {why}")]
    NotTraced {
        /// The pid asked for.
        pid: u32,
        /// Why, as far as `/proc` and the scope tell.
        why: NotTracedWhy,
    },
    /// No stored snapshot has this id.
    #[error("no snapshot with id {id}")]
    SnapshotNotFound {
        /// The id asked for.
        id: u64,
    },
    /// From the store (labels, files).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// From the model (cumulative with traceback).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An uploaded tracer file was refused.
    #[error("{0}")]
    Dump(#[from] DumpError),
    /// An uploaded tracemalloc pickle was refused.
    #[error("{0}")]
    Pickle(#[from] PickleError),
    /// `take_snapshot()` while not tracing (tracemalloc raises
    /// RuntimeError).
    #[error("{}", match pid { Some(pid) => format!("tracing is stopped for pid {pid}: no snapshot can be taken"), None => "tracing is stopped: no snapshot can be taken".to_string() })]
    TracingStopped {
        /// The process, or None system-wide.
        pid: Option<u32>,
    },
    /// The operation needs a live process and this one ended.
    #[error("pid {pid} has {state}: its blocks are gone")]
    Ended {
        /// The process.
        pid: u32,
        /// How it ended.
        state: ImageState,
    },
    /// `start(nframe)` with nframe outside 1..=tracerd's nframe.
    #[error("the number of frames must be in range [1; {max}], got {nframe}")]
    BadNframe {
        /// Given.
        nframe: u64,
        /// tracerd's nframe.
        max: u32,
    },
    /// `get_object_traceback()`: no traced block starts at this address.
    #[error("no traced block of pid {pid} starts at {address:#x}")]
    NoBlock {
        /// The process.
        pid: u32,
        /// The address asked for.
        address: u64,
    },
    /// A stored snapshot used where one of another scope is needed.
    #[error("snapshot {id} is not of pid {pid}'s current image ({reason})")]
    WrongScope {
        /// The snapshot.
        id: u64,
        /// The process asked about.
        pid: u32,
        /// What it is of.
        reason: String,
    },
    /// A compare of two sides of which one dropped the allocation
    /// machinery's leading frames and the other kept them.
    #[error(
        "the base was taken with allocator_frames={base} and the new side with allocator_frames={new}: their tracebacks do not compare"
    )]
    AllocatorFramesDiffer {
        /// How the base was taken.
        base: AllocatorFrames,
        /// How the new side was taken.
        new: AllocatorFrames,
    },
    /// tracerd is stopping (SIGTERM or SIGINT, the API's grace period
    /// over): what the request read may be partial, and is not shown.
    #[error("tracerd is stopping: the request was cut")]
    Stopping,
    /// The request's work was stopped by the interrupt check installed on
    /// its thread (nobody waits for it, or it went past its memory
    /// budget): what it read is partial, and is not shown.
    #[error("{0}")]
    Interrupted(#[from] tracer_model::interrupt::Interrupted),
    /// A scope could not be applied (invalid, or the system-wide probes
    /// could not be attached again).
    #[error("{reason}")]
    Scope {
        /// What went wrong.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_tracemalloc_says() {
        assert_eq!(
            ServiceError::BadNframe { nframe: 0, max: 16 }.to_string(),
            "the number of frames must be in range [1; 16], got 0"
        );
        assert_eq!(
            ServiceError::TracingStopped { pid: Some(7) }.to_string(),
            "tracing is stopped for pid 7: no snapshot can be taken"
        );
    }
}
