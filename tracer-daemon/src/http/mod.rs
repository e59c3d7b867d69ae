//! HTTP: the only module that imports axum. tracemalloc's module functions
//! as routes over the [`Service`](crate::service::Service), and
//! `/metrics`, served safely.
//!
//! - [`routes`]: the one route table (404 hint, cost class, each method's
//!   parameters and statuses), naming no handler.
//! - [`router`]: each route's handlers, and the JSON 404 and 405.
//! - [`openapi`]: the OpenAPI description (`GET /openapi.json`), from it.
//! - [`handlers`]: one file per family of routes.
//! - [`params`]: query and path parsing (400s that name the valid values).
//! - [`render`]: JSON and tracemalloc's text.
//! - [`error`]: every error to its status, in one place.
//! - [`server`], [`connections`], [`limits`], [`auth`]: listeners and
//!   their connections, limits, bearer tokens.
//! - [`work`]: every route's blocking work, holding its permit, stopped
//!   when nobody waits for it or past its memory budget, and the answers
//!   streamed as they are written.
//!
//! Statistics, compare and traces routes exist per process
//! (`/pid/{pid}/...`), system-wide (`/statistics`, every traced process, one
//! domain per pid) and per stored snapshot (`/snapshots/{id}/...`), and all
//! take the filters of `Snapshot.filter_traces()`. The table of routes with
//! every parameter is `docs/api.md`.
pub mod auth;
pub mod connections;
pub mod error;
pub mod handlers;
pub mod limits;
pub mod openapi;
pub mod params;
pub mod render;
pub mod router;
pub mod routes;
pub mod server;
pub mod work;

#[cfg(test)]
mod tests;

pub use auth::{Caller, Operators, Token, TokenError};
pub use connections::Connections;
pub use error::ApiError;
pub use limits::Limits;
pub use router::api_router;
pub use server::{ServerError, app, bind_tcp, bind_unix, serve};
pub use work::{blocking, streamed};

/// An answer of the typed API that tracerd built as a `json!` object
/// before: sent through a [`serde_json::Value`] (`tracer_api::to_wire`),
/// so its keys are sorted at every level, as they were.
///
/// # Errors
/// 500 when it does not serialize (never: the API's types have string
/// keys and UTF-8 text).
pub fn wire<T: serde::Serialize>(value: &T) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let value = tracer_api::to_wire(value)
        .map_err(|err| ApiError::internal(format!("encoding the answer: {err}")))?;
    Ok(axum::Json(value).into_response())
}
