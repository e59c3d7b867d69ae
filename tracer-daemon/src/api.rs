//! The HTTP API (axum): tracemalloc's module functions as routes. The
//! route table, with every parameter, is `docs/api.md`; [`ROUTES`] lists
//! them for 404 hints.
//!
//! Statistics, compare and traces routes exist per process
//! (`/pid/{pid}/...`), system-wide (`/statistics`, every traced process, one
//! domain per pid) and per stored snapshot (`/snapshots/{id}/...`), and all
//! take the filters of `Snapshot.filter_traces()`: `include=` and
//! `exclude=PATTERN[:LINENO][@DOMAIN]` (repeatable), `all_frames=`,
//! `domain=` and `exclude_domain=` (repeatable). Each of their answers, and
//! every stored snapshot's summary, says whether its data is complete
//! (`complete`, `drops`, `drops_by_pid`: [`Completeness`]); a compare says
//! it of each side.
//!
//! Errors are JSON `{"error": ..., "hint": ...}`: 400 for a bad parameter
//! or file (the hint names the valid values), 404 for an unknown pid,
//! snapshot, label, address or route, 409 for a state conflict (tracing
//! stopped, a process that ended, a snapshot of another scope, a label in
//! use). All status mapping is in the `From` impls of [`ApiError`].
use std::{collections::HashMap, sync::Arc};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{DefaultBodyLimit, Path, RawQuery, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    daemon::{Daemon, DaemonError},
    store::{StoreError, unix_ms},
    views::{BaseSpec, Scope, Side, SnapshotRef, ViewError},
};
use tracer_model::{
    Completeness, DomainFilter, Filter, GroupBy, LineCache, ModelError, Snapshot, Statistic,
    StatisticDiff, Trace, TraceFilter, Traceback, dump_tracemalloc, encode,
};

/// Default number of statistics or traces returned (`limit`); 0 means all.
pub const DEFAULT_LIMIT: usize = 50;
/// Largest snapshot file accepted by `POST /snapshots`, in bytes.
pub const MAX_UPLOAD_BYTES: usize = 1 << 30;

/// Every route, for the hint of a 404.
pub const ROUTES: &str = "GET /health, GET /processes, GET /maps, GET /pid/{pid}, \
    GET /pid/{pid}/statistics, GET /pid/{pid}/compare, GET /pid/{pid}/traces, \
    GET|POST /pid/{pid}/snapshots, GET /pid/{pid}/traced-memory, POST /pid/{pid}/clear-traces, \
    POST /pid/{pid}/reset-peak, GET /pid/{pid}/tracing, POST /pid/{pid}/tracing/start, \
    POST /pid/{pid}/tracing/stop, GET /pid/{pid}/object/{address}, GET /statistics, GET /compare, \
    GET /traces, GET /traced-memory, GET|POST /snapshots, GET|PATCH|DELETE /snapshots/{id}, \
    GET /snapshots/{id}/statistics, GET /snapshots/{id}/compare, GET /snapshots/{id}/traces, \
    GET /snapshots/{id}/dump, GET /tracing, POST /tracing/start, POST /tracing/stop, \
    GET /tracing/memory (see docs/api.md)";

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
        Self {
            status: StatusCode::BAD_REQUEST,
            error: error.into(),
            hint: hint.into(),
        }
    }

    fn new(status: StatusCode, error: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            hint: hint.into(),
        }
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

impl From<DaemonError> for ApiError {
    fn from(err: DaemonError) -> Self {
        let (status, hint) = match &err {
            DaemonError::NotTraced { .. } => (
                StatusCode::NOT_FOUND,
                "GET /processes lists the traced pids".to_string(),
            ),
            DaemonError::SnapshotNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "GET /snapshots lists the stored snapshots".to_string(),
            ),
            DaemonError::SnapshotOfOtherProcess { of_pid, .. } => (
                StatusCode::CONFLICT,
                format!(
                    "use it through /pid/{of_pid}, or take one of this process with POST /pid/{{pid}}/snapshots"
                ),
            ),
            DaemonError::Model(err) => return Self::from(err.clone()),
        };
        Self {
            status,
            error: err.to_string(),
            hint,
        }
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

impl From<ViewError> for ApiError {
    fn from(err: ViewError) -> Self {
        let (status, hint) = match &err {
            ViewError::Daemon(_) | ViewError::Store(_) | ViewError::Model(_) => {
                return match err {
                    ViewError::Daemon(e) => e.into(),
                    ViewError::Store(e) => e.into(),
                    ViewError::Model(e) => e.into(),
                    _ => Self::bad("unreachable", ""),
                };
            }
            ViewError::Dump(_) => (
                StatusCode::BAD_REQUEST,
                "the body must be a file from GET /snapshots/{id}/dump; a file from Python's Snapshot.dump() needs format=tracemalloc"
                    .to_string(),
            ),
            ViewError::Pickle(_) => (
                StatusCode::BAD_REQUEST,
                "with format=tracemalloc the body must be a file written by Python's tracemalloc Snapshot.dump()"
                    .to_string(),
            ),
            ViewError::TracingStopped { pid: Some(pid) } => {
                (StatusCode::CONFLICT, format!("start it with POST /pid/{pid}/tracing/start"))
            }
            ViewError::TracingStopped { pid: None } => {
                (StatusCode::CONFLICT, "start it with POST /tracing/start".to_string())
            }
            ViewError::Ended { .. } => (
                StatusCode::CONFLICT,
                "its last state stays readable with GET /pid/{pid}/statistics until it expires".to_string(),
            ),
            ViewError::BadNframe { max, .. } => {
                (StatusCode::BAD_REQUEST, format!("nframe is 1 to {max} (tracerd's --nframe)"))
            }
            ViewError::NoBlock { pid, .. } => (
                StatusCode::NOT_FOUND,
                format!("GET /pid/{pid}/traces lists the live blocks; the address is where a block starts"),
            ),
            ViewError::WrongScope { .. } => (
                StatusCode::CONFLICT,
                "any two stored snapshots compare with GET /snapshots/{id}/compare?base={id}".to_string(),
            ),
        };
        Self::new(status, err.to_string(), hint)
    }
}

/// The router over a daemon.
pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/processes", get(processes))
        .route("/maps", get(kernel_maps))
        .route("/pid/{pid}", get(process))
        .route("/pid/{pid}/statistics", get(pid_statistics))
        .route("/pid/{pid}/compare", get(pid_compare))
        .route("/pid/{pid}/traces", get(pid_traces))
        .route(
            "/pid/{pid}/snapshots",
            get(pid_snapshots).post(pid_take_snapshot),
        )
        .route("/pid/{pid}/traced-memory", get(pid_traced_memory))
        .route("/pid/{pid}/clear-traces", post(pid_clear_traces))
        .route("/pid/{pid}/reset-peak", post(pid_reset_peak))
        .route("/pid/{pid}/tracing", get(pid_tracing))
        .route("/pid/{pid}/tracing/start", post(pid_tracing_start))
        .route("/pid/{pid}/tracing/stop", post(pid_tracing_stop))
        .route("/pid/{pid}/object/{address}", get(pid_object))
        .route("/statistics", get(system_statistics))
        .route("/compare", get(system_compare))
        .route("/traces", get(system_traces))
        .route("/traced-memory", get(system_traced_memory))
        .route(
            "/snapshots",
            get(list_snapshots)
                .post(post_snapshots)
                .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES)),
        )
        .route(
            "/snapshots/{id}",
            get(snapshot_summary)
                .delete(delete_snapshot)
                .patch(label_snapshot),
        )
        .route("/snapshots/{id}/statistics", get(snapshot_statistics))
        .route("/snapshots/{id}/compare", get(snapshot_compare))
        .route("/snapshots/{id}/traces", get(snapshot_traces))
        .route("/snapshots/{id}/dump", get(snapshot_dump))
        .route("/tracing", get(system_tracing))
        .route("/tracing/start", post(system_tracing_start))
        .route("/tracing/stop", post(system_tracing_stop))
        .route("/tracing/memory", get(tracing_memory))
        .merge(crate::scope::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(daemon)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route", ROUTES)
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
        ROUTES,
    )
}

/// Runs blocking daemon work off the async threads.
async fn blocking<T: Send + 'static, E: Into<ApiError> + Send + 'static>(
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(Into::into),
        Err(err) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal error: {err}"),
            "see tracerd's log",
        )),
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

/// A snapshot reference from a path or parameter: an id (digits) or a
/// label.
fn parse_ref(name: &str, raw: &str) -> Result<SnapshotRef, ApiError> {
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return match raw.parse::<u64>() {
            Ok(id) if id > 0 => Ok(SnapshotRef::Id(id)),
            _ => Err(ApiError::bad(
                format!("invalid {name} {raw:?}"),
                format!("{name} is a snapshot id (1 or more) or label from GET /snapshots"),
            )),
        };
    }
    crate::store::check_label(raw).map_err(|e| {
        ApiError::bad(
            format!("invalid {name} {raw:?}: {e}"),
            format!("{name} is a snapshot id (1 or more) or label from GET /snapshots"),
        )
    })?;
    Ok(SnapshotRef::Label(raw.to_string()))
}

/// Parameters that may be given more than once.
const REPEATABLE: [&str; 4] = ["include", "exclude", "domain", "exclude_domain"];
/// The filter parameters, taken by every statistics, compare and traces
/// route.
const FILTERS: [&str; 5] = [
    "include",
    "exclude",
    "all_frames",
    "domain",
    "exclude_domain",
];
/// `Traceback.format()` options of text output.
const TEXT: [&str; 4] = ["format", "source", "tb_limit", "most_recent_first"];

/// Query parameters, checked against the names a route accepts.
#[derive(Debug, Default)]
pub struct Params(HashMap<String, Vec<String>>);

impl Params {
    /// Parses a query string; unknown names, and names given twice that are
    /// not repeatable (`include`, `exclude`, `domain`, `exclude_domain`),
    /// are a 400 that lists the valid ones.
    ///
    /// # Errors
    /// [`ApiError`] 400.
    pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Self, ApiError> {
        let mut map: HashMap<String, Vec<String>> = HashMap::new();
        for (name, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                return Err(ApiError::bad(
                    format!("unknown parameter {name:?}"),
                    format!("valid parameters: {}", allowed.join(", ")),
                ));
            }
            let values = map.entry(name.to_string()).or_default();
            if !values.is_empty() && !REPEATABLE.contains(&name.as_ref()) {
                return Err(ApiError::bad(
                    format!("parameter {name:?} given twice"),
                    "give each parameter once (only include, exclude, domain and exclude_domain repeat)",
                ));
            }
            values.push(value.to_string());
        }
        Ok(Self(map))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|v| v.first()).map(String::as_str)
    }

    fn all(&self, name: &str) -> &[String] {
        self.0.get(name).map_or(&[], Vec::as_slice)
    }

    /// `group_by`: filename, lineno (default), traceback, function, module.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn group_by(&self) -> Result<GroupBy, ApiError> {
        match self.get("group_by") {
            None => Ok(GroupBy::Lineno),
            Some(v) => v.parse::<GroupBy>().map_err(|_| {
                ApiError::bad(
                    format!("invalid group_by {v:?}"),
                    "group_by is one of: filename, lineno, traceback, function, module",
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

    /// `limit`: how many items, default [`DEFAULT_LIMIT`], 0 for all.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn limit(&self) -> Result<usize, ApiError> {
        self.count(
            "limit",
            DEFAULT_LIMIT,
            "limit is a whole number >= 0 (0 means all)",
        )
    }

    fn count(&self, name: &str, default: usize, hint: &str) -> Result<usize, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .map_err(|_| ApiError::bad(format!("invalid {name} {v:?}"), hint)),
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

    /// A snapshot parameter (`base`, `new`): an id or a label; `new=now`
    /// (or absent) is None.
    ///
    /// # Errors
    /// 400 naming the valid values.
    pub fn snapshot_ref(&self, name: &str) -> Result<Option<SnapshotRef>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some("now") if name == "new" => Ok(None),
            Some(v) => parse_ref(name, v).map(Some).map_err(|mut e| {
                if name == "new" {
                    e.hint = "new is a snapshot id or label from GET /snapshots, or now".into();
                }
                e
            }),
        }
    }

    /// `label`: None when absent; `Some(None)` for an empty value (removes
    /// a label).
    ///
    /// # Errors
    /// 400 for an invalid label.
    pub fn label(&self) -> Result<Option<Option<String>>, ApiError> {
        match self.get("label") {
            None => Ok(None),
            Some("") => Ok(Some(None)),
            Some(v) => {
                crate::store::check_label(v).map_err(ApiError::from)?;
                Ok(Some(Some(v.to_string())))
            }
        }
    }

    /// The `filter_traces()` filters: `include`/`exclude` as
    /// `PATTERN[:LINENO][@DOMAIN]` (each with `all_frames`), `domain` and
    /// `exclude_domain` as `DomainFilter`s.
    ///
    /// # Errors
    /// 400 naming the valid forms.
    pub fn filters(&self) -> Result<Vec<TraceFilter>, ApiError> {
        let all_frames = self.flag("all_frames")?;
        let mut filters = Vec::new();
        for (name, inclusive) in [("include", true), ("exclude", false)] {
            for value in self.all(name) {
                let (pattern, lineno, domain) = parse_filter(name, value)?;
                filters.push(TraceFilter::from(Filter::new(
                    inclusive, &pattern, lineno, all_frames, domain,
                )));
            }
        }
        for (name, inclusive) in [("domain", true), ("exclude_domain", false)] {
            for value in self.all(name) {
                let domain = value.parse::<u32>().map_err(|_| {
                    ApiError::bad(
                        format!("invalid {name} {value:?}"),
                        format!("{name} is a domain (a pid, 0 to 4294967295); repeat it for more"),
                    )
                })?;
                filters.push(TraceFilter::from(DomainFilter { inclusive, domain }));
            }
        }
        Ok(filters)
    }

    /// Options of text output: `source` (source lines), `tb_limit` and
    /// `most_recent_first` of `Traceback.format()`.
    ///
    /// # Errors
    /// 400 naming the valid values, or for `source` without `format=text`.
    pub fn text_options(&self, text: bool) -> Result<TextOptions, ApiError> {
        let source = self.flag("source")?;
        let most_recent_first = self.flag("most_recent_first")?;
        let tb_limit = match self.get("tb_limit") {
            None => None,
            Some(v) => Some(v.parse::<i64>().map_err(|_| {
                ApiError::bad(
                    format!("invalid tb_limit {v:?}"),
                    "tb_limit is Traceback.format()'s limit: a whole number, negative counts from the oldest frame",
                )
            })?),
        };
        let tracebacks = source || tb_limit.is_some() || self.get("most_recent_first").is_some();
        if tracebacks && !text {
            return Err(ApiError::bad(
                "source, tb_limit and most_recent_first shape text output",
                "add format=text (JSON always has every frame)",
            ));
        }
        Ok(TextOptions {
            tracebacks,
            source,
            tb_limit,
            most_recent_first,
        })
    }
}

/// `PATTERN[:LINENO][@DOMAIN]`: a trailing `@digits` is the domain, then a
/// trailing `:digits` the line number; the rest is the pattern.
fn parse_filter(name: &str, value: &str) -> Result<(String, Option<u32>, Option<u32>), ApiError> {
    let invalid = |what: &str| {
        ApiError::bad(
            format!("invalid {name} {value:?}: {what}"),
            format!(
                "{name} is PATTERN[:LINENO][@DOMAIN], e.g. {name}=/srv/app/*.c:88@1234 (fnmatch pattern; line and domain are whole numbers)"
            ),
        )
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut rest = value;
    let mut domain = None;
    if let Some((head, tail)) = rest.rsplit_once('@')
        && digits(tail)
    {
        domain = Some(
            tail.parse::<u32>()
                .map_err(|_| invalid("the domain does not fit in 32 bits"))?,
        );
        rest = head;
    }
    let mut lineno = None;
    if let Some((head, tail)) = rest.rsplit_once(':')
        && digits(tail)
    {
        lineno = Some(
            tail.parse::<u32>()
                .map_err(|_| invalid("the line number does not fit in 32 bits"))?,
        );
        rest = head;
    }
    Ok((rest.to_string(), lineno, domain))
}

/// How text output shows tracebacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextOptions {
    /// Append `Traceback.format()` lines after each line.
    pub tracebacks: bool,
    /// With source lines (as linecache).
    pub source: bool,
    /// `Traceback.format(limit=...)`.
    pub tb_limit: Option<i64>,
    /// `Traceback.format(most_recent_first=...)`.
    pub most_recent_first: bool,
}

impl TextOptions {
    /// The lines for one item: its `str()`, then its traceback's
    /// `format()` lines if asked.
    fn lines(
        &self,
        head: String,
        traceback: &Traceback,
        cache: &mut LineCache,
        out: &mut Vec<String>,
    ) {
        out.push(head);
        if self.tracebacks {
            let source = self.source;
            out.extend(
                traceback.format_with(self.tb_limit, self.most_recent_first, |f, l| {
                    if source {
                        cache.getline(f, l)
                    } else {
                        String::new()
                    }
                }),
            );
        }
    }

    /// The lines of every item of `items` (see [`TextOptions::lines`]).
    fn all_lines<T: std::fmt::Display>(
        &self,
        items: &[T],
        traceback: impl Fn(&T) -> &Traceback,
    ) -> Vec<String> {
        let mut cache = LineCache::new();
        let mut lines = Vec::new();
        for item in items {
            self.lines(item.to_string(), traceback(item), &mut cache, &mut lines);
        }
        lines
    }
}

/// Adds the query's `group_by`, `cumulative`, `filters` and `limit`, and
/// the number of groups before the limit (`total`), to a response head.
fn insert_query(head: &mut serde_json::Map<String, Value>, query: &StatsQuery, total: usize) {
    head.insert("group_by".into(), json!(query.group_by.as_str()));
    head.insert("cumulative".into(), json!(query.cumulative));
    head.insert("filters".into(), query.filters_json.clone());
    head.insert("limit".into(), json!(query.limit));
    head.insert("total".into(), json!(total));
}

fn text_response(lines: &[String], headers: &[(&'static str, String)]) -> Response {
    let mut body = String::new();
    for line in lines {
        body.push_str(line);
        body.push('\n');
    }
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
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

#[derive(Serialize)]
struct TraceOut<'a> {
    #[serde(flatten)]
    trace: &'a Trace,
    text: String,
}

/// What every statistics-like route parses.
#[derive(Clone, Debug)]
struct StatsQuery {
    group_by: GroupBy,
    cumulative: bool,
    limit: usize,
    text: bool,
    options: TextOptions,
    filters: Vec<TraceFilter>,
    filters_json: Value,
}

fn filters_json(params: &Params) -> Value {
    let mut out = serde_json::Map::new();
    for name in FILTERS {
        let values = params.all(name);
        if !values.is_empty() {
            out.insert(name.to_string(), json!(values));
        }
    }
    Value::Object(out)
}

/// The names a statistics route accepts: these, the text options, the
/// filters.
fn with_common(names: &[&'static str]) -> Vec<&'static str> {
    let mut all = names.to_vec();
    all.extend(TEXT);
    all.extend(FILTERS);
    all
}

fn stats_query(params: &Params) -> Result<StatsQuery, ApiError> {
    let text = params.text()?;
    let query = StatsQuery {
        group_by: params.group_by()?,
        cumulative: params.flag("cumulative")?,
        limit: params.limit()?,
        text,
        options: params.text_options(text)?,
        filters: params.filters()?,
        filters_json: filters_json(params),
    };
    if query.cumulative && query.group_by == GroupBy::Traceback {
        return Err(ModelError::CumulativeTraceback.into());
    }
    Ok(query)
}

/// The text headers that say whether the data is complete (text has no
/// room for it in its lines, which are tracemalloc's own).
fn completeness_headers(completeness: &Completeness) -> [(&'static str, String); 2] {
    [
        ("x-tracer-complete", completeness.is_complete().to_string()),
        ("x-tracer-drops", completeness.drops().to_string()),
    ]
}

/// Statistics of `snapshot` (filtered) as JSON with `head` fields and its
/// completeness, or text.
fn statistics_response(
    snapshot: &Snapshot,
    completeness: &Completeness,
    query: &StatsQuery,
    mut head: serde_json::Map<String, Value>,
) -> Result<Response, ApiError> {
    let filtered = snapshot.filter_traces(&query.filters);
    let stats = filtered.statistics(query.group_by, query.cumulative)?;
    let (stats, total) = cut(stats, query.limit);
    if query.text {
        let lines = query.options.all_lines(&stats, |s| &s.traceback);
        return Ok(text_response(&lines, &completeness_headers(completeness)));
    }
    let out: Vec<_> = stats
        .iter()
        .map(|s| StatisticOut {
            statistic: s,
            text: s.to_string(),
        })
        .collect();
    insert_query(&mut head, query, total);
    head.insert("traces".into(), json!(filtered.traces().len()));
    head.insert("traceback_limit".into(), json!(filtered.traceback_limit()));
    completeness.insert_into(&mut head);
    head.insert("statistics".into(), json!(out));
    Ok(Json(Value::Object(head)).into_response())
}

/// `new.compare_to(base)` of the filtered sides, as JSON or text. Each
/// side says its completeness; the answer is complete when both are.
fn compare_response(
    base: &Side,
    new: &Side,
    query: &StatsQuery,
    mut head: serde_json::Map<String, Value>,
) -> Result<Response, ApiError> {
    let new_filtered = new.snapshot.filter_traces(&query.filters);
    let base_filtered = base.snapshot.filter_traces(&query.filters);
    let diffs = new_filtered.compare_to(&base_filtered, query.group_by, query.cumulative)?;
    let (diffs, total) = cut(diffs, query.limit);
    let complete = base.completeness.is_complete() && new.completeness.is_complete();
    if query.text {
        let lines = query.options.all_lines(&diffs, |d| &d.traceback);
        let base_header = match (
            base.info.get("kind").and_then(Value::as_str),
            base.info.get("id"),
        ) {
            (Some("snapshot"), Some(id)) => format!("snapshot {id}"),
            (Some("since"), _) => "since".to_string(),
            _ => "tracing-start".to_string(),
        };
        let headers = [
            ("x-tracer-base", base_header),
            ("x-tracer-complete", complete.to_string()),
            ("x-tracer-base-drops", base.completeness.drops().to_string()),
            ("x-tracer-new-drops", new.completeness.drops().to_string()),
        ];
        return Ok(text_response(&lines, &headers));
    }
    let out: Vec<_> = diffs
        .iter()
        .map(|d| StatisticDiffOut {
            diff: d,
            text: d.to_string(),
        })
        .collect();
    let side = |side: &Side| {
        let mut info = object(side.info.clone());
        side.completeness.insert_into(&mut info);
        Value::Object(info)
    };
    head.insert("complete".into(), json!(complete));
    head.insert("base".into(), side(base));
    head.insert("new".into(), side(new));
    insert_query(&mut head, query, total);
    head.insert("statistics".into(), json!(out));
    Ok(Json(Value::Object(head)).into_response())
}

/// The traces of `snapshot` (filtered), `offset`/`limit` paged, as JSON
/// (with its completeness) or text (`str(Trace)` per line).
fn traces_response(
    snapshot: &Snapshot,
    completeness: &Completeness,
    params: &Params,
    mut head: serde_json::Map<String, Value>,
) -> Result<Response, ApiError> {
    let text = params.text()?;
    let options = params.text_options(text)?;
    let filters = params.filters()?;
    let offset = params.count(
        "offset",
        0,
        "offset is a whole number >= 0 (the first trace is 0)",
    )?;
    let limit = params.limit()?;
    let filtered = snapshot.filter_traces(&filters);
    let total = filtered.traces().len();
    let end = if limit == 0 {
        total
    } else {
        offset.saturating_add(limit).min(total)
    };
    let page = filtered.traces().get(offset.min(total)..end).unwrap_or(&[]);
    if text {
        let lines = options.all_lines(page, |t| &t.traceback);
        return Ok(text_response(&lines, &completeness_headers(completeness)));
    }
    let out: Vec<_> = page
        .iter()
        .map(|t| TraceOut {
            trace: t,
            text: t.to_string(),
        })
        .collect();
    head.insert("filters".into(), filters_json(params));
    head.insert("offset".into(), json!(offset));
    head.insert("limit".into(), json!(limit));
    head.insert("total".into(), json!(total));
    head.insert("traceback_limit".into(), json!(filtered.traceback_limit()));
    completeness.insert_into(&mut head);
    head.insert("traces".into(), json!(out));
    Ok(Json(Value::Object(head)).into_response())
}

fn object(pairs: Value) -> serde_json::Map<String, Value> {
    match pairs {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
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

async fn processes(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), &[])?;
    let list = blocking(move || Ok::<_, ApiError>(daemon.processes_adjusted())).await?;
    let out: Vec<Value> = list
        .into_iter()
        .map(|(view, tracing)| {
            let mut v = serde_json::to_value(&view).unwrap_or(Value::Null);
            if let Some(map) = v.as_object_mut() {
                map.insert("is_tracing".into(), json!(tracing.is_tracing));
                map.insert("traceback_limit".into(), json!(tracing.traceback_limit));
            }
            v
        })
        .collect();
    Ok(Json(json!({ "processes": out })).into_response())
}

async fn kernel_maps(State(daemon): State<Arc<Daemon>>) -> Result<Response, ApiError> {
    let maps = blocking(move || Ok::<_, ApiError>(daemon.kernel_maps())).await?;
    Ok(Json(maps).into_response())
}

async fn process(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let view = blocking(move || daemon.process_adjusted(pid)).await?;
    Ok(Json(view).into_response())
}

async fn pid_traced_memory(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let view = blocking(move || daemon.process_adjusted(pid)).await?;
    Ok(Json(json!({
        "pid": pid,
        "current": view.current,
        "peak": view.peak,
        "blocks": view.blocks,
        "state": view.state,
    }))
    .into_response())
}

async fn system_traced_memory(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), &[])?;
    let list = blocking(move || Ok::<_, ApiError>(daemon.processes_adjusted())).await?;
    let live = list.iter().filter(|(v, _)| v.state == "alive");
    let (current, peak, blocks, count) =
        live.fold((0u64, 0u64, 0u64, 0usize), |(c, p, b, n), (v, _)| {
            (
                c.saturating_add(v.current),
                p.saturating_add(v.peak),
                b.saturating_add(v.blocks),
                n + 1,
            )
        });
    Ok(
        Json(json!({"current": current, "peak": peak, "blocks": blocks, "processes": count}))
            .into_response(),
    )
}

async fn pid_statistics(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(
        query.as_deref(),
        &with_common(&["group_by", "cumulative", "limit"]),
    )?;
    let query = stats_query(&params)?;
    blocking(move || {
        let now = daemon.snapshot_now(Scope::Process(pid))?;
        statistics_response(
            &now.snapshot,
            &now.completeness,
            &query,
            object(json!({"pid": pid, "process": now.process})),
        )
    })
    .await
}

async fn system_statistics(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(
        query.as_deref(),
        &with_common(&["group_by", "cumulative", "limit"]),
    )?;
    let query = stats_query(&params)?;
    blocking(move || {
        let now = daemon.snapshot_now(Scope::System)?;
        let head = object(
            json!({"pids": now.pids, "current": now.traced_memory.0, "peak": now.traced_memory.1}),
        );
        statistics_response(&now.snapshot, &now.completeness, &query, head)
    })
    .await
}

async fn snapshot_statistics(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    let params = Params::parse(
        query.as_deref(),
        &with_common(&["group_by", "cumulative", "limit"]),
    )?;
    let query = stats_query(&params)?;
    blocking(move || {
        let (stored, summary) = daemon.stored(&reference)?;
        statistics_response(
            &stored.snapshot,
            &stored.completeness,
            &query,
            object(json!({"snapshot": summary})),
        )
    })
    .await
}

/// `base`, `since` (exclusive) and `new` of a compare.
fn compare_specs(params: &Params) -> Result<(BaseSpec, Option<SnapshotRef>), ApiError> {
    let base = params.snapshot_ref("base")?;
    let since = params.get("since").map(parse_duration).transpose()?;
    let spec = match (base, since) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad(
                "base and since are given together",
                "give base (a snapshot id or label) or since (e.g. 10m), not both",
            ));
        }
        (Some(reference), None) => BaseSpec::Snapshot(reference),
        (None, Some(ago)) => BaseSpec::Since(ago),
        (None, None) => BaseSpec::Default,
    };
    Ok((spec, params.snapshot_ref("new")?))
}

/// A duration like `90s`, `10m`, `2h`, `1d`, `1h30m`, or plain seconds.
fn parse_duration(raw: &str) -> Result<std::time::Duration, ApiError> {
    let invalid = || {
        ApiError::bad(
            format!("invalid since {raw:?}"),
            "since is a duration: whole numbers with units s, m, h, d (e.g. 90s, 10m, 1h30m), or seconds",
        )
    };
    if raw.is_empty() {
        return Err(invalid());
    }
    if raw.bytes().all(|b| b.is_ascii_digit()) {
        return raw
            .parse::<u64>()
            .map(std::time::Duration::from_secs)
            .map_err(|_| invalid());
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in raw.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(invalid()),
        };
        let n: u64 = number.parse().map_err(|_| invalid())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(invalid)?;
        number.clear();
    }
    if !number.is_empty() {
        return Err(invalid());
    }
    Ok(std::time::Duration::from_secs(total))
}

async fn pid_compare(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(
        query.as_deref(),
        &with_common(&["group_by", "cumulative", "limit", "base", "new", "since"]),
    )?;
    let query = stats_query(&params)?;
    let (base, new) = compare_specs(&params)?;
    blocking(move || {
        let (base, new) = daemon.compare_sides(Scope::Process(pid), &base, new.as_ref())?;
        compare_response(&base, &new, &query, object(json!({"pid": pid})))
    })
    .await
}

async fn system_compare(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(
        query.as_deref(),
        &with_common(&["group_by", "cumulative", "limit", "base", "new", "since"]),
    )?;
    let query = stats_query(&params)?;
    let (base, new) = compare_specs(&params)?;
    blocking(move || {
        let (base, new) = daemon.compare_sides(Scope::System, &base, new.as_ref())?;
        compare_response(&base, &new, &query, serde_json::Map::new())
    })
    .await
}

async fn snapshot_compare(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let new = parse_ref("id", &id)?;
    let params = Params::parse(
        query.as_deref(),
        &with_common(&["group_by", "cumulative", "limit", "base"]),
    )?;
    let query = stats_query(&params)?;
    let base = params.snapshot_ref("base")?.ok_or_else(|| {
        ApiError::bad(
            "base is missing",
            "give base=ID or base=LABEL of the older snapshot (GET /snapshots lists them)",
        )
    })?;
    blocking(move || {
        let (new_stored, new_summary) = daemon.stored(&new)?;
        let (base_stored, base_summary) = daemon.stored(&base)?;
        let side = |s: &crate::store::StoredSnapshot, summary: &crate::store::SnapshotSummary| Side {
            snapshot: Arc::clone(&s.snapshot),
            info: json!({"kind": "snapshot", "id": s.id, "snapshot_kind": summary.kind, "label": summary.label,
                         "taken_at_ms": summary.taken_at_ms}),
            completeness: s.completeness.clone(),
        };
        compare_response(&side(&base_stored, &base_summary), &side(&new_stored, &new_summary), &query, serde_json::Map::new())
    })
    .await
}

const TRACES_PARAMS: [&str; 2] = ["offset", "limit"];

async fn pid_traces(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(query.as_deref(), &with_common(&TRACES_PARAMS))?;
    params.text_options(params.text()?)?;
    blocking(move || {
        let now = daemon.snapshot_now(Scope::Process(pid))?;
        traces_response(
            &now.snapshot,
            &now.completeness,
            &params,
            object(json!({"pid": pid})),
        )
    })
    .await
}

async fn system_traces(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), &with_common(&TRACES_PARAMS))?;
    params.text_options(params.text()?)?;
    blocking(move || {
        let now = daemon.snapshot_now(Scope::System)?;
        traces_response(
            &now.snapshot,
            &now.completeness,
            &params,
            object(json!({"pids": now.pids})),
        )
    })
    .await
}

async fn snapshot_traces(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    let params = Params::parse(query.as_deref(), &with_common(&TRACES_PARAMS))?;
    params.text_options(params.text()?)?;
    blocking(move || {
        let (stored, summary) = daemon.stored(&reference)?;
        traces_response(
            &stored.snapshot,
            &stored.completeness,
            &params,
            object(json!({"snapshot": summary})),
        )
    })
    .await
}

async fn pid_take_snapshot(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(query.as_deref(), &["label"])?;
    let label = params.label()?.flatten();
    let summary = blocking(move || daemon.store_now(Scope::Process(pid), label)).await?;
    Ok((StatusCode::CREATED, Json(summary)).into_response())
}

async fn pid_snapshots(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), &[])?;
    let list = blocking(move || daemon.list_snapshots(Some(pid))).await?;
    Ok(Json(json!({ "pid": pid, "snapshots": list })).into_response())
}

async fn list_snapshots(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), &["pid", "kind"])?;
    let pid = params.get("pid").map(parse_pid).transpose()?;
    let kind = match params.get("kind") {
        None => None,
        Some(k @ ("taken" | "auto" | "loaded")) => Some(k.to_string()),
        Some(k) => {
            return Err(ApiError::bad(
                format!("invalid kind {k:?}"),
                "kind is one of: taken, auto, loaded",
            ));
        }
    };
    let (list, unreadable) = blocking(move || {
        let list = daemon.list_snapshots(None)?;
        Ok::<_, ApiError>((list, daemon.unreadable_snapshots()))
    })
    .await?;
    let list: Vec<_> = list
        .into_iter()
        .filter(|s| pid.is_none_or(|p| s.pid == Some(p)))
        .filter(|s| kind.as_deref().is_none_or(|k| s.kind.as_str() == k))
        .collect();
    Ok(Json(json!({ "snapshots": list, "unreadable": unreadable })).into_response())
}

/// `POST /snapshots`: with no body, takes a system-wide snapshot; with a
/// body, loads that file (`format=tracer`, the default, or `tracemalloc`).
async fn post_snapshots(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), &["label", "format"])?;
    let label = params.label()?.flatten();
    let format = params.get("format");
    let tracemalloc = match format {
        None | Some("tracer") => false,
        Some("tracemalloc") => true,
        Some(v) => {
            return Err(ApiError::bad(
                format!("invalid format {v:?}"),
                "format is one of: tracer, tracemalloc",
            ));
        }
    };
    let summary = if body.is_empty() {
        if format.is_some() {
            return Err(ApiError::bad(
                "format is given but the body is empty",
                "send the snapshot file as the body to load it; an empty body takes a system-wide snapshot",
            ));
        }
        blocking(move || daemon.store_now(Scope::System, label)).await?
    } else {
        blocking(move || daemon.load_snapshot(&body, tracemalloc, label)).await?
    };
    Ok((StatusCode::CREATED, Json(summary)).into_response())
}

async fn snapshot_summary(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    Params::parse(query.as_deref(), &[])?;
    let (_, summary) = blocking(move || daemon.stored(&reference)).await?;
    Ok(Json(summary).into_response())
}

async fn delete_snapshot(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    Params::parse(query.as_deref(), &[])?;
    let summary = blocking(move || daemon.delete_snapshot(&reference)).await?;
    Ok(Json(json!({"deleted": summary})).into_response())
}

async fn label_snapshot(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    let params = Params::parse(query.as_deref(), &["label"])?;
    let label = params.label()?.ok_or_else(|| {
        ApiError::bad(
            "label is missing",
            "PATCH /snapshots/{id}?label=NAME sets a label; label= (empty) removes it",
        )
    })?;
    let summary = blocking(move || daemon.label_snapshot(&reference, label)).await?;
    Ok(Json(summary).into_response())
}

async fn snapshot_dump(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    let params = Params::parse(query.as_deref(), &["format"])?;
    let tracemalloc = match params.get("format") {
        None | Some("tracer") => false,
        Some("tracemalloc") => true,
        Some(v) => {
            return Err(ApiError::bad(
                format!("invalid format {v:?}"),
                "format is one of: tracer, tracemalloc",
            ));
        }
    };
    let (bytes, name) = blocking(move || {
        let (stored, summary) = daemon.stored(&reference)?;
        let bytes = if tracemalloc {
            dump_tracemalloc(&stored.snapshot)
        } else {
            let mut meta = object(json!({
                "id": summary.id, "pid": summary.pid, "kind": summary.kind, "label": summary.label,
                "taken_at_ms": summary.taken_at_ms, "traced_memory": [summary.current, summary.peak],
                "comm": summary.comm,
            }));
            stored.completeness.insert_into(&mut meta);
            encode(&stored.snapshot, &Value::Object(meta))
        };
        let name = format!("snapshot-{}.{}", summary.id, if tracemalloc { "pickle" } else { "tsnap" });
        Ok::<_, ApiError>((bytes, name))
    })
    .await?;
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    Ok(response)
}

async fn pid_clear_traces(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), &[])?;
    let (cleared, view) = blocking(move || {
        let cleared = daemon.clear_traces(pid)?;
        Ok::<_, ViewError>((cleared, daemon.process_adjusted(pid)?))
    })
    .await?;
    Ok(Json(json!({"pid": pid, "cleared_blocks": cleared, "current": view.current, "peak": view.peak, "blocks": view.blocks}))
        .into_response())
}

async fn pid_reset_peak(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), &[])?;
    let view = blocking(move || daemon.reset_peak_of(pid)).await?;
    Ok(Json(json!({"pid": pid, "current": view.current, "peak": view.peak})).into_response())
}

async fn pid_tracing(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), &[])?;
    let state = blocking(move || daemon.tracing_state(Some(pid))).await?;
    Ok(Json(state).into_response())
}

async fn system_tracing(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), &[])?;
    let state = blocking(move || daemon.tracing_state(None)).await?;
    Ok(Json(state).into_response())
}

fn nframe_param(params: &Params) -> Result<Option<u64>, ApiError> {
    params
        .get("nframe")
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                ApiError::bad(format!("invalid nframe {v:?}"), "nframe is a whole number from 1 to tracerd's --nframe (GET /tracing says max_nframe)")
            })
        })
        .transpose()
}

async fn pid_tracing_start(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(query.as_deref(), &["nframe"])?;
    let nframe = nframe_param(&params)?;
    let state = blocking(move || {
        let started = daemon.start_tracing(Some(pid), nframe)?;
        let mut state = daemon.tracing_state(Some(pid))?;
        state["started"] = json!(started);
        Ok::<_, ViewError>(state)
    })
    .await?;
    Ok(Json(state).into_response())
}

async fn pid_tracing_stop(
    State(daemon): State<Arc<Daemon>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), &[])?;
    let state = blocking(move || {
        daemon.stop_tracing(Some(pid))?;
        daemon.tracing_state(Some(pid))
    })
    .await?;
    Ok(Json(state).into_response())
}

async fn system_tracing_start(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), &["nframe"])?;
    let nframe = nframe_param(&params)?;
    let state = blocking(move || {
        let started = daemon.start_tracing(None, nframe)?;
        let mut state = daemon.tracing_state(None)?;
        state["started"] = json!(started);
        Ok::<_, ViewError>(state)
    })
    .await?;
    Ok(Json(state).into_response())
}

async fn system_tracing_stop(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), &[])?;
    let state = blocking(move || {
        daemon.stop_tracing(None)?;
        daemon.tracing_state(None)
    })
    .await?;
    Ok(Json(state).into_response())
}

async fn tracing_memory(
    State(daemon): State<Arc<Daemon>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), &[])?;
    let memory = blocking(move || Ok::<_, ApiError>(daemon.tracer_memory())).await?;
    Ok(Json(memory).into_response())
}

/// An address: `0x` hexadecimal or decimal.
fn parse_address(raw: &str) -> Result<u64, ApiError> {
    let parsed = match raw.strip_prefix("0x").or_else(|| raw.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => raw.parse::<u64>().ok(),
    };
    parsed.ok_or_else(|| {
        ApiError::bad(
            format!("invalid address {raw:?}"),
            "address is where a block starts: 0x-prefixed hexadecimal (e.g. 0x55d0c3a2b2a0) or decimal",
        )
    })
}

async fn pid_object(
    State(daemon): State<Arc<Daemon>>,
    Path((pid, address)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let address = parse_address(&address)?;
    let params = Params::parse(query.as_deref(), &TEXT)?;
    let text = params.text()?;
    let mut options = params.text_options(text)?;
    let trace = blocking(move || daemon.object_traceback(pid, address)).await?;
    if text {
        // get_object_traceback() returns a Traceback: its format() lines.
        options.tracebacks = true;
        let mut lines = Vec::new();
        let mut cache = LineCache::new();
        options.lines(String::new(), &trace.traceback, &mut cache, &mut lines);
        lines.remove(0);
        return Ok(text_response(&lines, &[]));
    }
    Ok(Json(json!({"pid": pid, "address": address, "size": trace.size, "traceback": trace.traceback.as_ref(),
                   "total_nframe": trace.traceback.total_nframe(), "text": trace.to_string()}))
    .into_response())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (STYLE.md).
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
        assert_eq!(
            params.group_by().unwrap_err().hint,
            "group_by is one of: filename, lineno, traceback, function, module"
        );
        assert_eq!(
            params.flag("cumulative").unwrap_err().hint,
            "cumulative is one of: true, false, 1, 0"
        );
        assert_eq!(
            params.limit().unwrap_err().hint,
            "limit is a whole number >= 0 (0 means all)"
        );
        assert_eq!(
            params.text().unwrap_err().hint,
            "format is one of: json, text"
        );
    }

    #[test]
    fn defaults_apply_when_absent() {
        let params = Params::parse(None, &["group_by"]).unwrap();
        assert_eq!(params.group_by().unwrap(), GroupBy::Lineno);
        assert_eq!(params.limit().unwrap(), DEFAULT_LIMIT);
        assert!(!params.flag("cumulative").unwrap());
        assert_eq!(params.snapshot_ref("new").unwrap(), None);
        assert!(params.filters().unwrap().is_empty());
    }

    #[test]
    fn repeated_parameter_is_refused_unless_repeatable() {
        let err = Params::parse(Some("limit=1&limit=2"), &["limit"]).unwrap_err();
        assert_eq!(err.error, "parameter \"limit\" given twice");
        let params =
            Params::parse(Some("include=a.c&include=b.c&domain=1&domain=2"), &FILTERS).unwrap();
        assert_eq!(params.filters().unwrap().len(), 4);
    }

    #[test]
    fn filters_parse_pattern_line_and_domain_from_the_right() {
        assert_eq!(
            parse_filter("include", "/srv/*.c:88@1234").unwrap(),
            ("/srv/*.c".into(), Some(88), Some(1234))
        );
        assert_eq!(
            parse_filter("include", "a.c:12").unwrap(),
            ("a.c".into(), Some(12), None)
        );
        assert_eq!(
            parse_filter("include", "a.c@7").unwrap(),
            ("a.c".into(), None, Some(7))
        );
        assert_eq!(
            parse_filter("include", "lib@2x.c").unwrap(),
            ("lib@2x.c".into(), None, None)
        );
        assert_eq!(
            parse_filter("include", "c:\\x").unwrap(),
            ("c:\\x".into(), None, None)
        );
        assert_eq!(
            parse_filter("exclude", "a.c:").unwrap(),
            ("a.c:".into(), None, None)
        );
        let err = parse_filter("include", "a.c:99999999999").unwrap_err();
        assert_eq!(
            err.error,
            "invalid include \"a.c:99999999999\": the line number does not fit in 32 bits"
        );
        assert!(
            err.hint.starts_with("include is PATTERN[:LINENO][@DOMAIN]"),
            "{}",
            err.hint
        );
        let params = Params::parse(Some("domain=x"), &FILTERS).unwrap();
        assert_eq!(
            params.filters().unwrap_err().hint,
            "domain is a domain (a pid, 0 to 4294967295); repeat it for more"
        );
    }

    #[test]
    fn durations_and_references() {
        assert_eq!(parse_duration("10m").unwrap().as_secs(), 600);
        assert_eq!(parse_duration("1h30m").unwrap().as_secs(), 5400);
        assert_eq!(parse_duration("45").unwrap().as_secs(), 45);
        assert_eq!(parse_duration("2d").unwrap().as_secs(), 172_800);
        for bad in ["", "10x", "m", "10m5", "-1m", "99999999999999999999d"] {
            assert_eq!(
                parse_duration(bad).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        assert_eq!(parse_ref("base", "12").unwrap(), SnapshotRef::Id(12));
        assert_eq!(
            parse_ref("base", "before").unwrap(),
            SnapshotRef::Label("before".into())
        );
        assert_eq!(
            parse_ref("base", "0").unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            parse_ref("base", "a b").unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(parse_address("0x10").unwrap(), 16);
        assert_eq!(parse_address("16").unwrap(), 16);
        assert_eq!(
            parse_address("0xzz").unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn source_needs_text() {
        let params = Params::parse(Some("source=true"), &TEXT).unwrap();
        let err = params.text_options(false).unwrap_err();
        assert_eq!(err.hint, "add format=text (JSON always has every frame)");
        let params = Params::parse(Some("format=text&source=1&tb_limit=-2"), &TEXT).unwrap();
        let options = params.text_options(params.text().unwrap()).unwrap();
        assert_eq!(
            options,
            TextOptions {
                tracebacks: true,
                source: true,
                tb_limit: Some(-2),
                most_recent_first: false
            }
        );
    }

    #[test]
    fn pid_must_be_positive() {
        assert_eq!(parse_pid("12").unwrap(), 12);
        assert_eq!(parse_pid("0").unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(
            parse_pid("abc").unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn every_error_maps_to_its_status() {
        let cases: Vec<(ApiError, u16)> = vec![
            (DaemonError::NotTraced { pid: 1 }.into(), 404),
            (ViewError::TracingStopped { pid: None }.into(), 409),
            (ViewError::NoBlock { pid: 1, address: 2 }.into(), 404),
            (ViewError::BadNframe { nframe: 0, max: 16 }.into(), 400),
            (
                StoreError::LabelTaken {
                    label: "a".into(),
                    id: 1,
                }
                .into(),
                409,
            ),
            (StoreError::LabelNotFound { label: "a".into() }.into(), 404),
            (ModelError::CumulativeTraceback.into(), 400),
        ];
        for (err, status) in cases {
            assert_eq!(err.status.as_u16(), status, "{}", err.error);
            assert!(!err.hint.is_empty(), "{} has no hint", err.error);
        }
    }
}
