//! The real tracerd (real eBPF) on a free loopback port, and a client of its
//! API. Stopped by pid on drop (SIGTERM, then SIGKILL), even when a test
//! fails.

use std::{path::Path, process::Stdio, time::Duration};

use reqwest::{
    Method,
    blocking::{Client, Response},
};
use serde_json::Value;
use tracer_testkit::TracerdProcess;

use super::{
    files::TempDir,
    json::{sample, u64_of},
    process::{poll, require_root},
    shared::stop_shared,
};

/// How long an answer of tracerd may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// A running tracerd and an HTTP client for it.
pub struct Tracerd {
    // Declared first: stopped before its state directory goes.
    process: TracerdProcess,
    /// The state directory when this Tracerd made it (removed on drop).
    _state: Option<TempDir>,
    /// The file its stderr (its log) goes to, when started with
    /// [`Tracerd::start_logged`].
    log: Option<std::path::PathBuf>,
}

impl Tracerd {
    /// Starts tracerd with `extra` arguments and a state directory of its
    /// own; returns once `/health` answers 200.
    pub fn start(extra: &[&str]) -> Self {
        stop_shared();
        Self::start_own(extra)
    }

    /// [`Tracerd::start`] without stopping the shared tracerd (what
    /// [`Tracerd::shared`] starts it with).
    pub(super) fn start_own(extra: &[&str]) -> Self {
        let state = TempDir::new("state");
        let mut tracerd = Self::spawn(state.path(), extra, Stdio::inherit());
        tracerd._state = Some(state);
        tracerd
    }

    /// [`Tracerd::start`] with its log (stderr) in a file of its state
    /// directory, read by [`Tracerd::log`].
    pub fn start_logged(extra: &[&str]) -> Self {
        stop_shared();
        let state = TempDir::new("state");
        let log = state.path().join("tracerd.log");
        let file = std::fs::File::create(&log).expect("log file");
        let mut tracerd = Self::spawn(state.path(), extra, Stdio::from(file));
        tracerd._state = Some(state);
        tracerd.log = Some(log);
        tracerd
    }

    /// What tracerd logged so far (started with [`Tracerd::start_logged`]),
    /// without the terminal's colour sequences (`pid=42` reads as such).
    pub fn log(&self) -> String {
        let path = self.log.as_ref().expect("started with start_logged");
        let text = std::fs::read_to_string(path).expect("read the log");
        let mut plain = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find("\x1b[") {
            plain.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let end = after.find('m').map_or(after.len(), |m| m + 1);
            rest = &after[end..];
        }
        plain.push_str(rest);
        plain
    }

    /// Starts tracerd with `state` as its state directory (kept on drop, so
    /// another tracerd can start on it).
    pub fn start_at(state: &Path, extra: &[&str]) -> Self {
        stop_shared();
        Self::spawn(state, extra, Stdio::inherit())
    }

    /// Spawns tracerd with `extra`; every process traced exactly
    /// (`--exact all`) unless `extra` says otherwise: the suite checks the
    /// exact tracer on processes it starts after tracerd, and the tests of
    /// the default (`exact = "demand"`, `suite::watch`) say `--exact demand`.
    fn spawn(state: &Path, extra: &[&str], stderr: Stdio) -> Self {
        require_root();
        let mut args: Vec<&str> = extra.to_vec();
        if !extra.contains(&"--exact") {
            args.extend(["--exact", "all"]);
        }
        let process = TracerdProcess::start(
            Path::new(env!("CARGO_BIN_EXE_tracerd")),
            state,
            &args,
            stderr,
            ANSWER_WITHIN,
        )
        .unwrap_or_else(|e| panic!("tracerd {extra:?}: {e}"));
        Self {
            process,
            _state: None,
            log: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// `http://127.0.0.1:PORT`, what the API's paths are appended to.
    pub fn base(&self) -> &str {
        self.process.client().base()
    }

    /// reqwest's client of the API (its connections kept alive).
    pub fn client(&self) -> &Client {
        self.process.client().inner()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base())
    }

    /// The raw response to `method path` (for its headers).
    pub fn request(&self, method: Method, path: &str) -> Response {
        self.client()
            .request(method.clone(), self.url(path))
            .send()
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// GET a path; returns (status, body as JSON, or the text as a JSON string).
    pub fn get(&self, path: &str) -> (u16, Value) {
        decode(self.request(Method::GET, path))
    }

    /// GET a path that must answer 200; returns the body.
    pub fn get_ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    pub fn get_text(&self, path: &str) -> (u16, String) {
        let r = self.request(Method::GET, path);
        (r.status().as_u16(), r.text().expect("body"))
    }

    /// GET a path's body as bytes, with the status.
    pub fn get_bytes(&self, path: &str) -> (u16, Vec<u8>) {
        let r = self.request(Method::GET, path);
        (r.status().as_u16(), r.bytes().expect("body").to_vec())
    }

    pub fn post(&self, path: &str) -> (u16, Value) {
        decode(self.request(Method::POST, path))
    }

    /// PUT a path; the body is `null` when it is not JSON.
    pub fn put(&self, path: &str) -> (u16, Value) {
        let r = self.request(Method::PUT, path);
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    }

    /// A request with an optional body; returns (status, JSON or text).
    pub fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> (u16, Value) {
        let mut request = self.client().request(method, self.url(path));
        if let Some(body) = body {
            request = request.body(body);
        }
        decode(request.send().expect("request"))
    }

    /// `GET /maps`: the kernel maps' entries and the eBPF counters.
    pub fn maps(&self) -> Value {
        self.get_ok("/maps")
    }

    /// The eBPF counter `name`, from `GET /maps`.
    pub fn counter(&self, name: &str) -> u64 {
        u64_of(&self.maps()["counters"], name)
    }

    /// The unlabelled sample `name` from `GET /metrics`; fails the test
    /// when it is missing.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get_text("/metrics");
        sample(&text, name, &[]).unwrap_or_else(|| panic!("{name} in /metrics"))
    }

    /// `tracer_drops_total{reason="{reason}"}` from `GET /metrics`; fails
    /// the test when the sample is missing.
    pub fn drops_total(&self, reason: &str) -> f64 {
        let (_, text) = self.get_text("/metrics");
        sample(&text, "tracer_drops_total", &[("reason", reason)])
            .unwrap_or_else(|| panic!("tracer_drops_total{{reason=\"{reason}\"}} in /metrics"))
    }

    /// SIGKILL, and waits until it is gone.
    pub fn kill9(&mut self) {
        self.process.kill().expect("wait for tracerd");
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after 20 s); returns
    /// (exited cleanly, time taken).
    pub fn terminate(&mut self) -> (bool, Duration) {
        let (status, took) = self
            .process
            .terminate(Duration::from_secs(20))
            .expect("wait for tracerd");
        (status.success(), took)
    }

    /// Waits until tracerd lists `pid` (its `New` event was handled) with
    /// the image it runs now: while the process lives, the `exe` tracerd
    /// gives is its `/proc/PID/exe`. Before an exec's event is handled,
    /// `/pid/PID` still answers for the image before it (chroot's, runc's),
    /// which a query for the pid will not mean once it is.
    pub fn wait_traced(&self, pid: u32) {
        poll(Duration::from_secs(10), Duration::from_millis(20), || {
            let runs = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            match self.get(&format!("/pid/{pid}")) {
                (200, body) => match (runs, body["exe"].as_str()) {
                    (Some(runs), Some(exe)) if runs.as_os_str() != exe => Err(format!(
                        "pid {pid} traced as {exe}, runs {}",
                        runs.display()
                    )),
                    _ => Ok(()),
                },
                (status, body) => Err(format!("pid {pid} not traced: {status} {body}")),
            }
        });
    }
}

fn decode(r: Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

/// `dir/token` holding `token`, readable by its owner only (as tracerd's
/// `auth_token_file` must be).
pub fn token_file(dir: &Path, token: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join("token");
    std::fs::write(&path, token).expect("token");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path
}
