//! `tracer load FILE`: uploads a tracer dump or a tracemalloc pickle
//! (`POST /snapshots` with the file as body, `format=` told by its first
//! bytes unless given), then prints the loaded snapshot's statistics.
//! tracerd lets operators only load files (root, its operators group, the
//! token's holder).

use tracer_api::SnapshotSummary;

use super::{Context, emit_body, print_snapshot_statistics, snapshot_name};
use crate::{
    cli::{FileFormat, LoadArgs},
    client::query,
    error::CliError,
    format::{Style, int},
    output::{note, with_progress},
};

pub fn run(ctx: &Context, args: &LoadArgs) -> Result<(), CliError> {
    let bytes = std::fs::read(&args.file).map_err(|source| CliError::Io {
        what: format!("read {}", args.file.display()),
        source,
    })?;
    let format = match args.format {
        Some(format) => format,
        None => FileFormat::sniff(&bytes).ok_or_else(|| CliError::UnknownFormat {
            path: args.file.clone(),
        })?,
    };
    let mut pairs = vec![("format".to_string(), format.as_str().to_string())];
    if let Some(label) = &args.label {
        pairs.push(("label".into(), label.clone()));
    }
    let path = format!("/snapshots{}", query(&pairs));
    let size = bytes.len();
    let answer = with_progress(
        &format!("loading {} ({size} bytes)", args.file.display()),
        || ctx.client.post(&path, Some(bytes)),
    )?;
    if ctx.json {
        return emit_body(&answer);
    }
    let summary: SnapshotSummary = answer.typed(&format!("POST {path}"))?;
    let style = Style {
        bytes: args.output.bytes,
        ..Style::default()
    };
    note(&format!(
        "{} loaded from {} ({} file): {} in {} blocks",
        snapshot_name(&summary),
        args.file.display(),
        format.as_str(),
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
