//! Streamed answers: the work writes into a [`Sink`], which hands the
//! connection a chunk at a time, a few chunks queued at most.
use std::{
    io::Write,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    http::{HeaderName, HeaderValue},
    response::{IntoResponse, Response},
};
use tokio::sync::{mpsc, oneshot};

use super::admission::current_admission;
use super::{AbandonOnDrop, Cancel, WorkState, run, spawn_work};
use crate::http::ApiError;
use crate::sys::alloc::handed_off;

/// Bytes of a streamed answer's chunk: the writer hands a chunk to the
/// connection once it holds this many.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Chunks of a streamed answer waiting for the connection at most: the
/// work waits while they are full (so a streamed answer holds at most
/// about `CHUNKS_QUEUED + 1` chunks of [`CHUNK_BYTES`], whatever its
/// length).
pub const CHUNKS_QUEUED: usize = 4;

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
        let result = run(admission, &state, || {
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
