//! `tracer diff PID`: `GET /pid/{pid}/compare` against `--base` (a stored
//! snapshot), `--since` (the automatic snapshots of that long ago) or, by
//! default, the latest snapshot stored of the process: tracemalloc's text
//! (`format=text`), a table (`--table`), or the JSON. What the base was
//! goes to stderr.

use tracer_api::{CompareAnswer, SideKind};

use super::{Context, emit_body};
use crate::{
    cli::DiffArgs,
    client::query,
    error::CliError,
    format::{diff_table, table_text},
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
    let body: CompareAnswer = answer.typed(&format!("GET {path}"))?;
    note(&format!("compared with {}", describe_base(&body.base.kind)));
    emit(&table_text(&diff_table(
        &body.statistics,
        &ctx.style(args.output.bytes),
    )))
}

/// What a compare answer's `base` was, in words.
pub fn describe_base(base: &SideKind) -> String {
    match base {
        SideKind::Snapshot { id, .. } => match base.label() {
            Some(label) => format!("snapshot {id} ({label})"),
            None => format!("snapshot {id}"),
        },
        SideKind::TracingStart { .. } => "the start of tracing (nothing allocated)".to_string(),
        SideKind::Now { .. } => "now".to_string(),
        SideKind::Since { .. } => "since".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use tracer_api::CompareSide;

    use super::*;

    fn describe(side: &str) -> String {
        let side: CompareSide = serde_json::from_str(side).unwrap();
        describe_base(&side.kind)
    }

    #[test]
    fn the_base_is_named_in_words() {
        assert_eq!(
            describe(
                r#"{"kind":"snapshot","id":1,"label":"lab1","snapshot_kind":"taken","taken_at_ms":5}"#
            ),
            "snapshot 1 (lab1)"
        );
        assert_eq!(
            describe(r#"{"kind":"snapshot","id":4,"snapshot_kind":"auto","taken_at_ms":5}"#),
            "snapshot 4"
        );
        assert_eq!(
            describe(r#"{"kind":"tracing_start","at_ms":1}"#),
            "the start of tracing (nothing allocated)"
        );
        assert_eq!(
            describe(r#"{"kind":"since","since_ms":1,"processes":[]}"#),
            "since"
        );
    }
}
