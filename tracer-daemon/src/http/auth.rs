//! Bearer-token authentication for TCP clients: the token is read from a
//! file only its owner can read, and compared in constant time.
use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use axum::{
    extract::{RawPathParams, Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use subtle::ConstantTimeEq as _;

use super::ApiError;
use crate::service::{NotTracedWhy, Service, ServiceError, Viewer};

/// Fewest bytes a bearer token may have: shorter ones can be guessed.
pub const MIN_TOKEN_BYTES: usize = 16;

/// The authentication scheme of a token (`Authorization: Bearer TOKEN`),
/// compared without regard to case.
const BEARER: &[u8] = b"Bearer";

/// A token file that cannot be used (tracerd does not start).
#[derive(Debug, thiserror::Error)]
#[error("auth token file {path}: {reason}")]
pub struct TokenError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

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
    /// [`TokenError`] if the file cannot be read, is readable by group or
    /// others, or holds fewer than [`MIN_TOKEN_BYTES`] bytes.
    pub fn read(path: &Path) -> Result<Self, TokenError> {
        let err = |reason: String| TokenError {
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

    /// True if the `Authorization` header value is `Bearer <this token>`:
    /// the scheme in any case (`Bearer`, `bearer`, `BEARER`: RFC 7235
    /// makes it case-insensitive), one or more spaces, then the token,
    /// compared in constant time (no timing tells how much matched).
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let Some((scheme, rest)) = value.split_at_checked(BEARER.len()) else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case(BEARER) || rest.first() != Some(&b' ') {
            return false;
        }
        let given = rest.trim_ascii_start();
        bool::from(given.ct_eq(&self.0))
    }
}

/// Middleware: a request with `Authorization: Bearer <token>` is an
/// operator's ([`TokenHolder`]); one without it passes only from a peer the
/// kernel names (loopback TCP: inet_diag), whose user then decides what it
/// may do ([`authorize`]), so that plain `curl` works on the host. A wrong
/// token, or no token from a peer tracerd cannot identify (another host),
/// gets 401.
pub async fn authenticate(
    State(token): State<Token>,
    mut request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    if token.admits(given) {
        request.extensions_mut().insert(TokenHolder);
        return next.run(request).await;
    }
    let identified = request
        .extensions()
        .get::<axum::extract::ConnectInfo<Caller>>()
        .is_some_and(|info| info.0.uid.is_some());
    if given.is_none() && identified {
        return next.run(request).await;
    }
    let mut response = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token",
        "send Authorization: Bearer TOKEN with the token from tracerd's auth_token_file",
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::parse(b"0123456789abcdef-secret\n").expect("must succeed")
    }

    #[test]
    fn root_is_an_operator_and_an_unknown_peer_is_not() {
        let operators = Operators::named("root");
        assert_eq!(operators.gid, Some(0));
        assert!(operators.admit(Caller {
            uid: Some(0),
            gid: None
        }));
        // nobody is in no group named root.
        assert!(!operators.admit(Caller {
            uid: Some(65534),
            gid: Some(65534)
        }));
        assert!(operators.admit(Caller {
            uid: Some(65534),
            gid: Some(0)
        }));
        assert!(!operators.admit(Caller::default()));
        let none = Operators::named("no-such-group-here");
        assert_eq!(none.gid, None);
        assert!(!none.admit(Caller {
            uid: Some(65534),
            gid: Some(65534)
        }));
    }

    fn request(method: &str, uri: &str, length: Option<&str>) -> Request {
        let mut builder = axum::http::Request::builder().method(method).uri(uri);
        if let Some(length) = length {
            builder = builder.header(header::CONTENT_LENGTH, length);
        }
        builder
            .body(axum::body::Body::empty())
            .expect("must succeed")
    }

    #[test]
    fn a_user_may_change_only_what_is_theirs() {
        for (method, uri, length, may) in [
            ("POST", "/pid/42/snapshots?label=x", None, true),
            ("POST", "/pid/42/reset-peak", Some("0"), true),
            ("POST", "/snapshots", Some("0"), true),
            ("POST", "/snapshots", None, true),
            ("POST", "/snapshots?format=tracemalloc", Some("120"), false),
            ("PATCH", "/snapshots/3?label=y", None, true),
            ("DELETE", "/snapshots/mine", None, true),
            ("DELETE", "/snapshots", None, false),
            ("POST", "/pid/42/clear-traces", None, false),
            ("POST", "/pid/42/tracing/stop", None, false),
            ("POST", "/pid/42/tracing/start", None, false),
            ("POST", "/tracing/stop", None, false),
            ("POST", "/tracing/start", None, false),
            ("PUT", "/scope?pid=1", None, false),
            ("PUT", "/pid/42/snapshots", None, false),
        ] {
            assert_eq!(
                users_may(&request(method, uri, length)),
                may,
                "{method} {uri}"
            );
        }
    }

    /// A router behind [`authenticate`] whose `/health` says who it was
    /// for, with the peer `caller` as the listener would have found it.
    async fn through_authenticate(caller: Option<Caller>, authorization: Option<&str>) -> u16 {
        use tower::ServiceExt as _;
        let app = axum::Router::new()
            .route("/health", axum::routing::get(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(token(), authenticate));
        let mut request = request("GET", "/health", None);
        if let Some(caller) = caller {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(caller));
        }
        if let Some(value) = authorization {
            request.headers_mut().insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(value).expect("must succeed"),
            );
        }
        app.oneshot(request)
            .await
            .expect("must succeed")
            .status()
            .as_u16()
    }

    #[tokio::test]
    async fn the_token_is_needed_only_from_a_peer_the_kernel_does_not_name() {
        let local = Caller {
            uid: Some(65534),
            gid: None,
        };
        assert_eq!(through_authenticate(Some(local), None).await, 200);
        assert_eq!(
            through_authenticate(Some(local), Some("Bearer wrong-token-0123456789")).await,
            401
        );
        let remote = Caller::default();
        assert_eq!(through_authenticate(Some(remote), None).await, 401);
        assert_eq!(through_authenticate(None, None).await, 401);
        assert_eq!(
            through_authenticate(Some(remote), Some("Bearer 0123456789abcdef-secret")).await,
            200
        );
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_exact() {
        let t = token();
        assert!(t.admits(Some(b"Bearer 0123456789abcdef-secret")));
        assert!(!t.admits(Some(b"Bearer 0123456789abcdef-secreT")));
        assert!(!t.admits(Some(b"Bearer 0123456789abcdef-secret2")));
        // The scheme is case-insensitive (RFC 7235, section 2.1), the
        // token is not.
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            let value = format!("{scheme} 0123456789abcdef-secret");
            assert!(t.admits(Some(value.as_bytes())), "{value}");
        }
        assert!(t.admits(Some(b"Bearer   0123456789abcdef-secret")));
        assert!(!t.admits(Some(b"Bearer0123456789abcdef-secret")));
        assert!(!t.admits(Some(b"Basic 0123456789abcdef-secret")));
        assert!(!t.admits(Some(b"Bearer 0123456789ABCDEF-SECRET")));
        assert!(!t.admits(Some(b"Bearer")));
        assert!(!t.admits(Some(b"Bear")));
        assert!(!t.admits(Some(b"0123456789abcdef-secret")));
        assert!(!t.admits(None));
        assert_eq!(
            Token::parse(b"short").expect_err("must fail"),
            "the token has 5 bytes; at least 16 needed"
        );
        assert!(Token::parse(b"0123456789 abcdef").is_err());
    }
}

/// Who sent a request, from the kernel (`sys::peer`), found when its
/// connection was accepted: the peer's uid (and gid on the Unix socket);
/// None when it cannot be told (a client that is not on this host).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The peer's user id.
    pub uid: Option<u32>,
    /// The peer's group id (Unix socket only).
    pub gid: Option<u32>,
}

impl Caller {
    /// The peer of a TCP connection from `remote` to `local`: its user
    /// when it is on this host (loopback, inet_diag), else nobody known.
    /// One netlink query, answered at once.
    pub fn of_tcp(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> Self {
        let uid = remote
            .ip()
            .is_loopback()
            .then(|| crate::sys::peer::tcp_peer(local, remote).ok())
            .flatten()
            .map(|peer| peer.uid);
        Self { uid, gid: None }
    }

    /// The peer of a Unix socket connection (`SO_PEERCRED`): its user and
    /// group.
    pub fn of_unix(stream: &tokio::net::UnixStream) -> Self {
        use std::os::fd::AsRawFd as _;
        match crate::sys::peer::unix_peer(stream.as_raw_fd()) {
            Ok(peer) => Self {
                uid: Some(peer.uid),
                gid: peer.gid,
            },
            Err(_) => Self::default(),
        }
    }
}

/// Marks a request that carried the bearer token ([`authenticate`]): its
/// sender is an operator.
#[derive(Clone, Copy, Debug)]
pub struct TokenHolder;

/// The operators besides root and token holders: the members of this
/// group (`operators_group`).
#[derive(Clone, Debug)]
pub struct Operators {
    /// The group's name, for the hint.
    pub group: String,
    /// Its id, None when the host has no such group.
    pub gid: Option<u32>,
}

impl Operators {
    /// The group `name`, looked up in the host's group database now.
    pub fn named(name: &str) -> Self {
        Self {
            group: name.to_string(),
            gid: group_id(name),
        }
    }

    /// Whether `caller` is root or a member of the group (its primary
    /// group, its gid on the Unix socket, or one of its user's groups).
    pub fn admit(&self, caller: Caller) -> bool {
        let Some(uid) = caller.uid else {
            return false;
        };
        if uid == 0 {
            return true;
        }
        let Some(gid) = self.gid else {
            return false;
        };
        caller.gid == Some(gid) || user_groups(uid).contains(&gid)
    }
}

/// The id of group `name` (`getgrnam_r`), None when there is none.
fn group_id(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a plain C struct, for which all zeroes is a valid value.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; buf is writable for its
    // length; the result points into group or is null.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &raw mut group,
            buf.as_mut_ptr(),
            buf.len(),
            &raw mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some(group.gr_gid)
}

/// The groups of user `uid` (its primary group and those it is a member
/// of, `getgrouplist`); empty when the user is unknown.
fn user_groups(uid: u32) -> Vec<u32> {
    // SAFETY: a plain C struct, for which all zeroes is a valid value.
    let mut passwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: as in group_id.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &raw mut passwd,
            buf.as_mut_ptr(),
            buf.len(),
            &raw mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Vec::new();
    }
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut count = groups.len() as libc::c_int;
    // SAFETY: the name is the NUL-terminated string getpwuid_r wrote into
    // buf; groups is writable for count entries.
    let rc = unsafe {
        libc::getgrouplist(
            passwd.pw_name,
            passwd.pw_gid,
            groups.as_mut_ptr(),
            &raw mut count,
        )
    };
    if rc < 0 {
        return Vec::new();
    }
    groups.truncate(usize::try_from(count).unwrap_or(0));
    groups
}

/// Middleware: decides who the request is for ([`Viewer`], put in its
/// extensions for the handlers and the routes' gate, [`gate_pid`]), and
/// answers 403 to a change a non-operator may not make.
///
/// An operator is a holder of the token, root or a member of the
/// operators' group; a request that came through no listener (no
/// [`Caller`]: tracerd's own, and tests) is an operator's. A peer whose uid
/// the kernel does not tell is [`Viewer::Nobody`]. A user (neither) may
/// read (GET, HEAD) and make the changes that touch only what is theirs
/// ([`users_may`]); anything else gets 403 with a hint that says who may.
pub async fn authorize(
    State(operators): State<Arc<Operators>>,
    mut request: Request,
    next: Next,
) -> Response {
    use axum::extract::ConnectInfo;
    use axum::http::Method;
    let caller = request
        .extensions()
        .get::<ConnectInfo<Caller>>()
        .map(|info| info.0);
    let viewer = if request.extensions().get::<TokenHolder>().is_some() {
        Viewer::Operator
    } else {
        match caller {
            None => Viewer::Operator,
            Some(caller) if operators.admit(caller) => Viewer::Operator,
            Some(Caller { uid: Some(uid), .. }) => Viewer::User(uid),
            Some(Caller { uid: None, .. }) => Viewer::Nobody,
        }
    };
    request.extensions_mut().insert(viewer);
    if viewer.is_operator()
        || matches!(*request.method(), Method::GET | Method::HEAD)
        || users_may(&request)
    {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::FORBIDDEN,
        "only an operator may do this: change tracing or the scope, clear traces, reset the peak of another user's process, load a file, or change another user's snapshot",
        format!(
            "operators are root, the members of group {} and holders of tracerd's token; anyone may read (GET) their own processes and take snapshots of them, reset their peaks, and label or delete the snapshots they stored",
            operators.group
        ),
    )
    .into_response()
}

/// The changes an unprivileged user may ask for, each on what is theirs
/// (the routes check whose it is, and answer 404 for what is not):
/// `POST /pid/{pid}/snapshots` and `POST /pid/{pid}/reset-peak` of their
/// processes, `POST /snapshots` with no body (a snapshot of their
/// processes; a body loads a file: operators only), `PATCH` and `DELETE
/// /snapshots/{id}` of their snapshots.
fn users_may(request: &Request) -> bool {
    use axum::http::Method;
    let segments: Vec<&str> = request.uri().path().trim_matches('/').split('/').collect();
    let method = request.method();
    match segments.as_slice() {
        ["pid", _, "snapshots" | "reset-peak"] => method == Method::POST,
        ["snapshots"] => method == Method::POST && !has_body(request),
        ["snapshots", _] => matches!(*method, Method::PATCH | Method::DELETE),
        _ => false,
    }
}

/// Whether a request announces a body: a `Content-Length` other than 0,
/// or any `Transfer-Encoding`.
fn has_body(request: &Request) -> bool {
    let headers = request.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// The [`Viewer`] [`authorize`] decided; an operator for a request that
/// did not pass through it (tracerd's own router in tests).
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Viewer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Viewer>()
            .copied()
            .unwrap_or(Viewer::Operator))
    }
}

/// Route middleware of every `/pid/{pid}` route: a process the viewer may
/// not see ([`Service::visible`]) is answered exactly as a pid no process
/// has (404, "no such process"), before the route does anything; one it
/// may see is traced exactly from now on if it was watched only
/// ([`Service::trace_on_query`], but for `tracing/stop`). A pid that does
/// not parse is left to the route (its 400).
pub async fn gate_pid(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    params: RawPathParams,
    request: Request,
    next: Next,
) -> Response {
    let pid = params
        .iter()
        .find(|(name, _)| *name == "pid")
        .and_then(|(_, raw)| super::params::parse_pid(raw).ok());
    let Some(pid) = pid else {
        return next.run(request).await;
    };
    // A query starts exact tracing of a process watched only (`exact =
    // "demand"`), but not the one that stops it (and `tracing/start`
    // starts it itself, with or without its descendants).
    let path = request.uri().path();
    let starts = !path.ends_with("/tracing/stop") && !path.ends_with("/tracing/start");
    let visible = super::blocking(move || {
        let visible = viewer.is_operator() || service.visible(viewer, pid);
        if visible && starts {
            service.trace_on_query(pid);
        }
        Ok::<_, ApiError>(visible)
    })
    .await;
    match visible {
        Ok(true) => next.run(request).await,
        Ok(false) => ApiError::from(ServiceError::NotTraced {
            pid,
            why: NotTracedWhy::NoProcess,
        })
        .into_response(),
        Err(err) => err.into_response(),
    }
}
