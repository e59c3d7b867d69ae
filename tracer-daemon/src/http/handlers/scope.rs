//! `GET /scope` and `PUT /scope?pid=N&exe=PATH&cgroup=PATH` (each
//! repeatable; none: trace every process).
use std::sync::Arc;

use axum::{
    Json,
    extract::{RawQuery, State},
    response::{IntoResponse, Response},
};

use crate::http::params::{Params, parse_scope, spec};
use crate::http::{ApiError, blocking};
use crate::service::{Service, Viewer};

/// `GET /scope`: the scope and what is attached for it.
pub async fn get_scope(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let view = blocking(move || Ok::<_, ApiError>(service.scope(viewer))).await?;
    Ok(Json(view.wire()).into_response())
}

/// `PUT /scope`: sets the scope and attaches accordingly.
pub async fn put_scope(
    State(service): State<Arc<Service>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let scope = parse_scope(query.as_deref())?;
    let view = blocking(move || {
        service.set_scope(scope)?;
        Ok::<_, ApiError>(service.scope(Viewer::Operator))
    })
    .await?;
    Ok(Json(view.wire()).into_response())
}
