//! Serving: the listeners (TCP, and optionally a Unix socket with mode
//! 0666), the whole HTTP surface with its layers ([`app`]), and graceful
//! shutdown.
use std::{
    future::Future,
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use axum::{Router, extract::DefaultBodyLimit, http::StatusCode, middleware, routing::get};
use tokio::{
    net::{TcpListener, TcpSocket, UnixListener, UnixSocket},
    sync::{Semaphore, watch},
};
use tower_http::{
    limit::RequestBodyLimitLayer,
    timeout::{RequestBodyTimeoutLayer, TimeoutLayer},
};

use super::auth::{Operators, Token, authenticate, authorize};
use super::connections::{Connections, serve_listener};
use super::error::{ErrorHints, json_errors};
use super::handlers::metrics::{scrape, track_requests};
use super::limits::{Limits, validate_request};
use super::routes::METRICS_PATH;
use super::work::{Admissions, admit};
use crate::metrics::Metrics;

/// Errors of setting up the listeners.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The TCP address could not be bound.
    #[error("listening on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The Unix socket could not be created.
    #[error("unix socket {path}: {reason}")]
    UnixSocket {
        /// The socket's path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// The whole HTTP surface: `api` (the API's routes) and `/metrics`, wrapped
/// in request counting, the JSON shape of every error ([`json_errors`]),
/// path validation, authentication (when `token` is given), the
/// operators' rule for changes (`operators`), the body limit, the timeout
/// and the request body's read timeout (408) and the concurrency limit.
pub fn app(
    api: Router,
    metrics: Arc<Metrics>,
    limits: &Limits,
    token: Option<Token>,
    operators: Arc<Operators>,
) -> Router {
    let admissions = Arc::new(Admissions {
        permits: Arc::new(Semaphore::new(limits.max_expensive_requests)),
        budget: limits.request_memory_budget,
        stall: limits.request_timeout,
        metrics: metrics.clone(),
    });
    let mut router = api
        .merge(
            Router::new()
                .route(METRICS_PATH, get(scrape))
                .with_state(metrics.clone()),
        )
        .layer(middleware::from_fn_with_state(admissions, admit))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            limits.request_timeout,
        ))
        .layer(DefaultBodyLimit::max(limits.body_limit_bytes))
        .layer(RequestBodyLimitLayer::new(limits.body_limit_bytes))
        .layer(RequestBodyTimeoutLayer::new(limits.request_read_timeout))
        .layer(middleware::from_fn_with_state(operators, authorize));
    if let Some(token) = token {
        router = router.layer(middleware::from_fn_with_state(token, authenticate));
    }
    let hints = Arc::new(ErrorHints {
        body_limit_bytes: limits.body_limit_bytes,
        request_timeout: limits.request_timeout,
        request_read_timeout: limits.request_read_timeout,
    });
    router
        .layer(middleware::from_fn(validate_request))
        .layer(middleware::from_fn_with_state(hints, json_errors))
        .layer(middleware::from_fn_with_state(metrics, track_requests))
}

/// File descriptors tracerd needs besides its connections: probes (a perf
/// event each), maps, programs, the files it reads.
const OTHER_FILES: usize = 2048;

/// Makes room for `connections` open at once (raising the soft limit of
/// open files if it can), and warns when there is not: past the limit,
/// accepting pauses until a connection closes.
fn check_open_files(connections: usize) {
    let wanted = connections.saturating_add(OTHER_FILES);
    match crate::sys::raise_open_files(u64::try_from(wanted).unwrap_or(u64::MAX)) {
        Ok(limit) if limit >= wanted as u64 => {}
        Ok(limit) => tracing::warn!(
            limit,
            wanted,
            "the open files limit is below max_connections on every listener and tracerd's own files: raise LimitNOFILE (ulimit -n) or lower max_connections"
        ),
        Err(err) => tracing::debug!(err = %err, "cannot read the open files limit"),
    }
}

/// Connections the kernel holds for a listener until tracerd accepts them
/// (capped by `net.core.somaxconn`). tokio's default, 128, drops the SYNs
/// of a burst beyond it, and their clients retry only a second later: a
/// thousand connections at once took 4 s to open. With this, a burst
/// waits in the kernel instead.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds the TCP listener, with a backlog of [`LISTEN_BACKLOG`].
///
/// # Errors
/// [`ServerError::Bind`].
pub async fn bind_tcp(addr: std::net::SocketAddr) -> Result<TcpListener, ServerError> {
    let bind = || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }?;
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    bind().map_err(|source| ServerError::Bind { addr, source })
}

/// Creates the Unix socket at `path` with mode 0666: every local user may
/// connect, and what each may do is decided per request from the peer's
/// credentials (`SO_PEERCRED`: only operators change anything). A stale socket left by an earlier run is replaced; any other
/// file there is left alone and refused.
///
/// # Errors
/// [`ServerError::UnixSocket`].
pub fn bind_unix(path: &Path) -> Result<UnixListener, ServerError> {
    let err = |reason: String| ServerError::UnixSocket {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path)
                .map_err(|e| err(format!("removing the stale socket: {e}")))?;
        }
        Ok(_) => return Err(err("a file that is not a socket is in the way".into())),
        Err(_) => {}
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| err(format!("creating its directory: {e}")))?;
    }
    let listener = UnixSocket::new_stream()
        .and_then(|socket| {
            socket.bind(path)?;
            socket.listen(LISTEN_BACKLOG)
        })
        .map_err(|e| err(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| err(format!("chmod 0666: {e}")))?;
    Ok(listener)
}

/// Serves `tcp` (and `unix`) until `shutdown` completes, each listener
/// within `connections` (its own count of open connections, the idle and
/// header timeouts: [`super::connections`]), then stops taking connections
/// and gives the requests in flight `grace` to finish before cutting them.
/// Returns whether every request finished in time.
pub async fn serve(
    tcp: (TcpListener, Router),
    unix: Option<(UnixListener, Router)>,
    connections: Connections,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> bool {
    let (stop, stopped) = watch::channel(false);
    let listeners = if unix.is_some() { 2 } else { 1 };
    check_open_files(listeners * connections.max_connections);
    let connections = Arc::new(connections);
    let mut tasks = tokio::task::JoinSet::new();
    let (listener, app) = tcp;
    tasks.spawn(serve_listener(
        listener,
        app,
        connections.clone(),
        stopped.clone(),
        "tcp",
    ));
    if let Some((listener, app)) = unix {
        tasks.spawn(serve_listener(listener, app, connections, stopped, "unix"));
    }
    tokio::select! {
        () = shutdown => {}
        _ = tasks.join_next() => {
            tracing::error!("a listener stopped on its own; shutting down");
        }
    }
    tracing::info!("stop requested: closing the API");
    let _ = stop.send(true);
    let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} })
        .await
        .is_ok();
    if !drained {
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "requests still running at the end of the grace period: cut"
        );
        tasks.abort_all();
    }
    drained
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::{body::Body, extract::Request};
    use tower::ServiceExt as _;

    use super::*;

    fn token() -> Token {
        Token::parse(b"0123456789abcdef-secret\n").expect("must succeed")
    }

    /// A router whose `/pid/{pid}/statistics` waits until told to go on.
    fn slow_app(
        limits: &Limits,
        token: Option<Token>,
        gate: Arc<tokio::sync::Notify>,
        entered: Arc<AtomicUsize>,
    ) -> Router {
        let api = Router::new()
            .route(
                "/pid/{pid}/statistics",
                get(move || {
                    let gate = gate.clone();
                    let entered = entered.clone();
                    async move {
                        entered.fetch_add(1, Ordering::SeqCst);
                        gate.notified().await;
                        "done"
                    }
                }),
            )
            .route("/health", get(|| async { "ok" }))
            .route(
                "/upload",
                axum::routing::post(
                    |body: axum::body::Bytes| async move { body.len().to_string() },
                ),
            );
        let daemonless = Arc::new(Metrics::new());
        app(
            api,
            daemonless,
            limits,
            token,
            Arc::new(Operators::named("tracer")),
        )
    }

    fn limits() -> Limits {
        Limits {
            body_limit_bytes: 1024,
            request_timeout: Duration::from_secs(30),
            request_read_timeout: Duration::from_secs(10),
            max_expensive_requests: 1,
            request_memory_budget: 0,
        }
    }

    async fn status(app: &Router, request: Request<Body>) -> StatusCode {
        app.clone()
            .oneshot(request)
            .await
            .expect("must succeed")
            .status()
    }

    #[tokio::test]
    async fn a_second_expensive_request_at_once_gets_429_while_cheap_ones_pass() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let entered = Arc::new(AtomicUsize::new(0));
        let app = slow_app(&limits(), None, gate.clone(), entered.clone());
        let first = tokio::spawn({
            let app = app.clone();
            async move {
                status(
                    &app,
                    Request::get("/pid/1/statistics")
                        .body(Body::empty())
                        .expect("must succeed"),
                )
                .await
            }
        });
        while entered.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let second = status(
            &app,
            Request::get("/pid/2/statistics")
                .body(Body::empty())
                .expect("must succeed"),
        )
        .await;
        assert_eq!(second, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            status(
                &app,
                Request::get("/health")
                    .body(Body::empty())
                    .expect("must succeed")
            )
            .await,
            StatusCode::OK
        );
        gate.notify_one();
        assert_eq!(first.await.expect("must succeed"), StatusCode::OK);
        let gate2 = gate.clone();
        let third = tokio::spawn({
            let app = app.clone();
            async move {
                status(
                    &app,
                    Request::get("/pid/3/statistics")
                        .body(Body::empty())
                        .expect("must succeed"),
                )
                .await
            }
        });
        while entered.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        gate2.notify_one();
        assert_eq!(third.await.expect("must succeed"), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_request_past_the_timeout_gets_503() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let limits = Limits {
            request_timeout: Duration::from_millis(50),
            ..limits()
        };
        let app = slow_app(&limits, None, gate, Arc::new(AtomicUsize::new(0)));
        let response = app
            .oneshot(
                Request::get("/pid/1/statistics")
                    .body(Body::empty())
                    .expect("must succeed"),
            )
            .await
            .expect("must succeed");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("a JSON error");
        assert_eq!(body["error"], "service unavailable");
        assert_eq!(
            body["hint"],
            "the request took longer than 0.05 s (request_timeout_secs): ask for less (limit=, filters) or retry"
        );
    }

    #[tokio::test]
    async fn a_body_over_the_limit_gets_413() {
        let app = slow_app(
            &limits(),
            None,
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(AtomicUsize::new(0)),
        );
        let big = Request::post("/upload")
            .body(Body::from(vec![b'x'; 1025]))
            .expect("must succeed");
        assert_eq!(status(&app, big).await, StatusCode::PAYLOAD_TOO_LARGE);
        let small = Request::post("/upload")
            .body(Body::from(vec![b'x'; 1024]))
            .expect("must succeed");
        assert_eq!(status(&app, small).await, StatusCode::OK);
    }

    #[tokio::test]
    async fn with_a_token_every_route_needs_it() {
        let app = slow_app(
            &limits(),
            Some(token()),
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(AtomicUsize::new(0)),
        );
        assert_eq!(
            status(
                &app,
                Request::get("/health")
                    .body(Body::empty())
                    .expect("must succeed")
            )
            .await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status(
                &app,
                Request::get("/metrics")
                    .body(Body::empty())
                    .expect("must succeed")
            )
            .await,
            StatusCode::UNAUTHORIZED
        );
        let wrong = Request::get("/health")
            .header("authorization", "Bearer nope-nope-nope-nope")
            .body(Body::empty())
            .expect("must succeed");
        assert_eq!(status(&app, wrong).await, StatusCode::UNAUTHORIZED);
        let right = Request::get("/health")
            .header("authorization", "Bearer 0123456789abcdef-secret")
            .body(Body::empty())
            .expect("must succeed");
        assert_eq!(status(&app, right).await, StatusCode::OK);
    }

    #[tokio::test]
    async fn bad_paths_get_400_before_any_route() {
        let app = slow_app(
            &limits(),
            None,
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(AtomicUsize::new(0)),
        );
        let got = status(
            &app,
            Request::get("/pid/%2e%2e/statistics")
                .body(Body::empty())
                .expect("must succeed"),
        )
        .await;
        assert_eq!(got, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn shutdown_lets_a_request_in_flight_finish_then_stops() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let entered = Arc::new(AtomicUsize::new(0));
        let app = slow_app(&limits(), None, gate.clone(), entered.clone());
        let listener = bind_tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let connections = Connections {
            max_connections: 16,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        };
        let server = tokio::spawn(serve(
            (listener, app),
            None,
            connections,
            async move {
                let _ = stopped.await;
            },
            Duration::from_secs(3),
        ));
        let request = tokio::task::spawn_blocking(move || {
            use std::io::{Read as _, Write as _};
            let mut stream = std::net::TcpStream::connect(addr).expect("connect");
            stream
                .write_all(
                    b"GET /pid/1/statistics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                )
                .expect("write");
            let mut response = String::new();
            stream.read_to_string(&mut response).expect("read");
            response
        });
        while entered.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        stop.send(()).expect("signal");
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Stopped listening: a new connection is refused while the first
        // request is still running.
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
        gate.notify_one();
        let response = request.await.expect("request task");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            server.await.expect("serve"),
            "drained within the grace period"
        );
    }

    #[tokio::test]
    async fn unix_socket_is_created_with_mode_0666_replacing_a_stale_one() {
        let dir = std::env::temp_dir().join(format!("tracer-sock-{}", std::process::id()));
        let path = dir.join("tracerd.sock");
        let first = bind_unix(&path).expect("must succeed");
        drop(first);
        let second = bind_unix(&path).expect("must succeed");
        let mode = std::fs::metadata(&path)
            .expect("must succeed")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o666);
        drop(second);
        std::fs::remove_file(&path).expect("must succeed");
        std::fs::write(&path, b"not a socket").expect("must succeed");
        assert!(
            bind_unix(&path)
                .expect_err("must fail")
                .to_string()
                .contains("not a socket")
        );
        std::fs::remove_dir_all(&dir).expect("must succeed");
    }
}
