//! Connections over real loopback sockets: the header and idle timeouts,
//! the bound on connections, the stop, a burst waiting in the backlog.
use std::time::Duration;

use axum::routing::get;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

use super::*;

/// `/health` (answers at once) served on a free loopback port, with
/// `max_connections` and the header and idle timeouts; returns the
/// address and the stop.
async fn served(
    max_connections: usize,
    header_timeout: Duration,
    idle_timeout: Duration,
) -> (std::net::SocketAddr, watch::Sender<bool>) {
    let limits = Connections {
        max_connections,
        header_timeout,
        idle_timeout,
    };
    let listener = crate::http::bind_tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = Router::new().route("/health", get(|| async { "ok" }));
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(serve_listener(
        listener,
        app,
        Arc::new(limits),
        stopped,
        "test",
    ));
    (addr, stop)
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

/// Reads until the server closes the connection; returns what came and
/// when (the test fails past `within`).
async fn until_closed(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, Instant) {
    let mut got = Vec::new();
    tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server closed the connection in time");
    (got, Instant::now())
}

/// One response on a kept-alive connection: reads until its body.
async fn answer(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("an answer")
            .expect("read");
        assert_ne!(n, 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn silent_connections_close_after_the_idle_timeout_and_partial_heads_after_the_header_timeout()
 {
    let (addr, _stop) = served(16, Duration::from_millis(300), Duration::from_millis(1200)).await;
    let start = Instant::now();
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    let mut partial = TcpStream::connect(addr).await.expect("connect");
    partial
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let mut kept = TcpStream::connect(addr).await.expect("connect");
    kept.write_all(HEALTH).await.expect("write");
    assert!(answer(&mut kept).await.starts_with("HTTP/1.1 200"));
    // Idle longer than the header timeout, shorter than the idle one:
    // a request then is served (the header timeout starts at its
    // first byte, not at the end of the last answer).
    tokio::time::sleep(Duration::from_millis(600)).await;
    kept.write_all(HEALTH).await.expect("write");
    assert!(answer(&mut kept).await.starts_with("HTTP/1.1 200"));
    let answered = Instant::now();

    let (got, at) = until_closed(&mut partial, Duration::from_secs(5)).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let partial_after = at - start;
    let (got, at) = until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(got.is_empty());
    let silent_after = at - start;
    let (got, at) = until_closed(&mut kept, Duration::from_secs(5)).await;
    assert!(got.is_empty());
    let kept_after = at - answered;
    assert!(
        partial_after >= Duration::from_millis(300) && partial_after < Duration::from_millis(1000),
        "a partial head is cut at the header timeout: {partial_after:?}"
    );
    assert!(
        silent_after >= Duration::from_millis(1200) && silent_after < Duration::from_millis(2500),
        "a silent connection is cut at the idle timeout: {silent_after:?}"
    );
    assert!(
        kept_after >= Duration::from_millis(1200) && kept_after < Duration::from_millis(2500),
        "a kept-alive connection is cut at the idle timeout after its answer: {kept_after:?}"
    );
}

#[tokio::test]
async fn past_the_maximum_new_connections_wait_and_the_open_ones_are_served() {
    let (addr, _stop) = served(2, Duration::from_secs(10), Duration::from_secs(60)).await;
    let mut first = TcpStream::connect(addr).await.expect("connect");
    let mut second = TcpStream::connect(addr).await.expect("connect");
    first.write_all(HEALTH).await.expect("write");
    assert!(answer(&mut first).await.starts_with("HTTP/1.1 200"));
    second.write_all(HEALTH).await.expect("write");
    assert!(answer(&mut second).await.starts_with("HTTP/1.1 200"));
    // The kernel completes the third's handshake (the backlog), but
    // tracerd does not take it while two are open.
    let mut third = TcpStream::connect(addr).await.expect("connect");
    third.write_all(HEALTH).await.expect("write");
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf))
            .await
            .is_err(),
        "the third connection waits"
    );
    // The open ones are served meanwhile.
    first.write_all(HEALTH).await.expect("write");
    assert!(answer(&mut first).await.starts_with("HTTP/1.1 200"));
    drop(second);
    assert!(answer(&mut third).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn at_the_stop_idle_connections_close_and_no_new_one_is_taken() {
    let (addr, stop) = served(16, Duration::from_secs(10), Duration::from_secs(60)).await;
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(HEALTH).await.expect("write");
    assert!(answer(&mut idle).await.starts_with("HTTP/1.1 200"));
    stop.send(true).expect("stop");
    let (got, _) = until_closed(&mut idle, Duration::from_secs(2)).await;
    assert!(got.is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_a_thousand_connections_waits_in_the_backlog_and_health_answers_beside_them() {
    // 1000 client sockets and 1000 served ones in this process.
    crate::sys::raise_open_files(4096).expect("getrlimit");
    let (addr, _stop) = served(4096, Duration::from_secs(10), Duration::from_secs(60)).await;
    let (took, health) = tokio::task::spawn_blocking(move || {
        use std::io::{Read as _, Write as _};
        let start = Instant::now();
        let open: Vec<std::net::TcpStream> = (0..1000)
            .map(|i| {
                let mut stream = std::net::TcpStream::connect(addr).expect("connect");
                if i % 2 == 1 {
                    stream
                        .write_all(b"GET /health HTTP/1.1\r\nX-Slow: ")
                        .expect("write");
                }
                stream
            })
            .collect();
        let took = start.elapsed();
        // At once, beside them: /health.
        let start = Instant::now();
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let health = start.elapsed();
        drop(open);
        (took, health)
    })
    .await
    .expect("connects");
    // A SYN the kernel dropped is sent again only a second later.
    assert!(took < Duration::from_millis(900), "{took:?}");
    assert!(health < Duration::from_millis(100), "{health:?}");
}
