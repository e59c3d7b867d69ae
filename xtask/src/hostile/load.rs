//! The attacks by load: many clients at once, clients that leave in the
//! middle of an answer, a flood of stored snapshots, and a scope of hundreds
//! of processes.
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::bail;

use super::{Ctx, Outcome, holder, request};
use crate::util::daemon::status_kib;
use tracer_testkit::Running;

/// 64 clients for 8 s on the expensive routes of a 20,000-block process:
/// each answer 200 or 429 (the concurrency limit), never a 5xx. (Routes of
/// the whole host cost what the host holds, up to each request's memory
/// budget: the cancel tests bound them, not this attack.)
pub(super) fn many_clients(ctx: &Ctx) -> anyhow::Result<Outcome> {
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
pub(super) fn abandoned_traces(ctx: &Ctx) -> anyhow::Result<Outcome> {
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
    let rss_mib = status_kib(ctx.daemon.pid(), "VmRSS") / 1024;
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
pub(super) fn snapshot_flood(ctx: &Ctx) -> anyhow::Result<Outcome> {
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
    let rss_mib = status_kib(ctx.daemon.pid(), "VmRSS") / 1024;
    outcome.note = format!("RSS {rss_mib} MiB after 300 snapshots of 50,000 blocks");
    Ok(outcome)
}

/// 300 processes put in scope by pid, then every process again: each
/// change within 30 s, `/health` answering throughout (the watcher).
pub(super) fn wide_scope(ctx: &Ctx) -> anyhow::Result<Outcome> {
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
