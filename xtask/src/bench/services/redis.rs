//! redis-server for the services part: one process on 127.0.0.1, loaded
//! by redis-benchmark's SET and GET tests.
use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use tracer_testkit::{Running, TempDir, free_port};

use super::server::{Figure, Server, output_ok, wait_ready};

/// redis-benchmark's connections, and its requests per test in the warm-up
/// that sizes the measured runs.
const REDIS_CLIENTS: &str = "50";
const REDIS_WARMUP_REQUESTS: u64 = 50_000;

/// redis-server (jemalloc, statically linked), one process on 127.0.0.1
/// with no persistence, loaded by redis-benchmark's SET and GET tests.
/// redis-benchmark has no time limit: each test's request count is sized
/// to last about half the run's seconds at the rate of the mode's previous
/// run (of the warm-up for its first), so that a slow mode does not take
/// many times longer.
pub struct Redis {
    // Declared first: stopped before its directory goes.
    server: Running,
    port: u16,
    /// Requests per test of a mode's first run, sized by the warm-up.
    first_requests: u64,
    /// Requests per test of each mode's next run.
    requests: BTreeMap<String, u64>,
    _dir: TempDir,
}

impl Redis {
    /// Starts it and waits until it answers.
    ///
    /// # Errors
    /// It cannot be started, or does not answer in time.
    pub fn start() -> anyhow::Result<Self> {
        let dir = TempDir::try_new("bench-redis")?;
        let port = free_port()?;
        let server = Running::spawn(
            Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .context("starting redis-server")?;
        wait_ready("redis-server", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })?;
        Ok(Self {
            server,
            port,
            first_requests: REDIS_WARMUP_REQUESTS,
            requests: BTreeMap::new(),
            _dir: dir,
        })
    }

    /// redis-benchmark's SET and GET tests, `requests` each.
    fn bench(&self, requests: u64) -> anyhow::Result<Vec<Figure>> {
        let out = output_ok(
            Command::new("redis-benchmark")
                .args(["-p", &self.port.to_string(), "-c", REDIS_CLIENTS])
                .args(["-n", &requests.to_string(), "-t", "set,get", "--csv"]),
        )?;
        let figures = redis_csv(&out);
        if figures.len() != 2 {
            bail!("redis-benchmark printed no SET and GET figures: {out}");
        }
        Ok(figures)
    }
}

/// redis-benchmark's `--csv` lines (`"SET","rps","avg","min","p50","p95",
/// "p99","max"`): each test's figures.
fn redis_csv(text: &str) -> Vec<Figure> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').map(|f| f.trim_matches('"')).collect();
            Some(Figure {
                metric: fields.first()?.to_lowercase(),
                per_s: fields.get(1)?.parse().ok()?,
                p99_ms: fields.get(6).and_then(|v| v.parse().ok()),
            })
        })
        .collect()
}

impl Server for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn unit(&self) -> &'static str {
        "ops/s"
    }

    fn load(&self) -> String {
        format!(
            "redis-benchmark SET and GET, {REDIS_CLIENTS} clients, each test sized to half the run by the mode's previous rate ({} requests without tracerd)",
            self.first_requests
        )
    }

    fn pid(&self) -> u32 {
        self.server.pid()
    }

    fn run(&mut self, seconds: u64, mode: &str) -> anyhow::Result<Vec<Figure>> {
        let requests = self
            .requests
            .get(mode)
            .copied()
            .unwrap_or(self.first_requests);
        let figures = self.bench(requests)?;
        self.requests
            .insert(mode.to_string(), half_run(&figures, seconds));
        Ok(figures)
    }

    fn warm_up(&mut self, seconds: u64) -> anyhow::Result<()> {
        let figures = self.bench(REDIS_WARMUP_REQUESTS)?;
        self.first_requests = half_run(&figures, seconds);
        Ok(())
    }
}

/// Requests per test that make the slower of `figures`' tests last half of
/// `seconds` s (at least 1,000).
fn half_run(figures: &[Figure], seconds: u64) -> u64 {
    let slowest = figures
        .iter()
        .map(|f| f.per_s)
        .fold(f64::INFINITY, f64::min);
    (slowest * seconds as f64 / 2.0).max(1000.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_csv_gives_each_tests_rate_and_p99() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"SET\",\"20218.36\",\"1.859\",\"0.088\",\"0.647\",\"8.175\",\"16.495\",\"41.023\"\n\
                   \"GET\",\"27700.83\",\"1.318\",\"0.080\",\"0.591\",\"4.775\",\"15.503\",\"50.879\"\n";
        assert_eq!(
            redis_csv(csv),
            [
                Figure {
                    metric: "set".into(),
                    per_s: 20218.36,
                    p99_ms: Some(16.495)
                },
                Figure {
                    metric: "get".into(),
                    per_s: 27700.83,
                    p99_ms: Some(15.503)
                },
            ]
        );
    }
}
