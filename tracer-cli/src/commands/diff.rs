//! `tracer diff PID`: `GET /pid/{pid}/compare` against `--base` (a stored
//! snapshot), `--since` (the automatic snapshots of that long ago) or, by
//! default, the latest snapshot stored of the process: tracemalloc's text
//! (`format=text`), a table (`--table`), or the JSON. What the base was
//! goes to stderr.

use serde_json::Value;

use super::{Context, emit_body};
use crate::{
    cli::DiffArgs,
    client::query,
    error::CliError,
    format::{diff_table, int, table_text},
    output::{emit, note, with_progress},
};

pub fn run(ctx: &Context, args: &DiffArgs) -> Result<(), CliError> {
    let text = !args.output.table && !ctx.json;
    let path = format!("/pid/{}/compare{}", args.pid, query(&args.pairs(text)));
    let answer = with_progress(&format!("comparing pid {}", args.pid), || {
        ctx.client.get(&path)
    })?;
    if ctx.json {
        return emit_body(&answer);
    }
    if text {
        if let Some(base) = answer.header("x-tracer-base") {
            note(&format!("compared with {base}"));
        }
        if answer.header("x-tracer-complete").as_deref() == Some("false") {
            note("allocator events were lost (kernel maps full): these figures undercount");
        }
        return emit_body(&answer);
    }
    let body = answer.json(&format!("GET {path}"))?;
    note(&format!("compared with {}", describe_base(&body["base"])));
    let stats = body["statistics"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    emit(&table_text(&diff_table(
        stats,
        &ctx.style(args.output.bytes),
    )))
}

/// What a compare answer's `base` was, in words.
pub fn describe_base(base: &Value) -> String {
    match base["kind"].as_str() {
        Some("snapshot") => match base["label"].as_str() {
            Some(label) => format!("snapshot {} ({label})", int(base, "id")),
            None => format!("snapshot {}", int(base, "id")),
        },
        Some("tracing_start") => "the start of tracing (nothing allocated)".to_string(),
        Some(other) => other.replace('_', " "),
        None => "the default base".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_base_is_named_in_words() {
        assert_eq!(
            describe_base(&json!({"kind": "snapshot", "id": 1, "label": "lab1"})),
            "snapshot 1 (lab1)"
        );
        assert_eq!(
            describe_base(&json!({"kind": "snapshot", "id": 4})),
            "snapshot 4"
        );
        assert_eq!(
            describe_base(&json!({"kind": "tracing_start", "at_ms": 1})),
            "the start of tracing (nothing allocated)"
        );
    }
}
