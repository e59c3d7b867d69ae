//! The HTTP API (axum): tracemalloc's module functions as routes.
//!
//! | route | tracemalloc |
//! |---|---|
//! | `GET /health` | readiness: probes attached |
//! | `GET /processes` | traced processes with current/peak bytes |
//! | `GET /maps` | the kernel maps' entries and capacity, eBPF counters |
//! | `GET /pid/{pid}` | one process (says whether it exited) |
//! | `GET /pid/{pid}/statistics` | `take_snapshot().statistics(group_by, cumulative)` |
//! | `POST /pid/{pid}/snapshots` | `take_snapshot()`, stored under an id |
//! | `GET /pid/{pid}/snapshots` | stored snapshots of the process |
//! | `GET /pid/{pid}/compare` | `new.compare_to(base, group_by, cumulative)` |
//! | `GET /pid/{pid}/traced-memory` | `get_traced_memory()` |
//!
//! Errors are JSON `{"error": ..., "hint": ...}`: 400 for a bad parameter
//! (naming the valid values), 404 for an unknown pid or snapshot, 409 for a
//! snapshot of another process. All status mapping is in [`ApiError`].
use std::{collections::HashMap, sync::Arc};

use axum::{
    Json, Router,
    extract::{Path, RawQuery, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde::Serialize;
use serde_json::json;

use crate::{
    daemon::{Daemon, DaemonError},
    model::{GroupBy, ModelError, Snapshot, Statistic, StatisticDiff},
    store::unix_ms,
};

/// Default number of statistics returned (`limit`); 0 means all.
pub const DEFAULT_LIMIT: usize = 50;

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
    fn bad(error: impl Into<String>, hint: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, error: error.into(), hint: hint.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.error, "hint": self.hint}))).into_response()
    }
}

impl From<DaemonError> for ApiError {
    fn from(err: DaemonError) -> Self {
        let (status, hint) = match &err {
            DaemonError::NotTraced { .. } => {
                (StatusCode::NOT_FOUND, "GET /processes lists the traced pids".to_string())
            }
            DaemonError::SnapshotNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "GET /pid/{pid}/snapshots lists the stored snapshots of a process".to_string(),
            ),
            DaemonError::SnapshotOfOtherProcess { of_pid, .. } => (
                StatusCode::CONFLICT,
                format!("use it through /pid/{of_pid}, or take one of this process with POST /pid/{{pid}}/snapshots"),
            ),
            DaemonError::Model(ModelError::CumulativeTraceback) => (
                StatusCode::BAD_REQUEST,
                "cumulative=true works with group_by=filename or group_by=lineno".to_string(),
            ),
            #[allow(unreachable_patterns)]
            DaemonError::Model(_) => (StatusCode::BAD_REQUEST, String::new()),
        };
        Self { status, error: err.to_string(), hint }
    }
}

/// The router over a daemon.
pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/processes", get(processes))
        .route("/maps", get(kernel_maps))
        .route("/pid/{pid}", get(process))
        .route("/pid/{pid}/statistics", get(statistics))
        .route("/pid/{pid}/snapshots", get(list_snapshots).post(take_snapshot))
        .route("/pid/{pid}/compare", get(compare))
        .route("/pid/{pid}/traced-memory", get(traced_memory))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(daemon)
}

const ROUTES: &str = "GET /health, GET /processes, GET /maps, GET /pid/{pid}, GET /pid/{pid}/statistics, \
    POST|GET /pid/{pid}/snapshots, GET /pid/{pid}/compare, GET /pid/{pid}/traced-memory";

async fn not_found() -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, error: "no such route".into(), hint: ROUTES.into() }
}

async fn method_not_allowed() -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        error: "method not allowed on this route".into(),
        hint: ROUTES.into(),
    }
}

/// Runs blocking daemon work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, DaemonError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(err) => Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: format!("internal error: {err}"),
            hint: "see tracerd's log".into(),
        }),
    }
}

fn parse_pid(raw: &str) -> Result<u32, ApiError> {
    match raw.parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(ApiError::bad(
            format!("invalid pid {raw:?}"),
            "pid is a positive integer, e.g. /pid/1234; GET /processes lists them",
        )),
    }
}

/// Query parameters, checked against the names a route accepts.
#[derive(Debug, Default)]
pub struct Params(HashMap<String, String>);

impl Params {
    /// Parses a query string; unknown or repeated names are a 400 that lists
    /// the valid ones.
    ///
    /// # Errors
    /// [`ApiError`] 400.
    pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Self, ApiError> {
        let mut map = HashMap::new();
        for (name, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                return Err(ApiError::bad(
                    format!("unknown parameter {name:?}"),
                    format!("valid parameters: {}", allowed.join(", ")),
                ));
            }
            if map.insert(name.to_string(), value.to_string()).is_some() {
                return Err(ApiError::bad(
                    format!("parameter {name:?} given twice"),
                    "give each parameter once",
                ));
            }
        }
        Ok(Self(map))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// `group_by`: filename, lineno (default) or traceback.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn group_by(&self) -> Result<GroupBy, ApiError> {
        match self.get("group_by") {
            None => Ok(GroupBy::Lineno),
            Some(v) => v.parse::<GroupBy>().map_err(|_| {
                ApiError::bad(
                    format!("invalid group_by {v:?}"),
                    "group_by is one of: filename, lineno, traceback",
                )
            }),
        }
    }

    /// A boolean parameter: true/false/1/0, default false.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(v) => Err(ApiError::bad(
                format!("invalid {name} {v:?}"),
                format!("{name} is one of: true, false, 1, 0"),
            )),
        }
    }

    /// `limit`: how many statistics, default [`DEFAULT_LIMIT`], 0 for all.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn limit(&self) -> Result<usize, ApiError> {
        match self.get("limit") {
            None => Ok(DEFAULT_LIMIT),
            Some(v) => v.parse::<usize>().map_err(|_| {
                ApiError::bad(
                    format!("invalid limit {v:?}"),
                    "limit is a whole number >= 0 (0 means all)",
                )
            }),
        }
    }

    /// `format`: json (default) or text.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn text(&self) -> Result<bool, ApiError> {
        match self.get("format") {
            None | Some("json") => Ok(false),
            Some("text") => Ok(true),
            Some(v) => Err(ApiError::bad(
                format!("invalid format {v:?}"),
                "format is one of: json, text",
            )),
        }
    }

    /// A snapshot id parameter; `now` (or absent) is None.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn snapshot_id(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None | Some("now") if name == "new" => Ok(None),
            None => Ok(None),
            Some(v) => match v.parse::<u64>() {
                Ok(id) if id > 0 => Ok(Some(id)),
                _ => Err(ApiError::bad(
                    format!("invalid {name} {v:?}"),
                    if name == "new" {
                        "new is a snapshot id from GET /pid/{pid}/snapshots, or now".to_string()
                    } else {
                        format!("{name} is a snapshot id from GET /pid/{{pid}}/snapshots")
                    },
                )),
            },
        }
    }
}

fn text_response(lines: impl Iterator<Item = String>, headers: &[(&'static str, String)]) -> Response {
    let mut body = String::new();
    for line in lines {
        body.push_str(&line);
        body.push('\n');
    }
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(*name, value);
        }
    }
    response
}

fn cut<T>(mut items: Vec<T>, limit: usize) -> (Vec<T>, usize) {
    let total = items.len();
    if limit > 0 {
        items.truncate(limit);
    }
    (items, total)
}

#[derive(Serialize)]
struct StatisticOut<'a> {
    #[serde(flatten)]
    statistic: &'a Statistic,
    text: String,
}

#[derive(Serialize)]
struct StatisticDiffOut<'a> {
    #[serde(flatten)]
    diff: &'a StatisticDiff,
    text: String,
}

async fn health(State(daemon): State<Arc<Daemon>>) -> Response {
    let libraries = daemon.capture().libraries().to_vec();
    Json(json!({
        "status": "ready",
        "nframe": daemon.nframe(),
        "libraries": libraries,
        "started_at_ms": unix_ms(daemon.started_at),
    }))
    .into_response()
}

async fn processes(State(daemon): State<Arc<Daemon>>) -> Result<Response, ApiError> {
    let list = blocking(move || Ok(daemon.processes())).await?;
    Ok(Json(json!({ "processes": list })).into_response())
}

async fn kernel_maps(State(daemon): State<Arc<Daemon>>) -> Result<Response, ApiError> {
    let maps = blocking(move || Ok(daemon.kernel_maps())).await?;
    Ok(Json(maps).into_response())
}

async fn process(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let view = blocking(move || daemon.process(pid)).await?;
    Ok(Json(view).into_response())
}

async fn traced_memory(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let view = blocking(move || daemon.process(pid)).await?;
    Ok(Json(json!({
        "pid": pid,
        "current": view.current,
        "peak": view.peak,
        "blocks": view.blocks,
        "state": view.state,
    }))
    .into_response())
}

async fn statistics(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params =
        Params::parse(query.as_deref(), &["group_by", "cumulative", "limit", "format"])?;
    let (group_by, cumulative) = (params.group_by()?, params.flag("cumulative")?);
    let (limit, text) = (params.limit()?, params.text()?);
    let (taken, stats) = blocking(move || {
        let taken = daemon.take_snapshot(pid)?;
        let stats = taken.snapshot.statistics(group_by, cumulative)?;
        Ok((taken, stats))
    })
    .await?;
    let (stats, total) = cut(stats, limit);
    if text {
        return Ok(text_response(stats.iter().map(ToString::to_string), &[]));
    }
    let out: Vec<_> =
        stats.iter().map(|s| StatisticOut { statistic: s, text: s.to_string() }).collect();
    Ok(Json(json!({
        "pid": pid,
        "process": taken.process,
        "group_by": group_by.to_string(),
        "cumulative": cumulative,
        "limit": limit,
        "total": total,
        "traces": taken.snapshot.traces().len(),
        "statistics": out,
    }))
    .into_response())
}

async fn take_snapshot(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), &[])?;
    let summary = blocking(move || daemon.store_snapshot(pid)).await?;
    Ok((StatusCode::CREATED, Json(summary)).into_response())
}

async fn list_snapshots(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let list = blocking(move || daemon.snapshots_of(pid)).await?;
    Ok(Json(json!({ "pid": pid, "snapshots": list })).into_response())
}

async fn compare(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(
        query.as_deref(),
        &["group_by", "cumulative", "limit", "format", "base", "new"],
    )?;
    let (group_by, cumulative) = (params.group_by()?, params.flag("cumulative")?);
    let (limit, text) = (params.limit()?, params.text()?);
    let (base_id, new_id) = (params.snapshot_id("base")?, params.snapshot_id("new")?);
    let (base, new, diffs) = blocking(move || {
        let (base_snapshot, base) = match base_id {
            Some(id) => {
                let stored = daemon.stored_of(pid, id)?;
                let info = json!({"kind": "snapshot", "id": id, "taken_at_ms": unix_ms(stored.taken_at)});
                (stored.snapshot, info)
            }
            None => match daemon.latest_stored(pid)? {
                Some(stored) => {
                    let info = json!({"kind": "snapshot", "id": stored.id, "taken_at_ms": unix_ms(stored.taken_at)});
                    (stored.snapshot, info)
                }
                None => {
                    let view = daemon.process(pid)?;
                    let empty =
                        Arc::new(Snapshot::new(Vec::new(), daemon.nframe()));
                    (empty, json!({"kind": "tracing_start", "at_ms": view.first_seen_ms}))
                }
            },
        };
        let (new_snapshot, new) = match new_id {
            Some(id) => {
                let stored = daemon.stored_of(pid, id)?;
                let info = json!({"kind": "snapshot", "id": id, "taken_at_ms": unix_ms(stored.taken_at)});
                (stored.snapshot, info)
            }
            None => (daemon.take_snapshot(pid)?.snapshot, json!({"kind": "now"})),
        };
        let diffs = new_snapshot.compare_to(&base_snapshot, group_by, cumulative)?;
        Ok((base, new, diffs))
    })
    .await?;
    let (diffs, total) = cut(diffs, limit);
    if text {
        let base_header = match base.get("id") {
            Some(id) => format!("snapshot {id}"),
            None => "tracing-start".to_string(),
        };
        return Ok(text_response(
            diffs.iter().map(ToString::to_string),
            &[("x-tracer-base", base_header)],
        ));
    }
    let out: Vec<_> =
        diffs.iter().map(|d| StatisticDiffOut { diff: d, text: d.to_string() }).collect();
    Ok(Json(json!({
        "pid": pid,
        "base": base,
        "new": new,
        "group_by": group_by.to_string(),
        "cumulative": cumulative,
        "limit": limit,
        "total": total,
        "statistics": out,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_parameter_names_the_valid_ones() {
        let err = Params::parse(Some("group=lineno"), &["group_by", "limit"]).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert_eq!(err.error, "unknown parameter \"group\"");
        assert_eq!(err.hint, "valid parameters: group_by, limit");
    }

    #[test]
    fn bad_values_name_the_valid_ones() {
        let params = Params::parse(
            Some("group_by=line&cumulative=yes&limit=-1&format=xml"),
            &["group_by", "cumulative", "limit", "format"],
        )
        .unwrap();
        assert_eq!(params.group_by().unwrap_err().hint, "group_by is one of: filename, lineno, traceback");
        assert_eq!(params.flag("cumulative").unwrap_err().hint, "cumulative is one of: true, false, 1, 0");
        assert_eq!(params.limit().unwrap_err().hint, "limit is a whole number >= 0 (0 means all)");
        assert_eq!(params.text().unwrap_err().hint, "format is one of: json, text");
    }

    #[test]
    fn defaults_apply_when_absent() {
        let params = Params::parse(None, &["group_by"]).unwrap();
        assert_eq!(params.group_by().unwrap(), GroupBy::Lineno);
        assert_eq!(params.limit().unwrap(), DEFAULT_LIMIT);
        assert!(!params.flag("cumulative").unwrap());
        assert_eq!(params.snapshot_id("new").unwrap(), None);
    }

    #[test]
    fn repeated_parameter_is_refused() {
        let err = Params::parse(Some("limit=1&limit=2"), &["limit"]).unwrap_err();
        assert_eq!(err.error, "parameter \"limit\" given twice");
    }

    #[test]
    fn pid_must_be_positive() {
        assert_eq!(parse_pid("12").unwrap(), 12);
        assert_eq!(parse_pid("0").unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(parse_pid("abc").unwrap_err().status, StatusCode::BAD_REQUEST);
    }
}
