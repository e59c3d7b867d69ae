//! The work of requests over a real router: the memory budget, abandoned
//! requests, streamed answers and the threads of expensive work.
use std::{collections::HashMap, io::Write, pin::Pin, sync::mpsc as std_mpsc, time::Duration};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Query, Request},
    http::{HeaderValue, header},
    routing::get,
};
use tower::ServiceExt as _;

use super::*;
use crate::http::{Limits, Operators, app};
use crate::metrics::Metrics;
use crate::service::ServiceError;
use crate::sys::alloc::thread_net_bytes;
use std::sync::atomic::Ordering;
use tracer_model::interrupt::Interrupted;

fn limits(budget: u64) -> Limits {
    Limits {
        body_limit_bytes: 1024,
        request_timeout: Duration::from_secs(30),
        request_read_timeout: Duration::from_secs(10),
        max_expensive_requests: 1,
        request_memory_budget: budget,
    }
}

/// `routes` behind every layer of tracerd, with its metrics.
fn surface(routes: Router, budget: u64) -> (Router, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let app = app(
        routes,
        metrics.clone(),
        &limits(budget),
        None,
        Arc::new(Operators::named("tracer")),
    );
    (app, metrics)
}

fn get_request(uri: &str) -> Request {
    Request::builder()
        .uri(uri)
        .body(Body::empty())
        .expect("request")
}

async fn call(app: &Router, uri: &str) -> (StatusCode, Vec<u8>) {
    let response = app
        .clone()
        .oneshot(get_request(uri))
        .await
        .expect("infallible");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 30)
        .await
        .expect("body");
    (status, body.to_vec())
}

/// The value of `tracer_requests_cancelled_total{reason}`, 0 when
/// absent.
fn cancelled(metrics: &Metrics, reason: &str) -> u64 {
    let text = metrics.encode(true).expect("encode");
    let series = format!("tracer_requests_cancelled_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Waits (at most 5 s) until `tracer_requests_cancelled_total{reason}`
/// is `expected` (the work counts itself as it returns, after what
/// the test saw of it); returns the last value read.
async fn cancelled_after(metrics: &Metrics, reason: &str, expected: u64) -> u64 {
    for _ in 0..500 {
        if cancelled(metrics, reason) == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancelled(metrics, reason)
}

fn stopped(err: Interrupted) -> ApiError {
    ServiceError::from(err).into()
}

#[tokio::test]
async fn work_past_its_memory_budget_stops_at_once_and_is_a_413_that_says_how_to_ask_for_less() {
    let steps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = steps.clone();
    // 64 KiB more at each step, the check polled at each: 16 of them
    // are 1 MiB, and with the Vec that holds them, past it.
    let route = Router::new().route(
        "/pid/{pid}/statistics",
        get(move || {
            let steps = counted.clone();
            async move {
                blocking(move || {
                    let mut held = Vec::new();
                    loop {
                        held.push(vec![1u8; 64 * 1024]);
                        steps.fetch_add(1, Ordering::SeqCst);
                        tracer_model::interrupt::check().map_err(stopped)?;
                        if held.len() == 1000 {
                            return Ok::<_, ApiError>("done");
                        }
                    }
                })
                .await
            }
        }),
    );
    let (app, metrics) = surface(route, 1 << 20);
    let (status, body) = call(&app, "/pid/1/statistics").await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({
            "error": "the answer needs more than the request memory budget of 1048576 bytes",
            "hint": "ask for less: page the traces with limit= and offset=, narrow them with \
                     filters (filename=, lineno=, allocator=, domain=, ...; exclude_ for the \
                     opposite), take text with format=text, or ask an operator to raise \
                     request_memory_budget",
        })
    );
    assert_eq!(steps.load(Ordering::SeqCst), 16);
    assert_eq!(cancelled(&metrics, "memory_budget"), 1);
    assert_eq!(cancelled(&metrics, "abandoned"), 0);
}

#[tokio::test]
async fn an_abandoned_request_stops_its_work_which_holds_the_permit_until_it_ends() {
    // The work of `?hold` waits for the test's word (so that it cannot
    // see its request go), then polls the check until told to stop.
    let (word_tx, word_rx) = std_mpsc::channel::<()>();
    let word_rx = Arc::new(std::sync::Mutex::new(word_rx));
    let (ended_tx, ended_rx) = std_mpsc::channel::<Result<usize, String>>();
    let route = Router::new().route(
        "/pid/{pid}/statistics",
        get(move |Query(query): Query<HashMap<String, String>>| {
            let (word_rx, ended_tx) = (word_rx.clone(), ended_tx.clone());
            async move {
                blocking(move || {
                    if !query.contains_key("hold") {
                        return Ok::<_, ApiError>("served".to_string());
                    }
                    let _ = word_rx.lock().map(|rx| rx.recv());
                    for step in 0..usize::MAX {
                        if let Err(err) = tracer_model::interrupt::check() {
                            let _ = ended_tx.send(Ok(step));
                            return Err(stopped(err));
                        }
                        std::thread::sleep(Duration::from_millis(1));
                        if step == 10_000 {
                            let _ = ended_tx.send(Err("never stopped".into()));
                            break;
                        }
                    }
                    Ok("ran to its end".to_string())
                })
                .await
            }
        }),
    );
    let (app, metrics) = surface(route, 0);
    let held = tokio::spawn({
        let app = app.clone();
        async move { app.oneshot(get_request("/pid/1/statistics?hold")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The client leaves: hyper drops the request's future.
    held.abort();
    assert!(held.await.is_err_and(|e| e.is_cancelled()));
    // Its work still runs: it holds the one permit.
    let (status, _) = call(&app, "/pid/1/statistics").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Let go, it sees at its first check that nobody waits.
    word_tx.send(()).expect("the work waits");
    let ended = tokio::task::spawn_blocking(move || ended_rx.recv_timeout(Duration::from_secs(5)))
        .await
        .expect("join");
    assert_eq!(ended, Ok(Ok(0)));
    // Once it ended, the permit is back: the next one is served.
    let mut status = StatusCode::TOO_MANY_REQUESTS;
    for _ in 0..100 {
        (status, _) = call(&app, "/pid/1/statistics").await;
        if status != StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cancelled_after(&metrics, "abandoned", 1).await, 1);
    assert_eq!(cancelled(&metrics, "memory_budget"), 0);
}

#[tokio::test]
async fn a_streamed_answer_arrives_whole_while_its_work_holds_a_few_chunks() {
    let (held_tx, held_rx) = std_mpsc::channel::<i64>();
    let route = Router::new().route(
        "/pid/{pid}/traces",
        get(move || {
            let held_tx = held_tx.clone();
            async move {
                streamed(move |sink| {
                    let start = thread_net_bytes();
                    let mut most = 0;
                    sink.begin(vec![(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/plain"),
                    )]);
                    for line in 0..1_000_000 {
                        writeln!(sink, "{line}").map_err(ApiError::internal)?;
                        most = most.max(thread_net_bytes() - start);
                    }
                    let _ = held_tx.send(most);
                    Ok(())
                })
                .await
            }
        }),
    );
    let (app, metrics) = surface(route, 1 << 20);
    let (status, body) = call(&app, "/pid/1/traces").await;
    assert_eq!(status, StatusCode::OK);
    let expected: String = (0..1_000_000).map(|line| format!("{line}\n")).collect();
    assert_eq!(body.len(), 6_888_890);
    assert!(body == expected.as_bytes());
    // 6.9 MB written, under a budget of 1 MiB: the work held its
    // chunk being written, never more than 2 of them.
    let most = held_rx.recv().expect("the work ended");
    assert!(most <= 2 * CHUNK_BYTES as i64, "{most}");
    assert_eq!(cancelled(&metrics, "memory_budget"), 0);
}

/// The calling thread's nice value (Linux's is per thread).
///
/// # Errors
/// The `getpriority` call's.
fn this_threads_nice() -> std::io::Result<i32> {
    // SAFETY: gettid and getpriority take no pointer; errno is cleared
    // first, as getpriority may return -1 as a value.
    unsafe {
        let tid = libc::gettid();
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(nice)
    }
}

#[tokio::test]
async fn an_expensive_streamed_answer_read_slower_than_it_is_made_arrives_whole_from_a_lowered_thread()
 {
    // The traces are an expensive route: their work runs on a thread
    // at EXPENSIVE_NICE, of a runtime of its own; its waits for room
    // in the full queue of chunks are on the server's runtime.
    let route = Router::new().route(
        "/pid/{pid}/traces",
        get(|| async {
            streamed(|sink| {
                sink.begin(vec![(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain"),
                )]);
                let nice = this_threads_nice().map_err(ApiError::internal)?;
                writeln!(sink, "nice {nice}").map_err(ApiError::internal)?;
                for line in 0..400_000 {
                    writeln!(sink, "{line}").map_err(ApiError::internal)?;
                }
                Ok(())
            })
            .await
        }),
    );
    let (app, _) = surface(route, 0);
    let response = app
        .oneshot(get_request("/pid/1/traces"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut read = Vec::new();
    // A chunk every 2 ms: the work fills the queue long before.
    while let Some(frame) =
        std::future::poll_fn(|cx| http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx))
            .await
    {
        if let Ok(data) = frame.expect("frame").into_data() {
            read.extend_from_slice(&data);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let expected: String = std::iter::once(format!("nice {}\n", crate::sys::EXPENSIVE_NICE))
        .chain((0..400_000).map(|line| format!("{line}\n")))
        .collect();
    assert_eq!(read.len(), expected.len());
    assert!(read == expected.as_bytes());
}

#[tokio::test]
async fn a_streamed_answer_whose_reader_left_stops_its_work() {
    let (ended_tx, ended_rx) = std_mpsc::channel::<usize>();
    let route = Router::new().route(
        "/pid/{pid}/traces",
        get(move || {
            let ended_tx = ended_tx.clone();
            async move {
                streamed(move |sink| {
                    sink.begin(Vec::new());
                    let mut line = 0;
                    let result = loop {
                        if let Err(err) = writeln!(sink, "{line}") {
                            break Err(ApiError::internal(err));
                        }
                        line += 1;
                        if line == 100_000_000 {
                            break Ok(());
                        }
                    };
                    let _ = ended_tx.send(line);
                    result
                })
                .await
            }
        }),
    );
    let (app, metrics) = surface(route, 0);
    let response = app
        .clone()
        .oneshot(get_request("/pid/1/traces"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = http_body_util_frame(&mut body).await;
    assert_eq!(first.get(..8), Some(&b"0\n1\n2\n3\n"[..]));
    drop(body);
    let line = tokio::task::spawn_blocking(move || ended_rx.recv_timeout(Duration::from_secs(5)))
        .await
        .expect("join")
        .expect("the work ended");
    // It stopped within the chunks it had queued.
    assert!(line < 1_000_000, "{line}");
    assert_eq!(cancelled_after(&metrics, "abandoned", 1).await, 1);
}

/// The next data frame of `body`.
async fn http_body_util_frame(body: &mut Body) -> Bytes {
    use http_body::Body as _;
    std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
        .await
        .and_then(|frame| frame.ok())
        .and_then(|frame| frame.into_data().ok())
        .unwrap_or_default()
}
