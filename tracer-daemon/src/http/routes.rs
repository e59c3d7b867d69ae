//! The route table: every route once, with its methods, handlers and cost
//! class. It feeds the router ([`api_router`]), the hint of a 404
//! ([`route_list`]) and the concurrency limit ([`cost_of`]).
use std::sync::{Arc, LazyLock};

use axum::{
    Router,
    extract::DefaultBodyLimit,
    http::StatusCode,
    routing::{MethodRouter, get, post},
};

use super::ApiError;
use super::auth::gate_pid;
use super::handlers::{scope, snapshots, status, tracing, ui, views};
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

/// One route of the API.
pub struct Route {
    /// The path template, as axum matches it.
    pub path: &'static str,
    /// Its methods, for the hint (`GET|POST`).
    pub methods: &'static str,
    /// Its cost class.
    pub cost: Cost,
    /// Its handlers.
    handlers: fn() -> MethodRouter<Arc<Service>>,
}

use Cost::{Cheap, Expensive};

/// Every route of the API (`/metrics` too, served beside it), in the order
/// `docs/api.md` lists them.
pub static ROUTES: &[Route] = &[
    Route {
        path: "/health",
        methods: "GET",
        cost: Cheap,
        handlers: || get(status::health),
    },
    Route {
        path: "/processes",
        methods: "GET",
        cost: Cheap,
        handlers: || get(status::processes),
    },
    Route {
        path: "/maps",
        methods: "GET",
        cost: Expensive,
        handlers: || get(status::kernel_maps),
    },
    Route {
        path: "/pid/{pid}",
        methods: "GET",
        cost: Cheap,
        handlers: || get(status::process),
    },
    Route {
        path: "/pid/{pid}/statistics",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::pid_statistics),
    },
    Route {
        path: "/pid/{pid}/compare",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::pid_compare),
    },
    Route {
        path: "/pid/{pid}/traces",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::pid_traces),
    },
    Route {
        path: "/pid/{pid}/snapshots",
        methods: "GET|POST",
        cost: Expensive,
        handlers: || get(snapshots::pid_snapshots).post(snapshots::pid_take_snapshot),
    },
    Route {
        path: "/pid/{pid}/traced-memory",
        methods: "GET",
        cost: Cheap,
        handlers: || get(status::pid_traced_memory),
    },
    Route {
        path: "/pid/{pid}/clear-traces",
        methods: "POST",
        cost: Cheap,
        handlers: || post(tracing::pid_clear_traces),
    },
    Route {
        path: "/pid/{pid}/reset-peak",
        methods: "POST",
        cost: Cheap,
        handlers: || post(tracing::pid_reset_peak),
    },
    Route {
        path: "/pid/{pid}/tracing",
        methods: "GET",
        cost: Cheap,
        handlers: || get(tracing::pid_tracing),
    },
    Route {
        path: "/pid/{pid}/tracing/start",
        methods: "POST",
        cost: Cheap,
        handlers: || post(tracing::pid_tracing_start),
    },
    Route {
        path: "/pid/{pid}/tracing/stop",
        methods: "POST",
        cost: Cheap,
        handlers: || post(tracing::pid_tracing_stop),
    },
    Route {
        path: "/pid/{pid}/object/{address}",
        methods: "GET",
        cost: Expensive,
        handlers: || get(tracing::pid_object),
    },
    Route {
        path: "/statistics",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::system_statistics),
    },
    Route {
        path: "/compare",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::system_compare),
    },
    Route {
        path: "/traces",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::system_traces),
    },
    Route {
        path: "/traced-memory",
        methods: "GET",
        cost: Cheap,
        handlers: || get(status::system_traced_memory),
    },
    Route {
        path: "/snapshots",
        methods: "GET|POST",
        cost: Expensive,
        handlers: || {
            get(snapshots::list_snapshots)
                .post(snapshots::post_snapshots)
                .layer(DefaultBodyLimit::max(snapshots::MAX_UPLOAD_BYTES))
        },
    },
    Route {
        path: "/snapshots/{id}",
        methods: "GET|PATCH|DELETE",
        cost: Expensive,
        handlers: || {
            get(snapshots::snapshot_summary)
                .delete(snapshots::delete_snapshot)
                .patch(snapshots::label_snapshot)
        },
    },
    Route {
        path: "/snapshots/{id}/statistics",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::snapshot_statistics),
    },
    Route {
        path: "/snapshots/{id}/compare",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::snapshot_compare),
    },
    Route {
        path: "/snapshots/{id}/traces",
        methods: "GET",
        cost: Expensive,
        handlers: || get(views::snapshot_traces),
    },
    Route {
        path: "/snapshots/{id}/dump",
        methods: "GET",
        cost: Expensive,
        handlers: || get(snapshots::snapshot_dump),
    },
    Route {
        path: "/tracing",
        methods: "GET",
        cost: Cheap,
        handlers: || get(tracing::system_tracing),
    },
    Route {
        path: "/tracing/start",
        methods: "POST",
        cost: Cheap,
        handlers: || post(tracing::system_tracing_start),
    },
    Route {
        path: "/tracing/stop",
        methods: "POST",
        cost: Cheap,
        handlers: || post(tracing::system_tracing_stop),
    },
    Route {
        path: "/tracing/memory",
        methods: "GET",
        cost: Cheap,
        handlers: || get(status::tracing_memory),
    },
    Route {
        path: "/scope",
        methods: "GET|PUT",
        cost: Cheap,
        handlers: || get(scope::get_scope).put(scope::put_scope),
    },
    Route {
        path: "/ui",
        methods: "GET",
        cost: Cheap,
        handlers: || get(ui::page),
    },
    Route {
        path: "/ui/{asset}",
        methods: "GET",
        cost: Cheap,
        handlers: || get(ui::asset),
    },
];

/// The `/metrics` route, served beside the API with the metrics' own state.
pub const METRICS_PATH: &str = "/metrics";

/// Every route as `METHODS /path`, for the hint of a 404 or 405.
pub fn route_list() -> &'static str {
    static LIST: LazyLock<String> = LazyLock::new(|| {
        let mut list: Vec<String> = ROUTES
            .iter()
            .map(|r| format!("{} {}", r.methods, r.path))
            .collect();
        list.push(format!("GET {METRICS_PATH}"));
        format!("{} (see docs/api.md)", list.join(", "))
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
        .fold(Router::new(), |router, route| {
            let handlers = (route.handlers)();
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
            assert!(route_list().contains(&format!("{} {},", route.methods, route.path)));
        }
        assert!(route_list().contains("GET /metrics"));
    }
}
