//! Admission of a request's work: an expensive route's permit (or 429),
//! and the budget and stall bound every work gets, kept for the request's
//! future in a task-local.
use std::{sync::Arc, time::Duration};

use axum::{
    extract::{MatchedPath, Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::ApiError;
use crate::http::routes::{Cost, cost_of};
use crate::metrics::Metrics;

/// What the middleware [`admit`] gives the work of one request.
#[derive(Clone, Debug, Default)]
pub struct Admission {
    /// An expensive route's permit (None for a cheap route): held until
    /// the request and every work it started have ended.
    pub(super) permit: Option<Arc<OwnedSemaphorePermit>>,
    /// Bytes the work may hold (`request_memory_budget`); 0: no budget.
    pub(super) budget: u64,
    /// How long a streamed answer may wait for its reader before the
    /// request is taken as abandoned (`request_timeout_secs`).
    pub(super) stall: Duration,
    /// Where cancellations are counted.
    pub(super) metrics: Option<Arc<Metrics>>,
}

tokio::task_local! {
    /// The admission of the request whose future is being polled.
    static ADMISSION: Admission;
}

/// The admission of the current request; a default one (no permit, no
/// budget) outside any (a handler called directly in a test).
pub(super) fn current_admission() -> Admission {
    ADMISSION.try_with(Admission::clone).unwrap_or_default()
}

/// What [`admit`] needs: the permits of the expensive routes, the budget
/// and stall bound of every work, the metrics that count cancellations.
#[derive(Debug)]
pub struct Admissions {
    /// `max_expensive_requests` permits.
    pub permits: Arc<Semaphore>,
    /// `request_memory_budget` in bytes (0: none).
    pub budget: u64,
    /// `request_timeout_secs`, the longest wait of a streamed answer for
    /// its reader.
    pub stall: Duration,
    /// Counts `tracer_requests_cancelled_total`.
    pub metrics: Arc<Metrics>,
}

/// Middleware: an expensive route (see [`Cost`]) beyond
/// `max_expensive_requests` running at once gets 429 (with
/// `Retry-After: 1`); every request's work gets its budget, and an
/// expensive one its permit, which the work holds until it ends (see the
/// module's doc).
pub async fn admit(
    State(admissions): State<Arc<Admissions>>,
    request: Request,
    next: Next,
) -> Response {
    let expensive = request
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|p| cost_of(p.as_str()) == Cost::Expensive);
    let permit = if expensive {
        match admissions.permits.clone().try_acquire_owned() {
            Ok(permit) => Some(Arc::new(permit)),
            Err(_) => return too_many(),
        }
    } else {
        None
    };
    let admission = Admission {
        permit,
        budget: admissions.budget,
        stall: admissions.stall,
        metrics: Some(admissions.metrics.clone()),
    };
    ADMISSION.scope(admission, next.run(request)).await
}

fn too_many() -> Response {
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too many expensive requests at once",
        "statistics, compare, snapshot and trace requests share max_expensive_requests; retry in a moment",
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}
