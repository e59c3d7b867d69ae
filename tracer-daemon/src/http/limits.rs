//! Limits around every route: request body size (413), a per-request
//! timeout (503), a pause in a request body (408), a concurrency limit on
//! expensive routes (429, see [`super::work::admit`]), a memory budget of
//! each request's work (413, see [`super::work`]), and the
//! validation of every request's path before any route sees it (400).
use std::time::Duration;

use axum::{
    extract::Request,
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::ApiError;
use crate::config::Config;

/// The limits put around every route.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body in bytes (413 beyond).
    pub body_limit_bytes: usize,
    /// Time a request may take (503 beyond).
    pub request_timeout: Duration,
    /// Longest pause while a request body arrives (408 beyond).
    pub request_read_timeout: Duration,
    /// Expensive requests whose work runs at once (429 beyond).
    pub max_expensive_requests: usize,
    /// Bytes the work of one request may hold (`request_memory_budget`;
    /// 413 beyond).
    pub request_memory_budget: u64,
}

impl From<&Config> for Limits {
    fn from(config: &Config) -> Self {
        let api = &config.api;
        Limits {
            body_limit_bytes: usize::try_from(api.body_limit_bytes).unwrap_or(usize::MAX),
            request_timeout: Duration::from_secs(api.request_timeout_secs),
            request_read_timeout: Duration::from_secs(api.request_read_timeout_secs),
            max_expensive_requests: api.max_expensive_requests as usize,
            request_memory_budget: api.request_memory_budget,
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

/// Middleware: a request whose path [`check_path`] refuses gets 400.
pub async fn validate_request(request: Request, next: Next) -> Response {
    match check_path(request.uri().path(), request.uri().query()) {
        Ok(()) => next.run(request).await,
        Err(reason) => ApiError::bad(
            format!("invalid request path: {reason}"),
            "paths are like /pid/1234/statistics; GET /health answers when tracerd is up",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
