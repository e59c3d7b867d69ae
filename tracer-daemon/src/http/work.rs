//! A request's blocking work, bounded and cancellable: [`blocking`] for an
//! answer made whole, [`streamed`] for one written as it is made (the
//! traces, whatever their number, in memory independent of it).
//!
//! The work runs on blocking threads (an expensive route's on threads of
//! its own at a lower priority, [`crate::sys::EXPENSIVE_NICE`], so that
//! a cheap route gets a CPU first), with:
//! - its route's permit ([`admit`]): an expensive route's permit is held
//!   by the work, not by the connection, and is given back only when the
//!   work ends, so that `max_expensive_requests` counts running work;
//! - a cancel flag, raised when nobody waits for the answer any more:
//!   hyper dropped the request's future (the client left) or the request
//!   timed out (its 503 was sent), or a streamed body was dropped;
//! - a memory budget (`request_memory_budget`, bytes): the bytes its
//!   thread holds net since the work began ([`crate::sys::alloc`]).
//!
//! Both are polled through the model's interrupt check
//! ([`tracer_model::interrupt`]), installed on the work's thread: the
//! model's loops, the snapshot build, and each chunk of a streamed answer
//! call it. Once it said stop, it keeps saying so, the work returns early,
//! and what it returned is replaced by the reason: the budget's 413 (with
//! a hint to ask for less), or nothing for nobody (the abandoned request).
//! Each is logged at debug and counted in
//! `tracer_requests_cancelled_total{reason}`.
//!
//! The executor under it (the threads, the cancel flag, the budget's
//! check) is [`crate::work`]; this adds the route's permit, the answer's
//! status and the metrics.
use std::sync::Arc;

use axum::http::StatusCode;

use super::ApiError;
use crate::work::{AbandonOnDrop, Cancel, WorkState, run_installed, spawn_work};

mod admission;
mod stream;

pub use admission::{Admission, Admissions, admit};
pub use stream::{CHUNK_BYTES, CHUNKS_QUEUED, Headers, Sink, streamed};

use admission::current_admission;

/// The answer to a request stopped at its memory budget of `budget` bytes:
/// 413, with the ways to ask for less.
#[must_use]
pub fn over_budget(budget: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the answer needs more than the request memory budget of {budget} bytes"),
        "ask for less: page the traces with limit= and offset=, narrow them with filters \
         (filename=, lineno=, allocator=, domain=, ...; exclude_ for the opposite), take text \
         with format=text, or ask an operator to raise request_memory_budget",
    )
}

/// Runs `work` on this (blocking) thread as the request's work: installed,
/// holding the permit; if the check stopped it, its result is replaced by
/// the reason (counted and logged).
fn run<T>(
    admission: Admission,
    state: &Arc<WorkState>,
    work: impl FnOnce() -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let Admission {
        permit,
        budget,
        metrics,
        ..
    } = admission;
    // What a stopped work made is dropped in there, before its permit
    // goes back.
    let outcome = run_installed(state, budget, work);
    drop(permit);
    let why = match outcome {
        Ok(result) => return result,
        Err(why) => why,
    };
    tracing::debug!(reason = why.label(), "a request's work stopped early");
    if let Some(metrics) = metrics {
        metrics.cancelled(why.label());
    }
    Err(match why {
        Cancel::MemoryBudget => over_budget(budget),
        Cancel::Abandoned => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the request was abandoned",
            "nobody reads this answer",
        ),
    })
}

/// Runs a request's blocking service work off the async threads (see the
/// module's doc: permit, cancel flag, memory budget); its error becomes an
/// [`ApiError`], a panic a 500.
///
/// # Errors
/// The work's error; 413 when it went past the memory budget; a 500 if it
/// panicked.
pub async fn blocking<T: Send + 'static, E: Into<ApiError> + Send + 'static>(
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    let admission = current_admission();
    let state = Arc::new(WorkState::default());
    let _abandon = AbandonOnDrop(state.clone());
    let task = spawn_work(admission.permit.is_some(), move || {
        run(admission, &state, || work().map_err(Into::into))
    });
    match task.await {
        Ok(result) => result,
        Err(err) => Err(ApiError::internal(err)),
    }
}

#[cfg(test)]
mod tests;
