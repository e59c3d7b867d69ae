//! The listeners' security: a non-loopback listener needs a token (in a
//! file only root reads) and then requires it of every peer it cannot
//! identify, and refuses a wrong one; the unix socket's mode; body
//! limits and traversal paths refused.

use std::os::unix::{fs::PermissionsExt as _, net::UnixStream};

use super::{Running, exchange, http, run_tracerd};
use crate::suite::support::{TempDir, require_root};

#[test]
fn a_non_loopback_listener_needs_a_token_and_then_refuses_a_wrong_one() {
    require_root();
    let out = run_tracerd(&["--listen", "0.0.0.0:7466"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("a non-loopback address needs auth_token_file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = TempDir::new("token");
    let token_file = dir.path().join("token");
    let token = "s3cret-token-of-32-characters-ok";
    std::fs::write(&token_file, format!("{token}\n")).expect("write token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let path = token_file.to_str().expect("utf-8");
    let out = run_tracerd(
        &["--listen", "0.0.0.0:7466", "--auth-token-file", path],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 600"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    let mut running = Running::spawn(&[], &["--auth-token-file", path], &[], Some("0.0.0.0:PORT"));
    running.wait_ready(Some(token));
    let port = running.port;
    // Over loopback the kernel names the peer (root here): no token needed.
    // From another host (a peer tracerd cannot identify) the token is
    // required: `http::auth`'s tests.
    assert_eq!(http(port, "GET", "/health", None).expect("request").0, 200);
    assert_eq!(
        http(
            port,
            "GET",
            "/metrics",
            Some("s3cret-token-of-32-characters-no")
        )
        .expect("request")
        .0,
        401
    );
    assert_eq!(
        http(port, "GET", "/processes", Some(token))
            .expect("request")
            .0,
        200
    );
    assert_eq!(
        http(port, "GET", "/metrics", Some(token))
            .expect("request")
            .0,
        200
    );
}

#[test]
fn the_unix_socket_has_mode_0666_serves_the_api_and_is_removed_at_stop() {
    let dir = TempDir::new("unix");
    let socket = dir.path().join("run/tracerd.sock");
    let mut running = Running::start(&["--unix-socket", socket.to_str().expect("utf-8")], &[]);
    let mode = std::fs::metadata(&socket)
        .expect("socket exists")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666);
    let stream = UnixStream::connect(&socket).expect("connect");
    let (status, body) = exchange(stream, "GET", "/health", None, &[]).expect("request");
    assert_eq!(status, 200, "{body}");
    let (clean, _) = running.stop("TERM");
    assert!(clean);
    assert!(!socket.exists(), "the socket file is removed at stop");
}

#[test]
fn oversized_bodies_and_traversal_paths_are_refused() {
    let running = Running::start(&["--body-limit-bytes", "1024"], &[]);
    let stream = std::net::TcpStream::connect(("127.0.0.1", running.port)).expect("connect");
    let (status, _) =
        exchange(stream, "POST", "/pid/1/snapshots", None, &[b'x'; 4096]).expect("request");
    assert_eq!(status, 413);
    let (status, body) = running.get("/pid/%2e%2e/statistics");
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"],
        "invalid request path: the path must not contain . or .. segments"
    );
}
