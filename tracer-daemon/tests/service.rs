//! tracerd as a service, through the real binary: configuration sources and
//! their precedence, refusal of invalid values, the listeners' security,
//! stopping on SIGTERM/SIGINT/SIGKILL with nothing left attached in the
//! kernel, the capabilities the systemd unit grants, and the unit itself.
mod common;

use std::{
    io::Read as _,
    os::unix::{fs::PermissionsExt as _, net::UnixStream},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use common::{C_PRELUDE, Fixture, TempDir, compile_c, require_root};
use serde_json::Value;

const TRACERD: &str = env!("CARGO_BIN_EXE_tracerd");

fn workspace_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// A tracerd started with exactly the given arguments and environment
/// (no TRACERD_* inherited), killed by pid on drop.
struct Running {
    child: Child,
    port: u16,
    state: TempDir,
}

impl Running {
    fn spawn(prefix: &[&str], args: &[&str], env: &[(&str, &str)], listen: Option<&str>) -> Self {
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
        for (name, _) in std::env::vars() {
            if name.starts_with("TRACERD_") {
                command.env_remove(name);
            }
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().expect("spawn tracerd");
        Self { child, port, state }
    }

    fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        require_root();
        let mut running = Self::spawn(&[], args, env, None);
        running.wait_ready(None);
        running
    }

    fn wait_ready(&mut self, token: Option<&str>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let mut err = String::new();
                if let Some(mut stderr) = self.child.stderr.take() {
                    let _ = stderr.read_to_string(&mut err);
                }
                panic!("tracerd exited at start: {status}: {err}");
            }
            if let Ok((200, _)) = http(self.port, "GET", "/health", token) {
                return;
            }
            assert!(Instant::now() < deadline, "tracerd not ready within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
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

    /// Sends `signal` and waits; returns (exit status success, time taken).
    fn stop(&mut self, signal: &str) -> (bool, Duration) {
        let start = Instant::now();
        kill(self.pid(), signal);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status.success(), start.elapsed());
            }
            if start.elapsed() > Duration::from_secs(20) {
                kill(self.pid(), "KILL");
                let _ = self.child.wait();
                return (false, start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            kill(self.pid(), "KILL");
            let _ = self.child.wait();
        }
    }
}

fn kill(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
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

fn run_tracerd(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(TRACERD);
    command.args(args);
    for (name, _) in std::env::vars() {
        if name.starts_with("TRACERD_") {
            command.env_remove(name);
        }
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run tracerd")
}

// ---- configuration ----

#[test]
fn invalid_values_are_refused_at_start_with_the_valid_range() {
    let out = run_tracerd(&["--nframe", "0"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracerd: nframe = 0 is out of range; valid: 1..=64\n"
    );
    let out = run_tracerd(&[], &[("TRACERD_MAX_STACKS", "100")]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracerd: max_stacks = 100 is out of range; valid: 256..=4194304\n"
    );
    let out = run_tracerd(&["--max-expensive-requests", "0"], &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracerd: max_expensive_requests = 0 is out of range; valid: 1..=1024\n"
    );
}

#[test]
fn config_default_prints_the_shipped_file_and_check_validates() {
    let out = run_tracerd(&["config", "default"], &[]);
    assert!(out.status.success());
    let printed: toml::Table = String::from_utf8_lossy(&out.stdout).parse().expect("TOML");
    let shipped_text = std::fs::read_to_string(workspace_file("deploy/tracerd.toml"))
        .expect("deploy/tracerd.toml");
    let shipped: toml::Table = shipped_text.parse().expect("TOML");
    assert_eq!(
        printed, shipped,
        "deploy/tracerd.toml must hold exactly the defaults"
    );

    let shipped_path = workspace_file("deploy/tracerd.toml");
    let out = run_tracerd(
        &["config", "check", shipped_path.to_str().expect("utf-8")],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = TempDir::new("config-check");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "nframe = 16\nmax_live_blocks = 12\n").expect("write");
    let out = run_tracerd(&["config", "check", bad.to_str().expect("utf-8")], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracerd: max_live_blocks = 12 is out of range; valid: 1024..=67108864\n"
    );
    std::fs::write(&bad, "nframes = 16\n").expect("write");
    let out = run_tracerd(&["config", "check", bad.to_str().expect("utf-8")], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field `nframes`"));
}

#[test]
fn flags_beat_environment_which_beats_the_file() {
    let dir = TempDir::new("precedence");
    let file = dir.path().join("tracerd.toml");
    std::fs::write(&file, "nframe = 8\n").expect("write");
    let config = file.to_str().expect("utf-8");
    let nframe = |args: &[&str], env: &[(&str, &str)]| {
        let running = Running::start(args, env);
        let (status, health) = running.get("/health");
        assert_eq!(status, 200, "{health}");
        health["nframe"].as_u64().expect("nframe")
    };
    assert_eq!(
        nframe(
            &["--config", config, "--nframe", "20"],
            &[("TRACERD_NFRAME", "12")]
        ),
        20
    );
    assert_eq!(
        nframe(&["--config", config], &[("TRACERD_NFRAME", "12")]),
        12
    );
    assert_eq!(nframe(&[], &[("TRACERD_CONFIG", config)]), 8);
}

// ---- security ----

#[test]
fn a_non_loopback_listener_needs_a_token_and_then_requires_it() {
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
    assert_eq!(http(port, "GET", "/health", None).expect("request").0, 401);
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
fn the_unix_socket_has_mode_0660_serves_the_api_and_is_removed_at_stop() {
    let dir = TempDir::new("unix");
    let socket = dir.path().join("run/tracerd.sock");
    let mut running = Running::start(&["--unix-socket", socket.to_str().expect("utf-8")], &[]);
    let mode = std::fs::metadata(&socket)
        .expect("socket exists")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660);
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

// ---- lifecycle ----

/// Ids of the BPF programs, maps and links a process holds, from the
/// `prog_id:`/`map_id:`/`link_id:` lines of its `/proc/PID/fdinfo`.
fn bpf_ids(pid: u32) -> Vec<(&'static str, u32)> {
    let mut ids = Vec::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            for (prefix, kind) in [
                ("prog_id:", "prog"),
                ("map_id:", "map"),
                ("link_id:", "link"),
            ] {
                if let Some(id) = line
                    .strip_prefix(prefix)
                    .and_then(|v| v.trim().parse().ok())
                {
                    ids.push((kind, id));
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn bpftool_shows(kind: &str, id: u32) -> bool {
    Command::new("bpftool")
        .args([kind, "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run bpftool (cargo xtask setup installs it)")
        .success()
}

fn our_uprobe_events(pid: u32) -> Vec<String> {
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events")
        .or_else(|_| std::fs::read_to_string("/sys/kernel/debug/tracing/uprobe_events"))
        .unwrap_or_default();
    events
        .lines()
        .filter(|l| l.contains(&format!("aya_{pid}_")))
        .map(str::to_string)
        .collect()
}

/// Starts tracerd, records what it holds in the kernel, stops it with
/// `signal`, and checks that every program, map and link is gone.
fn stop_leaves_nothing(signal: &str, expect_clean_exit: bool) {
    let mut running = Running::start(&[], &[]);
    let pid = running.pid();
    let held = bpf_ids(pid);
    let programs = held.iter().filter(|(kind, _)| *kind == "prog").count();
    assert!(
        programs >= tracer_common::TRACEPOINTS.len() + 2,
        "tracerd holds {held:?}"
    );
    for (kind, id) in &held {
        assert!(
            bpftool_shows(kind, *id),
            "bpftool does not show {kind} {id} while tracerd runs"
        );
    }
    let (clean, took) = running.stop(signal);
    assert_eq!(clean, expect_clean_exit, "exit after SIG{signal}");
    if expect_clean_exit {
        assert!(took < Duration::from_secs(5), "SIG{signal} took {took:?}");
    }
    // The kernel frees programs and maps once their last reference goes,
    // after an RCU grace period.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left: Vec<_> = held.clone();
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|(kind, id)| bpftool_shows(kind, *id));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(left, Vec::new(), "left in the kernel after SIG{signal}");
    assert_eq!(our_uprobe_events(pid), Vec::<String>::new());
    if expect_clean_exit {
        let record: Value = serde_json::from_slice(
            &std::fs::read(running.state.path().join("last-stop.json"))
                .expect("last-stop.json written"),
        )
        .expect("JSON");
        assert_eq!(record["drained"], true);
        assert!(record["counters"]["allocs"].as_u64().is_some(), "{record}");
    }
}

#[test]
fn sigterm_stops_within_5s_and_leaves_no_program_map_or_link() {
    stop_leaves_nothing("TERM", true);
}

#[test]
fn sigint_stops_within_5s_and_leaves_no_program_map_or_link() {
    stop_leaves_nothing("INT", true);
}

#[test]
fn sigkill_leaves_no_program_map_or_link() {
    stop_leaves_nothing("KILL", false);
}

// ---- systemd ----

/// The unit's CapabilityBoundingSet, as setpriv's `--bounding-set` list.
fn unit_capabilities(drop: Option<&str>) -> String {
    let unit = std::fs::read_to_string(workspace_file("deploy/tracerd.service")).expect("unit");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet in the unit");
    let mut list = String::from("-all");
    for cap in line.split_whitespace() {
        if Some(cap) == drop {
            continue;
        }
        list.push_str(",+");
        list.push_str(&cap.trim_start_matches("CAP_").to_lowercase());
    }
    list
}

const KEEP_1000: &str = r#"
int main(void) {
    static void *keep[1000];
    say("ready");
    wait_go();
    for (int i = 0; i < 1000; i++)
        keep[i] = malloc(333);
    say("done");
    wait_go();
    return keep[0] == NULL;
}
"#;

#[test]
fn tracerd_works_with_exactly_the_units_capabilities_and_needs_cap_sys_admin() {
    require_root();
    let caps = unit_capabilities(None);
    let mut running = Running::spawn(
        &["setpriv", "--bounding-set", &caps, "--inh-caps=-all"],
        &[],
        &[],
        None,
    );
    running.wait_ready(None);
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", running.pid())).expect("status");
    let bounding = status
        .lines()
        .find(|l| l.starts_with("CapBnd:"))
        .expect("CapBnd");
    // CAP_DAC_READ_SEARCH 2, CAP_SYS_PTRACE 19, CAP_SYS_ADMIN 21, CAP_PERFMON 38, CAP_BPF 39.
    assert_eq!(bounding, "CapBnd:\t000000c000280004");

    let dir = TempDir::new("caps");
    let exe = compile_c(
        dir.path(),
        "keep1000",
        &format!("{C_PRELUDE}{KEEP_1000}"),
        &[],
    );
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    let (status, before) = running.get(&format!("/pid/{pid}/traced-memory"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut before = before;
    let mut status = status;
    while status != 200 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        (status, before) = running.get(&format!("/pid/{pid}/traced-memory"));
    }
    assert_eq!(status, 200, "{before}");
    fx.go();
    fx.expect_line("done");
    let (_, after) = running.get(&format!("/pid/{pid}/traced-memory"));
    let grown =
        after["current"].as_u64().expect("current") - before["current"].as_u64().expect("current");
    assert_eq!(
        grown, 333_000,
        "exact bytes traced with the unit's capabilities"
    );
    let (_, stats) = running.get(&format!("/pid/{pid}/statistics?limit=1"));
    assert_eq!(
        stats["statistics"][0]["traceback"][0]["filename"].as_str(),
        dir.path().join("keep1000.c").to_str()
    );
    fx.go();
    assert!(fx.finish().success());
    drop(running);

    let without = unit_capabilities(Some("CAP_SYS_ADMIN"));
    let out = Command::new("setpriv")
        .args([
            "--bounding-set",
            &without,
            "--inh-caps=-all",
            TRACERD,
            "--listen",
        ])
        .arg(format!("127.0.0.1:{}", free_port()))
        .args(["--state-dir", "/tmp", "--bpf-stats", "false"])
        .output()
        .expect("setpriv");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("perf_event_open") && err.contains("Permission denied"),
        "{err}"
    );
}

#[test]
fn systemd_analyze_verify_accepts_the_unit() {
    let dir = TempDir::new("unit");
    let unit = std::fs::read_to_string(workspace_file("deploy/tracerd.service")).expect("unit");
    assert!(unit.contains("\nType=notify\n"));
    assert!(
        !unit.contains("ProtectProc="),
        "tracerd must see every process"
    );
    // verify checks that ExecStart exists: point it at the built binary.
    let path = dir.path().join("tracerd.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/tracerd", TRACERD)).expect("write unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let about_ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("tracerd.service"))
        .collect();
    assert_eq!(about_ours, Vec::<&str>::new());
}

#[test]
fn ready_is_notified_only_after_the_probes_are_attached() {
    require_root();
    let dir = TempDir::new("notify");
    let socket_path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut running = Running::spawn(
        &[],
        &[],
        &[("NOTIFY_SOCKET", socket_path.to_str().expect("utf-8"))],
        None,
    );
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).expect("a notification within 60 s");
    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(message.lines().any(|l| l == "READY=1"), "{message}");
    // At READY the probes are attached: the API answers and lists them.
    let (status, health) = running.get("/health");
    assert_eq!(status, 200);
    assert!(
        !health["libraries"]
            .as_array()
            .expect("libraries")
            .is_empty(),
        "{health}"
    );
    let (clean, _) = running.stop("TERM");
    assert!(clean);
    // Then STOPPING=1 (systemd takes any number of messages before it).
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let n = socket.recv(&mut buf).expect("STOPPING=1");
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        let stopping = message.lines().any(|l| l == "STOPPING=1");
        seen.push(message);
        if stopping {
            break;
        }
    }
    assert!(
        seen.last()
            .is_some_and(|m| m.lines().any(|l| l == "STOPPING=1")),
        "{seen:?}"
    );
}
