//! `tracer ps`: the traced processes (`GET /processes`), largest current
//! heap first: pid, command, current, peak, blocks; `--all` adds, after
//! them, the images that ended and their state. A process whose figures
//! undercount (`complete: false`) is marked in a NOTE column and on stderr.

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
}
