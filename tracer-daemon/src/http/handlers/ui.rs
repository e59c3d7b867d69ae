//! The web page (`/ui`): one HTML page, its script and its style sheet,
//! embedded in the binary (no file is read, nothing is fetched from
//! another host). The page reads everything it shows from the API with
//! relative URLs, so it works the same behind a proxy of the Unix socket;
//! the Content-Security-Policy lets it reach nothing but tracerd.
use axum::{
    extract::{Path, RawQuery},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::http::{ApiError, params::Params, params::spec};

/// The page, its script and its style: (name under `/ui/`, content type,
/// bytes), named as the path's spec names them (`spec::ASSET_NAMES`). The
/// page itself is `/ui`.
const ASSETS: [(&str, &str, &str); 3] = [
    (
        spec::ASSET_NAMES[0],
        "text/html; charset=utf-8",
        include_str!("../ui/index.html"),
    ),
    (
        spec::ASSET_NAMES[1],
        "text/javascript; charset=utf-8",
        include_str!("../ui/app.js"),
    ),
    (
        spec::ASSET_NAMES[2],
        "text/css; charset=utf-8",
        include_str!("../ui/style.css"),
    ),
];

/// What the page may load: itself, and the flame graph it fetched (a
/// `blob:` image); no inline script, no other host.
const CSP: &str = "default-src 'self'; img-src 'self' blob:; style-src 'self'; script-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

/// `GET /ui`: the page.
pub async fn page(RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    Ok(asset_response(ASSETS[0].1, ASSETS[0].2))
}

/// `GET /ui/{asset}`: the page's script or style sheet (or the page as
/// `index.html`); 404 naming them for anything else.
pub async fn asset(
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let (_, content_type, body) = ASSETS
        .iter()
        .find(|(asset, _, _)| *asset == name)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no such file of the page: {name:?}"),
                "the page is /ui; its files are /ui/app.js and /ui/style.css",
            )
        })?;
    Ok(asset_response(content_type, body))
}

fn asset_response(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files_and_every_one_is_served() {
        let page = ASSETS[0].2;
        for (name, _, _) in &ASSETS[1..] {
            assert!(page.contains(&format!("\"/ui/{name}\"")), "{name}");
        }
        assert!(!page.contains("http://") && !page.contains("https://"));
        let script = ASSETS[1].2;
        assert!(!script.contains("http://") || script.contains("http://www.w3.org/2000/svg"));
        assert!(!script.contains("https://"));
    }
}
