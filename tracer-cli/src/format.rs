//! How answers are shown: sizes as tracemalloc prints them (`5000 KiB`,
//! `+4242 B`) or exact bytes, the place a statistic counts at, colour (on
//! for a terminal unless `NO_COLOR`), and tables (comfy-table) of
//! statistics, diffs and processes, as wide as the terminal.

use std::io::IsTerminal as _;

use comfy_table::{Cell, CellAlignment, Color, ContentArrangement, Table, presets};
use owo_colors::OwoColorize as _;
use tracer_api::{
    Completeness, Frame, ProcessStatus, ProcessView, SnapshotSummary, Statistic, StatisticDiff,
};
use tracer_model::{format_size, format_size_f64};

use crate::cli::ColorChoice;

/// How to show numbers and whether to colour them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Style {
    /// ANSI colours in tables and summaries.
    pub color: bool,
    /// Exact byte counts instead of tracemalloc's KiB/MiB.
    pub bytes: bool,
    /// The table width: the terminal's columns, `None` when stdout is not
    /// a terminal (lines are then as long as their content).
    pub width: Option<u16>,
}

impl Style {
    /// The style for stdout: colour by `choice` (auto: a terminal, and
    /// `NO_COLOR` unset or empty), the terminal's width.
    pub fn for_stdout(choice: ColorChoice, bytes: bool) -> Self {
        let tty = std::io::stdout().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Self {
            color: decide_color(choice, tty, no_color),
            bytes,
            width: tty
                .then(|| terminal_size::terminal_size_of(std::io::stdout()))
                .flatten()
                .map(|(w, _)| w.0),
        }
    }

    /// A size in bytes: exact, or as tracemalloc's `_format_size`.
    pub fn size(&self, bytes: i64) -> String {
        if self.bytes {
            bytes.to_string()
        } else {
            format_size(bytes, false)
        }
    }

    /// A size difference, always signed.
    pub fn size_diff(&self, bytes: i64) -> String {
        if self.bytes {
            format!("{bytes:+}")
        } else {
            format_size(bytes, true)
        }
    }

    /// The average block size of `size` over `count` blocks (tracemalloc's
    /// `average=`): rounded bytes, or `_format_size` of the quotient.
    pub fn average(&self, size: i64, count: i64) -> String {
        if count == 0 {
            return "-".to_string();
        }
        #[allow(clippy::cast_precision_loss)] // sizes far below 2^53
        let average = size as f64 / count as f64;
        if self.bytes {
            format!("{average:.0}")
        } else {
            format_size_f64(average, false)
        }
    }

    /// `text` in bold when colouring.
    pub fn bold(&self, text: &str) -> String {
        if self.color {
            text.bold().to_string()
        } else {
            text.to_string()
        }
    }

    /// `text` in red (growth) or green (shrinking) by the sign of `delta`.
    pub fn signed(&self, text: &str, delta: i64) -> String {
        match (self.color, delta.signum()) {
            (true, 1) => text.red().to_string(),
            (true, -1) => text.green().to_string(),
            _ => text.to_string(),
        }
    }

    /// An empty table of this style: no borders, sized for the terminal;
    /// the columns whose header is in `numbers` aligned right, header too.
    pub fn table(&self, header: &[&str], numbers: &[&str]) -> Table {
        let mut table = Table::new();
        table.load_preset(presets::NOTHING);
        if let Some(width) = self.width {
            table
                .set_content_arrangement(ContentArrangement::Dynamic)
                .set_width(width);
        } else {
            table.set_content_arrangement(ContentArrangement::Disabled);
        }
        if self.color {
            table.enforce_styling();
        } else {
            table.force_no_tty();
        }
        table.set_header(header.iter().map(|h| {
            let cell = Cell::new(h);
            if self.color {
                cell.add_attribute(comfy_table::Attribute::Bold)
            } else {
                cell
            }
        }));
        for (i, name) in header.iter().enumerate() {
            if numbers.contains(name)
                && let Some(column) = table.column_mut(i)
            {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        table
    }

    fn number(&self, text: String) -> Cell {
        Cell::new(text)
    }

    fn delta(&self, text: String, delta: i64) -> Cell {
        let cell = self.number(text);
        match (self.color, delta.signum()) {
            (true, 1) => cell.fg(Color::Red),
            (true, -1) => cell.fg(Color::Green),
            _ => cell,
        }
    }
}

/// Colour or not: `always`/`never` as told; `auto` on a terminal unless
/// `NO_COLOR` is set (<https://no-color.org>).
pub fn decide_color(choice: ColorChoice, tty: bool, no_color: bool) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => tty && !no_color,
    }
}

/// A count or size of the API as the tables' signed whole numbers (0
/// past `i64::MAX`, which no count reaches).
pub fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(0)
}

/// A statistic or a diff: a group key and its name.
pub trait Group {
    /// The group's name for `function` and `module` groups.
    fn label(&self) -> Option<&str>;
    /// The group key: one frame, or a whole traceback, most recent first.
    fn traceback(&self) -> &[Frame];
}

impl Group for Statistic {
    fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    fn traceback(&self) -> &[Frame] {
        &self.traceback
    }
}

impl Group for StatisticDiff {
    fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    fn traceback(&self) -> &[Frame] {
        &self.traceback
    }
}

/// One frame as `file:line`, or `file` when its line is unknown (0).
fn frame_place(frame: &Frame) -> String {
    match frame.lineno {
        0 => frame.filename.clone(),
        line => format!("{}:{line}", frame.filename),
    }
}

/// Where a statistic (or diff) counts: the label of a function or module
/// group, the file of a filename group, `file:line` of a line group, and a
/// whole traceback one frame a line, most recent first, with functions.
pub fn place(stat: &impl Group) -> String {
    if let Some(label) = stat.label() {
        return label.to_string();
    }
    match stat.traceback() {
        [] => "<unknown>".to_string(),
        [frame] => frame_place(frame),
        frames => frames
            .iter()
            .map(|f| match &f.function {
                Some(function) => format!("{} in {function}", frame_place(f)),
                None => frame_place(f),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// A table of statistics (`statistics` of a statistics answer): size,
/// blocks, average, where.
pub fn statistics_table(stats: &[Statistic], style: &Style) -> Table {
    let mut table = style.table(
        &["SIZE", "BLOCKS", "AVERAGE", "WHERE"],
        &["SIZE", "BLOCKS", "AVERAGE"],
    );
    for stat in stats {
        let (size, count) = (int(stat.size), int(stat.count));
        table.add_row(vec![
            style.number(style.size(size)),
            style.number(count.to_string()),
            style.number(style.average(size, count)),
            Cell::new(place(stat)),
        ]);
    }
    table
}

/// A table of differences (`statistics` of a compare answer): size and
/// its change, blocks and their change, where.
pub fn diff_table(stats: &[StatisticDiff], style: &Style) -> Table {
    let mut table = style.table(
        &["SIZE", "CHANGE", "BLOCKS", "CHANGE", "WHERE"],
        &["SIZE", "CHANGE", "BLOCKS"],
    );
    for stat in stats {
        let (size_diff, count_diff) = (stat.size_diff, stat.count_diff);
        table.add_row(vec![
            style.number(style.size(int(stat.size))),
            style.delta(style.size_diff(size_diff), size_diff),
            style.number(int(stat.count).to_string()),
            style.delta(format!("{count_diff:+}"), count_diff),
            Cell::new(place(stat)),
        ]);
    }
    table
}

/// Whether figures are complete, and what they lost (`complete`,
/// `drops`, `cut_tracebacks` of an answer, a process record or a snapshot
/// summary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loss {
    /// False when events were lost or tracebacks cut.
    pub complete: bool,
    /// Allocator events lost (the kernel maps were full).
    pub drops: u64,
    /// Blocks recorded with a cut traceback.
    pub cut_tracebacks: u64,
}

impl Loss {
    /// Nothing lost: what a record with no figures says.
    pub const NONE: Loss = Loss {
        complete: true,
        drops: 0,
        cut_tracebacks: 0,
    };
}

/// What says whether its figures are complete: an answer's completeness,
/// a process record, a snapshot summary.
pub trait Complete {
    /// Its completeness and losses.
    fn loss(&self) -> Loss;

    /// False when events were lost or tracebacks cut.
    fn complete(&self) -> bool {
        self.loss().complete
    }
}

impl Complete for Completeness {
    fn loss(&self) -> Loss {
        Loss {
            complete: self.complete,
            drops: self.drops,
            cut_tracebacks: self.cut_tracebacks,
        }
    }
}

impl Complete for ProcessView {
    fn loss(&self) -> Loss {
        Loss {
            complete: self.complete,
            drops: self.drops,
            cut_tracebacks: self.cut_tracebacks,
        }
    }
}

impl Complete for SnapshotSummary {
    fn loss(&self) -> Loss {
        self.completeness.loss()
    }
}

/// A table of processes (`"processes"` of `GET /processes`), in the order
/// given: pid, command, current, peak, blocks, the state when `state`, and
/// a NOTE column, when any of them undercounts (`complete: false`), that
/// says which and how many allocator events each lost.
pub fn processes_table(processes: &[&ProcessStatus], style: &Style, state: bool) -> Table {
    let mut header = vec!["PID", "COMMAND", "CURRENT", "PEAK", "BLOCKS"];
    if state {
        header.push("STATE");
    }
    let notes = processes.iter().any(|p| !p.view.complete);
    if notes {
        header.push("NOTE");
    }
    let mut table = style.table(&header, &["PID", "CURRENT", "PEAK", "BLOCKS"]);
    let size = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
    for p in processes {
        let p = &p.view;
        let mut row = vec![
            style.number(p.pid.to_string()),
            Cell::new(&p.comm),
            style.number(style.size(size(p.current))),
            style.number(style.size(size(p.peak))),
            style.number(p.blocks.to_string()),
        ];
        if state {
            row.push(Cell::new(p.state.as_str()));
        }
        if notes && !p.complete {
            row.push(Cell::new(format!(
                "incomplete ({})",
                lost(size(p.drops), size(p.cut_tracebacks))
            )));
        }
        table.add_row(row);
    }
    table
}

/// The table of `tracer ps --watched`: PID, COMMAND, RSS, ANON, GROWTH
/// (anonymous bytes gained over the watch's window, and the window in
/// seconds) and EXACT (why and since when the process is traced exactly,
/// UTC; `-`: watched only).
pub fn watched_table(processes: &[&tracer_api::WatchedProcess], style: &Style) -> Table {
    let mut table = style.table(
        &["PID", "COMMAND", "RSS", "ANON", "GROWTH", "EXACT"],
        &["PID", "RSS", "ANON", "GROWTH"],
    );
    let size = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
    for p in processes {
        let w = &p.watch;
        let exact = p.exact.map_or_else(
            || "-".to_string(),
            |e| format!("{} since {}", e.reason.as_str(), utc_time(e.since_ms)),
        );
        table.add_row(vec![
            style.number(p.pid.to_string()),
            Cell::new(&p.comm),
            style.number(style.size(size(w.rss))),
            style.number(style.size(size(w.anon))),
            style.number(format!(
                "{}/{}s",
                style.size_diff(w.anon_growth),
                w.growth_over_ms / 1000
            )),
            Cell::new(exact),
        ]);
    }
    table
}

/// `HH:MM:SS` (UTC) of Unix ms `ms`.
fn utc_time(ms: u64) -> String {
    let secs = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// What an incomplete process record or answer lost, as a note: `N events
/// lost` (`drops`: allocator events the full kernel maps refused) and `M
/// tracebacks cut` (`cut_tracebacks`: blocks with a part of their stack),
/// each when not 0.
pub fn losses(body: &impl Complete) -> String {
    let loss = body.loss();
    lost(int(loss.drops), int(loss.cut_tracebacks))
}

/// [`losses`] of `drops` events lost and `cut` tracebacks cut.
fn lost(drops: i64, cut: i64) -> String {
    let mut parts = Vec::new();
    if drops > 0 || cut == 0 {
        parts.push(format!("{drops} events lost"));
    }
    if cut > 0 {
        parts.push(format!("{cut} tracebacks cut"));
    }
    parts.join(", ")
}

/// The table as text lines without trailing spaces.
pub fn table_text(table: &Table) -> String {
    table
        .lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Plain text: no colour, KiB/MiB, no width (the tests' style).
#[cfg(test)]
pub const PLAIN: Style = Style {
    color: false,
    bytes: false,
    width: None,
};

#[cfg(test)]
pub(crate) mod tests;
