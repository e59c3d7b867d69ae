//! PostgreSQL 15 for the services part: a scratch cluster, its postmaster
//! as user postgres on a Unix socket only, loaded by pgbench.
use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use anyhow::Context as _;
use tracer_testkit::{TempDir, free_port};

use super::server::{Figure, Server, number_after, output_ok, stop_with_children, wait_ready};
use crate::util::stats::percentile;

/// PostgreSQL 15's programs, as Debian installs them.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// pgbench's clients (each a backend the postmaster forks) and threads.
const PG_CLIENTS: &str = "4";
const PG_THREADS: &str = "2";
/// pgbench's scale factor (100,000 accounts each).
const PG_SCALE: &str = "5";

/// PostgreSQL 15: a cluster made by initdb (trust) in a scratch directory,
/// the postmaster run as user postgres on a Unix socket there only, with
/// `synchronous_commit=off` (a commit does not wait for the disk: the
/// bench measures CPU, not this machine's fsync), loaded by pgbench's
/// TPC-B-like script; every client connection is a backend the postmaster
/// forks at the run's start.
pub struct Postgres {
    // Declared first: stopped before its directory goes.
    postmaster: Child,
    port: u16,
    socket_dir: PathBuf,
    logs: PathBuf,
    _dir: TempDir,
}

/// `program` as user postgres (setpriv execs it: the child is the program).
fn as_postgres(program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
        .arg(Path::new(PG_BIN).join(program))
        .env("HOME", "/var/lib/postgresql");
    command
}

impl Postgres {
    /// Makes the cluster, starts the postmaster, fills pgbench's tables.
    ///
    /// # Errors
    /// A step failed, or postgres does not answer in time.
    pub fn start() -> anyhow::Result<Self> {
        let dir = TempDir::try_new("bench-postgres")?;
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
        let socket_dir = dir.path().join("pg");
        output_ok(
            Command::new("install")
                .args(["-d", "-o", "postgres", "-g", "postgres"])
                .arg(&socket_dir),
        )?;
        let data = socket_dir.join("data");
        output_ok(
            as_postgres("initdb")
                .args(["-A", "trust", "-U", "postgres", "--no-locale", "-E", "UTF8"])
                .arg("-D")
                .arg(&data)
                .current_dir(&socket_dir),
        )?;
        let port = free_port()?;
        let postmaster = as_postgres("postgres")
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses="])
            .args(["-c", "synchronous_commit=off", "-k"])
            .arg(&socket_dir)
            .current_dir(&socket_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting postgres")?;
        let logs = dir.path().join("pgbench-logs");
        fs::create_dir(&logs)?;
        let postgres = Self {
            postmaster,
            port,
            socket_dir,
            logs,
            _dir: dir,
        };
        wait_ready("postgres", || {
            Command::new(Path::new(PG_BIN).join("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(&postgres.socket_dir)
                .args(["-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        })?;
        output_ok(
            postgres
                .pgbench()
                .args(["-i", "-q", "-s", PG_SCALE, "postgres"]),
        )?;
        Ok(postgres)
    }

    /// `pgbench` against this cluster as user postgres, before its arguments.
    fn pgbench(&self) -> Command {
        let mut command = Command::new(Path::new(PG_BIN).join("pgbench"));
        command.arg("-h").arg(&self.socket_dir).args([
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
        ]);
        command
    }

    /// The p99 of the run's transaction latencies in ms, from pgbench's
    /// per-transaction logs (`client tx latency_us script epoch_s us`, a
    /// file per thread), which it removes; None when they hold none.
    fn logged_p99_ms(&self) -> anyhow::Result<Option<f64>> {
        let mut latencies_us = Vec::new();
        for entry in fs::read_dir(&self.logs)?.flatten() {
            let text = fs::read_to_string(entry.path())?;
            latencies_us.extend(
                text.lines()
                    .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()),
            );
            fs::remove_file(entry.path())?;
        }
        latencies_us.sort_unstable();
        Ok((!latencies_us.is_empty()).then(|| percentile(&latencies_us, 99.0) as f64 / 1000.0))
    }
}

impl Server for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn unit(&self) -> &'static str {
        "tx/s"
    }

    fn load(&self) -> String {
        format!("pgbench TPC-B-like, scale {PG_SCALE}, {PG_CLIENTS} clients, {PG_THREADS} threads")
    }

    fn pid(&self) -> u32 {
        self.postmaster.id()
    }

    fn run(&mut self, seconds: u64, _mode: &str) -> anyhow::Result<Vec<Figure>> {
        let out = output_ok(
            self.pgbench()
                .args([
                    "-T",
                    &seconds.to_string(),
                    "-c",
                    PG_CLIENTS,
                    "-j",
                    PG_THREADS,
                ])
                .arg("-l")
                .arg(format!("--log-prefix={}", self.logs.join("tx").display()))
                .arg("postgres"),
        )?;
        let tps = number_after(&out, "tps = ").context("pgbench printed no tps")?;
        Ok(vec![Figure {
            metric: "tpcb".into(),
            per_s: tps,
            p99_ms: self.logged_p99_ms()?,
        }])
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGINT: a fast shutdown.
        stop_with_children(&mut self.postmaster, "INT");
    }
}
