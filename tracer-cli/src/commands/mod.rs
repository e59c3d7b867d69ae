//! One module per subcommand; what they share: the client, the output
//! choices, and showing a statistics answer as tracemalloc's text or a
//! table.

mod diff;
mod load;
mod ps;
mod run;
mod snapshot;
mod stat;
mod top;

use std::process::ExitCode;

use tracer_api::{SnapshotSummary, StatisticsAnswer};

use crate::{
    cli::{ColorChoice, Command},
    client::{Answer, Client, query},
    error::CliError,
    format::{Complete, Style, statistics_table, table_text},
    output::{emit, note},
};

/// What every command gets.
pub struct Context {
    pub client: Client,
    /// `--json`: print tracerd's JSON answer as it is.
    pub json: bool,
    pub color: ColorChoice,
}

impl Context {
    /// The style for stdout with exact bytes or not.
    pub fn style(&self, bytes: bool) -> Style {
        Style::for_stdout(self.color, bytes)
    }
}

/// Runs `command`; its exit status.
///
/// # Errors
/// What the command met ([`CliError`]).
pub fn run(ctx: &Context, command: &Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Ps(args) => ps::run(ctx, args).map(|()| ExitCode::SUCCESS),
        Command::Top(args) => top::run(ctx, args).map(|()| ExitCode::SUCCESS),
        Command::Stat(args) => stat::run(ctx, args).map(|()| ExitCode::SUCCESS),
        Command::Snapshot(args) => snapshot::run(ctx, args).map(|()| ExitCode::SUCCESS),
        Command::Diff(args) => diff::run(ctx, args).map(|()| ExitCode::SUCCESS),
        Command::Run(args) => run::run(ctx, args),
        Command::Load(args) => load::run(ctx, args).map(|()| ExitCode::SUCCESS),
    }
}

/// Prints an answer's body as it came (JSON or tracemalloc's text).
fn emit_body(answer: &Answer) -> Result<(), CliError> {
    let text = answer.text();
    if text.is_empty() {
        return Ok(());
    }
    emit(&text)
}

/// Warns on stderr when the data of `what` are incomplete (`complete:
/// false` in `body`, a process record or an answer): how many allocator
/// events were lost (`drops`) and tracebacks cut (`cut_tracebacks`).
fn warn_incomplete(what: &str, body: &impl Complete) {
    if let Some(why) = incomplete(body) {
        note(&format!("{what}: {why}; see docs/operations.md"));
    }
}

/// `incomplete, N events lost, M tracebacks cut: ...` when `body` (a
/// process record or an answer) says `complete: false`, else None.
pub fn incomplete(body: &impl Complete) -> Option<String> {
    (!body.complete()).then(|| {
        format!(
            "incomplete, {} (lost events: the kernel maps were full, these figures undercount; cut tracebacks: blocks with a part of their stack)",
            crate::format::losses(body)
        )
    })
}

/// The statistics of stored snapshot `id` (`limit` lines) as tracemalloc's
/// text, or as a table.
fn print_snapshot_statistics(
    ctx: &Context,
    id: u64,
    limit: usize,
    table: bool,
    bytes: bool,
) -> Result<(), CliError> {
    let mut pairs = vec![("limit".to_string(), limit.to_string())];
    if !table {
        pairs.push(("format".into(), "text".into()));
    }
    let answer = ctx
        .client
        .get(&format!("/snapshots/{id}/statistics{}", query(&pairs)))?;
    if !table {
        return emit_body(&answer);
    }
    let body: StatisticsAnswer = answer.typed("the snapshot's statistics")?;
    emit(&table_text(&statistics_table(
        &body.statistics,
        &ctx.style(bytes),
    )))
}

/// `snapshot N (label L)` for a snapshot summary.
fn snapshot_name(summary: &SnapshotSummary) -> String {
    match &summary.label {
        Some(label) => format!("snapshot {} ({label})", summary.id),
        None => format!("snapshot {}", summary.id),
    }
}
