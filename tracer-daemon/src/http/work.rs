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
    io::Write,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::{MatchedPath, Request, State},
    http::{HeaderName, HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot},
    task::JoinHandle,
};
use tracer_model::interrupt::{CheckGuard, Interrupted};

use super::ApiError;
use super::routes::{Cost, cost_of};
use crate::metrics::Metrics;
use crate::sys::alloc::{handed_off, thread_net_bytes};

/// Bytes of a streamed answer's chunk: the writer hands a chunk to the
/// connection once it holds this many.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Chunks of a streamed answer waiting for the connection at most: the
/// work waits while they are full (so a streamed answer holds at most
/// about `CHUNKS_QUEUED + 1` chunks of [`CHUNK_BYTES`], whatever its
/// length).
pub const CHUNKS_QUEUED: usize = 4;

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

/// What the middleware [`admit`] gives the work of one request.
#[derive(Clone, Debug, Default)]
pub struct Admission {
    /// An expensive route's permit (None for a cheap route): held until
    /// the request and every work it started have ended.
    permit: Option<Arc<OwnedSemaphorePermit>>,
    /// Bytes the work may hold (`request_memory_budget`); 0: no budget.
    budget: u64,
    /// How long a streamed answer may wait for its reader before the
    /// request is taken as abandoned (`request_timeout_secs`).
    stall: Duration,
    /// Where cancellations are counted.
    metrics: Option<Arc<Metrics>>,
}

tokio::task_local! {
    /// The admission of the request whose future is being polled.
    static ADMISSION: Admission;
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

/// The admission of the current request; a default one (no permit, no
/// budget) outside any (a handler called directly in a test).
fn current_admission() -> Admission {
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

/// The headers of a streamed answer's head.
pub type Headers = Vec<(HeaderName, HeaderValue)>;

/// Where a streamed answer is written: an [`std::io::Write`] that hands
/// the connection a chunk of [`CHUNK_BYTES`] at a time. The head (200 and
/// `headers`) goes with [`Sink::begin`]; before it, the work may still
/// fail with any status.
pub struct Sink {
    head: Option<oneshot::Sender<Result<Headers, ApiError>>>,
    chunks: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buffer: Vec<u8>,
    state: Arc<WorkState>,
    stall: Duration,
    /// The runtime whose tasks read the chunks (the server's; its workers
    /// drive the timer of a wait for room), which the work's thread, one
    /// of another runtime's blocking threads when the route is expensive,
    /// blocks on.
    runtime: tokio::runtime::Handle,
}

impl Sink {
    /// Sends the head: status 200 with `headers`. Only the first call
    /// counts.
    pub fn begin(&mut self, headers: Headers) {
        if let Some(head) = self.head.take() {
            // A dropped receiver: the request's future is gone, which the
            // next chunk finds out.
            let _ = head.send(Ok(headers));
        }
    }

    /// Hands the buffered bytes to the connection, after asking the check
    /// whether to go on. Waits while [`CHUNKS_QUEUED`] chunks wait, at most
    /// `stall`.
    fn send(&mut self) -> std::io::Result<()> {
        tracer_model::interrupt::check().map_err(std::io::Error::other)?;
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES));
        let bytes = chunk.capacity();
        if self.push(Ok(Bytes::from(chunk))) {
            // The connection's task frees it.
            handed_off(bytes);
            Ok(())
        } else {
            self.state.stop(Cancel::Abandoned);
            Err(std::io::Error::other("nobody reads the answer"))
        }
    }

    /// Queues `item` for the connection, waiting at most `stall` while
    /// [`CHUNKS_QUEUED`] wait; false when nobody takes it.
    fn push(&self, item: Result<Bytes, std::io::Error>) -> bool {
        match self.chunks.try_send(item) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(item)) => {
                // On a blocking thread: waiting on a runtime is allowed
                // there.
                self.runtime
                    .block_on(self.chunks.send_timeout(item, self.stall))
                    .is_ok()
            }
        }
    }

    /// Ends the answer with its last chunk.
    fn finish(&mut self) -> std::io::Result<()> {
        self.send()
    }

    /// Ends the answer with `error`: as the answer when the head is not
    /// sent yet; else the body stops with an error, and the connection is
    /// cut (the client sees a truncated answer, never a short one that
    /// looks whole).
    fn fail(&mut self, error: ApiError) {
        match self.head.take() {
            Some(head) => {
                let _ = head.send(Err(error));
            }
            None => {
                self.push(Err(std::io::Error::other(error.error)));
            }
        }
    }
}

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A streamed answer's body: the chunks the work sends; dropping it (the
/// connection closed) raises the work's cancel flag.
struct Streamed {
    chunks: mpsc::Receiver<Result<Bytes, std::io::Error>>,
    _abandon: AbandonOnDrop,
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| chunk.map(http_body::Frame::data)))
    }
}

/// Runs a request's blocking work that writes its answer into a [`Sink`]
/// as it makes it (see the module's doc): the answer is 200 with the
/// headers of [`Sink::begin`] and what was written, sent as it comes, or
/// the work's error if it failed before `begin`.
///
/// # Errors
/// The work's error before its head; 413 when it went past the memory
/// budget before its head; a 500 if it panicked.
pub async fn streamed(
    work: impl FnOnce(&mut Sink) -> Result<(), ApiError> + Send + 'static,
) -> Result<Response, ApiError> {
    let admission = current_admission();
    let state = Arc::new(WorkState::default());
    let abandon = AbandonOnDrop(state.clone());
    let (head_tx, head_rx) = oneshot::channel();
    let (chunks_tx, chunks_rx) = mpsc::channel(CHUNKS_QUEUED);
    let stall = admission.stall;
    let runtime = tokio::runtime::Handle::current();
    let task = spawn_work(admission.permit.is_some(), move || {
        let mut sink = Sink {
            head: Some(head_tx),
            chunks: chunks_tx,
            buffer: Vec::with_capacity(CHUNK_BYTES),
            state: state.clone(),
            stall: if stall.is_zero() {
                Duration::from_secs(30)
            } else {
                stall
            },
            runtime,
        };
        let result = run(admission, state, || {
            work(&mut sink)?;
            sink.finish().map_err(ApiError::internal)
        });
        if let Err(error) = result {
            sink.fail(error);
        }
    });
    match head_rx.await {
        Ok(Ok(headers)) => {
            let mut response = Body::new(Streamed {
                chunks: chunks_rx,
                _abandon: abandon,
            })
            .into_response();
            for (name, value) in headers {
                response.headers_mut().insert(name, value);
            }
            Ok(response)
        }
        Ok(Err(error)) => Err(error),
        // The work ended without a head: it panicked.
        Err(_) => Err(match task.await {
            Err(err) => ApiError::internal(err),
            Ok(()) => ApiError::internal("the answer ended before it began"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::mpsc as std_mpsc};

    use axum::{
        Router,
        body::Body,
        extract::{Query, Request},
        routing::get,
    };
    use tower::ServiceExt as _;

    use super::*;
    use crate::http::{Limits, Operators, app};
    use crate::service::ServiceError;

    fn limits(budget: u64) -> Limits {
        Limits {
            body_limit_bytes: 1024,
            request_timeout: Duration::from_secs(30),
            request_read_timeout: Duration::from_secs(10),
            max_expensive_requests: 1,
            request_memory_budget: budget,
        }
    }

    /// `routes` behind every layer of tracerd, with its metrics.
    fn surface(routes: Router, budget: u64) -> (Router, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let app = app(
            routes,
            metrics.clone(),
            &limits(budget),
            None,
            Arc::new(Operators::named("tracer")),
        );
        (app, metrics)
    }

    fn get_request(uri: &str) -> Request {
        Request::builder()
            .uri(uri)
            .body(Body::empty())
            .expect("request")
    }

    async fn call(app: &Router, uri: &str) -> (StatusCode, Vec<u8>) {
        let response = app
            .clone()
            .oneshot(get_request(uri))
            .await
            .expect("infallible");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 30)
            .await
            .expect("body");
        (status, body.to_vec())
    }

    /// The value of `tracer_requests_cancelled_total{reason}`, 0 when
    /// absent.
    fn cancelled(metrics: &Metrics, reason: &str) -> u64 {
        let text = metrics.encode(true).expect("encode");
        let series = format!("tracer_requests_cancelled_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    }

    /// Waits (at most 5 s) until `tracer_requests_cancelled_total{reason}`
    /// is `expected` (the work counts itself as it returns, after what
    /// the test saw of it); returns the last value read.
    async fn cancelled_after(metrics: &Metrics, reason: &str, expected: u64) -> u64 {
        for _ in 0..500 {
            if cancelled(metrics, reason) == expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancelled(metrics, reason)
    }

    fn stopped(err: Interrupted) -> ApiError {
        ServiceError::from(err).into()
    }

    #[tokio::test]
    async fn work_past_its_memory_budget_stops_at_once_and_is_a_413_that_says_how_to_ask_for_less()
    {
        let steps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = steps.clone();
        // 64 KiB more at each step, the check polled at each: 16 of them
        // are 1 MiB, and with the Vec that holds them, past it.
        let route = Router::new().route(
            "/pid/{pid}/statistics",
            get(move || {
                let steps = counted.clone();
                async move {
                    blocking(move || {
                        let mut held = Vec::new();
                        loop {
                            held.push(vec![1u8; 64 * 1024]);
                            steps.fetch_add(1, Ordering::SeqCst);
                            tracer_model::interrupt::check().map_err(stopped)?;
                            if held.len() == 1000 {
                                return Ok::<_, ApiError>("done");
                            }
                        }
                    })
                    .await
                }
            }),
        );
        let (app, metrics) = surface(route, 1 << 20);
        let (status, body) = call(&app, "/pid/1/statistics").await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            body,
            serde_json::json!({
                "error": "the answer needs more than the request memory budget of 1048576 bytes",
                "hint": "ask for less: page the traces with limit= and offset=, narrow them with \
                         filters (filename=, lineno=, allocator=, domain=, ...; exclude_ for the \
                         opposite), take text with format=text, or ask an operator to raise \
                         request_memory_budget",
            })
        );
        assert_eq!(steps.load(Ordering::SeqCst), 16);
        assert_eq!(cancelled(&metrics, "memory_budget"), 1);
        assert_eq!(cancelled(&metrics, "abandoned"), 0);
    }

    #[tokio::test]
    async fn an_abandoned_request_stops_its_work_which_holds_the_permit_until_it_ends() {
        // The work of `?hold` waits for the test's word (so that it cannot
        // see its request go), then polls the check until told to stop.
        let (word_tx, word_rx) = std_mpsc::channel::<()>();
        let word_rx = Arc::new(std::sync::Mutex::new(word_rx));
        let (ended_tx, ended_rx) = std_mpsc::channel::<Result<usize, String>>();
        let route = Router::new().route(
            "/pid/{pid}/statistics",
            get(move |Query(query): Query<HashMap<String, String>>| {
                let (word_rx, ended_tx) = (word_rx.clone(), ended_tx.clone());
                async move {
                    blocking(move || {
                        if !query.contains_key("hold") {
                            return Ok::<_, ApiError>("served".to_string());
                        }
                        let _ = word_rx.lock().map(|rx| rx.recv());
                        for step in 0..usize::MAX {
                            if let Err(err) = tracer_model::interrupt::check() {
                                let _ = ended_tx.send(Ok(step));
                                return Err(stopped(err));
                            }
                            std::thread::sleep(Duration::from_millis(1));
                            if step == 10_000 {
                                let _ = ended_tx.send(Err("never stopped".into()));
                                break;
                            }
                        }
                        Ok("ran to its end".to_string())
                    })
                    .await
                }
            }),
        );
        let (app, metrics) = surface(route, 0);
        let held = tokio::spawn({
            let app = app.clone();
            async move { app.oneshot(get_request("/pid/1/statistics?hold")).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The client leaves: hyper drops the request's future.
        held.abort();
        assert!(held.await.is_err_and(|e| e.is_cancelled()));
        // Its work still runs: it holds the one permit.
        let (status, _) = call(&app, "/pid/1/statistics").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        // Let go, it sees at its first check that nobody waits.
        word_tx.send(()).expect("the work waits");
        let ended =
            tokio::task::spawn_blocking(move || ended_rx.recv_timeout(Duration::from_secs(5)))
                .await
                .expect("join");
        assert_eq!(ended, Ok(Ok(0)));
        // Once it ended, the permit is back: the next one is served.
        let mut status = StatusCode::TOO_MANY_REQUESTS;
        for _ in 0..100 {
            (status, _) = call(&app, "/pid/1/statistics").await;
            if status != StatusCode::TOO_MANY_REQUESTS {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(status, StatusCode::OK);
        assert_eq!(cancelled_after(&metrics, "abandoned", 1).await, 1);
        assert_eq!(cancelled(&metrics, "memory_budget"), 0);
    }

    #[tokio::test]
    async fn a_streamed_answer_arrives_whole_while_its_work_holds_a_few_chunks() {
        let (held_tx, held_rx) = std_mpsc::channel::<i64>();
        let route = Router::new().route(
            "/pid/{pid}/traces",
            get(move || {
                let held_tx = held_tx.clone();
                async move {
                    streamed(move |sink| {
                        let start = thread_net_bytes();
                        let mut most = 0;
                        sink.begin(vec![(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("text/plain"),
                        )]);
                        for line in 0..1_000_000 {
                            writeln!(sink, "{line}").map_err(ApiError::internal)?;
                            most = most.max(thread_net_bytes() - start);
                        }
                        let _ = held_tx.send(most);
                        Ok(())
                    })
                    .await
                }
            }),
        );
        let (app, metrics) = surface(route, 1 << 20);
        let (status, body) = call(&app, "/pid/1/traces").await;
        assert_eq!(status, StatusCode::OK);
        let expected: String = (0..1_000_000).map(|line| format!("{line}\n")).collect();
        assert_eq!(body.len(), 6_888_890);
        assert!(body == expected.as_bytes());
        // 6.9 MB written, under a budget of 1 MiB: the work held its
        // chunk being written, never more than 2 of them.
        let most = held_rx.recv().expect("the work ended");
        assert!(most <= 2 * CHUNK_BYTES as i64, "{most}");
        assert_eq!(cancelled(&metrics, "memory_budget"), 0);
    }

    /// The calling thread's nice value (Linux's is per thread).
    ///
    /// # Errors
    /// The `getpriority` call's.
    fn this_threads_nice() -> std::io::Result<i32> {
        // SAFETY: gettid and getpriority take no pointer; errno is cleared
        // first, as getpriority may return -1 as a value.
        unsafe {
            let tid = libc::gettid();
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
            if nice == -1 && *libc::__errno_location() != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(nice)
        }
    }

    #[tokio::test]
    async fn an_expensive_streamed_answer_read_slower_than_it_is_made_arrives_whole_from_a_lowered_thread()
     {
        // The traces are an expensive route: their work runs on a thread
        // at EXPENSIVE_NICE, of a runtime of its own; its waits for room
        // in the full queue of chunks are on the server's runtime.
        let route = Router::new().route(
            "/pid/{pid}/traces",
            get(|| async {
                streamed(|sink| {
                    sink.begin(vec![(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/plain"),
                    )]);
                    let nice = this_threads_nice().map_err(ApiError::internal)?;
                    writeln!(sink, "nice {nice}").map_err(ApiError::internal)?;
                    for line in 0..400_000 {
                        writeln!(sink, "{line}").map_err(ApiError::internal)?;
                    }
                    Ok(())
                })
                .await
            }),
        );
        let (app, _) = surface(route, 0);
        let response = app
            .oneshot(get_request("/pid/1/traces"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body();
        let mut read = Vec::new();
        // A chunk every 2 ms: the work fills the queue long before.
        while let Some(frame) = std::future::poll_fn(|cx| {
            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await
        {
            if let Ok(data) = frame.expect("frame").into_data() {
                read.extend_from_slice(&data);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let expected: String =
            std::iter::once(format!("nice {}\n", crate::sys::threads::EXPENSIVE_NICE))
                .chain((0..400_000).map(|line| format!("{line}\n")))
                .collect();
        assert_eq!(read.len(), expected.len());
        assert!(read == expected.as_bytes());
    }

    #[tokio::test]
    async fn a_streamed_answer_whose_reader_left_stops_its_work() {
        let (ended_tx, ended_rx) = std_mpsc::channel::<usize>();
        let route = Router::new().route(
            "/pid/{pid}/traces",
            get(move || {
                let ended_tx = ended_tx.clone();
                async move {
                    streamed(move |sink| {
                        sink.begin(Vec::new());
                        let mut line = 0;
                        let result = loop {
                            if let Err(err) = writeln!(sink, "{line}") {
                                break Err(ApiError::internal(err));
                            }
                            line += 1;
                            if line == 100_000_000 {
                                break Ok(());
                            }
                        };
                        let _ = ended_tx.send(line);
                        result
                    })
                    .await
                }
            }),
        );
        let (app, metrics) = surface(route, 0);
        let response = app
            .clone()
            .oneshot(get_request("/pid/1/traces"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body();
        let first = http_body_util_frame(&mut body).await;
        assert_eq!(first.get(..8), Some(&b"0\n1\n2\n3\n"[..]));
        drop(body);
        let line =
            tokio::task::spawn_blocking(move || ended_rx.recv_timeout(Duration::from_secs(5)))
                .await
                .expect("join")
                .expect("the work ended");
        // It stopped within the chunks it had queued.
        assert!(line < 1_000_000, "{line}");
        assert_eq!(cancelled_after(&metrics, "abandoned", 1).await, 1);
    }

    /// The next data frame of `body`.
    async fn http_body_util_frame(body: &mut Body) -> Bytes {
        use http_body::Body as _;
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
            .await
            .and_then(|frame| frame.ok())
            .and_then(|frame| frame.into_data().ok())
            .unwrap_or_default()
    }
}
