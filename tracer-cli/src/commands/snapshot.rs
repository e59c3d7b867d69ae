//! `tracer snapshot PID`: `POST /pid/{pid}/snapshots` (a progress line
//! while it is taken), a summary on stderr, then the snapshot's statistics
//! (`GET /snapshots/{id}/statistics`) as tracemalloc's text or a table;
//! `--json` prints the stored snapshot's summary as tracerd answers it.

use tracer_api::SnapshotSummary;

use super::{Context, emit_body, print_snapshot_statistics, snapshot_name, warn_incomplete};
use crate::{
    cli::SnapshotArgs,
    client::query,
    error::CliError,
    format::{Style, int},
    output::{note, with_progress},
};

pub fn run(ctx: &Context, args: &SnapshotArgs) -> Result<(), CliError> {
    let mut pairs = Vec::new();
    if let Some(label) = &args.label {
        pairs.push(("label".to_string(), label.clone()));
    }
    if args.keep_allocator_frames {
        pairs.push(("allocator_frames".into(), "keep".into()));
    }
    let path = format!("/pid/{}/snapshots{}", args.pid, query(&pairs));
    let answer = with_progress(&format!("taking a snapshot of pid {}", args.pid), || {
        ctx.client.post(&path, None)
    })?;
    if ctx.json {
        return emit_body(&answer);
    }
    let summary: SnapshotSummary = answer.typed(&format!("POST {path}"))?;
    warn_incomplete(&snapshot_name(&summary), &summary);
    let style = Style {
        bytes: args.output.bytes,
        ..Style::default()
    };
    note(&format!(
        "{} of pid {} ({}) stored: {} in {} blocks",
        snapshot_name(&summary),
        args.pid,
        summary.comm.as_deref().unwrap_or("?"),
        style.size(int(summary.size)),
        summary.traces,
    ));
    print_snapshot_statistics(
        ctx,
        summary.id,
        args.limit,
        args.output.table,
        args.output.bytes,
    )
}
