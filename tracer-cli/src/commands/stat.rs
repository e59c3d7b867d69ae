//! `tracer stat PID`: `GET /pid/{pid}/statistics` with the grouping, limit
//! and filters given: a table, tracemalloc's text (`--text`) or the JSON.
//! An answer that undercounts (`complete: false`) says so in its head line
//! (`[incomplete, N allocator events lost ...]`) and on stderr.

use tracer_api::{StatisticsAnswer, StatisticsTarget};

use super::{Context, emit_body, incomplete, warn_incomplete};
use crate::{
    cli::StatArgs,
    client::query,
    error::CliError,
    format::{Style, int, statistics_table, table_text},
    output::emit,
};

pub fn run(ctx: &Context, args: &StatArgs) -> Result<(), CliError> {
    let text = args.text && !ctx.json;
    let path = format!("/pid/{}/statistics{}", args.pid, query(&args.pairs(text)));
    let answer = ctx.client.get(&path)?;
    if ctx.json || text {
        return emit_body(&answer);
    }
    let body: StatisticsAnswer = answer.typed(&format!("GET {path}"))?;
    warn_incomplete(&format!("pid {}", args.pid), &body.completeness);
    let style = ctx.style(args.bytes);
    emit(&style.bold(&head_line(
        &body,
        args.pid,
        args.view.group.group_by.as_str(),
        &style,
    )))?;
    emit(&table_text(&statistics_table(&body.statistics, &style)))
}

/// The line above the table: the process, its size, the groups shown,
/// and what it lost when incomplete.
fn head_line(body: &StatisticsAnswer, pid: u32, group_by: &str, style: &Style) -> String {
    let process = match &body.target {
        StatisticsTarget::Process { process, .. } => process.as_ref(),
        _ => None,
    };
    let mut head = format!(
        "{} (pid {pid}, {}): {} in {} blocks, {} groups by {group_by}",
        process.map_or("?", |p| p.comm.as_str()),
        process.map_or("?", |p| p.state.as_str()),
        style.size(process.map_or(0, |p| int(p.current))),
        process.map_or(0, |p| p.blocks),
        body.total,
    );
    let shown = body.statistics.len();
    if body.total > shown {
        head.push_str(&format!(", the top {shown} shown"));
    }
    if let Some(why) = incomplete(&body.completeness) {
        head.push_str(&format!(" [{why}]"));
    }
    head
}

#[cfg(test)]
mod tests {
    use tracer_api::{ProcessState, StatisticsAnswer, StatisticsTarget};

    use super::*;
    use crate::format::PLAIN;
    use crate::format::tests::{answer, frame, process, stat};

    fn of_process(mut body: StatisticsAnswer, blocks: u64) -> StatisticsAnswer {
        let mut status = process(12, "keep", 5_288_192, ProcessState::Alive);
        status.view.blocks = blocks;
        if let StatisticsTarget::Process { process, .. } = &mut body.target {
            *process = Some(status.view);
        }
        body
    }

    #[test]
    fn the_head_line_names_the_process_and_the_groups_shown() {
        let stats = vec![stat(5_120_000, 20000, vec![frame("/t/keep.c", 9, None)])];
        let body = of_process(answer(stats.clone()), 20003);
        assert_eq!(
            head_line(&body, 12, "lineno", &PLAIN),
            "keep (pid 12, alive): 5164 KiB in 20003 blocks, 1 groups by lineno"
        );
        let mut cut = of_process(answer(stats), 20003);
        cut.total = 4;
        (cut.completeness.complete, cut.completeness.drops) = (false, 7);
        assert_eq!(
            head_line(&cut, 12, "lineno", &PLAIN),
            "keep (pid 12, alive): 5164 KiB in 20003 blocks, 4 groups by lineno, the top 1 shown [incomplete, 7 events lost (lost events: the kernel maps were full, these figures undercount; cut tracebacks: blocks with a part of their stack)]"
        );
        // An image no longer kept: no process in the answer.
        assert_eq!(
            head_line(&answer(Vec::new()), 12, "lineno", &PLAIN),
            "? (pid 12, ?): 0 B in 0 blocks, 0 groups by lineno"
        );
    }
}
