//! The long runs that show tracerd holds up as a service, kept out of
//! `cargo xtask test` (CI's time limit): `fuzz` (every fuzz target for N
//! seconds), `load` (many loopback clients on the expensive routes while a
//! churning workload is traced) and `soak` (process churn for N minutes,
//! tracerd's memory and kernel map entries before and after).
//!
//! Everything started here talks to loopback only and is stopped by pid.
use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// Debian packages the service tests use: (command proving it is installed,
/// package).
pub const SERVICE_PACKAGES: &[(&str, &str)] = &[
    ("prometheus", "prometheus"),
    ("bpftool", "bpftool"),
    ("systemd-analyze", "systemd"),
    ("setpriv", "util-linux"),
];

/// `cargo xtask fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// Only these targets (default: every target in fuzz/Cargo.toml).
    pub targets: Vec<String>,
    /// Targets run side by side (each uses one core).
    #[arg(long, default_value_t = 2)]
    pub parallel: usize,
}

/// `cargo xtask load`.
#[derive(clap::Args)]
pub struct LoadArgs {
    /// Seconds of load.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Extra tracerd flags, e.g. `--max-expensive-requests 64`.
    #[arg(last = true)]
    pub tracerd_args: Vec<String>,
}

/// `cargo xtask soak`.
#[derive(clap::Args)]
pub struct SoakArgs {
    /// Seconds of process churn.
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// Threads spawning short-lived processes.
    #[arg(long, default_value_t = 2)]
    pub spawners: usize,
    /// Milliseconds each spawner waits between processes (0: back to back;
    /// 4 spawners back to back reach about 600 processes a second here,
    /// more than tracerd's exit handling keeps up with: see
    /// docs/operations.md).
    #[arg(long, default_value_t = 20)]
    pub pause_ms: u64,
    /// Extra tracerd flags, e.g. `--snapshot-interval 0`.
    #[arg(last = true)]
    pub tracerd_args: Vec<String>,
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Runs every fuzz target for `seconds`, `parallel` at a time, seeded from
/// real inputs, and prints one line per target (runs, coverage, result).
pub fn fuzz(root: &Path, args: &FuzzArgs) -> anyhow::Result<()> {
    if Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!("xtask: installing cargo-fuzz");
        super_run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let dir = root.join("fuzz");
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).context("fuzz/Cargo.toml")?;
    let all: Vec<String> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|name| *name != "tracer-fuzz")
        .map(str::to_string)
        .collect();
    let targets: Vec<String> = if args.targets.is_empty() {
        all
    } else {
        args.targets.clone()
    };
    // The targets need no eBPF object: skip building it with sanitizers.
    let build = Command::new("cargo")
        .args(["+nightly", "fuzz", "build", "-O"])
        .env("AYA_BUILD_SKIP", "1")
        .current_dir(&dir)
        .status()
        .context("cargo fuzz build")?;
    if !build.success() {
        bail!("cargo fuzz build failed");
    }
    for target in &targets {
        seed_corpus(root, &dir.join("corpus").join(target), target)?;
    }
    let mut results = Vec::new();
    for chunk in targets.chunks(args.parallel.max(1)) {
        let children: Vec<(String, Child)> = chunk
            .iter()
            .map(|target| {
                let log = std::fs::File::create(dir.join(format!("{target}.log")))?;
                let child = Command::new("cargo")
                    .args(["+nightly", "fuzz", "run", "-O", target, "--"])
                    .arg(format!("-max_total_time={}", args.seconds))
                    .args(["-rss_limit_mb=4096", "-print_final_stats=1"])
                    .env("AYA_BUILD_SKIP", "1")
                    .current_dir(&dir)
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()?;
                Ok((target.clone(), child))
            })
            .collect::<std::io::Result<_>>()
            .context("starting cargo fuzz run")?;
        for (target, mut child) in children {
            let status = child.wait().context("waiting for cargo fuzz")?;
            let log =
                std::fs::read_to_string(dir.join(format!("{target}.log"))).unwrap_or_default();
            results.push((target, status.success(), fuzz_summary(&log)));
        }
    }
    println!("| target | seconds | runs | coverage (edges) | corpus | result |");
    println!("|---|---|---|---|---|---|");
    let mut failed = Vec::new();
    for (target, ok, summary) in &results {
        println!(
            "| {target} | {} | {} | {} | {} | {} |",
            args.seconds,
            summary.get("runs").map_or("?", String::as_str),
            summary.get("cov").map_or("?", String::as_str),
            summary.get("corp").map_or("?", String::as_str),
            if *ok {
                "clean"
            } else {
                "CRASH (see fuzz/artifacts)"
            }
        );
        if !ok {
            failed.push(target.as_str());
        }
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Numbers from libFuzzer's last status line and final stats.
fn fuzz_summary(log: &str) -> BTreeMap<&'static str, String> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("stat::number_of_executed_units: ") {
            out.insert("runs", rest.trim().to_string());
        }
        if line.starts_with('#') && line.contains(" cov: ") {
            let mut words = line.split_whitespace();
            while let Some(word) = words.next() {
                match word {
                    "cov:" => {
                        out.insert("cov", words.next().unwrap_or("?").to_string());
                    }
                    "corp:" => {
                        out.insert("corp", words.next().unwrap_or("?").to_string());
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// Seeds a target's corpus with real inputs of its kind (once).
fn seed_corpus(root: &Path, corpus: &Path, target: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(corpus)?;
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    match target {
        "config_toml" => seeds.push(std::fs::read(root.join("deploy/tracerd.toml"))?),
        "proc_maps" => seeds.push(std::fs::read("/proc/self/maps")?),
        "proc_stat" => seeds.push(std::fs::read("/proc/self/stat")?),
        "query_params" => {
            for q in [
                "/pid/12/statistics?group_by=lineno&cumulative=true&limit=10&format=text",
                "/pid/12/compare?base=3&new=now&group_by=traceback",
                "/pid/%2e%2e/x?limit=-1",
            ] {
                seeds.push(q.as_bytes().to_vec());
            }
        }
        "token_file" => {
            seeds.push(b"0123456789abcdef-token\nBearer 0123456789abcdef-token".to_vec())
        }
        _ => {}
    }
    for (i, seed) in seeds.iter().enumerate() {
        let path = corpus.join(format!("seed-{i}"));
        if !path.exists() {
            std::fs::write(path, seed)?;
        }
    }
    Ok(())
}

fn super_run(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// A release tracerd on a free loopback port, stopped by pid on drop.
struct Daemon {
    child: Child,
    addr: SocketAddr,
    _state: TempDir,
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("tracer-xtask-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Daemon {
    fn start(root: &Path, extra: &[String]) -> anyhow::Result<Self> {
        let tracerd = target_dir(root).join("release/tracerd");
        let state = TempDir::new("state")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let child = Command::new(&tracerd)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--state-dir")
            .arg(&state.0)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", tracerd.display()))?;
        let mut daemon = Self {
            child,
            addr,
            _state: state,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(addr, "/health").map(|(s, _)| s).ok() != Some(200) {
            if let Some(status) = daemon.child.try_wait()? {
                bail!("tracerd exited at start: {status}");
            }
            if Instant::now() > deadline {
                bail!("tracerd not ready in 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(daemon)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            })
            .unwrap_or(0)
    }

    fn stop(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let status = self.child.wait()?;
        if !status.success() {
            bail!("tracerd exited with {status} after SIGTERM");
        }
        Ok(start.elapsed())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(self.child.id().to_string())
                .status();
            let _ = self.child.wait();
        }
    }
}

/// One GET on a fresh loopback connection: (status, body).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn compile(dir: &Path, name: &str, source: &str) -> anyhow::Result<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source)?;
    let exe = dir.join(name);
    super_run(
        Command::new("cc")
            .args(["-g", "-O1", "-fno-omit-frame-pointer", "-o"])
            .arg(&exe)
            .arg(&src),
    )?;
    Ok(exe)
}

/// A long-running churn: a ring of 20000 live blocks from four call sites,
/// each new block replacing (freeing) the oldest, in bursts.
const CHURN: &str = r#"
#include <stdlib.h>
#include <unistd.h>
#define SLOTS 20000
static void *ring[SLOTS];
__attribute__((noinline)) static void *small(int i) { return malloc(16 + i % 64); }
__attribute__((noinline)) static void *medium(int i) { return malloc(512 + i % 512); }
__attribute__((noinline)) static void *zeroed(int i) { return calloc(1, 64 + i % 128); }
__attribute__((noinline)) static void *grown(void *p, int i) { return realloc(p, 128 + i % 256); }
int main(void) {
    for (unsigned long i = 0;; i++) {
        unsigned slot = i % SLOTS;
        free(ring[slot]);
        switch (i % 4) {
        case 0: ring[slot] = small(i); break;
        case 1: ring[slot] = medium(i); break;
        case 2: ring[slot] = zeroed(i); break;
        default: ring[slot] = grown(small(i), i); break;
        }
        if (i % 2000 == 0) usleep(10000);
    }
}
"#;

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `cargo xtask load`: `clients` threads on statistics, compare and metrics
/// for `seconds` while the churn workload is traced.
pub fn load(root: &Path, args: &LoadArgs) -> anyhow::Result<()> {
    let scratch = TempDir::new("load")?;
    let churn = compile(&scratch.0, "churn", CHURN)?;
    let mut daemon = Daemon::start(root, &args.tracerd_args)?;
    let mut workload = Command::new(&churn).stdout(Stdio::null()).spawn()?;
    let pid = workload.id();
    let result = (|| -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(daemon.addr, &format!("/pid/{pid}")).map(|(s, _)| s)? != 200 {
            if Instant::now() > deadline {
                bail!("the churn workload is not traced after 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(2));
        let (status, _) = post(daemon.addr, &format!("/pid/{pid}/snapshots"))?;
        if status != 201 {
            bail!("POST snapshots: {status}");
        }
        let routes = [
            format!("/pid/{pid}/statistics?group_by=lineno&limit=20"),
            format!("/pid/{pid}/compare?group_by=lineno&limit=20"),
            "/metrics".to_string(),
        ];
        let names = ["statistics", "compare", "metrics"];
        let stop_at = Instant::now() + Duration::from_secs(args.seconds);
        let errors = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..args.clients)
            .map(|client| {
                let routes = routes.clone();
                let addr = daemon.addr;
                let errors = errors.clone();
                std::thread::spawn(move || {
                    let mut samples: Vec<(usize, u16, u64)> = Vec::new();
                    let mut i = client;
                    while Instant::now() < stop_at {
                        let route = i % routes.len();
                        let start = Instant::now();
                        match get(addr, &routes[route]) {
                            Ok((status, _)) => {
                                samples.push((route, status, start.elapsed().as_micros() as u64))
                            }
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        i += 1;
                    }
                    samples
                })
            })
            .collect();
        let mut samples = Vec::new();
        for thread in threads {
            samples.extend(
                thread
                    .join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))?,
            );
        }
        let stop_took = daemon.stop()?;
        report_load(
            &samples,
            &names,
            errors.load(Ordering::Relaxed),
            args,
            stop_took,
        )
    })();
    let _ = workload.kill();
    let _ = workload.wait();
    result
}

fn post(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    Ok((
        text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0),
        String::new(),
    ))
}

fn report_load(
    samples: &[(usize, u16, u64)],
    names: &[&str],
    connect_errors: u64,
    args: &LoadArgs,
    stop_took: Duration,
) -> anyhow::Result<()> {
    println!(
        "load: {} clients for {} s, tracerd flags {:?}; latency in ms (connect to last byte)",
        args.clients, args.seconds, args.tracerd_args
    );
    println!(
        "| route | requests | 200 | 429 | other 4xx | 5xx | p50 all | p99 all | p50 of 200 | p99 of 200 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut total_5xx = 0;
    let rows: Vec<Option<usize>> = (0..names.len()).map(Some).chain([None]).collect();
    for row in rows {
        let picked: Vec<&(usize, u16, u64)> = samples
            .iter()
            .filter(|s| row.is_none_or(|r| s.0 == r))
            .collect();
        let mut all: Vec<u64> = picked.iter().map(|s| s.2).collect();
        all.sort_unstable();
        let mut ok: Vec<u64> = picked.iter().filter(|s| s.1 == 200).map(|s| s.2).collect();
        ok.sort_unstable();
        let count = |f: &dyn Fn(u16) -> bool| picked.iter().filter(|s| f(s.1)).count();
        let fives = count(&|s| s >= 500);
        if row.is_none() {
            total_5xx = fives;
        }
        let ms = |us: u64| format!("{:.1}", us as f64 / 1000.0);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.map_or("all", |r| names[r]),
            picked.len(),
            count(&|s| s == 200),
            count(&|s| s == 429),
            count(&|s| (400..500).contains(&s) && s != 429),
            fives,
            ms(percentile(&all, 50.0)),
            ms(percentile(&all, 99.0)),
            ms(percentile(&ok, 50.0)),
            ms(percentile(&ok, 99.0)),
        );
    }
    println!("connection errors: {connect_errors}; SIGTERM to exit after the load: {stop_took:?}");
    if total_5xx > 0 || connect_errors > 0 {
        bail!("{total_5xx} responses were 5xx and {connect_errors} requests failed");
    }
    Ok(())
}

/// A short-lived process: 200 allocations from two sites, half freed, the
/// rest still live when it exits (tracerd must drop them with it).
const SHORT_LIVED: &str = r#"
#include <stdlib.h>
__attribute__((noinline)) static void *site_a(int i) { return malloc(32 + i); }
__attribute__((noinline)) static void *site_b(int i) { return calloc(4, 16 + i); }
int main(void) {
    void *p[200];
    for (int i = 0; i < 200; i++) p[i] = (i % 2) ? site_a(i) : site_b(i);
    for (int i = 0; i < 200; i += 2) free(p[i]);
    return p[1] == NULL;
}
"#;

/// What the soak measures at one moment.
#[derive(Clone, Debug, Default)]
struct Gauges {
    rss_kib: u64,
    maps: BTreeMap<String, u64>,
    processes: BTreeMap<String, u64>,
    /// LIVE_ALLOCS entries of processes that no longer exist: what exit
    /// handling failed to remove (the rest of the map belongs to live
    /// processes of a shared host).
    dead_blocks: u64,
}

fn gauges(daemon: &Daemon) -> anyhow::Result<Gauges> {
    let (status, text) = get(daemon.addr, "/metrics")?;
    if status != 200 {
        bail!("GET /metrics: {status}");
    }
    let mut out = Gauges {
        rss_kib: daemon.rss_kib(),
        ..Gauges::default()
    };
    let (status, maps) = get(daemon.addr, "/maps")?;
    if status == 200 {
        // "live_allocs_by_pid":{"12":3,...}
        if let Some(rest) = maps.split("\"live_allocs_by_pid\":{").nth(1)
            && let Some(body) = rest.split('}').next()
        {
            for pair in body.split(',') {
                let Some((pid, count)) = pair.split_once(':') else {
                    continue;
                };
                let pid = pid.trim_matches('"');
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    out.dead_blocks += count.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("tracer_bpf_map_entries{map=\"")
            && let Some((map, value)) = rest.split_once("\"} ")
        {
            out.maps
                .insert(map.to_string(), value.trim().parse().unwrap_or(0));
        }
        if let Some(rest) = line.strip_prefix("tracer_processes{state=\"")
            && let Some((state, value)) = rest.split_once("\"} ")
        {
            out.processes
                .insert(state.to_string(), value.trim().parse().unwrap_or(0));
        }
    }
    Ok(out)
}

/// `cargo xtask soak`: `spawners` threads run the short-lived program back
/// to back for `seconds`; tracerd's RSS and every map's entries are compared
/// before and after.
pub fn soak(root: &Path, args: &SoakArgs) -> anyhow::Result<()> {
    let scratch = TempDir::new("soak")?;
    let exe = compile(&scratch.0, "shortlived", SHORT_LIVED)?;
    // Ended images are kept for exited_retention: 5 s, so "after" is
    // measured with every ended process expired.
    let mut flags = vec!["--exited-retention".to_string(), "5".to_string()];
    flags.extend(args.tracerd_args.iter().cloned());
    let mut daemon = Daemon::start(root, &flags)?;
    std::thread::sleep(Duration::from_secs(15));
    let before = gauges(&daemon)?;
    let stop_at = Instant::now() + Duration::from_secs(args.seconds);
    let spawned = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..args.spawners)
        .map(|_| {
            let exe = exe.clone();
            let spawned = spawned.clone();
            let failed = failed.clone();
            let pause_ms = args.pause_ms;
            std::thread::spawn(move || {
                while Instant::now() < stop_at {
                    match Command::new(&exe).status() {
                        Ok(status) if status.success() => {
                            spawned.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => failed.store(true, Ordering::Relaxed),
                    }
                    std::thread::sleep(Duration::from_millis(pause_ms));
                }
            })
        })
        .collect();
    let mut minute = 0;
    while Instant::now() < stop_at {
        std::thread::sleep(
            Duration::from_secs(1).min(stop_at.saturating_duration_since(Instant::now())),
        );
        let elapsed = args
            .seconds
            .saturating_sub(stop_at.saturating_duration_since(Instant::now()).as_secs());
        if elapsed / 60 > minute {
            minute = elapsed / 60;
            let now = gauges(&daemon)?;
            println!(
                "soak: {minute} min, {} processes, tracerd RSS {} KiB, maps {:?}, blocks of exited processes {}",
                spawned.load(Ordering::Relaxed),
                now.rss_kib,
                now.maps,
                now.dead_blocks
            );
        }
    }
    for thread in threads {
        let _ = thread.join();
    }
    // Let exits be handled, retention expire and the orphan sweep pass:
    // settled once no exited process has a block left (at most 120 s; the
    // host's own processes keep exiting too).
    let settle = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let mut after = gauges(&daemon)?;
    while after.dead_blocks > 0 && settle.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_secs(5));
        after = gauges(&daemon)?;
    }
    println!(
        "soak: settled {:.0} s after the churn",
        settle.elapsed().as_secs_f64()
    );
    let stop_took = daemon.stop()?;
    println!(
        "soak: {} s, tracerd flags {:?}, {} spawners pausing {} ms: {} short-lived processes (each 200 allocations, 100 left live at exit)",
        args.seconds,
        flags,
        args.spawners,
        args.pause_ms,
        spawned.load(Ordering::Relaxed)
    );
    println!("| measure | before | after |");
    println!("|---|---|---|");
    println!(
        "| tracerd RSS (KiB) | {} | {} |",
        before.rss_kib, after.rss_kib
    );
    for (map, value) in &before.maps {
        println!(
            "| {map} entries | {value} | {} |",
            after.maps.get(map).copied().unwrap_or(0)
        );
    }
    println!(
        "| LIVE_ALLOCS entries of exited processes | {} | {} |",
        before.dead_blocks, after.dead_blocks
    );
    for (state, value) in &before.processes {
        println!(
            "| processes {state} | {value} | {} |",
            after.processes.get(state).copied().unwrap_or(0)
        );
    }
    println!("SIGTERM to exit: {stop_took:?}");
    if failed.load(Ordering::Relaxed) {
        bail!("a short-lived process failed");
    }
    Ok(())
}
