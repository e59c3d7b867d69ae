//! Shared by the root integration tests: start the real tracerd (real eBPF),
//! compile and run C fixtures, talk to the API. Everything started here is
//! stopped by pid on drop, even when a test fails.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value;

/// Fails the test at once with a clear message when not root: these tests
/// load eBPF programs and must not be skipped where root is available.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc_geteuid() };
    assert_eq!(
        euid, 0,
        "integration tests load eBPF: run them as root (cargo xtask test)"
    );
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tracer-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running tracerd on a free loopback port; SIGTERM, then SIGKILL, on drop.
pub struct Tracerd {
    child: Child,
    pub base: String,
    pub client: reqwest::blocking::Client,
    /// The state directory when this Tracerd made it (removed on drop).
    _state: Option<TempDir>,
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

impl Tracerd {
    pub fn start(extra: &[&str]) -> Self {
        let state = TempDir::new("state");
        let mut tracerd = Self::start_at(state.path(), extra);
        tracerd._state = Some(state);
        tracerd
    }

    /// Starts tracerd with `state` as its state directory (kept on drop, so
    /// another tracerd can start on it).
    pub fn start_at(state: &Path, extra: &[&str]) -> Self {
        require_root();
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_tracerd"))
            .args(["--listen", &listen, "--state-dir"])
            .arg(state)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tracerd");
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("http client");
        let mut tracerd = Self {
            child,
            base: format!("http://{listen}"),
            client,
            _state: None,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = tracerd.child.try_wait().expect("try_wait") {
                panic!("tracerd exited at start: {status}");
            }
            if let Ok(r) = tracerd
                .client
                .get(format!("{}/health", tracerd.base))
                .send()
                && r.status().is_success()
            {
                break;
            }
            assert!(Instant::now() < deadline, "tracerd not ready within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        tracerd
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// GET a path; returns (status, body as JSON, or the text as a JSON string).
    pub fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .expect("GET");
        decode(r)
    }

    pub fn get_text(&self, path: &str) -> (u16, String) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .expect("GET");
        (r.status().as_u16(), r.text().expect("body"))
    }

    pub fn post(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .send()
            .expect("POST");
        decode(r)
    }

    /// A request with an optional body; returns (status, JSON or text).
    pub fn send(&self, method: reqwest::Method, path: &str, body: Option<Vec<u8>>) -> (u16, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.body(body);
        }
        decode(request.send().expect("request"))
    }

    /// GET a path's body as bytes, with the status.
    pub fn get_bytes(&self, path: &str) -> (u16, Vec<u8>) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .expect("GET");
        (r.status().as_u16(), r.bytes().expect("body").to_vec())
    }

    /// SIGKILL, and waits until it is gone.
    pub fn kill9(&mut self) {
        kill(self.child.id(), "KILL");
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit; returns (exited cleanly, time taken).
    pub fn terminate(&mut self) -> (bool, Duration) {
        let start = Instant::now();
        kill(self.child.id(), "TERM");
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status.success(), start.elapsed());
            }
            if start.elapsed() > Duration::from_secs(20) {
                kill(self.child.id(), "KILL");
                let _ = self.child.wait();
                return (false, start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until tracerd lists `pid` (its `New` event was handled).
    pub fn wait_traced(&self, pid: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, _) = self.get(&format!("/pid/{pid}"));
            if status == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pid {pid} not traced within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn decode(r: reqwest::blocking::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

fn kill(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

impl Drop for Tracerd {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
    }
}

/// Compiles `source` (C) with `cc -g -O0 -fno-omit-frame-pointer` (plus
/// `flags`) into `dir/name`.
pub fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write C source");
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-g", "-O0", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The line number (1-based) of the only line of `source` containing `marker`.
pub fn line_of(source: &str, marker: &str) -> u32 {
    let lines: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "marker {marker} must be on exactly one line"
    );
    lines[0] as u32
}

/// A fixture process speaking a line protocol: it prints a line when it has
/// done a phase, and waits for a line on stdin before the next one. Killed
/// by pid on drop.
pub struct Fixture {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Fixture {
    pub fn spawn(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(exe);
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn fixture");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads the next line the fixture prints (trimmed).
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("read fixture output");
        line.trim().to_string()
    }

    /// Waits for the line `expected`.
    pub fn expect_line(&mut self, expected: &str) {
        let line = self.read_line();
        assert_eq!(line, expected, "fixture said {line:?}");
    }

    /// Lets the fixture go on to its next phase.
    pub fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("write to fixture");
        stdin.flush().expect("flush");
    }

    /// Closes stdin and waits for the exit.
    pub fn finish(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait fixture")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            kill(self.child.id(), "KILL");
            let _ = self.child.wait();
        }
    }
}

/// The C helpers every fixture uses: phase lines and waiting for "go".
pub const C_PRELUDE: &str = r#"#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void say(const char *what) { printf("%s\n", what); fflush(stdout); }
static void wait_go(void) { char buf[16]; if (!fgets(buf, sizeof buf, stdin)) exit(0); }
"#;

/// Finds the statistic (JSON object) whose first frame is `file:line`.
pub fn stat_at<'a>(stats: &'a Value, file: &Path, line: u32) -> Option<&'a Value> {
    stats.as_array()?.iter().find(|s| {
        let frame = &s["traceback"][0];
        frame["filename"].as_str() == file.to_str()
            && frame["lineno"].as_u64() == Some(u64::from(line))
    })
}
