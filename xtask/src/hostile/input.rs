//! The attacks by what a request holds: malformed parameters, paths,
//! methods and files; pickle bombs; and a file whose frames name kernel or
//! protected files.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{Ctx, Outcome, holder, request};
use crate::util::daemon::status_kib;

/// Bad parameters, paths, methods and files: each a 4xx naming what is
/// wrong, never a 5xx.
pub(super) fn malformed_requests(ctx: &Ctx) -> anyhow::Result<Outcome> {
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
pub(super) fn pickle_bombs(ctx: &Ctx) -> anyhow::Result<Outcome> {
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
        let before = status_kib(pid, "VmRSS");
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
        let rise = status_kib(pid, "VmHWM").saturating_sub(before) * 1024;
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
pub(super) fn proc_source(ctx: &Ctx) -> anyhow::Result<Outcome> {
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
