//! `tracer ps`: the traced processes (`GET /processes`), largest current
//! heap first: pid, command, current, peak, blocks; `--all` adds, after
//! them, the images that ended and their state. A process whose figures
//! undercount (`complete: false`) is marked in a NOTE column and on stderr.
//! `--watched` lists every process the watch reads instead.

use tracer_api::{ProcessList, ProcessStatus};

use super::{Context, emit_body};
use crate::{
    cli::PsArgs,
    error::CliError,
    format::{processes_table, table_text},
    output::{emit, note},
};

pub fn run(ctx: &Context, args: &PsArgs) -> Result<(), CliError> {
    let answer = ctx.client.get("/processes")?;
    if ctx.json {
        return emit_body(&answer);
    }
    let body: ProcessList = answer.typed("GET /processes")?;
    if args.watched {
        return watched(&body, &ctx.style(args.bytes));
    }
    let shown = select(&body.processes, args.all);
    if shown.is_empty() {
        note("no traced process (tracerd lists a process once it has allocated)");
        return Ok(());
    }
    let incomplete = shown.iter().filter(|p| !p.view.complete).count();
    if incomplete > 0 {
        note(&format!(
            "{incomplete} of these processes are incomplete: allocator events lost (kernel maps full: their figures undercount) or tracebacks cut (blocks with a part of their stack); see docs/operations.md"
        ));
    }
    emit(&table_text(&processes_table(
        &shown,
        &ctx.style(args.bytes),
        args.all,
    )))
}

/// `tracer ps --watched`: every watched process, the fastest growing
/// first: pid, command, resident and anonymous bytes, the anonymous growth
/// over the watch's window, and how it is traced exactly (`-`: watched
/// only).
fn watched(body: &ProcessList, style: &crate::format::Style) -> Result<(), CliError> {
    if body.watched.is_empty() {
        note("no process is watched (watch_interval = 0, or none may be seen)");
        return Ok(());
    }
    let mut shown: Vec<&tracer_api::WatchedProcess> = body.watched.iter().collect();
    shown.sort_by_key(|p| (std::cmp::Reverse(p.watch.anon_growth), p.pid));
    emit(&table_text(&crate::format::watched_table(&shown, style)))
}

/// The processes to show: the live ones by current bytes, largest first,
/// then by pid; with `all`, then the images that ended (exited, or
/// replaced by an exec) in the same order.
pub fn select(listed: &[ProcessStatus], all: bool) -> Vec<&ProcessStatus> {
    let mut shown: Vec<&ProcessStatus> = listed
        .iter()
        .filter(|p| all || p.view.state.is_alive())
        .collect();
    shown.sort_by_key(|p| {
        (
            !p.view.state.is_alive(),
            std::cmp::Reverse(p.view.current),
            p.view.pid,
        )
    });
    shown
}

#[cfg(test)]
mod tests {
    use tracer_api::ProcessState;

    use super::*;
    use crate::format::tests::process;

    #[test]
    fn live_processes_come_first_largest_first_and_ended_ones_only_with_all() {
        let listed = [
            process(3, "a", 10, ProcessState::Alive),
            process(1, "b", 500, ProcessState::Exited),
            process(2, "c", 99, ProcessState::Alive),
            process(4, "d", 99, ProcessState::Alive),
        ];
        let pids = |all| -> Vec<u32> { select(&listed, all).iter().map(|p| p.view.pid).collect() };
        assert_eq!(pids(false), [2, 4, 3]);
        assert_eq!(pids(true), [2, 4, 3, 1]);
    }

    #[test]
    fn watched_processes_show_their_growth_and_how_they_are_traced() {
        let figures = |anon_growth| tracer_api::WatchFigures {
            rss: 3 << 20,
            anon: 2 << 20,
            anon_growth,
            growth_over_ms: 300_000,
            read_at_ms: 0,
            watched_since_ms: 0,
        };
        let picked = tracer_api::WatchedProcess {
            pid: 7,
            comm: "leaky".into(),
            watch: figures(64 << 20),
            exact: Some(tracer_api::ExactTracing {
                since_ms: 3_723_000,
                reason: tracer_api::ExactReason::Watch,
            }),
        };
        let quiet = tracer_api::WatchedProcess {
            pid: 8,
            comm: "quiet".into(),
            watch: figures(-4096),
            exact: None,
        };
        let style = crate::format::Style {
            bytes: false,
            color: false,
            width: None,
        };
        let text = table_text(&crate::format::watched_table(&[&picked, &quiet], &style));
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["PID", "COMMAND", "RSS", "ANON", "GROWTH", "EXACT"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "7", "leaky", "3072", "KiB", "2048", "KiB", "+64.0", "MiB/300s", "watch", "since",
                "01:02:03"
            ]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            [
                "8", "quiet", "3072", "KiB", "2048", "KiB", "-4096", "B/300s", "-"
            ]
        );
    }
}
