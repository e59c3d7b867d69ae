//! A request's blocking work, bounded and cancellable: [`blocking`] for an
//! answer made whole, [`streamed`] for one written as it is made (the
//! traces, whatever their number, in memory independent of it).
//!
//! The work runs on blocking threads (an expensive route's on threads of
//! its own at a lower priority, [`crate::sys::threads::EXPENSIVE_NICE`], so that
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
use std::{
    cell::RefCell,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, Ordering},
    },
};

use axum::http::StatusCode;
use tokio::task::JoinHandle;
use tracer_model::interrupt::{CheckGuard, Interrupted};

use super::ApiError;
use crate::sys::alloc::thread_net_bytes;

mod admission;
mod stream;

pub use admission::{Admission, Admissions, admit};
pub use stream::{CHUNK_BYTES, CHUNKS_QUEUED, Headers, Sink, streamed};

use admission::current_admission;

/// Why a request's work stopped before its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancel {
    /// Nobody waits for the answer: the client left, or the request ran
    /// past `request_timeout_secs` (it was answered 503), or a streamed
    /// answer's reader stalled for as long.
    Abandoned,
    /// The work held more than `request_memory_budget` bytes.
    MemoryBudget,
}

impl Cancel {
    /// The `reason` label of `tracer_requests_cancelled_total`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Abandoned => "abandoned",
            Self::MemoryBudget => "memory_budget",
        }
    }

    fn code(self) -> u8 {
        match self {
            Self::Abandoned => 1,
            Self::MemoryBudget => 2,
        }
    }

    fn of_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Abandoned),
            2 => Some(Self::MemoryBudget),
            _ => None,
        }
    }
}

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

/// Runs `work` on a blocking thread: an expensive route's (it holds a
/// permit) on [`crate::sys::threads::spawn_expensive`]'s threads, any other on
/// tokio's.
fn spawn_work<T: Send + 'static>(
    expensive: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    if expensive {
        crate::sys::threads::spawn_expensive(work)
    } else {
        tokio::task::spawn_blocking(work)
    }
}

/// One work's flags, shared by the work and the future (or body) that
/// waits for it.
#[derive(Debug, Default)]
struct WorkState {
    /// Raised when nobody waits for the answer any more.
    abandoned: AtomicBool,
    /// The [`Cancel`] the check gave the work (0: none yet); once set it
    /// stays.
    stopped: AtomicU8,
}

impl WorkState {
    /// Records `why` (unless a reason is already recorded) and returns the
    /// one recorded.
    fn stop(&self, why: Cancel) -> Cancel {
        match self
            .stopped
            .compare_exchange(0, why.code(), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => why,
            Err(code) => Cancel::of_code(code).unwrap_or(why),
        }
    }

    fn stopped(&self) -> Option<Cancel> {
        Cancel::of_code(self.stopped.load(Ordering::Acquire))
    }
}

/// Raises a work's cancel flag when dropped: held by whatever waits for
/// the answer (the request's future, then a streamed body).
#[derive(Debug)]
struct AbandonOnDrop(Arc<WorkState>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.abandoned.store(true, Ordering::Release);
    }
}

/// The work on the current thread: what its check reads.
struct Current {
    state: Arc<WorkState>,
    /// The thread's net bytes when the work began.
    start: i64,
    budget: u64,
}

thread_local! {
    static CURRENT: RefCell<Option<Current>> = const { RefCell::new(None) };
}

impl Current {
    fn check(&self) -> Result<(), Interrupted> {
        let why = if let Some(why) = self.state.stopped() {
            why
        } else if self.state.abandoned.load(Ordering::Acquire) {
            self.state.stop(Cancel::Abandoned)
        } else if self.budget > 0 && self.held() > i64::try_from(self.budget).unwrap_or(i64::MAX) {
            self.state.stop(Cancel::MemoryBudget)
        } else {
            return Ok(());
        };
        Err(Interrupted {
            reason: match why {
                Cancel::Abandoned => "nobody waits for the answer".to_string(),
                Cancel::MemoryBudget => format!(
                    "the request went past its memory budget of {} bytes",
                    self.budget
                ),
            },
        })
    }

    /// Bytes the work's thread holds net since the work began.
    fn held(&self) -> i64 {
        thread_net_bytes().wrapping_sub(self.start)
    }
}

/// The model's interrupt check for the work on this thread.
fn check_current() -> Result<(), Interrupted> {
    CURRENT.with_borrow(|current| current.as_ref().map_or(Ok(()), Current::check))
}

/// Keeps a work installed on its thread (its [`Current`] and the model's
/// check); both go when dropped, even on a panic (the blocking threads are
/// reused).
struct Installed {
    _check: CheckGuard,
}

impl Installed {
    fn new(state: Arc<WorkState>, budget: u64) -> Self {
        CURRENT.set(Some(Current {
            state,
            start: thread_net_bytes(),
            budget,
        }));
        Self {
            _check: CheckGuard::install(check_current),
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        CURRENT.set(None);
    }
}

/// Runs `work` on this (blocking) thread as the request's work: installed,
/// holding the permit; if the check stopped it, its result is replaced by
/// the reason (counted and logged).
fn run<T>(
    admission: Admission,
    state: Arc<WorkState>,
    work: impl FnOnce() -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let Admission {
        permit,
        budget,
        metrics,
        ..
    } = admission;
    let installed = Installed::new(state.clone(), budget);
    let result = work();
    drop(installed);
    let Some(why) = state.stopped() else {
        drop(permit);
        return result;
    };
    // What the work made is dropped here, before its permit goes back.
    drop(result);
    drop(permit);
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
        run(admission, state, || work().map_err(Into::into))
    });
    match task.await {
        Ok(result) => result,
        Err(err) => Err(ApiError::internal(err)),
    }
}

#[cfg(test)]
mod tests;
