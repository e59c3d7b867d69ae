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

/// Middleware: a request without `Authorization: Bearer <token>` gets 401.
pub async fn authenticate(State(token): State<Token>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    if token.admits(given) {
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
