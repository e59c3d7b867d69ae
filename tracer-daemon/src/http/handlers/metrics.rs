//! `GET /metrics` (Prometheus, OpenMetrics text) and the middleware that
//! counts every request by route template and status.
use std::{sync::Arc, time::Instant};

use axum::{
    extract::{MatchedPath, RawQuery, Request, State},
    http::{HeaderValue, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use crate::http::{ApiError, blocking, params::Params, params::spec};
use crate::metrics::{CONTENT_TYPE, Metrics};
use crate::service::Viewer;

/// `GET /metrics`: every metric, the per-process series for operators (or
/// anyone with `metrics_public`) only (reads the service: blocks, so off
/// the async threads).
pub async fn scrape(
    State(metrics): State<Arc<Metrics>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(err) = Params::parse(query.as_deref(), spec::NONE) {
        return err.into_response();
    }
    let encoded = blocking(move || {
        metrics.encode(viewer.is_operator()).map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the metrics failed",
                "see tracerd's log",
            )
        })
    })
    .await;
    match encoded {
        Ok(text) => {
            let mut response = text.into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            response
        }
        Err(err) => err.into_response(),
    }
}

/// Middleware counting every request by route template and status. Apply
/// it with `Router::layer` so that [`MatchedPath`] is known.
pub async fn track_requests(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().as_str().to_string();
    let response = next.run(request).await;
    metrics.observe(&route, &method, response.status().as_u16(), start.elapsed());
    response
}
