//! `tracer ps`: the traced processes (`GET /processes`), largest current
//! heap first: pid, command, current, peak, blocks; `--all` adds, after
//! them, the images that ended and their state. A process whose figures
//! undercount (`complete: false`) is marked in a NOTE column and on stderr.

use serde_json::Value;

use super::{Context, emit_body};
use crate::{
    cli::PsArgs,
    error::CliError,
    format::{int, processes_table, table_text},
    output::{emit, note},
};

pub fn run(ctx: &Context, args: &PsArgs) -> Result<(), CliError> {
    let answer = ctx.client.get("/processes")?;
    if ctx.json {
        return emit_body(&answer);
    }
    let body = answer.json("GET /processes")?;
    let listed = body["processes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let shown = select(listed, args.all);
    if shown.is_empty() {
        note("no traced process (tracerd lists a process once it has allocated)");
        return Ok(());
    }
    let incomplete = shown
        .iter()
        .filter(|p| p["complete"].as_bool() == Some(false))
        .count();
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
pub fn select(listed: &[Value], all: bool) -> Vec<&Value> {
    let mut shown: Vec<&Value> = listed
        .iter()
        .filter(|p| all || p["state"].as_str() == Some("alive"))
        .collect();
    shown.sort_by_key(|p| {
        (
            p["state"].as_str() != Some("alive"),
            std::cmp::Reverse(int(p, "current")),
            int(p, "pid"),
        )
    });
    shown
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn live_processes_come_first_largest_first_and_ended_ones_only_with_all() {
        let listed = [
            json!({"pid": 3, "current": 10, "state": "alive"}),
            json!({"pid": 1, "current": 500, "state": "exited"}),
            json!({"pid": 2, "current": 99, "state": "alive"}),
            json!({"pid": 4, "current": 99, "state": "alive"}),
        ];
        let pids =
            |all| -> Vec<i64> { select(&listed, all).iter().map(|p| int(p, "pid")).collect() };
        assert_eq!(pids(false), [2, 4, 3]);
        assert_eq!(pids(true), [2, 4, 3, 1]);
    }
}
