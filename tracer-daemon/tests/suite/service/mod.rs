//! tracerd as a service, through the real binary: configuration sources and
//! their precedence, refusal of invalid values, the listeners' security,
//! stopping on SIGTERM/SIGINT/SIGKILL with nothing left attached in the
//! kernel (under load too: `stopping`), the capabilities the systemd unit
//! grants, and the unit itself. Most talk raw HTTP/1.1 (tokens, unix
//! sockets, oversized bodies), so they run tracerd as `Running` rather than
//! `support::Tracerd`; `stopping` restarts tracerd on a state directory,
//! which `support::Tracerd` does.

mod access;
mod config;
mod connections;
mod lifecycle;
mod peers;
mod security;
mod stopping;
mod storage;
mod systemd;

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use serde_json::Value;

use super::support::{TempDir, free_port, kill_if_running, poll, require_root, stop, stop_shared};

const TRACERD: &str = env!("CARGO_BIN_EXE_tracerd");

fn workspace_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Leaves out every `TRACERD_*` variable of the test's environment, then
/// sets `env`: tracerd sees exactly what the test gives it.
fn exact_env(command: &mut Command, env: &[(&str, &str)]) {
    for (name, _) in std::env::vars() {
        if name.starts_with("TRACERD_") {
            command.env_remove(name);
        }
    }
    for (name, value) in env {
        command.env(name, value);
    }
}

/// A tracerd started with exactly the given arguments and environment
/// (no TRACERD_* inherited), killed by pid on drop.
struct Running {
    child: Child,
    port: u16,
    state: TempDir,
}

impl Running {
    /// Starts `prefix... tracerd --listen ... --state-dir ... args...`,
    /// without waiting; `listen` may hold `PORT` for the free port chosen.
    fn spawn(prefix: &[&str], args: &[&str], env: &[(&str, &str)], listen: Option<&str>) -> Self {
        stop_shared();
        let state = TempDir::new("svc-state");
        let port = free_port();
        let listen = listen.map_or_else(
            || format!("127.0.0.1:{port}"),
            |l| l.replace("PORT", &port.to_string()),
        );
        let (program, first) = match prefix.split_first() {
            Some((program, rest)) => (
                program.to_string(),
                rest.iter().map(|s| s.to_string()).collect(),
            ),
            None => (TRACERD.to_string(), Vec::<String>::new()),
        };
        let mut command = Command::new(program);
        command.args(first);
        if !prefix.is_empty() {
            command.arg(TRACERD);
        }
        command
            .args(["--listen", &listen, "--state-dir"])
            .arg(state.path())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        exact_env(&mut command, env);
        let child = command.spawn().expect("spawn tracerd");
        Self { child, port, state }
    }

    /// Starts tracerd and waits until `/health` answers 200.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        require_root();
        let mut running = Self::spawn(&[], args, env, None);
        running.wait_ready(None);
        running
    }

    fn wait_ready(&mut self, token: Option<&str>) {
        poll(Duration::from_secs(60), Duration::from_millis(50), || {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let mut err = String::new();
                if let Some(mut stderr) = self.child.stderr.take() {
                    let _ = stderr.read_to_string(&mut err);
                }
                panic!("tracerd exited at start: {status}: {err}");
            }
            match http(self.port, "GET", "/health", token) {
                Ok((200, _)) => Ok(()),
                _ => Err("tracerd not ready".to_string()),
            }
        });
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let (status, body) = http(self.port, "GET", path, None).expect("request");
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }

    /// Sends `SIG{signal}` and waits (SIGKILL after 20 s); returns (exit
    /// status success, time taken).
    fn stop(&mut self, signal: &str) -> (bool, Duration) {
        stop(&mut self.child, signal, Duration::from_secs(20))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        kill_if_running(&mut self.child);
    }
}

/// One HTTP/1.1 request on a fresh loopback connection: (status, body).
fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    exchange(stream, method, path, token, &[])
}

/// One HTTP/1.1 request on `stream` (TCP or unix): (status, body).
fn exchange<S: std::io::Read + std::io::Write>(
    mut stream: S,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Runs tracerd to its exit with exactly `args` and `env`.
fn run_tracerd(args: &[&str], env: &[(&str, &str)]) -> Output {
    stop_shared();
    let mut command = Command::new(TRACERD);
    command.args(args);
    exact_env(&mut command, env);
    command.output().expect("run tracerd")
}
