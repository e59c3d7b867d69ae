//! [`ApiError`]: an error response, and the one place where every error of
//! the service, the store and the model becomes an HTTP status with a hint
//! naming what is valid. Bodies are JSON `{"error": ..., "hint": ...}`: 400
//! for a bad parameter or file, 404 for an unknown pid, snapshot, label,
//! address or route, 409 for a state conflict (tracing stopped, a process
//! that ended, a snapshot of another target, a label in use).
use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;
use tracer_model::ModelError;

use crate::service::ServiceError;
use crate::store::StoreError;

/// An error response: status, message, and a hint naming what is valid.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What is wrong.
    pub error: String,
    /// What would be right.
    pub hint: String,
}

impl ApiError {
    /// A 400 for a bad parameter.
    pub fn bad(error: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error, hint)
    }

    /// An error with any status.
    pub fn new(status: StatusCode, error: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            hint: hint.into(),
        }
    }

    /// A 500: something inside tracerd failed (never bad input).
    pub fn internal(error: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal error: {error}"),
            "see tracerd's log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": self.error, "hint": self.hint})),
        )
            .into_response()
    }
}

impl From<ModelError> for ApiError {
    fn from(err: ModelError) -> Self {
        let hint = match &err {
            ModelError::CumulativeTraceback => {
                "cumulative=true works with group_by=filename, lineno, function or module"
            }
            ModelError::UnknownGroupBy { .. } => {
                "group_by is one of: filename, lineno, traceback, function, module"
            }
        };
        Self::bad(err.to_string(), hint)
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        let (status, hint) = match &err {
            StoreError::NotFound { .. } | StoreError::LabelNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "GET /snapshots lists the stored snapshots and their labels",
            ),
            StoreError::LabelTaken { .. } => (
                StatusCode::CONFLICT,
                "choose another label, or remove it from the other snapshot with PATCH /snapshots/{id}?label=",
            ),
            StoreError::InvalidLabel { .. } => (
                StatusCode::BAD_REQUEST,
                "a label is 1 to 64 of A-Z a-z 0-9 . _ : - and not all digits",
            ),
            StoreError::Io { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "tracerd could not write its state directory; see its log and the disk",
            ),
        };
        Self::new(status, err.to_string(), hint)
    }
}

impl From<ServiceError> for ApiError {
    fn from(err: ServiceError) -> Self {
        let (status, hint) = match &err {
            ServiceError::Store(_) | ServiceError::Model(_) => {
                return match err {
                    ServiceError::Store(e) => e.into(),
                    ServiceError::Model(e) => e.into(),
                    other => Self::internal(other),
                };
            }
            ServiceError::NotTraced { .. } => (
                StatusCode::NOT_FOUND,
                "GET /processes lists the traced pids".to_string(),
            ),
            ServiceError::SnapshotNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "GET /snapshots lists the stored snapshots".to_string(),
            ),
            ServiceError::Dump(_) => (
                StatusCode::BAD_REQUEST,
                "the body must be a file from GET /snapshots/{id}/dump; a file from Python's Snapshot.dump() needs format=tracemalloc"
                    .to_string(),
            ),
            ServiceError::Pickle(_) => (
                StatusCode::BAD_REQUEST,
                "with format=tracemalloc the body must be a file written by Python's tracemalloc Snapshot.dump()"
                    .to_string(),
            ),
            ServiceError::TracingStopped { pid: Some(pid) } => {
                (StatusCode::CONFLICT, format!("start it with POST /pid/{pid}/tracing/start"))
            }
            ServiceError::TracingStopped { pid: None } => {
                (StatusCode::CONFLICT, "start it with POST /tracing/start".to_string())
            }
            ServiceError::Ended { .. } => (
                StatusCode::CONFLICT,
                "its last state stays readable with GET /pid/{pid}/statistics until it expires".to_string(),
            ),
            ServiceError::BadNframe { max, .. } => {
                (StatusCode::BAD_REQUEST, format!("nframe is 1 to {max} (tracerd's --nframe)"))
            }
            ServiceError::NoBlock { pid, .. } => (
                StatusCode::NOT_FOUND,
                format!("GET /pid/{pid}/traces lists the live blocks; the address is where a block starts"),
            ),
            ServiceError::WrongScope { .. } => (
                StatusCode::CONFLICT,
                "any two stored snapshots compare with GET /snapshots/{id}/compare?base={id}".to_string(),
            ),
            ServiceError::Scope { .. } => (StatusCode::CONFLICT, "see tracerd's log".to_string()),
            ServiceError::Stopping => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ask again once tracerd is back (systemctl status tracerd)".to_string(),
            ),
            ServiceError::AllocatorFramesDiffer { base, .. } => (
                StatusCode::CONFLICT,
                format!(
                    "compare snapshots taken alike (GET /snapshots shows each one's allocator_frames): give base= one taken as the new side was, or compare now with allocator_frames={base}"
                ),
            ),
        };
        Self::new(status, err.to_string(), hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_status() {
        let cases: Vec<(ApiError, u16)> = vec![
            (
                ServiceError::NotTraced {
                    pid: 1,
                    why: crate::service::NotTracedWhy::NoAllocationSeen,
                }
                .into(),
                404,
            ),
            (ServiceError::SnapshotNotFound { id: 1 }.into(), 404),
            (ServiceError::TracingStopped { pid: None }.into(), 409),
            (ServiceError::NoBlock { pid: 1, address: 2 }.into(), 404),
            (ServiceError::BadNframe { nframe: 0, max: 16 }.into(), 400),
            (
                ServiceError::Ended {
                    pid: 1,
                    state: crate::lifecycle::ImageState::Exited,
                }
                .into(),
                409,
            ),
            (ServiceError::Scope { reason: "x".into() }.into(), 409),
            (ServiceError::Stopping.into(), 503),
            (
                ServiceError::AllocatorFramesDiffer {
                    base: crate::snapshot::AllocatorFrames::Drop,
                    new: crate::snapshot::AllocatorFrames::Keep,
                }
                .into(),
                409,
            ),
            (
                StoreError::LabelTaken {
                    label: "a".into(),
                    id: Some(1),
                }
                .into(),
                409,
            ),
            (StoreError::LabelNotFound { label: "a".into() }.into(), 404),
            (ModelError::CumulativeTraceback.into(), 400),
            (
                ServiceError::Model(ModelError::CumulativeTraceback).into(),
                400,
            ),
        ];
        for (err, status) in cases {
            assert_eq!(err.status.as_u16(), status, "{}", err.error);
            assert!(!err.hint.is_empty(), "{} has no hint", err.error);
        }
    }
}
