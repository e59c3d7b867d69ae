//! Connections of every listener (TCP, the Unix socket): how many may be
//! open at once, and how long one may sit without a request in progress.
//!
//! - At most `max_connections` per listener ([`Connections`]): past it,
//!   tracerd stops accepting on that listener, so new connections wait in
//!   the kernel's backlog until one closes; the open ones are served as
//!   before (the Unix socket keeps its own count, so a flood of TCP
//!   connections does not shut local users out).
//! - A connection with no request in progress (a new one before its first
//!   byte, a kept-alive one between requests, one whose client does not
//!   read its answer) is closed after `idle_timeout` without a byte
//!   received or sent.
//! - Once the first byte of a request has arrived, its head (request line
//!   and headers) must be complete within `header_timeout`, or the
//!   connection is closed (slowloris).
//! - Then the request is the router's: its body may not pause longer than
//!   `request_read_timeout` (408, [`super::server::app`]) and the whole
//!   request takes at most `request_timeout` (503).
//!
//! hyper serves each connection (HTTP/1.1). Its one timeout,
//! `header_read_timeout`, runs from the moment it waits for a request, idle
//! time included, so it cannot give a short header timeout and a longer
//! idle one (hyperium/hyper#1628, #3828): [`Phase`] keeps both, fed by the
//! bytes the connection moves ([`Watched`]) and by the service (request
//! head parsed, answer ready).
use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use axum::{Router, extract::ConnectInfo};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, UnixListener},
    sync::{Notify, OwnedSemaphorePermit, Semaphore, watch},
    task::JoinSet,
    time::Instant,
};
use tower::ServiceExt as _;

use super::auth::Caller;
use crate::config::Config;

/// The limits of every listener's connections (from `max_connections`,
/// `header_timeout_secs` and `idle_timeout_secs`).
#[derive(Clone, Debug)]
pub struct Connections {
    /// Connections open at once per listener; more wait to be accepted.
    pub max_connections: usize,
    /// From a request's first byte to the end of its head.
    pub header_timeout: Duration,
    /// With no request in progress, without a byte received or sent.
    pub idle_timeout: Duration,
}

impl From<&Config> for Connections {
    fn from(config: &Config) -> Self {
        Connections {
            max_connections: config.api.max_connections as usize,
            header_timeout: Duration::from_secs(config.api.header_timeout_secs),
            idle_timeout: Duration::from_secs(config.api.idle_timeout_secs),
        }
    }
}

/// Where a connection is in its request cycle, and since when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No request in progress; the instant of the last byte moved (or of
    /// the accept, or of the answer).
    Idle(Instant),
    /// A request's head is arriving; the instant of its first byte.
    Head(Instant),
    /// The router has the request: the request and body timeouts rule.
    Busy,
}

/// A connection's [`State`], shared by its bytes ([`Watched`]), its
/// service and the task that closes it when its time is up.
#[derive(Debug)]
struct Phase {
    state: Mutex<State>,
    /// Woken when the deadline may have come closer.
    changed: Notify,
}

impl Phase {
    fn new() -> Self {
        Self {
            state: Mutex::new(State::Idle(Instant::now())),
            changed: Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Bytes arrived: an idle connection starts a request head.
    fn received(&self) {
        let started = self.with(|state| match state {
            State::Idle(_) => {
                *state = State::Head(Instant::now());
                true
            }
            _ => false,
        });
        if started {
            self.changed.notify_one();
        }
    }

    /// Bytes left: an idle connection's answer is moving.
    fn sent(&self) {
        self.with(|state| {
            if let State::Idle(since) = state {
                *since = Instant::now();
            }
        });
    }

    /// A request's head is parsed: the router has it.
    fn request(&self) {
        self.with(|state| *state = State::Busy);
        self.changed.notify_one();
    }

    /// The router answered: idle again while the answer is written.
    fn answered(&self) {
        self.with(|state| *state = State::Idle(Instant::now()));
        self.changed.notify_one();
    }

    /// When the connection is to be closed, if nothing happens before.
    fn deadline(&self, limits: &Connections) -> Option<Instant> {
        match self.with(|state| *state) {
            State::Idle(since) => Some(since + limits.idle_timeout),
            State::Head(since) => Some(since + limits.header_timeout),
            State::Busy => None,
        }
    }

    /// Completes when the deadline has passed with nothing to move it.
    async fn expired(&self, limits: &Connections) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.deadline(limits) {
                None => changed.await,
                Some(deadline) if deadline <= Instant::now() => return,
                Some(deadline) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {}
                        () = changed => {}
                    }
                }
            }
        }
    }
}

/// A connection's stream, telling its [`Phase`] of every byte moved.
struct Watched<IO> {
    io: IO,
    phase: Arc<Phase>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.phase.received();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.phase.sent();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.phase.sent();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A listener tracerd serves: TCP or the Unix socket.
pub trait Listener: Send + 'static {
    /// Its connections.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Waits for the next connection.
    fn accept(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
    /// How to tell who is on the other end of `io`, from the kernel.
    fn peer(io: &Self::Io) -> Peer;
}

/// Who is on the other end of a connection, or how to find out.
#[derive(Clone, Copy, Debug)]
pub enum Peer {
    /// Known at once (`SO_PEERCRED` on the Unix socket).
    Known(Caller),
    /// A TCP connection from the second address to the first: its user is
    /// looked up (inet_diag over netlink, for loopback) at its first
    /// request, so that a connection that never sends one costs no query.
    Tcp(std::net::SocketAddr, std::net::SocketAddr),
}

impl Peer {
    fn caller(self) -> Caller {
        match self {
            Self::Known(caller) => caller,
            Self::Tcp(local, remote) => Caller::of_tcp(local, remote),
        }
    }
}

impl Listener for TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&self) -> io::Result<Self::Io> {
        let (stream, _) = TcpListener::accept(self).await?;
        // Answers are written whole: no reason to wait for more.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    fn peer(io: &Self::Io) -> Peer {
        match (io.local_addr(), io.peer_addr()) {
            (Ok(local), Ok(remote)) => Peer::Tcp(local, remote),
            _ => Peer::Known(Caller::default()),
        }
    }
}

impl Listener for UnixListener {
    type Io = tokio::net::UnixStream;

    async fn accept(&self) -> io::Result<Self::Io> {
        UnixListener::accept(self).await.map(|(stream, _)| stream)
    }

    fn peer(io: &Self::Io) -> Peer {
        Peer::Known(Caller::of_unix(io))
    }
}

/// Serves `listener` with `app` until `stop` turns true: at most
/// `limits.max_connections` connections at once, each closed past its
/// idle or header timeout. At the stop, the listener is closed (new
/// connections are refused), idle connections close at once, and each
/// request in progress finishes; returns when every connection has closed.
pub async fn serve_listener<L: Listener>(
    listener: L,
    app: Router,
    limits: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
    name: &'static str,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    let mut warned_full: Option<Instant> = None;
    loop {
        while connections.try_join_next().is_some() {}
        if permits.available_permits() == 0
            && warned_full.is_none_or(|at| at.elapsed() >= WARN_EVERY)
        {
            tracing::warn!(
                listener = name,
                max_connections = limits.max_connections,
                "every connection is taken: new ones wait until one closes"
            );
            warned_full = Some(Instant::now());
        }
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        match accepted {
            Ok(io) => {
                connections.spawn(serve_connection::<L>(
                    io,
                    app.clone(),
                    limits.clone(),
                    stop.clone(),
                    permit,
                ));
            }
            // The client gave up before it was accepted: nothing to do.
            Err(err) if is_connection_error(&err) => {}
            Err(err) => {
                // Out of file descriptors (EMFILE, ENFILE) or memory: the
                // open connections go on; accepting resumes in a moment.
                if warned_full.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    tracing::warn!(listener = name, err = %err, "cannot accept connections (raise LimitNOFILE, or lower max_connections)");
                    warned_full = Some(Instant::now());
                }
                tokio::time::sleep(ACCEPT_RETRY).await;
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Least time between two warnings of a full listener.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// Pause before accepting again after the OS refused an accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves one connection (holding its `permit` of the listener) until the
/// client closes it, its time is up, or the stop has let its request
/// finish.
async fn serve_connection<L: Listener>(
    io: L::Io,
    app: Router,
    limits: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let peer = L::peer(&io);
    let caller = Arc::new(std::sync::OnceLock::new());
    let phase = Arc::new(Phase::new());
    let service = {
        let phase = phase.clone();
        service_fn(move |mut request: hyper::Request<Incoming>| {
            phase.request();
            let caller = *caller.get_or_init(|| peer.caller());
            request.extensions_mut().insert(ConnectInfo(caller));
            let phase = phase.clone();
            let app = app.clone();
            async move {
                let response = app.oneshot(request).await;
                phase.answered();
                response
            }
        })
    };
    let io = TokioIo::new(Watched {
        io,
        phase: phase.clone(),
    });
    let mut builder = http1::Builder::new();
    // hyper's own timer would close idle connections after the header
    // timeout: Phase keeps both timeouts instead (see the module doc).
    builder.header_read_timeout(None);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(err) = served {
                    tracing::debug!(err = %err, "connection ended with an error");
                }
                break;
            }
            () = phase.expired(&limits) => {
                // No request in progress: dropping the connection closes it.
                tracing::debug!("connection closed: idle or header timeout");
                break;
            }
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests;
