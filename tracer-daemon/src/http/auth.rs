//! Bearer-token authentication for TCP clients: the token is read from a
//! file only its owner can read, and compared in constant time.
use std::{os::unix::fs::PermissionsExt as _, path::Path, sync::Arc};

use axum::{
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use subtle::ConstantTimeEq as _;

use super::ApiError;
use super::server::ServerError;

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

/// Middleware: a request without `Authorization: Bearer <token>` gets 401;
/// one with it is an operator's ([`TokenHolder`]).
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

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>>
    for Caller
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        let remote = *stream.remote_addr();
        let uid = stream
            .io()
            .local_addr()
            .ok()
            .filter(|_| remote.ip().is_loopback())
            .and_then(|local| crate::sys::peer::tcp_peer(local, remote).ok())
            .map(|peer| peer.uid);
        Self { uid, gid: None }
    }
}

impl
    axum::extract::connect_info::Connected<
        axum::serve::IncomingStream<'_, tokio::net::UnixListener>,
    > for Caller
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::UnixListener>) -> Self {
        use std::os::fd::AsRawFd as _;
        match crate::sys::peer::unix_peer(stream.io().as_raw_fd()) {
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

/// Middleware: a request that changes anything (any method but GET and
/// HEAD) from a caller who is not an operator (root, a member of the
/// operators' group, a holder of the token) gets 403. A request that came
/// through no listener (no [`Caller`]: tracerd's own, and tests) passes.
pub async fn authorize(
    State(operators): State<Arc<Operators>>,
    request: Request,
    next: Next,
) -> Response {
    use axum::extract::ConnectInfo;
    use axum::http::Method;
    if matches!(*request.method(), Method::GET | Method::HEAD)
        || request.extensions().get::<TokenHolder>().is_some()
    {
        return next.run(request).await;
    }
    let caller = request
        .extensions()
        .get::<ConnectInfo<Caller>>()
        .map(|info| info.0);
    match caller {
        None => next.run(request).await,
        Some(caller) if operators.admit(caller) => next.run(request).await,
        Some(_) => ApiError::new(
            StatusCode::FORBIDDEN,
            "only an operator may change tracing, the scope or the stored snapshots",
            format!(
                "operators are root, the members of group {} and holders of tracerd's token; reading (GET) is open",
                operators.group
            ),
        )
        .into_response(),
    }
}
