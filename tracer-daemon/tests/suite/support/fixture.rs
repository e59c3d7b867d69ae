//! The C fixtures: compiled for a test from `tests/fixtures/NAME.c`, and run
//! as processes that speak a line protocol (`fixtures/fixture.h`): a line
//! when a phase is done, then a wait for `go` on stdin. Every fixture
//! process is killed by pid on drop.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio},
};

use super::{
    files::{TempDir, fixture_path, fixture_text, line_of},
    process::kill_if_running,
    tracerd::Tracerd,
};

/// A fixture compiled into a scratch directory (removed on drop).
pub struct Program {
    /// The executable, `{scratch}/{name}`: its name is the process's comm.
    pub exe: PathBuf,
    /// `{scratch}/{name}.c`, a copy of `tests/fixtures/{name}.c` and the
    /// filename of its frames. A copy in a world-readable directory: tracerd
    /// shows source lines (`source=true`) only of files anyone may read, and
    /// a clone may live under a private (0700) directory.
    pub source: PathBuf,
    text: String,
    _dir: TempDir,
}

impl Program {
    /// Compiles `tests/fixtures/{name}.c` with `cc -g -O0
    /// -fno-omit-frame-pointer` (plus `flags`) into a scratch `{name}`.
    pub fn build(name: &str, flags: &[&str]) -> Self {
        Self::build_with("cc", &format!("{name}.c"), flags)
    }

    /// Compiles `tests/fixtures/{file}` with `compiler` (`musl-gcc`, `g++`
    /// ...), the flags of [`Program::build`] and `flags`.
    pub fn build_with(compiler: &str, file: &str, flags: &[&str]) -> Self {
        let name = file.split('.').next().unwrap_or(file);
        let dir = TempDir::new(name);
        let source = dir.path().join(file);
        std::fs::copy(fixture_path(file), &source).expect("copy the fixture's source");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the scratch directory");
        std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o644))
            .expect("chmod the source copy");
        let exe = dir.path().join(name);
        let include = fixture_path("");
        let flags: Vec<&std::ffi::OsStr> = [
            std::ffi::OsStr::new("-O0"),
            "-I".as_ref(),
            include.as_os_str(),
        ]
        .into_iter()
        .chain(flags.iter().map(std::ffi::OsStr::new))
        .collect();
        tracer_testkit::compile(compiler, &source, &exe, &flags).unwrap_or_else(|e| panic!("{e}"));
        Self {
            exe,
            source,
            text: fixture_text(file),
            _dir: dir,
        }
    }

    /// The line of the source holding `marker`.
    pub fn line(&self, marker: &str) -> u32 {
        line_of(&self.text, marker)
    }

    /// The source's path as a string, as frames show it.
    pub fn src(&self) -> &str {
        self.source.to_str().expect("utf-8 path")
    }
}

/// A running fixture process, killed by pid on drop.
pub struct Fixture {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Fixture {
    /// Starts `exe` with `args`; stdin and stdout are the protocol's pipes.
    pub fn spawn(exe: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn fixture");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Starts `exe` and waits until it says `ready`.
    pub fn spawn_ready(exe: &Path, args: &[&str]) -> Self {
        let mut fx = Self::spawn(exe, args);
        fx.expect_line("ready");
        fx
    }

    /// Starts `exe`, waits until it says `ready` and until `tracerd` traces
    /// its pid.
    pub fn spawn_traced(tracerd: &Tracerd, exe: &Path, args: &[&str]) -> Self {
        let fx = Self::spawn_ready(exe, args);
        tracerd.wait_traced(fx.pid());
        fx
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

    /// Lets the fixture go on, and waits until it says `line`.
    pub fn step(&mut self, line: &str) {
        self.go();
        self.expect_line(line);
    }

    /// Closes stdin and waits for the exit.
    pub fn finish(&mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait fixture")
    }

    /// Lets the fixture past its last wait, and asserts that it exits 0.
    pub fn end(&mut self) {
        self.go();
        let status = self.finish();
        assert!(status.success(), "fixture exited with {status}");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        kill_if_running(&mut self.child);
    }
}
