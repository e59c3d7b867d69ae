//! The `tracer` command (the `tracer-cli` crate) against the real
//! tracerd tracing `fixtures/keep.c`: `ps`, `stat`, `snapshot`, `diff`,
//! `top`, `load` and `run` show the fixture's exact bytes and blocks at its
//! lines, `--json` is the API's JSON, and tracerd's 4xx messages are shown.
//!
//! The `tracer` binary belongs to another package, so cargo gives this one
//! no `CARGO_BIN_EXE_tracer`: [`tracer_bin`] builds it once per run with the
//! cargo that runs these tests, into the target directory and profile of
//! tracerd's, so it is never stale. Every `tracer` started here is a
//! [`Started`]: killed by pid on drop, with the command `tracer run`
//! started, even when a test fails.

mod run;
mod views;

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::OnceLock,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::support::{
    Fixture, Program, SharedTracerd, Tracerd, kill_if_running, output_ok, running, signal,
};

/// `tracer`, built (once per test run) into the directory tracerd was
/// built in.
fn tracer_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let tracerd = Path::new(env!("CARGO_BIN_EXE_tracerd"));
        let profile_dir = tracerd.parent().expect("tracerd's directory");
        let target = profile_dir.parent().expect("the target directory");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => panic!("no profile directory in {}", tracerd.display()),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        output_ok(
            Command::new(cargo)
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .args(["build", "--quiet", "-p", "tracer-cli", "--bin", "tracer"])
                .args(["--profile", profile, "--target-dir"])
                .arg(target),
        );
        profile_dir.join("tracer")
    })
}

/// A `tracer` command for `tracerd` (over TCP), with no colour and none
/// of the caller's `TRACER_*` settings.
fn tracer(tracerd: &Tracerd, args: &[&str]) -> Command {
    let mut command = bare_tracer();
    command.arg("--addr").arg(tracerd.base()).args(args);
    command
}

/// A `tracer` command with no address given.
fn bare_tracer() -> Command {
    let mut command = Command::new(tracer_bin());
    for name in [
        "TRACER_ADDR",
        "TRACER_SOCKET",
        "TRACER_TOKEN",
        "TRACER_TOKEN_FILE",
    ] {
        command.env_remove(name);
    }
    command.env("NO_COLOR", "1");
    command
}

/// What a finished `tracer` said.
#[derive(Debug)]
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// Asserts that it exited 0; its stdout.
    fn ok(self) -> String {
        assert!(
            self.status.success(),
            "tracer failed ({}): {}",
            self.status,
            self.stderr
        );
        self.stdout
    }

    /// The rows of a table on stdout, each split at its whitespace.
    fn rows(&self) -> Vec<Vec<String>> {
        self.stdout
            .lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    }
}

/// A running `tracer`, killed by pid on drop with the children it started
/// (`tracer run`'s command).
struct Started {
    child: Child,
    readers: Vec<JoinHandle<String>>,
}

impl Started {
    /// Starts `command` with stdout and stderr read whole in the
    /// background and `stdin` as its input.
    fn spawn(command: &mut Command, stdin: &[u8]) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tracer");
        let mut input = child.stdin.take().expect("stdin");
        std::io::Write::write_all(&mut input, stdin).expect("write tracer's stdin");
        drop(input);
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let readers = [
            Box::new(out) as Box<dyn std::io::Read + Send>,
            Box::new(err),
        ]
        .into_iter()
        .map(|mut pipe| {
            std::thread::spawn(move || {
                // The command's own output may not be UTF-8 (gzip -c).
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                String::from_utf8_lossy(&bytes).into_owned()
            })
        })
        .collect();
        Self { child, readers }
    }

    /// Waits for the exit (at most `within`, then the test fails).
    fn wait(mut self, within: Duration) -> Ran {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                start.elapsed() < within,
                "tracer still runs after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut texts = std::mem::take(&mut self.readers)
            .into_iter()
            .map(|r| r.join().expect("reader"));
        Ran {
            status,
            stdout: texts.next().unwrap_or_default(),
            stderr: texts.next().unwrap_or_default(),
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if !running(&mut self.child) {
            return;
        }
        // The processes `tracer run` started, by pid, then tracer itself.
        let pid = self.child.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|p| p.parse().ok()) {
            signal(child, "KILL");
        }
        kill_if_running(&mut self.child);
    }
}

/// Runs `command` to its end (at most 120 s) with empty input.
fn finish(command: &mut Command) -> Ran {
    Started::spawn(command, b"").wait(Duration::from_secs(120))
}

/// `fixtures/keep.c` compiled, traced by the shared tracerd of `extra`
/// flags ([`Tracerd::shared`]), and stepped to "done": it holds its `calloc` of 20000 pointers
/// (160000 bytes), 20000 blocks of 256 bytes at `ALLOC_SITE`, and the
/// 4096-byte buffers glibc gave its stdin and stdout (pipes).
fn keep_done(extra: &[&str]) -> (Program, SharedTracerd, Fixture) {
    let keep = Program::build("keep", &[]);
    let tracerd = Tracerd::shared(extra);
    let mut fx = Fixture::spawn_traced(&tracerd, &keep.exe, &[]);
    fx.step("done");
    (keep, tracerd, fx)
}

/// What `keep.c` holds at "done" and at its exit, in bytes and blocks.
const KEEP_BYTES: u64 = 160_000 + 20_000 * 256 + 2 * 4096;
const KEEP_BLOCKS: u64 = 1 + 20_000 + 2;
