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

use crate::suite::support::{TempDir, kill_if_running, poll};

/// Debian's `python3` as uid and gid 65534 with no supplementary group, running
/// `code` (which connects, then sleeps): killed by pid when dropped.
struct Nobody(Child);

impl Drop for Nobody {
    fn drop(&mut self) {
        kill_if_running(&mut self.0);
    }
}

fn as_nobody(code: &str) -> Nobody {
    Nobody(
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                code,
            ])
            .spawn()
            .expect("setpriv"),
    )
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
