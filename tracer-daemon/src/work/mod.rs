//! Work that grows with the traced data, run off the async threads,
//! bounded and cancellable: the executor under a request's work (`http`
//! adds its permit, its answer and its status), an automatic snapshot, or
//! any later consumer of the service (an exporter).
//!
//! The work runs on blocking threads (expensive work on threads of its
//! own at a lower priority, [`crate::sys::EXPENSIVE_NICE`], see
//! [`threads`]), with:
//! - a cancel flag ([`WorkState`]), raised when nobody waits for the
//!   answer any more (an [`AbandonOnDrop`] held by whoever waits was
//!   dropped);
//! - a memory budget (bytes): the bytes its thread holds net since the
//!   work began ([`crate::sys::alloc`]).
//!
//! Both are polled through the model's interrupt check
//! ([`tracer_model::interrupt`]), installed on the work's thread by
//! [`run_installed`]: the model's loops, the snapshot build, and each
//! chunk of a streamed answer call it. Once it said stop, it keeps saying
//! so, the work returns early, and [`run_installed`] gives the reason
//! ([`Cancel`]) instead of what the work returned.
use std::{
    cell::RefCell,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, Ordering},
    },
};

use tokio::task::JoinHandle;
use tracer_model::interrupt::{CheckGuard, Interrupted};

use crate::sys::alloc::thread_net_bytes;

pub mod threads;

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

/// Runs `work` on a blocking thread: an expensive route's (it holds a
/// permit) on [`threads::spawn_expensive`]'s threads, any other on
/// tokio's.
pub fn spawn_work<T: Send + 'static>(
    expensive: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    if expensive {
        threads::spawn_expensive(work)
    } else {
        tokio::task::spawn_blocking(work)
    }
}

/// One work's flags, shared by the work and the future (or body) that
/// waits for it.
#[derive(Debug, Default)]
pub struct WorkState {
    /// Raised when nobody waits for the answer any more.
    abandoned: AtomicBool,
    /// The [`Cancel`] the check gave the work (0: none yet); once set it
    /// stays.
    stopped: AtomicU8,
}

impl WorkState {
    /// Records `why` (unless a reason is already recorded) and returns the
    /// one recorded.
    pub fn stop(&self, why: Cancel) -> Cancel {
        match self
            .stopped
            .compare_exchange(0, why.code(), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => why,
            Err(code) => Cancel::of_code(code).unwrap_or(why),
        }
    }

    pub fn stopped(&self) -> Option<Cancel> {
        Cancel::of_code(self.stopped.load(Ordering::Acquire))
    }
}

/// Raises a work's cancel flag when dropped: held by whatever waits for
/// the answer (the request's future, then a streamed body).
#[derive(Debug)]
pub struct AbandonOnDrop(pub Arc<WorkState>);

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

/// Runs `work` on this (blocking) thread as a cancellable work of
/// `budget` bytes (0: none) whose flags are `state`: installed while it
/// runs (its check reads `state` and the thread's bytes).
///
/// # Errors
/// The [`Cancel`] the check gave, when it stopped the work: what the work
/// returned is dropped before this returns.
pub fn run_installed<T>(
    state: &Arc<WorkState>,
    budget: u64,
    work: impl FnOnce() -> T,
) -> Result<T, Cancel> {
    let installed = Installed::new(state.clone(), budget);
    let result = work();
    drop(installed);
    match state.stopped() {
        None => Ok(result),
        Some(why) => {
            drop(result);
            Err(why)
        }
    }
}
