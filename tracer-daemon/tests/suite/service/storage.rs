//! A full state directory: a snapshot that cannot be
//! written is a 507 with a hint, the log names the file, and tracerd goes
//! on (and stores again once there is room).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use super::{TRACERD, exact_env, http};
use crate::suite::support::{
    TempDir, free_port, kill_if_running, output_ok, poll, require_root, stop_shared,
};

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = TempDir::new("tmpfs");
        output_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
                .arg("tracer-test")
                .arg(dir.path()),
        );
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// tracerd with its log in a file, killed by pid on drop.
struct Logged {
    child: Child,
    log: PathBuf,
}

impl Drop for Logged {
    fn drop(&mut self) {
        kill_if_running(&mut self.child);
    }
}

/// Fills the filesystem of `dir` up: writes `dir/filler` until ENOSPC.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0u8; 4096];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    path
}

#[test]
fn a_full_state_directory_is_a_507_with_a_hint_and_an_error_in_the_log() {
    require_root();
    let state = Tmpfs::mount("16m");
    let logs = TempDir::new("full-log");
    let log = logs.path().join("tracerd.log");
    let port = free_port();
    stop_shared();
    let mut command = Command::new(TRACERD);
    command
        .args(["--listen", &format!("127.0.0.1:{port}"), "--state-dir"])
        .arg(state.path())
        .args(["--snapshot-interval", "0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"));
    exact_env(&mut command, &[]);
    let mut running = Logged {
        child: command.spawn().expect("spawn tracerd"),
        log,
    };
    poll(Duration::from_secs(60), Duration::from_millis(50), || {
        if let Some(status) = running.child.try_wait().expect("try_wait") {
            panic!("tracerd exited at start: {status}");
        }
        match http(port, "GET", "/health", None) {
            Ok((200, _)) => Ok(()),
            _ => Err("tracerd not ready".to_string()),
        }
    });

    let filler = fill(state.path());
    let (status, body) = http(port, "POST", "/snapshots", None).expect("request");
    assert_eq!(status, 507, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
    let error = body["error"].as_str().expect("error");
    assert!(
        error.contains(&state.path().join("snapshots").display().to_string())
            && error.ends_with("No space left on device (os error 28)"),
        "{error}"
    );
    assert!(
        body["hint"]
            .as_str()
            .unwrap_or_default()
            .starts_with("the filesystem of tracerd's state directory (state_dir) is full"),
        "{body}"
    );
    let logged = std::fs::read_to_string(&running.log).expect("log");
    let line = logged
        .lines()
        .find(|l| l.contains("cannot write to the state directory"))
        .unwrap_or_else(|| panic!("no error logged:\n{logged}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains(&state.path().join("snapshots").display().to_string()),
        "the log names the file: {line}"
    );
    assert!(line.contains("No space left on device"), "{line}");

    // Room again: tracerd stores as before.
    std::fs::remove_file(filler).expect("remove filler");
    let (status, body) = http(port, "POST", "/snapshots", None).expect("request");
    assert_eq!(status, 201, "{body}");
    drop(running);
}
