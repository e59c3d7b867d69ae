//! `tracer run -- CMD ARGS`: starts CMD, waits for its end, and prints
//! what it allocated and what it still held when it exited (its leaks),
//! as heaptrack and `valgrind --leak-check` users expect.
//!
//! Where the data comes from: tracerd traces every new program from its
//! first allocation (each exec waits until the program's allocators are
//! probed), and when a process image ends it keeps the image's last state
//! (`GET /pid/{pid}`: `state: "exited"`, its totals, allocation and free
//! counts) and its last blocks, queryable with the statistics route, for
//! `exited_retention` seconds (600 by default; docs/api.md, `GET
//! /pid/{pid}`, and architecture.md, lifecycle). Those blocks are exactly
//! what the program still held at exit. So nothing has to be taken before
//! the exit (which cannot be timed from outside): `tracer run` waits for
//! the exit with `waitid(WEXITED | WNOWAIT)`, which leaves the child a
//! zombie, so its pid cannot be given to another process while tracer
//! asks tracerd about it; it waits until tracerd has ended the image (the
//! exit event comes from the kernel's `sched_process_exit`, before the
//! zombie is waitable, and tracerd handles it a moment later), reads the
//! record and the statistics of the ended image, and only then reaps the
//! child. tracer's exit status is the command's (128 + the signal that
//! killed it).

use std::{
    process::ExitCode,
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use rustix::process::{Pid, WaitId, WaitIdOptions, waitid};
use serde_json::Value;

use super::{Context, emit_body, warn_incomplete};
use crate::{
    cli::RunArgs,
    client::{ClientError, query},
    error::CliError,
    format::{int, statistics_table, table_text},
    output::emit,
};

/// How long tracerd may take to report the end of an image.
const ENDED_WITHIN: Duration = Duration::from_secs(10);

pub fn run(ctx: &Context, args: &RunArgs) -> Result<ExitCode, CliError> {
    // Refuse before starting anything when tracerd is not there: the
    // command's run would tell nothing.
    ctx.client.get("/health")?;
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| CliError::Run("no command given".into()))?;
    let shown = program.to_string_lossy().into_owned();
    let mut child = std::process::Command::new(program)
        .args(rest)
        .spawn()
        .map_err(|e| CliError::Run(format!("cannot start {shown}: {e}")))?;
    // The terminal's Ctrl-C and Ctrl-\ reach the command (the same process
    // group); tracer stays to report on it.
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGQUIT] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted)).map_err(|source| {
            CliError::Io {
                what: "handle SIGINT".into(),
                source,
            }
        })?;
    }
    let pid = child.id();
    wait_exit_unreaped(pid)?;
    let report = report(ctx, args, pid);
    let status = child.wait().map_err(|source| CliError::Io {
        what: format!("reap {shown} (pid {pid})"),
        source,
    })?;
    let code = exit_code(status);
    let (record, stats) = report?;
    if ctx.json {
        emit_body(&stats)?;
        return Ok(ExitCode::from(code));
    }
    let body = stats.json("the ended process's statistics")?;
    warn_incomplete(&body);
    emit(&summary(ctx, args, &shown, &record, &body, status))?;
    Ok(ExitCode::from(code))
}

/// Waits until `pid` (our child) has exited, leaving it unreaped.
fn wait_exit_unreaped(pid: u32) -> Result<(), CliError> {
    let failed = |e: std::io::Error| CliError::Io {
        what: format!("wait for pid {pid}"),
        source: e,
    };
    let raw = i32::try_from(pid).ok().and_then(Pid::from_raw);
    let Some(pid) = raw else {
        return Err(CliError::Run(format!("pid {pid} out of range")));
    };
    loop {
        match waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(failed(e.into())),
        }
    }
}

/// The ended image's record (`GET /pid/{pid}`, once it says the image
/// ended) and its statistics (what it held at exit).
fn report(
    ctx: &Context,
    args: &RunArgs,
    pid: u32,
) -> Result<(Value, crate::client::Answer), CliError> {
    let deadline = Instant::now() + ENDED_WITHIN;
    let record = loop {
        let last: CliError = match ctx.client.get_json(&format!("/pid/{pid}")) {
            Ok(record) if record["state"].as_str() != Some("alive") => break record,
            Ok(record) => CliError::Run(format!(
                "tracerd still shows pid {pid} as {} {} s after it exited",
                record["state"].as_str().unwrap_or("?"),
                ENDED_WITHIN.as_secs()
            )),
            // A 404 may be an image whose events tracerd has not handled yet.
            Err(e @ ClientError::Api { .. }) => e.into(),
            Err(e) => return Err(e.into()),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut pairs = Vec::new();
    args.group.pairs(&mut pairs);
    pairs.push(("limit".into(), args.limit.to_string()));
    let stats = ctx
        .client
        .get(&format!("/pid/{pid}/statistics{}", query(&pairs)))?;
    Ok((record, stats))
}

/// The exit status tracer gives: the command's, or 128 + its signal.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

/// The report: how the command ended, its allocator calls, peak and what
/// it held at exit, then its top lines of what it held.
fn summary(
    ctx: &Context,
    args: &RunArgs,
    shown: &str,
    record: &Value,
    stats: &Value,
    status: std::process::ExitStatus,
) -> String {
    let style = ctx.style(args.bytes);
    let held = int(record, "current");
    let blocks = int(record, "blocks");
    let groups = stats["statistics"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut out = vec![
        style.bold(&format!(
            "tracer: {shown} (pid {}) {}",
            int(record, "pid"),
            ended(status)
        )),
        format!(
            "  allocations: {}, frees: {}, peak: {}",
            int(record, "allocs"),
            int(record, "frees"),
            style.size(int(record, "peak"))
        ),
    ];
    let leaked = format!(
        "  still held at exit (leaks): {} in {blocks} blocks",
        style.size(held)
    );
    out.push(style.signed(&leaked, held));
    if !groups.is_empty() {
        let total = int(stats, "total");
        out.push(format!(
            "  where it was held, by {} ({} of {total}):",
            args.group.group_by.as_str(),
            groups.len()
        ));
        out.push(table_text(&statistics_table(groups, &style)));
    }
    out.join("\n")
}

/// `exited with status N` or `was killed by signal N`.
fn ended(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;

    #[test]
    fn the_exit_status_is_the_commands() {
        assert_eq!(exit_code(std::process::ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(std::process::ExitStatus::from_raw(3 << 8)), 3);
        // Killed by SIGKILL (9): 137, as shells say.
        assert_eq!(exit_code(std::process::ExitStatus::from_raw(9)), 137);
        assert_eq!(
            ended(std::process::ExitStatus::from_raw(9)),
            "was killed by signal 9"
        );
        assert_eq!(
            ended(std::process::ExitStatus::from_raw(3 << 8)),
            "exited with status 3"
        );
    }
}
