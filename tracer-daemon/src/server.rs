//! Serving the API safely: the listeners (TCP, and optionally a Unix socket
//! with mode 0660), bearer-token authentication for TCP clients (constant-time
//! compare), limits (request body size, per-request timeout, a concurrency
//! limit on expensive routes answered 429), validation of every request's
//! path, graceful shutdown, and systemd's readiness protocol.
//!
//! The routes themselves are [`crate::api`]'s and [`crate::metrics`]'s; this
//! module only wraps them.
use std::{
    future::Future,
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, MatchedPath, Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use serde_json::json;
use subtle::ConstantTimeEq as _;
use tokio::{
    net::{TcpListener, UnixListener},
    sync::{Semaphore, watch},
};
use tower_http::{limit::RequestBodyLimitLayer, timeout::TimeoutLayer};

use crate::metrics::{self, Metrics};

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
    /// The token file is unusable.
    #[error("auth token file {path}: {reason}")]
    Token {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Fewest bytes a bearer token may have: shorter ones can be guessed.
pub const MIN_TOKEN_BYTES: usize = 16;

/// A bearer token, read from a file.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Reads the token from `path`: the file's content without surrounding
    /// whitespace. The file must not be readable by other users.
    ///
    /// # Errors
    /// [`ServerError::Token`] if the file cannot be read, is readable by
    /// group or others, or holds fewer than [`MIN_TOKEN_BYTES`] bytes.
    pub fn read(path: &Path) -> Result<Self, ServerError> {
        let err = |reason: String| ServerError::Token {
            path: path.to_path_buf(),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(err(format!(
                "mode {:o} lets other users read it; chmod 600 it",
                meta.permissions().mode() & 0o777
            )));
        }
        let text = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        Self::parse(&text).map_err(err)
    }

    /// A token from the bytes of a token file (surrounding whitespace
    /// ignored).
    ///
    /// # Errors
    /// A message if fewer than [`MIN_TOKEN_BYTES`] bytes remain or they are
    /// not printable ASCII.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let token = bytes.trim_ascii();
        if token.len() < MIN_TOKEN_BYTES {
            return Err(format!(
                "the token has {} bytes; at least {MIN_TOKEN_BYTES} needed",
                token.len()
            ));
        }
        if !token.iter().all(|b| b.is_ascii_graphic()) {
            return Err("the token must be printable ASCII without spaces".into());
        }
        Ok(Self(Arc::from(token)))
    }

    /// True if the `Authorization` header value is `Bearer <this token>`,
    /// compared in constant time (no timing tells how much matched).
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let Some(given) = value.strip_prefix(b"Bearer ") else {
            return false;
        };
        bool::from(given.ct_eq(&self.0))
    }
}

/// The limits put around every route.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body in bytes (413 beyond).
    pub body_limit_bytes: usize,
    /// Time a request may take (503 beyond).
    pub request_timeout: Duration,
    /// Expensive requests served at once (429 beyond).
    pub max_expensive_requests: usize,
}

/// Route templates whose work grows with the traced data (a snapshot, a
/// walk of the live map): they share the concurrency limit.
pub fn is_expensive(route: &str) -> bool {
    const EXPENSIVE: [&str; 7] = [
        "statistics",
        "compare",
        "snapshots",
        "traces",
        "dump",
        "maps",
        "object",
    ];
    route.split('/').any(|segment| EXPENSIVE.contains(&segment))
}

/// The whole HTTP surface: `api` (the API's routes) and `/metrics`, wrapped
/// in request counting, path validation, authentication (when `token` is
/// given), the body limit, the timeout and the concurrency limit.
pub fn app(api: Router, metrics: Arc<Metrics>, limits: &Limits, token: Option<Token>) -> Router {
    let permits = Arc::new(Semaphore::new(limits.max_expensive_requests));
    let mut router = api
        .merge(metrics::router(metrics.clone()))
        .layer(middleware::from_fn_with_state(permits, limit_expensive))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            limits.request_timeout,
        ))
        .layer(DefaultBodyLimit::max(limits.body_limit_bytes))
        .layer(RequestBodyLimitLayer::new(limits.body_limit_bytes));
    if let Some(token) = token {
        router = router.layer(middleware::from_fn_with_state(token, authenticate));
    }
    router
        .layer(middleware::from_fn(validate_request))
        .layer(middleware::from_fn_with_state(
            metrics,
            metrics::track_requests,
        ))
}

fn error(status: StatusCode, error: &str, hint: String) -> Response {
    (status, Json(json!({"error": error, "hint": hint}))).into_response()
}

async fn authenticate(State(token): State<Token>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    if token.admits(given) {
        return next.run(request).await;
    }
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token",
        "send Authorization: Bearer TOKEN with the token from tracerd's auth_token_file".into(),
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

async fn limit_expensive(
    State(permits): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    let expensive = request
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|p| is_expensive(p.as_str()));
    if !expensive {
        return next.run(request).await;
    }
    match permits.clone().try_acquire_owned() {
        Ok(_permit) => next.run(request).await,
        Err(_) => {
            let mut response = error(
                StatusCode::TOO_MANY_REQUESTS,
                "too many expensive requests at once",
                "statistics, compare, snapshot and trace requests share max_expensive_requests; retry in a moment"
                    .into(),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

/// Longest request path accepted, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest query string accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 8192;

/// Checks a request path: bounded length, and no segment that is `.` or
/// `..` or holds a NUL or control character once percent-decoded. Every
/// path parameter (pid, snapshot id, address) passes this before a route
/// parses it.
///
/// # Errors
/// A message naming what is wrong.
pub fn check_path(path: &str, query: Option<&str>) -> Result<(), String> {
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "the path has {} bytes; at most {MAX_PATH_BYTES}",
            path.len()
        ));
    }
    if let Some(query) = query
        && query.len() > MAX_QUERY_BYTES
    {
        return Err(format!(
            "the query has {} bytes; at most {MAX_QUERY_BYTES}",
            query.len()
        ));
    }
    for segment in path.split('/') {
        let decoded: Vec<u8> = percent_decode(segment.as_bytes());
        if decoded == b"." || decoded == b".." {
            return Err("the path must not contain . or .. segments".into());
        }
        if decoded.iter().any(|b| b.is_ascii_control()) {
            return Err("the path must not contain control characters".into());
        }
        if decoded.contains(&b'/') {
            return Err("the path must not contain an encoded /".into());
        }
    }
    Ok(())
}

fn percent_decode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        let byte = input.get(i).copied().unwrap_or(0);
        let hex = |at: usize| input.get(at).and_then(|b| (*b as char).to_digit(16));
        match (byte, hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).unwrap_or(0));
                i += 3;
            }
            _ => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

async fn validate_request(request: Request, next: Next) -> Response {
    match check_path(request.uri().path(), request.uri().query()) {
        Ok(()) => next.run(request).await,
        Err(reason) => error(
            StatusCode::BAD_REQUEST,
            &format!("invalid request path: {reason}"),
            "paths are like /pid/1234/statistics; GET /health answers when tracerd is up".into(),
        ),
    }
}

/// Binds the TCP listener.
///
/// # Errors
/// [`ServerError::Bind`].
pub async fn bind_tcp(addr: std::net::SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Creates the Unix socket at `path` with mode 0660 (owner and group may
/// connect). A stale socket left by an earlier run is replaced; any other
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
    let listener = UnixListener::bind(path).map_err(|e| err(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| err(format!("chmod 0660: {e}")))?;
    Ok(listener)
}

/// Serves `tcp` (and `unix`) until `shutdown` completes, then stops taking
/// connections and gives the requests in flight `grace` to finish before
/// cutting them. Returns whether every request finished in time.
pub async fn serve(
    tcp: (TcpListener, Router),
    unix: Option<(UnixListener, Router)>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> bool {
    let (stop, stopped) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut tasks = tokio::task::JoinSet::new();
    let (listener, app) = tcp;
    let tcp_server = axum::serve(listener, app).with_graceful_shutdown(wait(stopped.clone()));
    tasks.spawn(async move {
        if let Err(err) = tcp_server.await {
            tracing::error!(err = %err, "the TCP listener failed");
        }
    });
    if let Some((listener, app)) = unix {
        let unix_server = axum::serve(listener, app).with_graceful_shutdown(wait(stopped));
        tasks.spawn(async move {
            if let Err(err) = unix_server.await {
                tracing::error!(err = %err, "the Unix socket listener failed");
            }
        });
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

/// Name of the file in the state directory that records the last stop.
pub const LAST_STOP_FILE: &str = "last-stop.json";

/// Records the stop in `state_dir/last-stop.json` (written to a temporary
/// file, then renamed over, so a crash never leaves half a file): when,
/// whether the API drained in time, the eBPF counters (drops included) and
/// the processes traced at the end. Stored snapshots are persisted by the
/// store as they are taken, not here.
///
/// # Errors
/// The I/O error of writing or renaming.
pub fn write_last_stop(
    state_dir: &Path,
    daemon: &crate::daemon::Daemon,
    drained: bool,
) -> std::io::Result<()> {
    let counters: serde_json::Map<String, serde_json::Value> = daemon
        .capture()
        .counters()
        .into_iter()
        .map(|(name, v)| (name.to_string(), v.into()))
        .collect();
    let processes = daemon.processes();
    let record = json!({
        "stopped_at_ms": crate::store::unix_ms(std::time::SystemTime::now()),
        "started_at_ms": crate::store::unix_ms(daemon.started_at),
        "drained": drained,
        "counters": counters,
        "processes_alive": processes.iter().filter(|p| p.state == "alive").count(),
        "processes_incomplete": processes.iter().filter(|p| !p.complete).count(),
    });
    let path = state_dir.join(LAST_STOP_FILE);
    let tmp = state_dir.join(format!(".{LAST_STOP_FILE}.tmp"));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(&record).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, &path)
}

/// Tells systemd (`Type=notify`) something, if tracerd runs under it;
/// a no-op elsewhere.
pub fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(err) = sd_notify::notify(false, state) {
        tracing::warn!(err = %err, "cannot notify systemd");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::{body::Body, routing::get};
    use tower::ServiceExt as _;

    use super::*;

    fn token() -> Token {
        Token::parse(b"0123456789abcdef-secret\n").expect("must succeed")
    }

    #[test]
    fn token_needs_exact_bearer_match() {
        let t = token();
        assert!(t.admits(Some(b"Bearer 0123456789abcdef-secret")));
        assert!(!t.admits(Some(b"Bearer 0123456789abcdef-secreT")));
        assert!(!t.admits(Some(b"Bearer 0123456789abcdef-secret2")));
        assert!(!t.admits(Some(b"bearer 0123456789abcdef-secret")));
        assert!(!t.admits(Some(b"0123456789abcdef-secret")));
        assert!(!t.admits(None));
        assert_eq!(
            Token::parse(b"short").expect_err("must fail"),
            "the token has 5 bytes; at least 16 needed"
        );
        assert!(Token::parse(b"0123456789 abcdef").is_err());
    }

    #[test]
    fn paths_with_dot_segments_or_control_bytes_are_refused() {
        assert_eq!(
            check_path("/pid/12/statistics", Some("group_by=lineno")),
            Ok(())
        );
        assert!(check_path("/pid/%2e%2E/statistics", None).is_err());
        assert!(check_path("/pid/../statistics", None).is_err());
        assert!(check_path("/snapshots/1%00", None).is_err());
        assert!(check_path("/snapshots/a%2fb", None).is_err());
        assert!(check_path(&format!("/{}", "a".repeat(MAX_PATH_BYTES)), None).is_err());
        assert!(check_path("/x", Some(&"a".repeat(MAX_QUERY_BYTES + 1))).is_err());
    }

    #[test]
    fn expensive_routes_are_the_data_walking_ones() {
        assert!(is_expensive("/pid/{pid}/statistics"));
        assert!(is_expensive("/pid/{pid}/compare"));
        assert!(is_expensive("/snapshots/{id}/traces"));
        assert!(!is_expensive("/pid/{pid}/traced-memory"));
        assert!(!is_expensive("/metrics"));
        assert!(!is_expensive("/health"));
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
        app(api, daemonless, limits, token)
    }

    fn limits() -> Limits {
        Limits {
            body_limit_bytes: 1024,
            request_timeout: Duration::from_secs(30),
            max_expensive_requests: 1,
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
        let got = status(
            &app,
            Request::get("/pid/1/statistics")
                .body(Body::empty())
                .expect("must succeed"),
        )
        .await;
        assert_eq!(got, StatusCode::SERVICE_UNAVAILABLE);
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
        let server = tokio::spawn(serve(
            (listener, app),
            None,
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
    async fn unix_socket_is_created_with_mode_0660_replacing_a_stale_one() {
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
        assert_eq!(mode, 0o660);
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
