//! The HTTP client of tracerd's API (`docs/api.md`): one HTTP/1 request per
//! connection, over TCP (`--addr`, default `127.0.0.1:7466`) or tracerd's
//! Unix socket (`--socket`), with `Authorization: Bearer TOKEN` on TCP when
//! a token is given (the socket takes none: tracerd asks the kernel who is
//! on the other end). Answers are read whole; a 4xx/5xx answer becomes
//! [`ClientError::Api`] with tracerd's `{"error", "hint"}`, a connection
//! that cannot be made [`ClientError::Unreachable`] with what to do.

use std::{fmt, path::PathBuf, time::Duration};

use http_body_util::{BodyExt as _, Full};
use hyper::{
    Method, Request, StatusCode,
    body::Bytes,
    header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderMap},
};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Where tracerd listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `HOST:PORT` of its TCP listener.
    Tcp(String),
    /// The path of its Unix socket.
    Unix(PathBuf),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(addr) => f.write_str(addr),
            Self::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// What can go wrong talking to tracerd.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection could be made (nothing listens, or the socket is missing).
    #[error(
        "tracerd is not running on {endpoint} ({reason}): start it with `cargo xtask run` or `systemctl start tracerd`{}",
        match endpoint {
            Endpoint::Tcp(_) => ", or point --addr (TRACER_ADDR) or --socket (TRACER_SOCKET) at it",
            Endpoint::Unix(_) => ", or point --socket (TRACER_SOCKET) or --addr (TRACER_ADDR) at it",
        }
    )]
    Unreachable { endpoint: Endpoint, reason: String },
    /// The connection broke, or the answer was not HTTP.
    #[error("talking to tracerd on {endpoint} failed: {reason}")]
    Transport { endpoint: Endpoint, reason: String },
    /// tracerd did not answer in time.
    #[error("tracerd on {endpoint} did not answer within {} s: {what}", timeout.as_secs())]
    Timeout {
        endpoint: Endpoint,
        timeout: Duration,
        what: String,
    },
    /// tracerd answered with an error status: its message and hint.
    #[error("{message}{}", hint.as_deref().map(|h| format!("\n  hint: {h}")).unwrap_or_default())]
    Api {
        status: u16,
        message: String,
        hint: Option<String>,
    },
    /// An answer that should have been JSON was not.
    #[error("tracerd's answer to {what} is not the JSON docs/api.md describes: {reason}")]
    BadAnswer { what: String, reason: String },
}

/// A whole answer of tracerd.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The body as UTF-8 text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as one of the API's answers (`tracer_api`).
    ///
    /// # Errors
    /// [`ClientError::BadAnswer`] when it is not that answer.
    pub fn typed<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T, ClientError> {
        serde_json::from_slice(&self.body).map_err(|e| ClientError::BadAnswer {
            what: what.to_string(),
            reason: e.to_string(),
        })
    }

    /// A header's value as text, if present.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

/// A client of one tracerd: a current-thread tokio runtime that each
/// request blocks on, so the commands stay plain sequential code.
pub struct Client {
    endpoint: Endpoint,
    token: Option<String>,
    timeout: Duration,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// A client of `endpoint`, sending `token` over TCP; each request may
    /// take `timeout`.
    ///
    /// # Errors
    /// When the runtime cannot be built (no threads or descriptors left).
    pub fn new(
        endpoint: Endpoint,
        token: Option<String>,
        timeout: Duration,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        Ok(Self {
            endpoint,
            token,
            timeout,
            runtime,
        })
    }

    /// `GET path` (with its query); an error status is an error.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn get(&self, path: &str) -> Result<Answer, ClientError> {
        self.ok(Method::GET, path, None)
    }

    /// `GET path` as one of the API's answers (`tracer_api`).
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn get_typed<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.get(path)?.typed(&format!("GET {path}"))
    }

    /// `POST path` with an optional body (sent as `application/octet-stream`).
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn post(&self, path: &str, body: Option<Vec<u8>>) -> Result<Answer, ClientError> {
        self.ok(Method::POST, path, body)
    }

    /// `DELETE path`.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn delete(&self, path: &str) -> Result<Answer, ClientError> {
        self.ok(Method::DELETE, path, None)
    }

    /// A request whose error statuses become [`ClientError::Api`].
    fn ok(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Answer, ClientError> {
        let answer = self.send(method, path, body)?;
        if answer.status >= 400 {
            return Err(api_error(&answer));
        }
        Ok(answer)
    }

    /// Sends one request and reads the whole answer, whatever its status.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`], [`ClientError::Transport`],
    /// [`ClientError::Timeout`].
    pub fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, ClientError> {
        let what = format!("{method} {path}");
        let work = self.exchange(method, path, body);
        self.runtime.block_on(async {
            match tokio::time::timeout(self.timeout, work).await {
                Ok(result) => result,
                Err(_) => Err(ClientError::Timeout {
                    endpoint: self.endpoint.clone(),
                    timeout: self.timeout,
                    what,
                }),
            }
        })
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, ClientError> {
        let host = match &self.endpoint {
            Endpoint::Tcp(addr) => addr.clone(),
            Endpoint::Unix(_) => "localhost".to_string(),
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, host);
        if let (Endpoint::Tcp(_), Some(token)) = (&self.endpoint, &self.token) {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/octet-stream");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.transport(format!("a bad request {path:?}: {e}")))?;
        match &self.endpoint {
            Endpoint::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr.as_str())
                    .await
                    .map_err(|e| self.unreachable(&e))?;
                self.round_trip(TokioIo::new(stream), request).await
            }
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| self.unreachable(&e))?;
                self.round_trip(TokioIo::new(stream), request).await
            }
        }
    }

    async fn round_trip<S>(
        &self,
        io: TokioIo<S>,
        request: Request<Full<Bytes>>,
    ) -> Result<Answer, ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| self.transport(e.to_string()))?;
        // The connection is driven beside the request; it ends with the
        // answer (one request per connection).
        let driver = tokio::spawn(connection);
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| self.transport(e.to_string()))?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| self.transport(e.to_string()))?
            .to_bytes();
        driver.abort();
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    fn unreachable(&self, err: &std::io::Error) -> ClientError {
        ClientError::Unreachable {
            endpoint: self.endpoint.clone(),
            reason: err.to_string(),
        }
    }

    fn transport(&self, reason: String) -> ClientError {
        ClientError::Transport {
            endpoint: self.endpoint.clone(),
            reason,
        }
    }
}

/// tracerd's error answer as [`ClientError::Api`]: its `error` and `hint`,
/// or, for a body that is not the API's JSON, the status and the text.
pub fn api_error(answer: &Answer) -> ClientError {
    let status = answer.status;
    let parsed: Option<Value> = serde_json::from_slice(&answer.body).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let message = field("error").unwrap_or_else(|| {
        let reason = StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("error");
        let text = answer.text();
        if text.trim().is_empty() {
            format!("tracerd answered {status} {reason}")
        } else {
            format!("tracerd answered {status} {reason}: {}", text.trim())
        }
    });
    let mut hint = field("hint");
    if status == 401 {
        hint = Some(
            "tracerd wants a bearer token over TCP: pass --token-file FILE (TRACER_TOKEN_FILE) or --token TOKEN (TRACER_TOKEN) with the token of its auth_token_file, or use its Unix socket (--socket)"
                .to_string(),
        );
    }
    ClientError::Api {
        status,
        message,
        hint,
    }
}

/// A query string (`?a=1&b=2`, empty when there are no pairs), each value
/// percent-encoded.
pub fn query(pairs: &[(String, String)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        out.append_pair(k, v);
    }
    format!("?{}", out.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            headers: HeaderMap::new(),
            body: Bytes::from(body.to_string()),
        }
    }

    #[test]
    fn an_api_error_shows_tracerds_message_and_hint() {
        let err = api_error(&answer(
            400,
            r#"{"error":"invalid group_by \"bogus\"","hint":"group_by is one of: filename, lineno"}"#,
        ));
        assert_eq!(
            err.to_string(),
            "invalid group_by \"bogus\"\n  hint: group_by is one of: filename, lineno"
        );
    }

    #[test]
    fn an_error_without_the_apis_json_shows_the_status_and_text() {
        assert_eq!(
            api_error(&answer(502, "bad gateway\n")).to_string(),
            "tracerd answered 502 Bad Gateway: bad gateway"
        );
        assert_eq!(
            api_error(&answer(500, "")).to_string(),
            "tracerd answered 500 Internal Server Error"
        );
    }

    #[test]
    fn a_401_says_how_to_send_the_token() {
        let err = api_error(&answer(
            401,
            r#"{"error":"missing or wrong bearer token","hint":"send Authorization"}"#,
        ));
        assert!(
            err.to_string().starts_with(
                "missing or wrong bearer token\n  hint: tracerd wants a bearer token over TCP: pass --token-file FILE"
            ),
            "{err}"
        );
    }

    #[test]
    fn the_unreachable_error_says_how_to_start_tracerd() {
        let err = ClientError::Unreachable {
            endpoint: Endpoint::Tcp("127.0.0.1:7466".into()),
            reason: "Connection refused (os error 111)".into(),
        };
        assert_eq!(
            err.to_string(),
            "tracerd is not running on 127.0.0.1:7466 (Connection refused (os error 111)): start it with `cargo xtask run` or `systemctl start tracerd`, or point --addr (TRACER_ADDR) or --socket (TRACER_SOCKET) at it"
        );
    }

    #[test]
    fn query_strings_are_percent_encoded() {
        assert_eq!(query(&[]), "");
        assert_eq!(
            query(&[
                ("include".into(), "/a b/*.c:12@7".into()),
                ("limit".into(), "5".into())
            ]),
            "?include=%2Fa+b%2F*.c%3A12%407&limit=5"
        );
    }
}
