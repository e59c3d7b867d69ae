//! `tracer ps`: the traced processes (`GET /processes`), largest current
//! heap first: pid, command, current, peak, blocks.

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
    emit(&table_text(&processes_table(
        &shown,
        &ctx.style(args.bytes),
        args.all,
    )))
}

/// The processes to show: the live ones (every one with `all`), by current
/// bytes, largest first, then by pid.
pub fn select(listed: &[Value], all: bool) -> Vec<&Value> {
    let mut shown: Vec<&Value> = listed
        .iter()
        .filter(|p| all || p["state"].as_str() == Some("alive"))
        .collect();
    shown.sort_by_key(|p| (std::cmp::Reverse(int(p, "current")), int(p, "pid")));
    shown
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn processes_are_listed_largest_first_and_ended_ones_only_with_all() {
        let listed = [
            json!({"pid": 3, "current": 10, "state": "alive"}),
            json!({"pid": 1, "current": 500, "state": "exited"}),
            json!({"pid": 2, "current": 99, "state": "alive"}),
            json!({"pid": 4, "current": 99, "state": "alive"}),
        ];
        let pids =
            |all| -> Vec<i64> { select(&listed, all).iter().map(|p| int(p, "pid")).collect() };
        assert_eq!(pids(false), [2, 4, 3]);
        assert_eq!(pids(true), [1, 2, 4, 3]);
    }
}
