//! [`ApiError`]: an error response, and the one place where every error of
//! the service, the store and the model becomes an HTTP status with a hint
//! naming what is valid. Bodies are JSON `{"error": ..., "hint": ...}`: 400
//! for a bad parameter or file, 404 for an unknown pid, snapshot, label,
//! address or route, 409 for a state conflict (tracing stopped, a process
//! that ended, a snapshot of another target, a label in use), 507 when the
//! state directory's filesystem is full or a snapshot quota is.
//!
//! Every other error response, whoever made it (axum's own rejections of a
//! path, query or body it cannot extract, tower-http's 413 and 503), is
//! given the same JSON shape on its way out by [`json_errors`], keeping
//! its status and headers.
use std::time::Duration;

use axum::{
    Json,
    extract::{Request, State, rejection::BytesRejection},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use tracer_model::interrupt::Interrupted;
use tracer_model::{DumpError, ModelError, PickleError};

use super::routes::{MAX_UPLOAD_BYTES, route_list};
use crate::service::ServiceError;
use crate::store::StoreError;

/// Marks a response whose body is already an [`ApiError`]'s JSON (a
/// response extension), so that [`json_errors`] leaves it alone.
#[derive(Clone, Copy, Debug)]
struct JsonErrorBody;

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
        let mut response = (
            self.status,
            // Its keys in this order are the sorted order of the map it
            // was built as before.
            Json(tracer_api::ErrorBody {
                error: self.error,
                hint: self.hint,
            }),
        )
            .into_response();
        response.extensions_mut().insert(JsonErrorBody);
        response
    }
}

/// What [`json_errors`] says in the hints of the errors it reshapes: the
/// limits in force.
#[derive(Clone, Debug)]
pub struct ErrorHints {
    /// `body_limit_bytes`: the largest request body, in bytes.
    pub body_limit_bytes: usize,
    /// `request_timeout_secs`: the time a request may take.
    pub request_timeout: Duration,
    /// `request_read_timeout_secs`: the longest pause while a request
    /// body arrives.
    pub request_read_timeout: Duration,
}

/// Longest text of a foreign error body that is kept as the error message;
/// axum's rejections are one line.
const FOREIGN_BODY_BYTES: usize = 1024;

/// Middleware: an error response (4xx or 5xx) whose body is not an
/// [`ApiError`]'s (axum's rejections of a path, query, JSON or body, a
/// 404 or 405 outside the API's router, tower-http's 413 and request
/// timeout 503) gets the API's JSON body `{"error", "hint"}`: the error is
/// its own text when it had one (else the status's reason), the hint says
/// what is valid. Status and headers (`Allow`, `Retry-After`, ...) are
/// kept.
pub async fn json_errors(
    State(hints): State<std::sync::Arc<ErrorHints>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error())
        || response.extensions().get::<JsonErrorBody>().is_some()
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, FOREIGN_BODY_BYTES)
        .await
        .ok()
        .and_then(|bytes| String::from_utf8(bytes.to_vec()).ok())
        .map(|text| text.trim().to_string())
        .filter(|text| !text.is_empty());
    let error = text.unwrap_or_else(|| {
        status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
    });
    let reshaped = ApiError::new(status, error, hint_for(status, &hints)).into_response();
    let (fresh, body) = reshaped.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some(kind) = fresh.headers.get(header::CONTENT_TYPE) {
        parts.headers.insert(header::CONTENT_TYPE, kind.clone());
    }
    parts.extensions.insert(JsonErrorBody);
    Response::from_parts(parts, body)
}

/// The hint of an error response that came without one, by status.
fn hint_for(status: StatusCode, hints: &ErrorHints) -> String {
    match status {
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {
            route_list().to_string()
        }
        StatusCode::PAYLOAD_TOO_LARGE => format!(
            "request bodies are at most {} bytes (body_limit_bytes; POST /snapshots takes a file of up to {} bytes)",
            hints.body_limit_bytes,
            MAX_UPLOAD_BYTES,
        ),
        StatusCode::REQUEST_TIMEOUT => format!(
            "send the request body without a pause of {} s or more (request_read_timeout_secs)",
            hints.request_read_timeout.as_secs_f64()
        ),
        StatusCode::SERVICE_UNAVAILABLE => format!(
            "the request took longer than {} s (request_timeout_secs): ask for less (limit=, filters) or retry",
            hints.request_timeout.as_secs_f64()
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            "send the body a route takes (docs/api.md): a snapshot file to POST /snapshots, no body elsewhere".into()
        }
        s if s.is_server_error() => "see tracerd's log".into(),
        _ => "paths are like /pid/1234/statistics, parameters as docs/api.md lists them; GET /health answers when tracerd is up".into(),
    }
}

impl From<BytesRejection> for ApiError {
    /// A request body that could not be read: 413 past the body limit,
    /// 408 when it paused longer than `request_read_timeout_secs`, else
    /// 400.
    fn from(rejection: BytesRejection) -> Self {
        let timed_out = {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&rejection);
            let mut found = false;
            while let Some(err) = cause {
                if err.is::<tower_http::timeout::TimeoutError>() {
                    found = true;
                    break;
                }
                cause = err.source();
            }
            found
        };
        if timed_out {
            return Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "the request body stopped arriving",
                "send the request body without pausing longer than request_read_timeout_secs",
            );
        }
        let status = rejection.status();
        let hint = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the body is larger than the route takes (body_limit_bytes; POST /snapshots takes files up to 1 GiB)"
        } else {
            "the request body could not be read; send it whole, with a correct Content-Length or chunked encoding"
        };
        Self::new(status, rejection.body_text(), hint)
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
                "GET /snapshots lists the stored snapshots and their labels".into(),
            ),
            StoreError::LabelTaken { .. } => (
                StatusCode::CONFLICT,
                "choose another label, or remove it from the other snapshot with PATCH /snapshots/{id}?label=".into(),
            ),
            StoreError::FileGone { id, .. } | StoreError::FileChanged { id, .. } => (
                StatusCode::CONFLICT,
                format!(
                    "tracerd keeps a stored snapshot in its file and reads it on use: put the file back as tracerd wrote it, or drop the snapshot with DELETE /snapshots/{id} (a restart of tracerd reads the state directory anew)"
                )
                .into(),
            ),
            StoreError::InvalidLabel { .. } => (
                StatusCode::BAD_REQUEST,
                "a label is 1 to 64 of A-Z a-z 0-9 . _ : - and not all digits".into(),
            ),
            StoreError::QuotaFull { quota, .. } => (
                StatusCode::INSUFFICIENT_STORAGE,
                format!(
                    "delete stored snapshots (GET /snapshots lists them with their bytes, DELETE /snapshots/{{id}} removes one), or raise {} ({}, {}); the snapshot was not stored",
                    quota.setting(),
                    quota.flag(),
                    quota.env()
                )
                .into(),
            ),
            StoreError::Io { source, .. } if is_full(source) => (
                StatusCode::INSUFFICIENT_STORAGE,
                "the filesystem of tracerd's state directory (state_dir) is full: free space there, or delete stored snapshots (DELETE /snapshots/{id}); the snapshot was not stored".into(),
            ),
            StoreError::Io { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "tracerd could not use its state directory; see its log and the disk".into(),
            ),
        };
        let hint: std::borrow::Cow<'static, str> = hint;
        Self::new(status, err.to_string(), hint)
    }
}

/// Whether a write failed for want of space: the filesystem is full
/// (ENOSPC) or the user's quota is (EDQUOT).
fn is_full(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// The hint of a file refused for what loading it would cost.
const OVER_BUDGET_HINT: &str = "tracerd loads a file only if it takes at most 24 bytes of memory per byte of the file plus 64 MiB (files from GET /snapshots/{id}/dump and from Python's Snapshot.dump() take 7 to 21); this one expands, as a traceback repeating one frame or pickle opcodes that copy values do";

/// A 503 for model work that the thread's interrupt check stopped (the
/// client left, or the request went past its budget).
fn interrupted(stop: &Interrupted) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the request was interrupted: {}", stop.reason),
        "nothing was changed; ask again",
    )
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
            ServiceError::Dump(DumpError::Interrupted(stop))
            | ServiceError::Pickle(PickleError::Interrupted(stop)) => {
                return interrupted(stop);
            }
            ServiceError::Dump(DumpError::OverBudget(_))
            | ServiceError::Pickle(PickleError::OverBudget(_)) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                OVER_BUDGET_HINT.to_string(),
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
            // The request's work answers with its reason instead (see
            // http::work); this is what a work stopped outside one gets.
            ServiceError::Interrupted(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ask for less: limit= and offset=, filters, format=".to_string(),
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
    fn a_file_past_the_load_bound_is_a_413_and_an_interrupted_load_a_503() {
        let over = tracer_model::OverBudget {
            input: 10,
            limit: 67_109_104,
            at: "traceback 0 of the tracebacks section (9 frames)".into(),
        };
        let err: ApiError = ServiceError::Dump(DumpError::OverBudget(over.clone())).into();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            err.error,
            "tracer snapshot refused: loading this 10-byte file would take more than 67109104 bytes of memory (at most 24 bytes per byte of the file plus 64 MiB); it went past that at traceback 0 of the tracebacks section (9 frames)"
        );
        assert_eq!(err.hint, OVER_BUDGET_HINT);
        let err: ApiError = ServiceError::Pickle(PickleError::OverBudget(over)).into();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            err.error.starts_with("tracemalloc pickle refused: "),
            "{}",
            err.error
        );
        let stop = Interrupted {
            reason: "the client left".into(),
        };
        for err in [
            ServiceError::Dump(DumpError::Interrupted(stop.clone())),
            ServiceError::Pickle(PickleError::Interrupted(stop.clone())),
        ] {
            let err: ApiError = err.into();
            assert_eq!(err.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(err.error, "the request was interrupted: the client left");
        }
    }

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
            (
                StoreError::FileGone {
                    id: 3,
                    path: "/var/lib/tracer/snapshots/3.tsnap".into(),
                }
                .into(),
                409,
            ),
            (
                StoreError::FileChanged {
                    id: 3,
                    path: "/var/lib/tracer/snapshots/3.tsnap".into(),
                    reason: "its bytes were modified".into(),
                }
                .into(),
                409,
            ),
            (
                StoreError::QuotaFull {
                    quota: crate::store::Quota::Bytes,
                    limit: 1,
                    held: 0,
                    need: 2,
                    owner: None,
                }
                .into(),
                507,
            ),
            (
                StoreError::Io {
                    action: "writing",
                    path: "/var/lib/tracer/snapshots/.1.tsnap.7.tmp".into(),
                    source: std::io::Error::from_raw_os_error(libc::ENOSPC),
                }
                .into(),
                507,
            ),
            (
                StoreError::Io {
                    action: "writing",
                    path: "/var/lib/tracer/snapshots/.1.tsnap.7.tmp".into(),
                    source: std::io::Error::from_raw_os_error(libc::EDQUOT),
                }
                .into(),
                507,
            ),
            (
                StoreError::Io {
                    action: "writing",
                    path: "/var/lib/tracer/snapshots/.1.tsnap.7.tmp".into(),
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                }
                .into(),
                500,
            ),
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
