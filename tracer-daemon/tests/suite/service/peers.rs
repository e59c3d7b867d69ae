//! Who is asking (`sys::peer`), as the kernel says it: a client started as
//! another user (`setpriv`, uid and gid 65534, no groups) is known by its
//! uid over loopback TCP (inet_diag: the owner of the client's own socket,
//! looked up by its four-tuple) and by its credentials over a Unix socket
//! (`SO_PEERCRED`).

use std::net::TcpListener;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixListener;
use std::process::{Child, Command};
use std::time::Duration;

use tracer_daemon::sys::peer::{tcp_peer, unix_peer};

use crate::suite::support::{TempDir, Tracerd, kill_if_running, poll};

/// Debian's `python3` as uid and gid 65534 with no supplementary group, running
/// `code` (which connects, then sleeps): killed by pid when dropped.
struct Nobody(Child);

impl Drop for Nobody {
    fn drop(&mut self) {
        kill_if_running(&mut self.0);
    }
}

/// `setpriv ... python3 -c code` as uid and gid 65534, no supplementary
/// group: the command, not started.
fn nobody_python(code: &str) -> Command {
    let mut command = Command::new("setpriv");
    command.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/bin/python3",
        "-c",
        code,
    ]);
    command
}

fn as_nobody(code: &str) -> Nobody {
    Nobody(nobody_python(code).spawn().expect("setpriv"))
}

/// `accept` of `listener`, for 10 s at most.
fn accept_within<T>(accept: impl Fn() -> std::io::Result<T>) -> T {
    poll(Duration::from_secs(10), Duration::from_millis(10), || {
        accept().map_err(|err| format!("no connection: {err}"))
    })
}

#[test]
fn a_client_of_another_user_is_known_by_its_uid_over_tcp_and_a_unix_socket() {
    for host in ["127.0.0.1", "::1"] {
        let listener = TcpListener::bind((host, 0)).expect("bind");
        let local = listener.local_addr().expect("local");
        listener.set_nonblocking(true).expect("nonblocking");
        let _child = as_nobody(&format!(
            "import socket, time\ns = socket.create_connection(('{host}', {}))\ntime.sleep(60)",
            local.port()
        ));
        let (_conn, remote) = accept_within(|| listener.accept());
        let peer = tcp_peer(local, remote).expect("inet_diag");
        assert_eq!(
            (peer.uid, peer.gid, peer.pid),
            (65534, None, None),
            "{host}"
        );
    }
    let dir = TempDir::new("peers");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let path = dir.path().join("api.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    listener.set_nonblocking(true).expect("nonblocking");
    let child = as_nobody(&format!(
        "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect('{}')\ntime.sleep(60)",
        path.display()
    ));
    let (conn, _) = accept_within(|| listener.accept());
    let peer = unix_peer(conn.as_raw_fd()).expect("SO_PEERCRED");
    let pid = child.0.id();
    assert_eq!((peer.uid, peer.gid), (65534, Some(65534)));
    // setpriv execs python3 in place: the same pid.
    assert_eq!(peer.pid, Some(pid));
}

/// What Debian's `python3 -c code` prints, run as uid and gid 65534 with
/// no supplementary group (it must exit 0).
fn nobody_output(code: &str) -> String {
    let out = crate::suite::support::output_ok(&mut nobody_python(code));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `method path` to `base` as uid 65534 (over loopback TCP): the status
/// and the body.
fn as_nobody_request(base: &str, method: &str, path: &str) -> (u16, serde_json::Value) {
    let code = format!(
        "import urllib.request, urllib.error, sys\n\
         r = urllib.request.Request('{base}{path}', method='{method}')\n\
         try:\n    resp = urllib.request.urlopen(r); print(resp.status); print(resp.read().decode())\n\
         except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n"
    );
    let text = nobody_output(&code);
    let (status, body) = text.split_once('\n').expect("status and body");
    (
        status.trim().parse().expect("a status"),
        serde_json::from_str(body.trim()).unwrap_or(serde_json::Value::Null),
    )
}

#[test]
fn only_an_operator_changes_tracing_and_anyone_reads() {
    let tracerd = Tracerd::start(&[]);
    let hint = "operators are root, the members of group tracer and holders of tracerd's token; anyone may read (GET) their own processes and take snapshots of them, reset their peaks, and label or delete the snapshots they stored";
    for (method, path) in [
        ("POST", "/tracing/stop"),
        ("PUT", "/scope?pid=1"),
        ("POST", "/tracing/start"),
        ("POST", "/pid/1/clear-traces"),
    ] {
        let (status, body) = as_nobody_request(tracerd.base(), method, path);
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert_eq!(body["hint"], hint, "{method} {path}");
    }
    // Nothing changed; reading is open.
    let (status, health) = as_nobody_request(tracerd.base(), "GET", "/health");
    assert_eq!(status, 200, "{health}");
    let scope = tracerd.get_ok("/scope");
    assert_eq!(scope["all_processes"], true, "{scope}");
    let tracing = tracerd.get_ok("/tracing");
    assert_eq!(tracing["is_tracing"], true, "{tracing}");
    // Root is an operator.
    let (status, body) = tracerd.post("/tracing/stop");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn over_the_unix_socket_anyone_reads_and_only_an_operator_changes_tracing() {
    let dir = TempDir::new("unix-access");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let socket = dir.path().join("api.sock");
    let tracerd = Tracerd::start(&["--unix-socket", socket.to_str().expect("utf-8")]);
    // A raw HTTP/1.1 request as uid 65534 over the socket: the status.
    let request = |method: &str, path: &str| -> u16 {
        let code = format!(
            "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('{}')\n\
             s.sendall(b'{method} {path} HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n')\n\
             print(s.recv(4096).split()[1].decode())\n",
            socket.display()
        );
        nobody_output(&code).trim().parse().expect("a status")
    };
    assert_eq!(request("GET", "/health"), 200);
    assert_eq!(request("POST", "/tracing/stop"), 403);
    assert_eq!(request("PUT", "/scope?pid=1"), 403);
    let tracing = tracerd.get_ok("/tracing");
    assert_eq!(tracing["is_tracing"], true, "{tracing}");
}
