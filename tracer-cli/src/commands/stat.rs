//! `tracer stat PID`: `GET /pid/{pid}/statistics` with the grouping, limit
//! and filters given: a table, tracemalloc's text (`--text`) or the JSON.
//! An answer that undercounts (`complete: false`) says so in its head line
//! (`[incomplete, N allocator events lost ...]`) and on stderr.

use super::{Context, emit_body, incomplete, warn_incomplete};
use crate::{
    cli::StatArgs,
    client::query,
    error::CliError,
    format::{int, statistics_table, table_text},
    output::emit,
};

pub fn run(ctx: &Context, args: &StatArgs) -> Result<(), CliError> {
    let text = args.text && !ctx.json;
    let path = format!("/pid/{}/statistics{}", args.pid, query(&args.pairs(text)));
    let answer = ctx.client.get(&path)?;
    if ctx.json || text {
        return emit_body(&answer);
    }
    let body = answer.json(&format!("GET {path}"))?;
    warn_incomplete(&format!("pid {}", args.pid), &body);
    let style = ctx.style(args.bytes);
    let stats = body["statistics"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let process = &body["process"];
    let total: i64 = int(process, "current");
    let mut head = format!(
        "{} (pid {}, {}): {} in {} blocks, {} groups by {}",
        process["comm"].as_str().unwrap_or("?"),
        args.pid,
        process["state"].as_str().unwrap_or("?"),
        style.size(total),
        int(process, "blocks"),
        int(&body, "total"),
        args.view.group.group_by.as_str(),
    );
    if usize::try_from(int(&body, "total")).is_ok_and(|n| n > stats.len()) {
        head.push_str(&format!(", the top {} shown", stats.len()));
    }
    if let Some(why) = incomplete(&body) {
        head.push_str(&format!(" [{why}]"));
    }
    emit(&style.bold(&head))?;
    emit(&table_text(&statistics_table(stats, &style)))
}
