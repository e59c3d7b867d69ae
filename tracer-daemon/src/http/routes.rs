//! The route table: every route once, with its methods (what each takes
//! and answers: [`Op`]), handlers and cost class. It feeds the router
//! ([`api_router`]), the hint of a 404 ([`route_list`]), the concurrency
//! limit ([`cost_of`]), the query parser of each handler (the [`Op::query`]
//! it passes to `Params::parse`) and the OpenAPI description
//! (`GET /openapi.json`, [`super::openapi`]).
use std::sync::{Arc, LazyLock};

use axum::{
    Router,
    extract::DefaultBodyLimit,
    http::StatusCode,
    routing::{MethodRouter, get, post},
};

use super::ApiError;
use super::auth::gate_pid;
use super::handlers::{openapi, scope, snapshots, status, tracing, ui, views};
use super::params::spec::{self, Query};
use crate::service::Service;

/// How much work a route's answer takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// Milliseconds whatever the load: counters, the process list.
    Cheap,
    /// Grows with the traced data (a snapshot, a walk of the live map):
    /// these share the `max_expensive_requests` limit (429 beyond).
    Expensive,
}

/// An HTTP method of a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// GET (and HEAD, which axum answers with it).
    Get,
    /// POST.
    Post,
    /// PUT.
    Put,
    /// PATCH.
    Patch,
    /// DELETE.
    Delete,
}

impl Verb {
    /// Its name, as HTTP writes it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Put => "PUT",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
        }
    }
}

/// Media types of answers.
pub mod media {
    /// JSON (the default answer, and every error).
    pub const JSON: &str = "application/json";
    /// tracemalloc's text lines (`format=text`) and folded stacks
    /// (`format=collapsed`).
    pub const TEXT: &str = "text/plain";
    /// A gzipped pprof profile, a snapshot file.
    pub const OCTETS: &str = "application/octet-stream";
    /// A flame graph.
    pub const SVG: &str = "image/svg+xml";
    /// The web page.
    pub const HTML: &str = "text/html";
    /// The page's script.
    pub const JS: &str = "text/javascript";
    /// The page's style sheet.
    pub const CSS: &str = "text/css";
    /// Prometheus' OpenMetrics text.
    pub const OPENMETRICS: &str = "application/openmetrics-text";
}

/// What one method of a route takes and answers: the one description of
/// it, which the handler's query parser ([`Op::query`]), the 404's hint
/// and `GET /openapi.json` all read.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    /// The method.
    pub method: Verb,
    /// What it does (tracemalloc's equivalent).
    pub summary: &'static str,
    /// The query parameters its handler accepts (it passes this to
    /// `Params::parse`).
    pub query: Query,
    /// Whether it takes a request body (a snapshot file,
    /// `application/octet-stream`; empty is allowed).
    pub body: bool,
    /// Its success status (200, or 201 for what it stores).
    pub ok: u16,
    /// The media types of its success answers.
    pub content: &'static [&'static str],
    /// Error statuses of its own work, beyond those of every route and of
    /// its facts ([`Op::statuses`]): 404 (a `base` that does not exist),
    /// 409 (a state conflict), 507 (the store is full).
    pub refusals: &'static [u16],
    /// Whether only an operator may ask it (403 for anyone else; see
    /// `http::auth::authorize`).
    pub operators: bool,
}

impl Op {
    const fn new(method: Verb, summary: &'static str) -> Self {
        Self {
            method,
            summary,
            query: spec::NONE,
            body: false,
            ok: 200,
            content: &[media::JSON],
            refusals: &[],
            operators: false,
        }
    }

    const fn get(summary: &'static str) -> Self {
        Self::new(Verb::Get, summary)
    }

    const fn post(summary: &'static str) -> Self {
        Self::new(Verb::Post, summary)
    }

    const fn query(self, query: Query) -> Self {
        Self { query, ..self }
    }

    const fn refuses(self, refusals: &'static [u16]) -> Self {
        Self { refusals, ..self }
    }

    const fn answers(self, content: &'static [&'static str]) -> Self {
        Self { content, ..self }
    }

    const fn creates(self) -> Self {
        Self { ok: 201, ..self }
    }

    const fn operators_only(self) -> Self {
        Self {
            operators: true,
            ..self
        }
    }

    const fn takes_file(self) -> Self {
        Self { body: true, ..self }
    }

    /// Every status this method of `route` can answer, ascending: its
    /// success; what every route can (400: its query is parsed; 401: a
    /// token is set and missing; 413: a body over `body_limit_bytes`,
    /// refused before any route reads it; 500; 503: past
    /// `request_timeout_secs`, or tracerd stopping); 403 for an
    /// operators' change; 404 where the path names a process, snapshot,
    /// address or file; 429 for an expensive route (and 413 past
    /// `request_memory_budget`); 408 and 413 where a body is read; and
    /// its [`Op::refusals`].
    #[must_use]
    pub fn statuses(&self, route: &Route) -> Vec<u16> {
        let mut all = vec![self.ok, 400, 401, 413, 500, 503];
        if self.operators {
            all.push(403);
        }
        if route.path.contains('{') {
            all.push(404);
        }
        if route.cost == Expensive {
            all.push(429);
        }
        if self.body {
            all.push(408);
        }
        all.extend_from_slice(self.refusals);
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// One route of the API.
pub struct Route {
    /// The path template, as axum matches it.
    pub path: &'static str,
    /// Its cost class.
    pub cost: Cost,
    /// Its methods, what each takes and answers.
    pub ops: &'static [Op],
    /// Its handlers; `None` for `/metrics`, which `http::server::app`
    /// serves beside the API with the metrics' own state.
    handlers: Option<fn() -> MethodRouter<Arc<Service>>>,
}

impl Route {
    /// Its methods, for the hint: `GET|POST`.
    #[must_use]
    pub fn methods(&self) -> String {
        self.ops
            .iter()
            .map(|op| op.method.as_str())
            .collect::<Vec<_>>()
            .join("|")
    }
}

use Cost::{Cheap, Expensive};

/// What a statistics or compare route answers: JSON, text (tracemalloc's
/// lines, folded stacks), pprof, a flame graph.
const PROFILES: &[&str] = &[media::JSON, media::TEXT, media::OCTETS, media::SVG];
/// What a traces or object route answers: JSON or tracemalloc's text.
const JSON_OR_TEXT: &[&str] = &[media::JSON, media::TEXT];
/// Conflicts of a view of now: tracing stopped, the process ended.
const CONFLICT: &[u16] = &[409];
/// A snapshot being stored: a conflict (tracing stopped, a label in use),
/// or no room (507).
const STORING: &[u16] = &[409, 507];

/// Every route of the API (`/metrics` too, served beside it), in the order
/// `docs/api.md` lists them.
pub static ROUTES: &[Route] = &[
    Route {
        path: "/health",
        cost: Cheap,
        ops: &[Op::get("readiness: probes attached")],
        handlers: Some(|| get(status::health)),
    },
    Route {
        path: "/processes",
        cost: Cheap,
        ops: &[Op::get("the traced processes the caller may see")],
        handlers: Some(|| get(status::processes)),
    },
    Route {
        path: "/maps",
        cost: Expensive,
        ops: &[Op::get("the kernel maps' use, the eBPF counters, the unwind tables")],
        handlers: Some(|| get(status::kernel_maps)),
    },
    Route {
        path: "/pid/{pid}",
        cost: Cheap,
        ops: &[Op::get("one process (live, or its last state once it exited)")],
        handlers: Some(|| get(status::process)),
    },
    Route {
        path: "/pid/{pid}/statistics",
        cost: Expensive,
        ops: &[Op::get("take_snapshot().filter_traces(f).statistics(group_by, cumulative)")
            .query(spec::STATISTICS_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::pid_statistics)),
    },
    Route {
        path: "/pid/{pid}/compare",
        cost: Expensive,
        ops: &[Op::get("new.compare_to(base, group_by, cumulative)")
            .query(spec::COMPARE_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::pid_compare)),
    },
    Route {
        path: "/pid/{pid}/traces",
        cost: Expensive,
        ops: &[Op::get("take_snapshot().traces, paged")
            .query(spec::TRACES_NOW)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::pid_traces)),
    },
    Route {
        path: "/pid/{pid}/snapshots",
        cost: Expensive,
        ops: &[
            Op::get("stored snapshots of the process's current image"),
            Op::post("take_snapshot(), stored")
                .query(spec::TAKE)
                .creates()
                .refuses(STORING),
        ],
        handlers: Some(|| get(snapshots::pid_snapshots).post(snapshots::pid_take_snapshot)),
    },
    Route {
        path: "/pid/{pid}/traced-memory",
        cost: Cheap,
        ops: &[Op::get("get_traced_memory(), and by source")],
        handlers: Some(|| get(status::pid_traced_memory)),
    },
    Route {
        path: "/pid/{pid}/clear-traces",
        cost: Cheap,
        ops: &[Op::post("clear_traces()").operators_only().refuses(CONFLICT)],
        handlers: Some(|| post(tracing::pid_clear_traces)),
    },
    Route {
        path: "/pid/{pid}/reset-peak",
        cost: Cheap,
        ops: &[Op::post("reset_peak()").refuses(CONFLICT)],
        handlers: Some(|| post(tracing::pid_reset_peak)),
    },
    Route {
        path: "/pid/{pid}/tracing",
        cost: Cheap,
        ops: &[Op::get("is_tracing(), get_traceback_limit()")],
        handlers: Some(|| get(tracing::pid_tracing)),
    },
    Route {
        path: "/pid/{pid}/tracing/start",
        cost: Cheap,
        ops: &[Op::post("start(nframe)")
            .query(spec::START)
            .operators_only()
            .refuses(CONFLICT)],
        handlers: Some(|| post(tracing::pid_tracing_start)),
    },
    Route {
        path: "/pid/{pid}/tracing/stop",
        cost: Cheap,
        ops: &[Op::post("stop()").operators_only().refuses(CONFLICT)],
        handlers: Some(|| post(tracing::pid_tracing_stop)),
    },
    Route {
        path: "/pid/{pid}/object/{address}",
        cost: Expensive,
        ops: &[Op::get("get_object_traceback()")
            .query(spec::OBJECT)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
        handlers: Some(|| get(tracing::pid_object)),
    },
    Route {
        path: "/statistics",
        cost: Expensive,
        ops: &[Op::get("statistics of every traced process at once (one domain per pid)")
            .query(spec::STATISTICS_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::system_statistics)),
    },
    Route {
        path: "/compare",
        cost: Expensive,
        ops: &[Op::get("compare, system-wide")
            .query(spec::COMPARE_NOW)
            .answers(PROFILES)
            .refuses(&[404, 409])],
        handlers: Some(|| get(views::system_compare)),
    },
    Route {
        path: "/traces",
        cost: Expensive,
        ops: &[Op::get("every trace of every traced process, paged")
            .query(spec::TRACES_NOW)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::system_traces)),
    },
    Route {
        path: "/traced-memory",
        cost: Cheap,
        ops: &[Op::get("get_traced_memory() summed over live processes")],
        handlers: Some(|| get(status::system_traced_memory)),
    },
    Route {
        path: "/snapshots",
        cost: Expensive,
        ops: &[
            Op::get("every stored snapshot the caller may see").query(spec::LIST),
            Op::post(
                "an empty body: take_snapshot() of every traced process, stored; a file: Snapshot.load() (operators only)",
            )
            .query(spec::TAKE_OR_LOAD)
            .takes_file()
            .creates()
            .operators_only()
            .refuses(STORING),
        ],
        handlers: Some(|| {
            get(snapshots::list_snapshots)
                .post(snapshots::post_snapshots)
                .layer(DefaultBodyLimit::max(snapshots::MAX_UPLOAD_BYTES))
        }),
    },
    Route {
        path: "/snapshots/{id}",
        cost: Expensive,
        ops: &[
            Op::get("the snapshot's summary").refuses(CONFLICT),
            Op::new(Verb::Patch, "set the label (label= empty removes it)")
                .query(spec::RELABEL)
                .refuses(STORING),
            Op::new(Verb::Delete, "forget the snapshot and its file").refuses(CONFLICT),
        ],
        handlers: Some(|| {
            get(snapshots::snapshot_summary)
                .delete(snapshots::delete_snapshot)
                .patch(snapshots::label_snapshot)
        }),
    },
    Route {
        path: "/snapshots/{id}/statistics",
        cost: Expensive,
        ops: &[Op::get("snapshot.filter_traces(f).statistics(group_by, cumulative)")
            .query(spec::STATISTICS_STORED)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::snapshot_statistics)),
    },
    Route {
        path: "/snapshots/{id}/compare",
        cost: Expensive,
        ops: &[Op::get("snapshot.compare_to(base, group_by, cumulative)")
            .query(spec::COMPARE_STORED)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::snapshot_compare)),
    },
    Route {
        path: "/snapshots/{id}/traces",
        cost: Expensive,
        ops: &[Op::get("snapshot.traces, paged")
            .query(spec::TRACES_STORED)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::snapshot_traces)),
    },
    Route {
        path: "/snapshots/{id}/dump",
        cost: Expensive,
        ops: &[Op::get("Snapshot.dump()")
            .query(spec::DUMP)
            .answers(&[media::OCTETS])
            .refuses(CONFLICT)],
        handlers: Some(|| get(snapshots::snapshot_dump)),
    },
    Route {
        path: "/tracing",
        cost: Cheap,
        ops: &[Op::get("is_tracing(), get_traceback_limit() system-wide, and per-process exceptions")],
        handlers: Some(|| get(tracing::system_tracing)),
    },
    Route {
        path: "/tracing/start",
        cost: Cheap,
        ops: &[Op::post("start(nframe) for every process")
            .query(spec::START)
            .operators_only()
            .refuses(CONFLICT)],
        handlers: Some(|| post(tracing::system_tracing_start)),
    },
    Route {
        path: "/tracing/stop",
        cost: Cheap,
        ops: &[Op::post("stop() for every process")
            .operators_only()
            .refuses(CONFLICT)],
        handlers: Some(|| post(tracing::system_tracing_stop)),
    },
    Route {
        path: "/tracing/memory",
        cost: Cheap,
        ops: &[Op::get("get_tracemalloc_memory()")],
        handlers: Some(|| get(status::tracing_memory)),
    },
    Route {
        path: "/scope",
        cost: Cheap,
        ops: &[
            Op::get("which processes are traced"),
            Op::new(Verb::Put, "trace only these processes (none given: every process)")
                .query(spec::SET_SCOPE)
                .operators_only()
                .refuses(CONFLICT),
        ],
        handlers: Some(|| get(scope::get_scope).put(scope::put_scope)),
    },
    Route {
        path: METRICS_PATH,
        cost: Cheap,
        ops: &[Op::get("Prometheus metrics, OpenMetrics text (docs/metrics.md)")
            .answers(&[media::OPENMETRICS])],
        handlers: None,
    },
    Route {
        path: "/ui",
        cost: Cheap,
        ops: &[Op::get("the web page").answers(&[media::HTML])],
        handlers: Some(|| get(ui::page)),
    },
    Route {
        path: "/ui/{asset}",
        cost: Cheap,
        ops: &[Op::get("the web page's files").answers(&[media::HTML, media::JS, media::CSS])],
        handlers: Some(|| get(ui::asset)),
    },
    Route {
        path: OPENAPI_PATH,
        cost: Cheap,
        ops: &[Op::get("this description of the API, OpenAPI 3.1")],
        handlers: Some(|| get(openapi::document)),
    },
];

/// The `/metrics` route, served beside the API with the metrics' own state.
pub const METRICS_PATH: &str = "/metrics";
/// The API's OpenAPI description.
pub const OPENAPI_PATH: &str = "/openapi.json";

/// Every route as `METHODS /path`, for the hint of a 404 or 405.
pub fn route_list() -> &'static str {
    static LIST: LazyLock<String> = LazyLock::new(|| {
        let list: Vec<String> = ROUTES
            .iter()
            .map(|r| format!("{} {}", r.methods(), r.path))
            .collect();
        format!("{} (see docs/api.md, GET {OPENAPI_PATH})", list.join(", "))
    });
    &LIST
}

/// The cost class of a matched route template; a route not in the table
/// (none, or one added by a test) is cheap.
pub fn cost_of(path: &str) -> Cost {
    ROUTES
        .iter()
        .find(|r| r.path == path)
        .map_or(Cheap, |r| r.cost)
}

/// The API's router over a service: every route of [`ROUTES`] (those of
/// a process behind [`gate_pid`]: a process the caller may not see does
/// not exist for them), and a JSON 404 or 405 that lists them.
pub fn api_router(service: Arc<Service>) -> Router {
    ROUTES
        .iter()
        .filter_map(|route| route.handlers.map(|handlers| (route, handlers)))
        .fold(Router::new(), |router, (route, handlers)| {
            let handlers = handlers();
            let handlers = if route.path.starts_with("/pid/{pid}") {
                handlers.route_layer(axum::middleware::from_fn_with_state(
                    service.clone(),
                    gate_pid,
                ))
            } else {
                handlers
            };
            router.route(route.path, handlers)
        })
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(service)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route", route_list())
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
        route_list(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expensive_routes_are_the_data_walking_ones() {
        assert_eq!(cost_of("/pid/{pid}/statistics"), Expensive);
        assert_eq!(cost_of("/pid/{pid}/compare"), Expensive);
        assert_eq!(cost_of("/snapshots/{id}/traces"), Expensive);
        assert_eq!(cost_of("/pid/{pid}/object/{address}"), Expensive);
        assert_eq!(cost_of("/pid/{pid}/traced-memory"), Cheap);
        assert_eq!(cost_of("/metrics"), Cheap);
        assert_eq!(cost_of("/health"), Cheap);
        assert_eq!(cost_of("/scope"), Cheap);
    }

    #[test]
    fn every_route_is_once_in_the_table_and_in_the_hint() {
        let mut paths: Vec<&str> = ROUTES.iter().map(|r| r.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), ROUTES.len());
        for route in ROUTES {
            assert!(route_list().contains(&format!("{} {}", route.methods(), route.path)));
        }
        assert!(route_list().contains("GET /metrics,"));
    }
}
