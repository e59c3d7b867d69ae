//! Connections under hostile and heavy use: a thousand
//! idle connections do not slow `/health`, and each is closed at its
//! timeout, on TCP and on the Unix socket.

use std::{
    io::{ErrorKind, Write as _},
    net::TcpStream,
    os::unix::net::UnixStream,
    time::{Duration, Instant},
};

use super::{Running, exchange, http};
use crate::suite::support::TempDir;

/// Whether the server has closed `stream` (non-blocking): a read gives end
/// of file or a reset at once, where an open connection would block.
///
/// Non-blocking rather than a short read timeout: `SO_RCVTIMEO` of 1 ms
/// waits whole kernel ticks (8 ms at HZ=250), so checking 500 open
/// connections took 4 s, and the ones read after the idle timeout had
/// indeed been closed by then.
fn closed_by_server<S: std::io::Read>(stream: &mut S) -> bool {
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            ) =>
        {
            true
        }
        Err(e) => panic!("reading a connection: {e}"),
    }
}

#[test]
fn a_thousand_idle_connections_leave_health_fast_and_each_closes_at_its_timeout() {
    let dir = TempDir::new("connections");
    let socket = dir.path().join("api.sock");
    let running = Running::start(
        &[
            "--header-timeout-secs",
            "2",
            "--idle-timeout-secs",
            "6",
            "--unix-socket",
            socket.to_str().expect("utf-8"),
        ],
        &[],
    );
    let addr = ("127.0.0.1", running.port);
    let opened = Instant::now();
    let mut silent = Vec::new();
    let mut partial = Vec::new();
    for i in 0..1000 {
        let mut stream = TcpStream::connect(addr).expect("connect");
        if i % 2 == 1 {
            stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                .expect("write");
        }
        stream.set_nonblocking(true).expect("non-blocking");
        if i % 2 == 0 {
            silent.push(stream);
        } else {
            partial.push(stream);
        }
    }
    let mut unix_silent: Vec<UnixStream> = (0..10)
        .map(|_| {
            let stream = UnixStream::connect(&socket).expect("connect");
            stream.set_nonblocking(true).expect("non-blocking");
            stream
        })
        .collect();
    let all_open = opened.elapsed();
    assert!(
        all_open < Duration::from_millis(1500),
        "opening took {all_open:?}: the timeouts below assume less"
    );

    // The API answers at once beside them, on both listeners.
    let mut took = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let (status, body) = http(running.port, "GET", "/health", None).expect("request");
        took.push(start.elapsed());
        assert_eq!(status, 200, "{body}");
    }
    assert!(
        took.iter().all(|t| *t < Duration::from_millis(100)),
        "GET /health with 1000 idle connections: {took:?}"
    );
    let start = Instant::now();
    let (status, _) = exchange(
        UnixStream::connect(&socket).expect("connect"),
        "GET",
        "/health",
        None,
        &[],
    )
    .expect("request");
    assert_eq!(status, 200);
    assert!(start.elapsed() < Duration::from_millis(100));

    // Past the header timeout (2 s from the first byte), before the idle
    // one (6 s): every partial head is cut, every silent connection open.
    std::thread::sleep(Duration::from_millis(3000).saturating_sub(opened.elapsed()));
    let cut = partial
        .iter_mut()
        .map(closed_by_server)
        .filter(|c| *c)
        .count();
    assert_eq!(cut, 500, "partial heads closed at the header timeout");
    let cut = silent
        .iter_mut()
        .map(closed_by_server)
        .filter(|c| *c)
        .count();
    let checked = opened.elapsed();
    assert!(
        checked < Duration::from_secs(5),
        "checked well before the idle timeout: {checked:?}"
    );
    assert_eq!(
        cut, 0,
        "silent connections are still open before the idle timeout"
    );

    // Past the idle timeout: every silent one is cut, TCP and Unix.
    std::thread::sleep(Duration::from_millis(7500).saturating_sub(opened.elapsed()));
    let cut = silent
        .iter_mut()
        .map(closed_by_server)
        .filter(|c| *c)
        .count();
    assert_eq!(cut, 500, "silent connections closed at the idle timeout");
    let cut = unix_silent
        .iter_mut()
        .map(closed_by_server)
        .filter(|closed| *closed)
        .count();
    assert_eq!(
        cut, 10,
        "silent Unix socket connections closed at the idle timeout"
    );
    let (status, _) = http(running.port, "GET", "/health", None).expect("request");
    assert_eq!(status, 200);
}
