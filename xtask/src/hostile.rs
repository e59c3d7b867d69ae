//! `cargo xtask hostile`: the attacks of a hostile local user replayed
//! against a release tracerd with its default settings, each with bounded
//! counts and times. For every attack tracerd starts afresh; while the
//! attack runs a watcher asks `/health` every 50 ms. An attack passes when
//!
//! - every answer tracerd gave is a status `docs/api.md` documents (its
//!   status table, 500 excepted, and 200/201),
//! - tracerd's peak resident memory during the attack stays under
//!   `--rss-bound-mib` (1024 MiB: the default `request_memory_budget`): `VmHWM` of `/proc/PID/status`, reset
//!   (`/proc/PID/clear_refs`) once tracerd's start is over, so that the
//!   unwind tables it compiles at start for every running program (their
//!   cost depends on the host, not on the attack) are not counted; the
//!   start's own peak is reported beside it,
//! - `/health` answered 200 every time, each within `--health-bound-ms`
//!   (1000 ms; the idle-connections attack holds 95 % of its own 50 to
//!   100 ms, as issue 14 asks),
//! - and the attack's own checks hold (its answers, its duration).
//!
//! The suite prints one markdown row per attack and fails if any failed.
//! `cargo xtask test` runs it after the test passes.
use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    setup::setup,
    util::{
        cc::compile_c,
        child::Running,
        cmd::cargo,
        daemon::{BUILD_TRACERD, Daemon, status_kib},
        http::Client,
        paths::{TempDir, workspace_root},
    },
};

/// `cargo xtask hostile`.
#[derive(clap::Args, Clone, Debug)]
pub struct HostileArgs {
    /// Run only the attacks whose name contains one of these (repeatable).
    #[arg(long)]
    pub only: Vec<String>,
    /// tracerd's peak resident memory allowed during an attack, in MiB:
    /// its default `request_memory_budget` (1 GiB), which one request may
    /// hold (a statistics of a process of 4 M blocks needs hundreds of MiB).
    #[arg(long, default_value_t = 1024)]
    pub rss_bound_mib: u64,
    /// Longest `/health` answer allowed during an attack, in ms.
    #[arg(long, default_value_t = 1000)]
    pub health_bound_ms: u64,
}

impl Default for HostileArgs {
    fn default() -> Self {
        Self {
            only: Vec::new(),
            rss_bound_mib: 1024,
            health_bound_ms: 1000,
        }
    }
}

/// Set up, build tracerd, run the suite.
pub fn task(args: &HostileArgs) -> anyhow::Result<()> {
    setup()?;
    cargo(&BUILD_TRACERD)?;
    suite(args)
}

/// What an attack did: the statuses of tracerd's answers, and what the
/// attack checked itself (an error fails it).
#[derive(Default)]
struct Outcome {
    statuses: BTreeMap<u16, usize>,
    note: String,
}

impl Outcome {
    fn count(&mut self, status: u16) {
        *self.statuses.entry(status).or_default() += 1;
    }
}

/// One attack: a name, tracerd's extra flags, and the attack itself.
struct Attack {
    name: &'static str,
    flags: &'static [&'static str],
    run: fn(&Ctx) -> anyhow::Result<Outcome>,
}

/// What an attack gets: the running tracerd and a scratch directory.
struct Ctx<'a> {
    daemon: &'a Daemon,
    scratch: &'a Path,
}

impl Ctx<'_> {
    fn addr(&self) -> SocketAddr {
        self.daemon.client().addr()
    }
}

const ATTACKS: &[Attack] = &[
    Attack {
        name: "idle-connections",
        flags: &[],
        run: idle_connections,
    },
    Attack {
        name: "slow-headers",
        flags: &["--header-timeout-secs", "2"],
        run: slow_headers,
    },
    Attack {
        name: "malformed-requests",
        flags: &[],
        run: malformed_requests,
    },
    Attack {
        name: "pickle-bombs",
        flags: &[],
        run: pickle_bombs,
    },
    Attack {
        name: "proc-source",
        flags: &[],
        run: proc_source,
    },
    Attack {
        name: "many-clients",
        flags: &[],
        run: many_clients,
    },
    Attack {
        name: "abandoned-traces",
        flags: &[],
        run: abandoned_traces,
    },
    Attack {
        name: "snapshot-flood",
        flags: &[],
        run: snapshot_flood,
    },
    Attack {
        name: "wide-scope",
        flags: &[],
        run: wide_scope,
    },
];

/// Runs every attack (or those `--only` names); fails if any failed.
pub fn suite(args: &HostileArgs) -> anyhow::Result<()> {
    let documented = documented_statuses(&workspace_root())?;
    let scratch = TempDir::new("hostile")?;
    println!(
        "hostile: tracerd with its defaults, fresh for each attack; peak RSS bound {} MiB",
        args.rss_bound_mib
    );
    println!(
        "| attack | answers by status | start's peak RSS MiB | attack's peak RSS MiB | /health answers | slowest /health ms | took s | result |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---|");
    let mut failed = Vec::new();
    for attack in ATTACKS {
        if !args.only.is_empty() && !args.only.iter().any(|o| attack.name.contains(o.as_str())) {
            continue;
        }
        let dir = scratch.path().join(attack.name);
        std::fs::create_dir_all(&dir)?;
        let verdict = run_attack(attack, &dir, &documented, args);
        if verdict.is_err() {
            failed.push(attack.name);
        }
    }
    if !failed.is_empty() {
        bail!("hostile: attacks failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Starts tracerd, runs one attack under the `/health` watcher, checks the
/// bounds, prints the row.
fn run_attack(
    attack: &Attack,
    dir: &Path,
    documented: &[u16],
    args: &HostileArgs,
) -> anyhow::Result<()> {
    let flags: Vec<String> = attack.flags.iter().map(|f| (*f).to_string()).collect();
    let daemon = Daemon::start(&workspace_root(), &flags)?;
    // The start's passes (allocator discovery, unwind tables of the running
    // programs) run in the background after /health answers.
    std::thread::sleep(Duration::from_secs(3));
    let start_peak_mib = status_kib(daemon.pid(), "VmHWM:") / 1024;
    std::fs::write(format!("/proc/{}/clear_refs", daemon.pid()), "5")
        .context("resetting tracerd's peak RSS")?;
    let watcher = HealthWatch::start(daemon.client().addr());
    let start = Instant::now();
    let result = (attack.run)(&Ctx {
        daemon: &daemon,
        scratch: dir,
    });
    let took = start.elapsed();
    let health = watcher.stop();
    let peak_mib = status_kib(daemon.pid(), "VmHWM:") / 1024;
    let stopped = daemon.stop();
    let health_bound = Duration::from_millis(args.health_bound_ms);
    let slowest = health.iter().map(|h| h.1).max().unwrap_or_default();
    let mut problems = Vec::new();
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(err) => {
            problems.push(format!("{err:#}"));
            Outcome::default()
        }
    };
    let undocumented: Vec<u16> = outcome
        .statuses
        .keys()
        .copied()
        .filter(|s| !documented.contains(s))
        .collect();
    if !undocumented.is_empty() {
        problems.push(format!("undocumented statuses {undocumented:?}"));
    }
    if peak_mib > args.rss_bound_mib {
        problems.push(format!(
            "peak RSS {peak_mib} MiB over {} MiB",
            args.rss_bound_mib
        ));
    }
    let failures: Vec<_> = health.iter().filter(|h| h.0 != 200).collect();
    if !failures.is_empty() {
        problems.push(format!(
            "/health failed {} times, first {:?}",
            failures.len(),
            failures[0]
        ));
    }
    if slowest > health_bound {
        problems.push(format!(
            "/health took {} ms (bound {} ms)",
            slowest.as_millis(),
            health_bound.as_millis()
        ));
    }
    if health.is_empty() {
        problems.push("/health was never asked".into());
    }
    if let Err(err) = stopped {
        problems.push(format!("stopping tracerd: {err:#}"));
    }
    let statuses: Vec<String> = outcome
        .statuses
        .iter()
        .map(|(s, n)| format!("{s}: {n}"))
        .collect();
    let verdict = if problems.is_empty() {
        "ok".to_string()
    } else {
        format!("FAILED: {}", problems.join("; "))
    };
    println!(
        "| {} | {} | {start_peak_mib} | {peak_mib} | {} | {} | {:.1} | {}{} |",
        attack.name,
        if statuses.is_empty() {
            "-".to_string()
        } else {
            statuses.join(", ")
        },
        health.len(),
        slowest.as_millis(),
        took.as_secs_f64(),
        verdict,
        if outcome.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", outcome.note)
        },
    );
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("{verdict}")
    }
}

/// The statuses `docs/api.md` documents: 200, 201 and every row of its
/// status table but 500.
fn documented_statuses(root: &Path) -> anyhow::Result<Vec<u16>> {
    let doc = std::fs::read_to_string(root.join("docs/api.md")).context("reading docs/api.md")?;
    let mut statuses = vec![200, 201];
    for line in doc.lines() {
        let Some(rest) = line.strip_prefix("| ") else {
            continue;
        };
        if let Some(code) = rest.get(..3).and_then(|c| c.parse::<u16>().ok())
            && rest.get(3..5) == Some(" |")
            && code != 500
        {
            statuses.push(code);
        }
    }
    if statuses.len() < 6 {
        bail!("docs/api.md: no status table found");
    }
    Ok(statuses)
}

/// Asks `/health` every 50 ms on a thread of its own (status 0: no answer
/// within 10 s).
struct HealthWatch {
    done: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(u16, Duration)>>,
}

impl HealthWatch {
    fn start(addr: SocketAddr) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let done = done.clone();
            move || {
                let mut answers = Vec::new();
                while !done.load(Ordering::Acquire) {
                    let start = Instant::now();
                    let status = request(addr, "GET", "/health", &[], Duration::from_secs(10))
                        .map_or(0, |(status, _)| status);
                    answers.push((status, start.elapsed()));
                    std::thread::sleep(Duration::from_millis(50));
                }
                answers
            }
        });
        Self { done, thread }
    }

    fn stop(self) -> Vec<(u16, Duration)> {
        self.done.store(true, Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

/// One request on a fresh connection with `body`, answered within
/// `timeout`: the status and the body's bytes.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<(u16, Vec<u8>)> {
    Client::new(addr, timeout).send(method, path, body)
}

/// A C program that keeps `argv[1]` live blocks of 64 to 4159 bytes from
/// eight call sites, prints `ready`, and sleeps.
const HOLDER: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void *volatile *keep;
#define SITE(n) __attribute__((noinline)) static void *site##n(size_t s) { return malloc(s + n); }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7)
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    keep = calloc(n, sizeof(void *));
    for (long i = 0; i < n; i++) {
        size_t s = 64 + (i * 97) % 4096;
        switch (i % 8) {
        case 0: keep[i] = site0(s); break; case 1: keep[i] = site1(s); break;
        case 2: keep[i] = site2(s); break; case 3: keep[i] = site3(s); break;
        case 4: keep[i] = site4(s); break; case 5: keep[i] = site5(s); break;
        case 6: keep[i] = site6(s); break; default: keep[i] = site7(s); break;
        }
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
"#;

/// Starts the holder with `blocks` live blocks and waits until tracerd
/// reports them all (at most 120 s).
fn holder(ctx: &Ctx, blocks: u64) -> anyhow::Result<Running> {
    let exe = compile_c(ctx.scratch, "holder", HOLDER, &["-O1"])?;
    let running = Running::spawn(
        Command::new(&exe)
            .arg(blocks.to_string())
            .stdout(Stdio::null()),
    )?;
    let pid = running.pid();
    let client = ctx.daemon.client();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let seen = client
            .get(&format!("/pid/{pid}/traced-memory"))
            .ok()
            .filter(|r| r.status == 200)
            .and_then(|r| serde_json::from_str::<serde_json::Value>(&r.body).ok())
            .and_then(|v| v["blocks"].as_u64());
        if seen.is_some_and(|b| b >= blocks) {
            return Ok(running);
        }
        if Instant::now() > deadline {
            bail!("the holder of {blocks} blocks is not traced after 120 s (seen {seen:?})");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// 1,000 connections opened and left idle for 5 s; then 50 `/health`
/// requests: 95 % of them within 100 ms (the issue's bound; one in a
/// fresh run here took 168 ms, a 2-core host's scheduling), every one
/// within 1 s (the watcher's bound, all along).
fn idle_connections(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect_timeout(
            &ctx.addr(),
            Duration::from_secs(5),
        )?);
    }
    std::thread::sleep(Duration::from_secs(5));
    let mut outcome = Outcome::default();
    let mut took = Vec::new();
    for _ in 0..50 {
        let start = Instant::now();
        let (status, _) = request(ctx.addr(), "GET", "/health", &[], Duration::from_secs(5))?;
        took.push(start.elapsed());
        outcome.count(status);
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(idle);
    took.sort_unstable();
    let p95 = took
        .get(took.len() * 95 / 100 - 1)
        .copied()
        .unwrap_or_default();
    let max = took.last().copied().unwrap_or_default();
    if p95 > Duration::from_millis(100) || max > Duration::from_secs(1) {
        bail!("/health with 1,000 idle connections: p95 {p95:?}, max {max:?}");
    }
    outcome.note = format!(
        "1000 idle connections held 5 s; /health p95 {} ms, max {} ms",
        p95.as_millis(),
        max.as_millis()
    );
    Ok(outcome)
}

/// 200 connections send a request head one byte a second: tracerd closes
/// each once its header timeout (2 s here) passes, answering 408 or
/// nothing, well before the head would end (60 s).
fn slow_headers(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut slow = Vec::new();
    for _ in 0..200 {
        let stream = TcpStream::connect_timeout(&ctx.addr(), Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_millis(1)))?;
        slow.push((stream, 0usize, false));
    }
    let start = Instant::now();
    let mut outcome = Outcome::default();
    while start.elapsed() < Duration::from_secs(10) && slow.iter().any(|s| !s.2) {
        for (stream, sent, closed) in &mut slow {
            if *closed {
                continue;
            }
            if let Some(byte) = head.get(*sent) {
                let _ = stream.write_all(std::slice::from_ref(byte));
                *sent += 1;
            }
            let mut buf = [0u8; 512];
            match stream.read(&mut buf) {
                Ok(0) => *closed = true,
                Ok(n) => {
                    if let Some(status) =
                        std::str::from_utf8(buf.get(9..12.min(n)).unwrap_or_default())
                            .ok()
                            .and_then(|s| s.parse().ok())
                    {
                        outcome.count(status);
                    }
                    *closed = true;
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => *closed = true,
            }
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
    let open = slow.iter().filter(|s| !s.2).count();
    if open > 0 {
        bail!("{open} of 200 slow connections still open after 10 s (header timeout 2 s)");
    }
    outcome.note = format!(
        "200 slow heads closed in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(outcome)
}

/// Bad parameters, paths, methods and files: each a 4xx naming what is
/// wrong, never a 5xx.
fn malformed_requests(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let holder = holder(ctx, 1000)?;
    let pid = holder.pid();
    let t = Duration::from_secs(30);
    let mut outcome = Outcome::default();
    let gets = [
        format!("/pid/{pid}/statistics?group_by=bogus"),
        format!("/pid/{pid}/statistics?limit=-1"),
        format!("/pid/{pid}/statistics?cumulative=maybe"),
        format!("/pid/{pid}/statistics?group_by=traceback&cumulative=true"),
        format!("/pid/{pid}/traces?offset=99999999999999999999999"),
        format!("/pid/{pid}/statistics?filter=%00"),
        "/pid/+1/statistics".to_string(),
        "/pid/01/statistics".to_string(),
        "/pid/4294967296/statistics".to_string(),
        "/snapshots/..%2f..%2fetc%2fpasswd/statistics".to_string(),
        "/snapshots/%2e%2e/statistics".to_string(),
        format!("/pid/{pid}/statistics?{}", "a=b&".repeat(3000)),
        "/health?unknown=1".to_string(),
        format!("/pid/{pid}/object/0xzz"),
    ];
    for path in &gets {
        let (status, raw) = request(ctx.addr(), "GET", path, &[], t)?;
        outcome.count(status);
        if !(400..500).contains(&status) {
            bail!(
                "GET {path}: {status}, expected a 4xx: {}",
                String::from_utf8_lossy(&raw)
            );
        }
    }
    let (status, _) = request(ctx.addr(), "DELETE", "/health", &[], t)?;
    outcome.count(status);
    // Files: random bytes, a truncated and a bit-flipped dump of a real
    // snapshot, a pickle that would run code.
    let (status, raw) = request(ctx.addr(), "POST", &format!("/pid/{pid}/snapshots"), &[], t)?;
    outcome.count(status);
    let id = serde_json::from_slice::<serde_json::Value>(&raw[..])
        .ok()
        .and_then(|v| v["id"].as_u64())
        .with_context(|| format!("POST snapshots: {status}"))?;
    let (status, raw) = request(ctx.addr(), "GET", &format!("/snapshots/{id}/dump"), &[], t)?;
    outcome.count(status);
    let dump = &raw[..].to_vec();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    files.push(("random".into(), (0..65536).map(|_| next() as u8).collect()));
    for cut in [1, 7, 64, dump.len() / 2, dump.len().saturating_sub(1)] {
        files.push((
            format!("truncated at {cut}"),
            dump.get(..cut).unwrap_or_default().to_vec(),
        ));
    }
    for _ in 0..20 {
        let mut flipped = dump.clone();
        let at = (next() as usize) % flipped.len().max(1);
        if let Some(b) = flipped.get_mut(at) {
            *b ^= 1 << (next() % 8);
        }
        files.push((format!("bit flipped at {at}"), flipped));
    }
    let code =
        b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R."
            .to_vec();
    for (name, body) in &files {
        let (status, raw) = request(ctx.addr(), "POST", "/snapshots", body, t)?;
        outcome.count(status);
        if status != 400 {
            bail!(
                "POST /snapshots of a file {name}: {status}: {}",
                String::from_utf8_lossy(&raw[..])
            );
        }
    }
    let (status, raw) = request(
        ctx.addr(),
        "POST",
        "/snapshots?format=tracemalloc",
        &code,
        t,
    )?;
    outcome.count(status);
    if status != 400 {
        bail!(
            "a pickle calling os.system: {status}: {}",
            String::from_utf8_lossy(&raw[..])
        );
    }
    outcome.note = format!("{} requests, {} files", gets.len() + 3, files.len() + 1);
    Ok(outcome)
}

/// Pickles of 16 MB whose opcodes replicate: a stack of 16 M `DUP`s of
/// one list, a memo of 16 M `MEMOIZE`s, a list, tuples and a dict grown
/// by batches of 997 `DUP`s (`APPENDS`, `TUPLE`, `SETITEMS`), and nested
/// lists of two `BINGET`s of the level below (2^40 elements once
/// expanded). Each is refused (400 or 413) within 30 s, and raises
/// tracerd's peak RSS by no more than docs/api.md's bound for loading a
/// file (24 bytes a byte + 64 MiB), plus the body's two copies (as
/// received, as collected). The bound holds with tracerd's allocator,
/// whose `realloc` copies: a table that doubled took up to 32 bytes a byte.
fn pickle_bombs(ctx: &Ctx) -> anyhow::Result<Outcome> {
    const N: usize = 16_000_000;
    let mut dup = b"\x80\x04]".to_vec();
    dup.extend(std::iter::repeat_n(b'2', N));
    dup.push(b'.');
    let mut memo = b"\x80\x04]".to_vec();
    memo.extend(std::iter::repeat_n(0x94u8, N));
    memo.push(b'.');
    // MARK, None, 997 DUPs, then the opcode that takes the 998 items.
    let batches = |head: &[u8], close: &[u8], tail: &[u8]| {
        let mut out = b"\x80\x04".to_vec();
        out.extend_from_slice(head);
        for _ in 0..N / 1000 {
            out.extend_from_slice(b"(N");
            out.extend(std::iter::repeat_n(b'2', 997));
            out.extend_from_slice(close);
        }
        out.extend_from_slice(tail);
        out.push(b'.');
        out
    };
    let appends = batches(b"]", b"e", b"");
    let tuples = batches(b"]", b"t0", b"");
    let setitems = batches(b"}", b"u", b"");
    let mut laughs = b"\x80\x04]\x94".to_vec();
    for level in 0u32..40 {
        // MARK, LONG_BINGET level, LONG_BINGET level, LIST, MEMOIZE.
        laughs.push(b'(');
        for _ in 0..2 {
            laughs.push(b'j');
            laughs.extend(level.to_le_bytes());
        }
        laughs.extend(b"l\x94");
    }
    laughs.push(b'.');
    let pid = ctx.daemon.pid();
    let mut outcome = Outcome::default();
    let mut rises = Vec::new();
    for (name, body) in [
        ("dup", dup),
        ("memoize", memo),
        ("appends", appends),
        ("tuples", tuples),
        ("setitems", setitems),
        ("laughs", laughs),
    ] {
        let before = status_kib(pid, "VmRSS:");
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
        let start = Instant::now();
        let (status, raw) = request(
            ctx.addr(),
            "POST",
            "/snapshots?format=tracemalloc",
            &body,
            Duration::from_secs(60),
        )?;
        outcome.count(status);
        if status != 400 && status != 413 {
            bail!(
                "the {name} pickle: {status}: {}",
                String::from_utf8_lossy(&raw[..])
            );
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the {name} pickle took {:?}", start.elapsed());
        }
        let rise = status_kib(pid, "VmHWM:").saturating_sub(before) * 1024;
        let bound = 26 * body.len() as u64 + (64 << 20);
        if rise > bound {
            bail!(
                "the {name} pickle of {} bytes raised tracerd's RSS by {rise} bytes; the bound is {bound}",
                body.len()
            );
        }
        rises.push(format!("{name} +{} MiB", rise >> 20));
    }
    outcome.note = format!("{} pickles of 16 MB: {}", rises.len(), rises.join(", "));
    Ok(outcome)
}

/// A tracemalloc file (written by CPython) whose frames name
/// `/proc/self/maps`, `/proc/kallsyms` and `/etc/shadow`: loaded, its
/// statistics with `source=true` show no line of any of them.
fn proc_source(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let file = ctx.scratch.join("proc.pickle");
    let script = format!(
        "import tracemalloc\ntracemalloc.Snapshot([(0, 64, (('/proc/self/maps', 1), ('/proc/kallsyms', 1), ('/etc/shadow', 1)), 3)], 25).dump({:?})\n",
        file.display().to_string()
    );
    let out = Command::new("python3").arg("-c").arg(&script).output()?;
    if !out.status.success() {
        bail!("python3: {}", String::from_utf8_lossy(&out.stderr));
    }
    let body = std::fs::read(&file)?;
    let t = Duration::from_secs(30);
    let mut outcome = Outcome::default();
    let (status, raw) = request(
        ctx.addr(),
        "POST",
        "/snapshots?format=tracemalloc",
        &body,
        t,
    )?;
    outcome.count(status);
    let id = serde_json::from_slice::<serde_json::Value>(&raw[..])
        .ok()
        .and_then(|v| v["id"].as_u64())
        .with_context(|| format!("loading the pickle: {status}"))?;
    let (status, raw) = request(
        ctx.addr(),
        "GET",
        &format!("/snapshots/{id}/statistics?group_by=traceback&format=text&source=true"),
        &[],
        t,
    )?;
    outcome.count(status);
    let text = String::from_utf8_lossy(&raw[..]).into_owned();
    if status != 200 || !text.contains("File \"/proc/kallsyms\", line 1") {
        bail!("statistics with source: {status}: {text}");
    }
    let leaked: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("    ") && !l.trim().is_empty())
        .collect();
    if !leaked.is_empty() {
        bail!("source lines of kernel or protected files: {leaked:?}");
    }
    outcome.note = "no line of /proc or /etc/shadow".into();
    Ok(outcome)
}

/// 64 clients for 8 s on the expensive routes of a 20,000-block process:
/// each answer 200 or 429 (the concurrency limit), never a 5xx. (Routes of
/// the whole host cost what the host holds, up to each request's memory
/// budget: the cancel tests bound them, not this attack.)
fn many_clients(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let holder = holder(ctx, 20_000)?;
    let pid = holder.pid();
    let routes = [
        format!("/pid/{pid}/statistics?group_by=lineno&limit=20"),
        format!("/pid/{pid}/compare?group_by=traceback&limit=20"),
        format!("/pid/{pid}/traces?limit=200"),
        format!("/pid/{pid}/statistics?group_by=traceback&cumulative=false&limit=5"),
        "/metrics".to_string(),
    ];
    let addr = ctx.addr();
    let statuses = Arc::new(Mutex::new(Outcome::default()));
    let stop_at = Instant::now() + Duration::from_secs(8);
    let threads: Vec<_> = (0..64)
        .map(|i| {
            let routes = routes.clone();
            let statuses = statuses.clone();
            std::thread::spawn(move || {
                let mut k = i;
                while Instant::now() < stop_at {
                    let route = &routes[k % routes.len()];
                    let status = request(addr, "GET", route, &[], Duration::from_secs(60))
                        .map_or(0, |(s, _)| s);
                    if let Ok(mut outcome) = statuses.lock() {
                        outcome.count(status);
                    }
                    k += 1;
                }
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
    let outcome = std::mem::take(&mut *statuses.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    if let Some(bad) = outcome.statuses.keys().find(|s| ![200, 429].contains(*s)) {
        bail!(
            "an answer {bad} (0: no answer) among {:?}",
            outcome.statuses
        );
    }
    Ok(outcome)
}

/// A process with 400,000 live blocks; ten clients ask for every trace
/// (`limit=0`, four of the process and six system-wide) and leave after
/// the first 64 KiB. Their work must stop: 10 s later tracerd's resident
/// memory is back under the bound, and the next request is served.
fn abandoned_traces(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let holder = holder(ctx, 400_000)?;
    let pid = holder.pid();
    let mut outcome = Outcome::default();
    for i in 0..10 {
        let path = if i < 4 {
            format!("/pid/{pid}/traces?limit=0")
        } else {
            "/traces?limit=0".to_string()
        };
        let mut stream = TcpStream::connect_timeout(&ctx.addr(), Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )?;
        let mut first = vec![0u8; 65536];
        let mut got = 0;
        while got < first.len() {
            match stream.read(&mut first[got..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        if let Some(status) = std::str::from_utf8(first.get(9..12).unwrap_or_default())
            .ok()
            .and_then(|s| s.parse().ok())
        {
            outcome.count(status);
        }
    }
    std::thread::sleep(Duration::from_secs(10));
    let rss_mib = status_kib(ctx.daemon.pid(), "VmRSS:") / 1024;
    let (status, _) = request(
        ctx.addr(),
        "GET",
        &format!("/pid/{pid}/statistics?limit=5"),
        &[],
        Duration::from_secs(60),
    )?;
    outcome.count(status);
    if status != 200 {
        bail!("statistics after the abandoned requests: {status}");
    }
    outcome.note = format!("RSS {rss_mib} MiB 10 s after 10 abandoned limit=0 traces");
    Ok(outcome)
}

/// 300 snapshots stored of a 50,000-block process, one after another:
/// each 201, or 507 once the store's quotas are full (never a 5xx), and
/// tracerd's memory bounded: stored snapshots do not sit whole in RAM.
fn snapshot_flood(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let holder = holder(ctx, 50_000)?;
    let pid = holder.pid();
    let mut outcome = Outcome::default();
    for _ in 0..300 {
        let (status, raw) = request(
            ctx.addr(),
            "POST",
            &format!("/pid/{pid}/snapshots"),
            &[],
            Duration::from_secs(60),
        )?;
        outcome.count(status);
        if status != 201 && status != 507 {
            bail!(
                "POST snapshots: {status}: {}",
                String::from_utf8_lossy(&raw[..])
            );
        }
    }
    let rss_mib = status_kib(ctx.daemon.pid(), "VmRSS:") / 1024;
    outcome.note = format!("RSS {rss_mib} MiB after 300 snapshots of 50,000 blocks");
    Ok(outcome)
}

/// 300 processes put in scope by pid, then every process again: each
/// change within 30 s, `/health` answering throughout (the watcher).
fn wide_scope(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let mut sleepers = Vec::new();
    for _ in 0..300 {
        sleepers.push(Running::spawn(Command::new("sleep").arg("120"))?);
    }
    let query: Vec<String> = sleepers
        .iter()
        .map(|s| format!("pid={}", s.pid()))
        .collect();
    let mut outcome = Outcome::default();
    let mut slowest_pid = Duration::ZERO;
    for path in [format!("/scope?{}", query.join("&")), "/scope".to_string()] {
        let start = Instant::now();
        // Meanwhile, why pid 2 (kthreadd, never traced) is not traced: a
        // 404 told from the scope published, never waiting for the change
        // (which holds the scope's lock while it attaches).
        let changing = AtomicBool::new(true);
        let (put, asked) = std::thread::scope(|scope| {
            let asker = scope.spawn(|| -> anyhow::Result<Vec<(u16, Duration)>> {
                let mut asked = Vec::new();
                while changing.load(Ordering::Acquire) {
                    let at = Instant::now();
                    let (status, _) =
                        request(ctx.addr(), "GET", "/pid/2", &[], Duration::from_secs(60))?;
                    asked.push((status, at.elapsed()));
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(asked)
            });
            let put = request(ctx.addr(), "PUT", &path, &[], Duration::from_secs(60));
            changing.store(false, Ordering::Release);
            (put, asker.join())
        });
        let (status, raw) = put?;
        outcome.count(status);
        if status != 200 {
            bail!("PUT scope: {status}: {}", String::from_utf8_lossy(&raw[..]));
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("a scope change took {:?}", start.elapsed());
        }
        let asked = asked.map_err(|_| anyhow::anyhow!("the asker of /pid/2 panicked"))??;
        for (status, took) in asked {
            outcome.count(status);
            if status != 404 {
                bail!("GET /pid/2 during a scope change: {status}");
            }
            slowest_pid = slowest_pid.max(took);
        }
    }
    if slowest_pid > Duration::from_secs(1) {
        bail!("GET /pid/2 took {slowest_pid:?} during a scope change");
    }
    outcome.note = format!(
        "300 pids in scope and back; /pid/2 meanwhile within {} ms",
        slowest_pid.as_millis()
    );
    Ok(outcome)
}
