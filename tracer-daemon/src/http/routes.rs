//! The route table: every route once, with its methods (what each takes
//! and answers: [`Op`]) and cost class. It feeds the router
//! ([`super::router`], which gives each path its handlers), the hint of a 404
//! ([`route_list`]), the concurrency limit ([`cost_of`]), the query parser
//! of each handler (the [`Op::query`] it passes to `Params::parse`) and the
//! OpenAPI description (`GET /openapi.json`, [`super::openapi`]). It names no
//! handler, so that the errors and the admission of work below the
//! handlers read it. The table itself, [`ROUTES`], is in `table`; here the
//! shapes of its entries and what is made of it.
use std::sync::LazyLock;

use super::params::spec::{self, Query};

mod table;

pub use table::ROUTES;

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

/// The `/metrics` route, served beside the API with the metrics' own state.
pub const METRICS_PATH: &str = "/metrics";
/// The API's OpenAPI description.
pub const OPENAPI_PATH: &str = "/openapi.json";
/// Largest snapshot file accepted by `POST /snapshots`, in bytes.
pub const MAX_UPLOAD_BYTES: usize = 1 << 30;

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
