//! Debian's services as the tests' own processes (`/work/shared/SERVICES.md`):
//! nginx (a master and its workers) and PostgreSQL (a postmaster and its
//! backends) in a scratch directory on loopback or a Unix socket directory,
//! waited for until they answer and stopped by pid on drop, their children
//! too; programs held at a line of their output (node, java, python3); and
//! a process frozen (SIGSTOP) while the tests read its blocks twice.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use super::{
    files::TempDir,
    process::{free_port, kill_if_running, output_ok, poll, signal, stop},
};

/// PostgreSQL 15's programs, as Debian installs them.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// The pids whose parent is `pid` (from `/proc/*/stat`: this kernel has no
/// `/proc/PID/task/TID/children`).
fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            children.push(child);
        }
    }
    children.sort_unstable();
    children
}

/// `/proc/{pid}/cmdline` with spaces for its NULs (empty once it is gone).
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// SIGKILL to each of `pids` (only processes a test started).
fn kill_all(pids: &[u32]) {
    for &pid in pids {
        signal(pid, "KILL");
    }
}

/// A process stopped by SIGSTOP until drop (SIGCONT): what it holds cannot
/// change between two reads of it.
pub struct Frozen(u32);

impl Frozen {
    /// Stops `pid` and waits until the kernel says it is stopped.
    pub fn new(pid: u32) -> Self {
        signal(pid, "STOP");
        let frozen = Self(pid);
        poll(Duration::from_secs(10), Duration::from_millis(10), || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("");
            if state == "T" {
                Ok(())
            } else {
                Err(format!("{pid} is not stopped: {state:?}"))
            }
        });
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

/// nginx as SERVICES.md runs it: `daemon off`, a master (this process's
/// child) and `workers` workers as www-data, serving a 2000-byte file on
/// 127.0.0.1. Stopped by pid on drop (SIGTERM to the master, then SIGKILL
/// to it and its workers).
pub struct Nginx {
    master: Child,
    pub port: u16,
    workers: usize,
    _dir: TempDir,
}

impl Nginx {
    /// Starts nginx and waits until it answers and has its workers.
    pub fn start(workers: usize) -> Self {
        let dir = TempDir::new("nginx");
        let root = dir.path();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::create_dir(root.join("www")).expect("mkdir www");
        std::fs::write(root.join("www/file"), vec![b'x'; 2000]).expect("write file");
        let port = free_port();
        let conf = format!(
            "daemon off; master_process on; worker_processes {workers}; user www-data;\n\
             pid {dir}/nginx.pid; error_log {dir}/error.log;\n\
             events {{ worker_connections 256; }}\n\
             http {{ server {{ listen 127.0.0.1:{port}; root {dir}/www; access_log off; }} }}\n",
            dir = root.display()
        );
        std::fs::write(root.join("nginx.conf"), conf).expect("write nginx.conf");
        let master = Command::new("/usr/sbin/nginx")
            .arg("-c")
            .arg(root.join("nginx.conf"))
            .arg("-p")
            .arg(root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn nginx");
        let nginx = Self {
            master,
            port,
            workers,
            _dir: dir,
        };
        poll(Duration::from_secs(20), Duration::from_millis(50), || {
            let up = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            let n = children_of(nginx.master()).len();
            if up && n == workers {
                Ok(())
            } else {
                Err(format!("nginx: listening {up}, {n} of {workers} workers"))
            }
        });
        nginx
    }

    /// The master's pid.
    pub fn master(&self) -> u32 {
        self.master.id()
    }

    /// The workers' pids.
    pub fn workers(&self) -> Vec<u32> {
        let workers = children_of(self.master());
        assert_eq!(workers.len(), self.workers, "nginx workers: {workers:?}");
        workers
    }

    /// `ab -n requests -c concurrency` against the file; asserts that every
    /// request succeeded.
    pub fn load(&self, requests: u32, concurrency: u32) {
        let out = output_ok(
            Command::new("ab")
                .arg("-q")
                .args(["-n", &requests.to_string(), "-c", &concurrency.to_string()])
                .arg(self.url()),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Failed", "requests:", "0"]),
            "ab: {text}"
        );
    }

    /// The URL of the file.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/file", self.port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let workers = children_of(self.master());
        stop(&mut self.master, "TERM", Duration::from_secs(10));
        kill_all(&workers);
    }
}

/// PostgreSQL 15 as SERVICES.md runs it: a cluster made by initdb (trust)
/// in a scratch directory, the postmaster run as user postgres (setpriv
/// execs it: the child is the postmaster) on a Unix socket in that
/// directory only. Stopped by pid on drop (SIGINT, a fast shutdown; then
/// SIGKILL to it and its children).
pub struct Postgres {
    postmaster: Child,
    pub port: u16,
    socket_dir: PathBuf,
    _dir: TempDir,
}

/// `command` as user postgres.
fn as_postgres(program: &Path) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
        .arg(program)
        .env("HOME", "/var/lib/postgresql");
    command
}

impl Postgres {
    /// Makes a cluster, starts the postmaster and waits until it accepts
    /// connections.
    pub fn start() -> Self {
        let dir = TempDir::new("postgres");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let socket_dir = dir.path().join("pg");
        output_ok(
            Command::new("install")
                .args(["-d", "-o", "postgres", "-g", "postgres"])
                .arg(&socket_dir),
        );
        let data = socket_dir.join("data");
        output_ok(
            as_postgres(&Path::new(PG_BIN).join("initdb"))
                .args(["-A", "trust", "-U", "postgres", "-D"])
                .arg(&data)
                .current_dir(&socket_dir),
        );
        let port = free_port();
        let postmaster = as_postgres(&Path::new(PG_BIN).join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=", "-k"])
            .arg(&socket_dir)
            .current_dir(&socket_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn postgres");
        let postgres = Self {
            postmaster,
            port,
            socket_dir,
            _dir: dir,
        };
        poll(Duration::from_secs(30), Duration::from_millis(100), || {
            let ready = Command::new(Path::new(PG_BIN).join("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(&postgres.socket_dir)
                .args(["-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                Ok(())
            } else {
                Err("postgres does not accept connections".to_string())
            }
        });
        postgres
    }

    /// The postmaster's pid.
    pub fn postmaster(&self) -> u32 {
        self.postmaster.id()
    }

    /// `pgbench` against database postgres as user postgres, before `args`.
    pub fn pgbench(&self, args: &[&str]) -> Command {
        let mut command = Command::new(Path::new(PG_BIN).join("pgbench"));
        command
            .arg("-h")
            .arg(&self.socket_dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres"])
            .args(args)
            .arg("postgres")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }

    /// The backends serving clients now (children of the postmaster
    /// whose title says `[local]`).
    pub fn backends(&self) -> Vec<u32> {
        children_of(self.postmaster())
            .into_iter()
            .filter(|&pid| cmdline(pid).contains("[local]"))
            .collect()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let children = children_of(self.postmaster());
        stop(&mut self.postmaster, "INT", Duration::from_secs(20));
        kill_all(&children);
    }
}

/// A program the test talks to by lines (node, java, python3): killed by
/// pid on drop.
pub struct Held {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Held {
    /// Spawns `command` with its stdin and stdout as pipes.
    pub fn spawn(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
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

    /// Reads lines until one starts with `prefix`; returns it (trimmed).
    pub fn line_starting(&mut self, prefix: &str) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("read output");
            assert!(n > 0, "the program ended before it said {prefix:?}");
            if line.starts_with(prefix) {
                return line.trim().to_string();
            }
        }
    }

    /// Writes `line` and a newline to its stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to the program");
        stdin.flush().expect("flush");
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.stdin.take());
        kill_if_running(&mut self.child);
    }
}
