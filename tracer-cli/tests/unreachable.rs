//! The built `tracer` with no tracerd to talk to (no root needed): it says
//! what to do and exits 3, before starting anything (`tracer run`).

use std::{
    net::TcpListener,
    process::{Command, Output},
};

fn tracer(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tracer"));
    for name in [
        "TRACER_ADDR",
        "TRACER_SOCKET",
        "TRACER_TOKEN",
        "TRACER_TOKEN_FILE",
    ] {
        command.env_remove(name);
    }
    command.args(args).output().expect("run tracer")
}

/// A loopback port nothing listens on (it was free a moment ago).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[test]
fn an_unreachable_tracerd_is_named_with_how_to_start_it_and_exit_status_3() {
    let addr = format!("127.0.0.1:{}", closed_port());
    for args in [
        vec!["ps"],
        vec!["stat", "1", "--json"],
        vec!["diff", "1", "--since", "10m"],
    ] {
        let out = tracer(&[&["--addr", &addr][..], &args].concat());
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!(
                "tracer: tracerd is not running on {addr} (Connection refused (os error 111)): start it with `cargo xtask run` or `systemctl start tracerd`, or point --addr (TRACER_ADDR) or --socket (TRACER_SOCKET) at it\n"
            ),
            "{args:?}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_missing_socket_is_named_too() {
    let out = tracer(&["--socket", "/nonexistent/tracer/api.sock", "ps"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracer: tracerd is not running on /nonexistent/tracer/api.sock (No such file or directory (os error 2)): start it with `cargo xtask run` or `systemctl start tracerd`, or point --socket (TRACER_SOCKET) or --addr (TRACER_ADDR) at it\n"
    );
}

#[test]
fn tracer_run_starts_nothing_without_tracerd() {
    let dir = std::env::temp_dir().join(format!("tracer-cli-run-{}", std::process::id()));
    let marker = dir.join("ran");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let addr = format!("127.0.0.1:{}", closed_port());
    let out = tracer(&[
        "--addr",
        &addr,
        "run",
        "--",
        "touch",
        marker.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(!marker.exists(), "the command ran untraced");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreadable_token_file_is_named() {
    let out = tracer(&["--token-file", "/nonexistent/token", "ps"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracer: cannot read the token file /nonexistent/token: No such file or directory (os error 2)\n"
    );
}
