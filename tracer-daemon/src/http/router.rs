//! The API's router: the handlers of every route of the table
//! ([`ROUTES`], which names no handler, so that what reads it, the hint
//! of an error, the admission of expensive work and the OpenAPI
//! description, sits below the handlers), those of a process behind
//! [`gate_pid`], and a JSON 404 or 405 that lists the routes.
use std::sync::Arc;

use axum::{
    Router,
    extract::DefaultBodyLimit,
    http::StatusCode,
    routing::{MethodRouter, get, post},
};

use super::auth::gate_pid;
use super::error::ApiError;
use super::handlers::{control, openapi, scope, snapshots, status, ui, views};
use super::routes::{MAX_UPLOAD_BYTES, OPENAPI_PATH, ROUTES, route_list};
use crate::service::Service;

/// The handlers of a route's methods, made when the router is.
type Handlers = fn() -> MethodRouter<Arc<Service>>;

/// The handlers of every route of [`ROUTES`] by path, in its order; all
/// but `/metrics`, which `http::server::app` serves beside the API with
/// the metrics' own state.
static HANDLERS: &[(&str, Handlers)] = &[
    ("/health", || get(status::health)),
    ("/processes", || get(status::processes)),
    ("/maps", || get(status::kernel_maps)),
    ("/pid/{pid}", || get(status::process)),
    ("/pid/{pid}/statistics", || get(views::statistics)),
    ("/pid/{pid}/compare", || get(views::compare)),
    ("/pid/{pid}/traces", || get(views::traces)),
    ("/pid/{pid}/snapshots", || {
        get(snapshots::pid_snapshots).post(snapshots::pid_take_snapshot)
    }),
    ("/pid/{pid}/traced-memory", || {
        get(status::pid_traced_memory)
    }),
    ("/pid/{pid}/clear-traces", || {
        post(control::pid_clear_traces)
    }),
    ("/pid/{pid}/reset-peak", || post(control::pid_reset_peak)),
    ("/pid/{pid}/tracing", || get(control::pid_tracing)),
    ("/pid/{pid}/tracing/start", || {
        post(control::pid_tracing_start)
    }),
    ("/pid/{pid}/tracing/stop", || {
        post(control::pid_tracing_stop)
    }),
    ("/pid/{pid}/object/{address}", || get(control::pid_object)),
    ("/statistics", || get(views::statistics)),
    ("/compare", || get(views::compare)),
    ("/traces", || get(views::traces)),
    ("/traced-memory", || get(status::system_traced_memory)),
    ("/snapshots", || {
        get(snapshots::list_snapshots)
            .post(snapshots::post_snapshots)
            .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES))
    }),
    ("/snapshots/{id}", || {
        get(snapshots::snapshot_summary)
            .delete(snapshots::delete_snapshot)
            .patch(snapshots::label_snapshot)
    }),
    ("/snapshots/{id}/statistics", || get(views::statistics)),
    ("/snapshots/{id}/compare", || get(views::compare)),
    ("/snapshots/{id}/traces", || get(views::traces)),
    ("/snapshots/{id}/dump", || get(snapshots::snapshot_dump)),
    ("/tracing", || get(control::system_tracing)),
    ("/tracing/start", || post(control::system_tracing_start)),
    ("/tracing/stop", || post(control::system_tracing_stop)),
    ("/tracing/memory", || get(status::tracing_memory)),
    ("/scope", || get(scope::get_scope).put(scope::put_scope)),
    ("/ui", || get(ui::page)),
    ("/ui/{asset}", || get(ui::asset)),
    (OPENAPI_PATH, || get(openapi::document)),
];

/// The handlers of the route `path`, if the API serves it.
fn handlers_of(path: &str) -> Option<Handlers> {
    HANDLERS
        .iter()
        .find(|(served, _)| *served == path)
        .map(|(_, handlers)| *handlers)
}

/// The API's router over a service: every route of [`ROUTES`] (those of
/// a process behind [`gate_pid`]: a process the caller may not see does
/// not exist for them), and a JSON 404 or 405 that lists them.
pub fn api_router(service: Arc<Service>) -> Router {
    ROUTES
        .iter()
        .filter_map(|route| handlers_of(route.path).map(|handlers| (route, handlers)))
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
    use crate::http::routes::METRICS_PATH;

    #[test]
    fn every_route_of_the_table_but_metrics_has_handlers_once_in_its_order() {
        let served: Vec<&str> = HANDLERS.iter().map(|(path, _)| *path).collect();
        let table: Vec<&str> = ROUTES
            .iter()
            .map(|route| route.path)
            .filter(|path| *path != METRICS_PATH)
            .collect();
        assert_eq!(served, table);
    }
}
