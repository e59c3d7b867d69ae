//! How answers are shown: sizes as tracemalloc prints them (`5000 KiB`,
//! `+4242 B`) or exact bytes, the place a statistic counts at, colour (on
//! for a terminal unless `NO_COLOR`), and tables (comfy-table) of
//! statistics, diffs and processes, as wide as the terminal.

use std::io::IsTerminal as _;

use comfy_table::{Cell, CellAlignment, Color, ContentArrangement, Table, presets};
use owo_colors::OwoColorize as _;
use serde_json::Value;
use tracer_api::ProcessStatus;
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

/// `value[key]` as a whole number (0 when absent).
pub fn int(value: &Value, key: &str) -> i64 {
    value[key]
        .as_i64()
        .or_else(|| value[key].as_u64().and_then(|n| i64::try_from(n).ok()))
        .unwrap_or(0)
}

/// One frame as `file:line`, or `file` when its line is unknown (0).
fn frame_place(frame: &Value) -> String {
    let file = frame["filename"].as_str().unwrap_or("<unknown>");
    match frame["lineno"].as_u64() {
        Some(line) if line > 0 => format!("{file}:{line}"),
        _ => file.to_string(),
    }
}

/// Where a statistic (or diff) counts: the label of a function or module
/// group, the file of a filename group, `file:line` of a line group, and a
/// whole traceback one frame a line, most recent first, with functions.
pub fn place(stat: &Value) -> String {
    if let Some(label) = stat["label"].as_str() {
        return label.to_string();
    }
    let frames = stat["traceback"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    match frames {
        [] => "<unknown>".to_string(),
        [frame] => frame_place(frame),
        frames => frames
            .iter()
            .map(|f| match f["function"].as_str() {
                Some(function) => format!("{} in {function}", frame_place(f)),
                None => frame_place(f),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// A table of statistics (`"statistics"` of a statistics answer): size,
/// blocks, average, where.
pub fn statistics_table(stats: &[Value], style: &Style) -> Table {
    let mut table = style.table(
        &["SIZE", "BLOCKS", "AVERAGE", "WHERE"],
        &["SIZE", "BLOCKS", "AVERAGE"],
    );
    for stat in stats {
        let (size, count) = (int(stat, "size"), int(stat, "count"));
        table.add_row(vec![
            style.number(style.size(size)),
            style.number(count.to_string()),
            style.number(style.average(size, count)),
            Cell::new(place(stat)),
        ]);
    }
    table
}

/// A table of differences (`"statistics"` of a compare answer): size and
/// its change, blocks and their change, where.
pub fn diff_table(stats: &[Value], style: &Style) -> Table {
    let mut table = style.table(
        &["SIZE", "CHANGE", "BLOCKS", "CHANGE", "WHERE"],
        &["SIZE", "CHANGE", "BLOCKS"],
    );
    for stat in stats {
        let (size_diff, count_diff) = (int(stat, "size_diff"), int(stat, "count_diff"));
        table.add_row(vec![
            style.number(style.size(int(stat, "size"))),
            style.delta(style.size_diff(size_diff), size_diff),
            style.number(int(stat, "count").to_string()),
            style.delta(format!("{count_diff:+}"), count_diff),
            Cell::new(place(stat)),
        ]);
    }
    table
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

/// What an incomplete process record or answer lost, as a note: `N events
/// lost` (`drops`: allocator events the full kernel maps refused) and `M
/// tracebacks cut` (`cut_tracebacks`: blocks with a part of their stack),
/// each when not 0.
pub fn losses(body: &Value) -> String {
    lost(int(body, "drops"), int(body, "cut_tracebacks"))
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
pub(crate) mod tests {
    use serde_json::json;
    use tracer_api::{ProcessState, ProcessView};

    use super::*;

    /// A complete process of `current` bytes (peak the same, no blocks).
    pub fn process(pid: u32, comm: &str, current: u64, state: ProcessState) -> ProcessStatus {
        ProcessStatus {
            view: ProcessView {
                pid,
                generation: 1,
                ppid: None,
                comm: comm.into(),
                exe: None,
                nspid: None,
                cgroup: None,
                container_id: None,
                owner_uid: None,
                state,
                first_seen_ms: 0,
                ended_ms: None,
                current,
                peak: current,
                blocks: 0,
                allocs: 0,
                frees: 0,
                unknown_frees: 0,
                drops: 0,
                cut_tracebacks: 0,
                complete: true,
            },
            is_tracing: true,
            traceback_limit: 1,
        }
    }

    #[test]
    fn sizes_are_tracemallocs_or_exact() {
        assert_eq!(PLAIN.size(5_120_000), "5000 KiB");
        assert_eq!(PLAIN.size(4242), "4242 B");
        assert_eq!(PLAIN.size_diff(300), "+300 B");
        assert_eq!(PLAIN.size_diff(-20_480), "-20.0 KiB");
        assert_eq!(PLAIN.average(1300, 13), "100 B");
        assert_eq!(PLAIN.average(0, 0), "-");
        let exact = Style {
            bytes: true,
            ..PLAIN
        };
        assert_eq!(exact.size(5_288_192), "5288192");
        assert_eq!(exact.size_diff(0), "+0");
        assert_eq!(exact.size_diff(-7), "-7");
        assert_eq!(exact.average(1000, 3), "333");
    }

    #[test]
    fn colour_follows_the_terminal_and_no_color() {
        assert!(decide_color(ColorChoice::Auto, true, false));
        assert!(!decide_color(ColorChoice::Auto, true, true));
        assert!(!decide_color(ColorChoice::Auto, false, false));
        assert!(decide_color(ColorChoice::Always, false, true));
        assert!(!decide_color(ColorChoice::Never, true, false));
        let coloured = Style {
            color: true,
            ..PLAIN
        };
        assert_eq!(coloured.signed("+1 B", 1), "\u{1b}[31m+1 B\u{1b}[39m");
        assert_eq!(PLAIN.signed("+1 B", 1), "+1 B");
    }

    #[test]
    fn places_name_the_line_file_label_or_traceback() {
        let frame = |file: &str, line: u64, function: &str| json!({"filename": file, "lineno": line, "function": function});
        assert_eq!(
            place(&json!({"traceback": [frame("/src/a.c", 12, "f")]})),
            "/src/a.c:12"
        );
        assert_eq!(
            place(&json!({"traceback": [frame("/src/a.c", 0, "f")]})),
            "/src/a.c"
        );
        assert_eq!(
            place(&json!({"label": "alloc_a", "traceback": [frame("/src/a.c", 10, "alloc_a")]})),
            "alloc_a"
        );
        assert_eq!(
            place(
                &json!({"traceback": [frame("/src/a.c", 10, "alloc_a"), frame("/src/a.c", 25, "main")]})
            ),
            "/src/a.c:10 in alloc_a\n/src/a.c:25 in main"
        );
        assert_eq!(place(&json!({"traceback": []})), "<unknown>");
    }

    #[test]
    fn a_statistics_table_aligns_its_columns() {
        let stats = [
            json!({"size": 5_120_000, "count": 20000, "traceback": [{"filename": "/t/keep.c", "lineno": 9}]}),
            json!({"size": 8192, "count": 2, "traceback": [{"filename": "./libio/filedoalloc.c", "lineno": 101}]}),
        ];
        assert_eq!(
            table_text(&statistics_table(&stats, &PLAIN)),
            [
                "     SIZE  BLOCKS  AVERAGE  WHERE",
                " 5000 KiB   20000    256 B  /t/keep.c:9",
                "   8192 B       2   4096 B  ./libio/filedoalloc.c:101",
            ]
            .join("\n")
        );
    }

    #[test]
    fn a_diff_table_signs_the_changes() {
        let stats = [json!({
            "size": 5_120_000, "size_diff": 5_120_000, "count": 20000, "count_diff": 20000,
            "traceback": [{"filename": "/t/keep.c", "lineno": 9}]
        })];
        let exact = Style {
            bytes: true,
            ..PLAIN
        };
        assert_eq!(
            table_text(&diff_table(&stats, &exact)),
            [
                "    SIZE    CHANGE  BLOCKS  CHANGE  WHERE",
                " 5120000  +5120000   20000  +20000  /t/keep.c:9",
            ]
            .join("\n")
        );
    }

    #[test]
    fn a_process_table_lists_pid_command_and_sizes() {
        let mut a = process(12, "keep", 5_288_192, ProcessState::Alive);
        (a.view.peak, a.view.blocks) = (5_288_192, 20003);
        let mut b = process(7, "bash", 5937, ProcessState::Exited);
        (b.view.peak, b.view.blocks) = (6560, 67);
        assert_eq!(
            table_text(&processes_table(&[&a, &b], &PLAIN, true)),
            [
                " PID  COMMAND   CURRENT      PEAK  BLOCKS  STATE",
                "  12  keep     5164 KiB  5164 KiB   20003  alive",
                "   7  bash       5937 B    6560 B      67  exited",
            ]
            .join("\n")
        );
    }

    #[test]
    fn a_process_that_lost_events_is_marked_in_the_table() {
        let mut a = process(12, "keep", 4096, ProcessState::Alive);
        (a.view.peak, a.view.blocks, a.view.complete, a.view.drops) = (4096, 1, false, 7);
        let mut b = process(7, "bash", 5937, ProcessState::Alive);
        (b.view.peak, b.view.blocks) = (6560, 67);
        assert_eq!(
            table_text(&processes_table(&[&a, &b], &PLAIN, false)),
            [
                " PID  COMMAND  CURRENT    PEAK  BLOCKS  NOTE",
                "  12  keep      4096 B  4096 B       1  incomplete (7 events lost)",
                "   7  bash      5937 B  6560 B      67",
            ]
            .join("\n")
        );
    }

    #[test]
    fn an_incomplete_process_says_what_it_lost() {
        let note = |drops: u64, cut: u64| losses(&json!({"drops": drops, "cut_tracebacks": cut}));
        assert_eq!(note(7, 0), "7 events lost");
        assert_eq!(note(0, 44), "44 tracebacks cut");
        assert_eq!(note(7, 44), "7 events lost, 44 tracebacks cut");
        // An older tracerd gives no cut tracebacks.
        assert_eq!(losses(&json!({"drops": 3})), "3 events lost");
    }

    #[test]
    fn a_table_fits_the_terminals_width() {
        let stats = [json!({"size": 64_000, "count": 1000,
            "traceback": [{"filename": "/a/long/path/to/the/sources/names.c", "lineno": 9}]})];
        let narrow = Style {
            width: Some(40),
            ..PLAIN
        };
        let text = table_text(&statistics_table(&stats, &narrow));
        assert_eq!(
            text,
            [
                "     SIZE  BLOCKS  AVERAGE  WHERE",
                " 62.5 KiB    1000     64 B  /a/long/pat",
                "                            h/to/the/so",
                "                            urces/names",
                "                            .c:9",
            ]
            .join("\n")
        );
        assert!(text.lines().all(|l| l.chars().count() <= 40));
    }
}
