//! The whole HTTP surface over a fake kernel (no root, no eBPF): every
//! error is the API's JSON `{"error", "hint"}`, whoever made it (a handler,
//! axum's rejections, tower-http's limits), and routes without parameters
//! refuse unknown ones.
use std::{collections::HashMap, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::Body,
    extract::{Query, Request},
    http::{HeaderMap, StatusCode, header},
    routing::{get, post},
};
use serde_json::Value;
use tower::ServiceExt as _;

use super::{Limits, Operators, api_router, app};
use crate::metrics::Metrics;
use crate::service::tests::{PID, service, start};

fn limits() -> Limits {
    Limits {
        body_limit_bytes: 1024,
        request_timeout: Duration::from_secs(30),
        request_read_timeout: Duration::from_secs(10),
        max_expensive_requests: 2,
        request_memory_budget: 0,
    }
}

/// The API of a fake kernel that traces [`PID`], with `extra` routes
/// beside it (extractors no route of the API uses yet), behind every layer
/// tracerd puts around it.
fn surface(extra: Router<Arc<crate::service::Service>>) -> Router {
    surface_with(extra, &limits())
}

/// [`surface`] with other limits.
fn surface_with(extra: Router<Arc<crate::service::Service>>, limits: &Limits) -> Router {
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    let api = api_router(service.clone()).merge(extra.with_state(service));
    app(
        api,
        Arc::new(Metrics::new()),
        limits,
        None,
        Arc::new(Operators::named("tracer")),
    )
}

/// Sends a request; returns its status, headers and, for an error, its
/// body, which must be JSON (the test fails with the body otherwise).
async fn call(app: &Router, request: Request) -> (StatusCode, HeaderMap, Value) {
    let what = format!("{} {}", request.method(), request.uri());
    let response = app.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.expect("body");
    if parts.status.is_success() {
        return (parts.status, parts.headers, Value::Null);
    }
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "{what}: {} with a body that is not JSON: {:?}",
            parts.status,
            String::from_utf8_lossy(&bytes)
        )
    });
    (parts.status, parts.headers, value)
}

fn request(method: &str, uri: &str, body: Body) -> Request {
    Request::builder()
        .method(method)
        .uri(uri)
        .body(body)
        .expect("request")
}

/// Asserts the API's error shape: `error` and `hint`, both non-empty
/// strings, and nothing else.
fn assert_error_shape(what: &str, body: &Value) {
    let object = body.as_object().expect("an object");
    assert_eq!(object.len(), 2, "{what}: {body}");
    for field in ["error", "hint"] {
        assert!(
            !body[field].as_str().unwrap_or_default().is_empty(),
            "{what}: no {field}: {body}"
        );
    }
}

#[tokio::test]
async fn routes_without_parameters_refuse_unknown_ones() {
    let app = surface(Router::new());
    for path in [
        "/health".to_string(),
        "/maps".into(),
        "/metrics".into(),
        "/scope".into(),
        format!("/pid/{PID}"),
        format!("/pid/{PID}/traced-memory"),
    ] {
        let (status, _, body) = call(&app, request("GET", &path, Body::empty())).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        let with = format!("{path}?verbose=1");
        let (status, _, body) = call(&app, request("GET", &with, Body::empty())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{with}: {body}");
        assert_eq!(body["error"], "unknown parameter \"verbose\"", "{with}");
        assert_eq!(
            body["hint"], "valid parameters: none (this route takes no query parameters)",
            "{with}"
        );
    }
}

#[tokio::test]
async fn a_pid_is_digits_without_sign_or_leading_zero() {
    let app = surface(Router::new());
    let (status, _, _) = call(&app, request("GET", &format!("/pid/{PID}"), Body::empty())).await;
    assert_eq!(status, StatusCode::OK);
    for pid in [
        "+1",
        "01",
        &format!("0{PID}"),
        &format!("+{PID}"),
        "4294967296",
    ] {
        for path in [format!("/pid/{pid}"), format!("/pid/{pid}/statistics")] {
            let (status, _, body) = call(&app, request("GET", &path, Body::empty())).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
            assert_eq!(body["error"], format!("invalid pid {pid:?}"), "{path}");
        }
    }
    let (status, _, body) = call(&app, request("PUT", "/scope?pid=01", Body::empty())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _, body) = call(&app, request("GET", "/snapshots?pid=%2B1", Body::empty())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// Every kind of error axum or tower-http answers on its own comes back in
/// the API's shape, with its status and the headers that go with it.
#[tokio::test]
async fn every_error_is_the_apis_json_whoever_made_it() {
    let extra = Router::new()
        .route(
            "/test/json",
            post(|Json(value): Json<Value>| async move { Json(value) }),
        )
        .route(
            "/test/query",
            get(|Query(q): Query<HashMap<String, u32>>| async move { format!("{q:?}") }),
        );
    let app = surface(extra);
    let json = |uri: &str, kind: Option<&str>, body: &'static str| {
        let mut builder = Request::builder().method("POST").uri(uri);
        if let Some(kind) = kind {
            builder = builder.header(header::CONTENT_TYPE, kind);
        }
        builder.body(Body::from(body)).expect("request")
    };
    let cases: Vec<(&str, Request, StatusCode, &str)> = vec![
        (
            "unknown route",
            request("GET", "/nowhere", Body::empty()),
            StatusCode::NOT_FOUND,
            "GET /health",
        ),
        (
            "method of another route",
            request("DELETE", "/health", Body::empty()),
            StatusCode::METHOD_NOT_ALLOWED,
            "GET /health",
        ),
        (
            "method on /metrics",
            request("POST", "/metrics", Body::empty()),
            StatusCode::METHOD_NOT_ALLOWED,
            "GET /metrics",
        ),
        (
            "path that is not UTF-8",
            request("GET", "/pid/%FF/traced-memory", Body::empty()),
            StatusCode::BAD_REQUEST,
            "paths are like /pid/1234/statistics",
        ),
        (
            "snapshot id that is not UTF-8",
            request("GET", "/snapshots/%C3%28", Body::empty()),
            StatusCode::BAD_REQUEST,
            "paths are like /pid/1234/statistics",
        ),
        (
            "query extractor",
            request("GET", "/test/query?n=x", Body::empty()),
            StatusCode::BAD_REQUEST,
            "parameters as docs/api.md lists them",
        ),
        (
            "JSON without its content type",
            json("/test/json", None, "{}"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the body a route takes",
        ),
        (
            "JSON that does not parse",
            json("/test/json", Some("application/json"), "{"),
            StatusCode::BAD_REQUEST,
            "parameters as docs/api.md lists them",
        ),
        (
            "body over the limit, announced",
            Request::builder()
                .method("POST")
                .uri("/snapshots")
                .header(header::CONTENT_LENGTH, "2048")
                .body(Body::from(vec![b'x'; 2048]))
                .expect("request"),
            StatusCode::PAYLOAD_TOO_LARGE,
            "request bodies are at most 1024 bytes (body_limit_bytes",
        ),
        (
            "body over the limit, streamed",
            // No Content-Length: the limit is found while reading.
            request("POST", "/snapshots", Body::from(vec![b'x'; 2048])),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_limit_bytes",
        ),
    ];
    for (what, request, status, hint) in cases {
        let (got, _, body) = call(&app, request).await;
        assert_eq!(got, status, "{what}: {body}");
        assert_error_shape(what, &body);
        let text = body["hint"].as_str().unwrap_or_default();
        assert!(text.contains(hint), "{what}: hint {text:?} lacks {hint:?}");
    }
    let (_, headers, body) = call(&app, request("GET", "/pid/%FF", Body::empty())).await;
    assert_eq!(
        headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
        Some(&b"application/json"[..]),
        "{body}"
    );
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Invalid UTF-8 in `pid`"),
        "axum's own words stay the error: {body}"
    );
}

/// A request body that sends `first` and then nothing more, ever.
struct Stalled(Option<&'static [u8]>);

impl hyper::body::Body for Stalled {
    type Data = axum::body::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        match self.0.take() {
            Some(first) => std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(
                axum::body::Bytes::from_static(first),
            )))),
            None => std::task::Poll::Pending,
        }
    }
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_a_408_once_it_paused_request_read_timeout() {
    let limits = Limits {
        request_read_timeout: Duration::from_millis(200),
        ..limits()
    };
    let app = surface_with(Router::new(), &limits);
    let started = std::time::Instant::now();
    let stalled = Request::builder()
        .method("POST")
        .uri("/snapshots")
        .header(header::CONTENT_LENGTH, "100")
        .body(Body::new(Stalled(Some(b"0123456789"))))
        .expect("request");
    let (status, _, body) = call(&app, stalled).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert_eq!(body["error"], "the request body stopped arriving");
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[tokio::test]
async fn traces_are_streamed_as_the_compact_json_of_their_map_and_as_text_lines() {
    let (kernel, service) = crate::service::tests::service();
    start(&kernel, &service, PID);
    for (at, size) in [(0x1000, 100), (0x2000, 28), (0x3000, 7)] {
        kernel.alloc(PID, at, size, &[0x40_1000]);
    }
    let app = app(
        api_router(service),
        Arc::new(Metrics::new()),
        &limits(),
        None,
        Arc::new(Operators::named("tracer")),
    );
    let get = |uri: String| {
        let app = app.clone();
        async move {
            let response = app
                .oneshot(request("GET", &uri, Body::empty()))
                .await
                .expect("infallible");
            let headers = response.headers().clone();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("body");
            (headers, bytes)
        }
    };
    let (headers, body) = get(format!("/pid/{PID}/traces?limit=0")).await;
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    let value: Value = serde_json::from_slice(&body).expect("json");
    // Written piece by piece, it is what Json(value) would have sent.
    assert_eq!(serde_json::to_vec(&value).expect("json"), body.to_vec());
    let sizes: Vec<_> = value["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .map(|t| t["size"].as_u64())
        .collect();
    let mut sorted = sizes.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [Some(7), Some(28), Some(100)], "{value}");
    assert_eq!(
        (value["total"].as_u64(), value["limit"].as_u64()),
        (Some(3), Some(0))
    );
    let (headers, body) = get(format!("/pid/{PID}/traces?offset=1&limit=1&format=text")).await;
    assert_eq!(headers[header::CONTENT_TYPE], "text/plain; charset=utf-8");
    assert_eq!(headers["x-tracer-complete"], "true");
    let text = String::from_utf8(body.to_vec()).expect("utf-8");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.ends_with(" B\n"), "{text}");
}

/// The route table's facts, each asked of the real surface, method by
/// method: the query parameters each handler accepts (the names its 400
/// lists) and the words it takes, the 429 of expensive routes, the 403 of
/// operators' changes, the 404 of a path that names nothing, the 401 and
/// 413 every route can give. The OpenAPI document describes exactly these
/// (see `openapi::tests`).
mod table {
    use axum::extract::ConnectInfo;

    use super::*;
    use crate::http::auth::{Caller, Token};
    use crate::http::params::spec::{self, Kind};
    use crate::http::routes::{Op, ROUTES, Route, Verb};

    /// `route`'s path with every `{name}` given `values`' value (a pid
    /// tracerd traces, an address, an id, a file of the page by default).
    fn concrete(route: &Route, values: &[(&str, String)]) -> String {
        route
            .path
            .split('/')
            .map(|s| {
                s.strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .map_or_else(
                        || s.to_string(),
                        |name| {
                            values
                                .iter()
                                .find(|(n, _)| *n == name)
                                .map(|(_, v)| v.clone())
                                .unwrap_or_else(|| panic!("no value for {{{name}}}"))
                        },
                    )
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    fn existing() -> Vec<(&'static str, String)> {
        vec![
            ("pid", PID.to_string()),
            ("id", "1".into()),
            ("address", "0x10".into()),
            ("asset", "app.js".into()),
        ]
    }

    fn ops() -> impl Iterator<Item = (&'static Route, &'static Op)> {
        ROUTES
            .iter()
            .flat_map(|route| route.ops.iter().map(move |op| (route, op)))
    }

    fn ask(op: &Op, uri: &str) -> Request {
        request(op.method.as_str(), uri, Body::empty())
    }

    #[tokio::test]
    async fn each_handler_accepts_exactly_the_parameters_the_table_names() {
        let app = surface(Router::new());
        for (route, op) in ops() {
            let uri = format!("{}?zz_unknown=1", concrete(route, &existing()));
            let (status, _, body) = call(&app, ask(op, &uri)).await;
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{} {uri}: {body}",
                op.method.as_str()
            );
            let names = spec::names(op.query);
            let listed = if names.is_empty() {
                "none (this route takes no query parameters)".to_string()
            } else {
                names.join(", ")
            };
            assert_eq!(
                body["hint"],
                format!("valid parameters: {listed}"),
                "{} {uri}",
                op.method.as_str()
            );
        }
    }

    #[tokio::test]
    async fn each_handler_takes_every_word_the_table_names_and_no_other() {
        let app = surface(Router::new());
        let mut checked = 0;
        for (route, op) in ops() {
            let params = op.query.iter().flat_map(|g| g.iter());
            for param in params {
                let Kind::Words(words) = param.kind else {
                    continue;
                };
                let path = concrete(route, &existing());
                let invalid = format!("invalid {} ", param.name);
                for word in words.iter().chain(["zz"].iter()) {
                    let uri = format!("{path}?{}={word}", param.name);
                    let (_, _, body) = call(&app, ask(op, &uri)).await;
                    let refused = body["error"]
                        .as_str()
                        .is_some_and(|e| e.starts_with(&invalid));
                    assert_eq!(
                        refused,
                        *word == "zz",
                        "{} {uri}: {body}",
                        op.method.as_str()
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 50, "{checked}");
    }

    #[tokio::test]
    async fn expensive_routes_and_only_they_answer_429_when_every_permit_is_taken() {
        let app = surface_with(
            Router::new(),
            &Limits {
                max_expensive_requests: 0,
                ..limits()
            },
        );
        for (route, op) in ops() {
            let uri = format!("{}?zz_unknown=1", concrete(route, &existing()));
            let (status, _, body) = call(&app, ask(op, &uri)).await;
            let expected = if op.statuses(route).contains(&429) {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::BAD_REQUEST
            };
            assert_eq!(status, expected, "{} {uri}: {body}", op.method.as_str());
        }
    }

    #[tokio::test]
    async fn a_user_gets_403_exactly_for_the_operators_changes() {
        let app = surface(Router::new());
        for (route, op) in ops() {
            let uri = format!("{}?zz_unknown=1", concrete(route, &existing()));
            // A body: POST /snapshots with a file is the operators'.
            let mut req = request(op.method.as_str(), &uri, Body::from("x"));
            req.headers_mut().insert(
                header::CONTENT_LENGTH,
                header::HeaderValue::from_static("1"),
            );
            req.extensions_mut().insert(ConnectInfo(Caller {
                uid: Some(4_000_000),
                gid: None,
            }));
            let (status, _, body) = call(&app, req).await;
            assert_eq!(
                status == StatusCode::FORBIDDEN,
                op.statuses(route).contains(&403),
                "{} {uri}: {status} {body}",
                op.method.as_str()
            );
            assert_eq!(op.operators, status == StatusCode::FORBIDDEN);
            if op.method == Verb::Get {
                assert!(!op.operators, "{}", route.path);
            }
        }
    }

    #[tokio::test]
    async fn a_path_that_names_nothing_is_a_404_where_the_table_says() {
        let app = surface(Router::new());
        let missing = [
            ("pid", "4000000".to_string()),
            ("id", "999".into()),
            ("address", "0x10".into()),
            ("asset", "nope.js".into()),
        ];
        for (route, op) in ops() {
            let uri = concrete(route, &missing);
            // Parameters a route requires, so that only the path is wrong.
            let uri = match (route.path, op.method) {
                ("/snapshots/{id}/compare", _) => format!("{uri}?base=1"),
                ("/snapshots/{id}", Verb::Patch) => format!("{uri}?label=x"),
                _ => uri,
            };
            let (status, _, body) = call(&app, ask(op, &uri)).await;
            let named = route.path.contains('{');
            if named {
                assert!(op.statuses(route).contains(&404), "{}", route.path);
                assert_eq!(
                    status,
                    StatusCode::NOT_FOUND,
                    "{} {uri}: {body}",
                    op.method.as_str()
                );
            } else {
                assert_ne!(
                    status,
                    StatusCode::NOT_FOUND,
                    "{} {uri}: {body}",
                    op.method.as_str()
                );
            }
        }
    }

    #[tokio::test]
    async fn every_route_answers_401_without_the_token_and_413_past_the_body_limit() {
        let (kernel, service) = service();
        start(&kernel, &service, PID);
        let token = Token::parse(b"0123456789abcdef0123456789abcdef").expect("token");
        let app = app(
            api_router(service),
            Arc::new(Metrics::new()),
            &limits(),
            Some(token),
            Arc::new(Operators::named("tracer")),
        );
        let plain = surface(Router::new());
        for (route, op) in ops() {
            let uri = concrete(route, &existing());
            let statuses = op.statuses(route);
            let (status, headers, _) = call(&app, ask(op, &uri)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri}");
            assert!(statuses.contains(&401) && headers.contains_key(header::WWW_AUTHENTICATE));
            let big = Request::builder()
                .method(op.method.as_str())
                .uri(&uri)
                .header(header::CONTENT_LENGTH, "2048")
                .body(Body::from(vec![b'x'; 2048]))
                .expect("request");
            let (status, _, body) = call(&plain, big).await;
            assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{uri}: {body}");
            assert!(statuses.contains(&413));
        }
    }
}
