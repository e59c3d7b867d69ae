//! `tracer top PID`: a live view, redrawn in place every `--interval`
//! seconds, of a process's top lines: size, blocks and their growth since
//! the view started. At start it stores a snapshot of the process (`POST
//! /pid/{pid}/snapshots`) as the base of every refresh (`GET
//! /pid/{pid}/compare?base=ID`), and deletes it when the view ends (`q`,
//! Esc, Ctrl-C, SIGTERM, `-n` refreshes done, the process ended). On a
//! terminal it uses the alternate screen and reads keys; elsewhere (a pipe,
//! a test) it prints one frame after another.

use std::{
    io::{IsTerminal as _, Write as _},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crossterm::{
    cursor,
    event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    execute, queue, terminal,
};
use tracer_api::{CompareAnswer, ProcessView, SnapshotSummary, StatisticDiff};

use super::Context;
use crate::{
    cli::{TopArgs, TopSort},
    client::{Client, query},
    error::CliError,
    format::{Style, diff_table, int, place, table_text},
    output::{emit, note, with_progress},
};

/// Lines of a frame above its table: the process, the base, the blank line.
const HEADER_LINES: u16 = 3;

pub fn run(ctx: &Context, args: &TopArgs) -> Result<(), CliError> {
    let pid = args.pid;
    // Fails here, before anything is stored, for a pid tracerd does not trace.
    ctx.client
        .get_typed::<ProcessView>(&format!("/pid/{pid}"))?;
    let summary: SnapshotSummary =
        with_progress(&format!("taking the base snapshot of pid {pid}"), || {
            ctx.client.post(&format!("/pid/{pid}/snapshots"), None)
        })?
        .typed("POST /pid/{pid}/snapshots")?;
    let base = BaseSnapshot {
        client: &ctx.client,
        id: summary.id,
    };
    let started = Instant::now();
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).map_err(|source| CliError::Io {
            what: "handle SIGINT".into(),
            source,
        })?;
    }
    let screen = Screen::enter(interactive)?;
    let mut refreshes = 0u64;
    let ended = loop {
        let record: ProcessView = ctx.client.get_typed(&format!("/pid/{pid}"))?;
        let compare: CompareAnswer = ctx.client.get_typed(&format!(
            "/pid/{pid}/compare{}",
            query(&args.pairs(base.id))
        ))?;
        let style = ctx.style(args.bytes);
        let rows = visible_rows(args.limit, interactive);
        let frame = frame(
            args,
            &style,
            &record,
            &compare,
            base.id,
            started.elapsed(),
            rows,
            interactive,
        );
        screen.draw(&frame)?;
        refreshes += 1;
        if !record.state.is_alive() {
            break true;
        }
        if args.iterations.is_some_and(|n| refreshes >= n) || screen.wait(args.interval, &stop)? {
            break false;
        }
    };
    drop(screen);
    if ended {
        note(&format!("pid {pid} has ended"));
    }
    drop(base);
    Ok(())
}

/// The base snapshot of the view, deleted when the view ends.
struct BaseSnapshot<'a> {
    client: &'a Client,
    id: u64,
}

impl Drop for BaseSnapshot<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.client.delete(&format!("/snapshots/{}", self.id)) {
            note(&format!(
                "could not delete the view's snapshot {}: {e}",
                self.id
            ));
        }
    }
}

/// Table rows that fit: `limit` when given, else the terminal's height
/// less the header (20 when not a terminal).
fn visible_rows(limit: usize, interactive: bool) -> usize {
    if limit > 0 {
        return limit;
    }
    if !interactive {
        return 20;
    }
    let height = terminal_size::terminal_size_of(std::io::stdout()).map_or(24, |(_, h)| h.0);
    usize::from(height.saturating_sub(HEADER_LINES + 3).max(3))
}

/// The lines to show, ordered by `sort`; ties by place.
pub fn top_lines(compare: &CompareAnswer, sort: TopSort, rows: usize) -> Vec<StatisticDiff> {
    let mut stats = compare.statistics.clone();
    let key = |s: &StatisticDiff| match sort {
        TopSort::Size => int(s.size),
        TopSort::Growth => s.size_diff,
        TopSort::Count => int(s.count),
    };
    stats.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| place(a).cmp(&place(b))));
    stats.truncate(rows);
    stats
}

/// One frame: the process line, the base line, then the table.
#[allow(clippy::too_many_arguments)]
fn frame(
    args: &TopArgs,
    style: &Style,
    record: &ProcessView,
    compare: &CompareAnswer,
    base: u64,
    elapsed: Duration,
    rows: usize,
    interactive: bool,
) -> Vec<String> {
    let stats = top_lines(compare, args.sort, rows);
    let head = format!(
        "tracer top: {} (pid {}, {}): current {}, peak {}, {} blocks",
        record.comm,
        args.pid,
        record.state.as_str(),
        style.size(int(record.current)),
        style.size(int(record.peak)),
        record.blocks,
    );
    let mut second = format!(
        "growth over {} s (since snapshot {base}), by {}, sorted by {}, every {} s",
        elapsed.as_secs(),
        args.group.group_by.as_str(),
        match args.sort {
            TopSort::Size => "size",
            TopSort::Growth => "growth",
            TopSort::Count => "blocks",
        },
        args.interval.as_secs_f64(),
    );
    if interactive {
        second.push_str("; q quits");
    }
    let clip = |line: String| match style.width {
        Some(width) => line.chars().take(usize::from(width)).collect(),
        None => line,
    };
    let mut lines = vec![style.bold(&clip(head)), clip(second), String::new()];
    lines.extend(
        table_text(&diff_table(&stats, style))
            .lines()
            .map(str::to_string),
    );
    lines
}

/// Where frames go: the alternate screen of a terminal in raw mode (keys
/// read), or plain stdout.
struct Screen {
    interactive: bool,
}

impl Screen {
    fn enter(interactive: bool) -> Result<Self, CliError> {
        if interactive {
            let io = |source| CliError::Io {
                what: "set up the terminal".into(),
                source,
            };
            terminal::enable_raw_mode().map_err(io)?;
            execute!(
                std::io::stdout(),
                terminal::EnterAlternateScreen,
                cursor::Hide
            )
            .map_err(io)?;
        }
        Ok(Self { interactive })
    }

    /// Shows `lines`: in place on a terminal, else after the last frame
    /// with a blank line between.
    fn draw(&self, lines: &[String]) -> Result<(), CliError> {
        if !self.interactive {
            return emit(&format!("{}\n", lines.join("\n")));
        }
        let mut out = std::io::stdout().lock();
        let written = queue!(
            out,
            cursor::MoveTo(0, 0),
            terminal::Clear(terminal::ClearType::All)
        )
        .and_then(|()| out.write_all(lines.join("\r\n").as_bytes()))
        .and_then(|()| out.flush());
        written.map_err(|source| CliError::Io {
            what: "draw the view".into(),
            source,
        })
    }

    /// Waits `interval`; true when the view is to end (a quit key, or
    /// SIGINT/SIGTERM).
    fn wait(&self, interval: Duration, stop: &AtomicBool) -> Result<bool, CliError> {
        let deadline = Instant::now() + interval;
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let step = left.min(Duration::from_millis(100));
            if !self.interactive {
                std::thread::sleep(step);
                continue;
            }
            let io = |source| CliError::Io {
                what: "read the keyboard".into(),
                source,
            };
            if event::poll(step).map_err(io)?
                && let Event::Key(key) = event::read().map_err(io)?
                && key.kind == KeyEventKind::Press
                && quits(key.code, key.modifiers)
            {
                return Ok(true);
            }
        }
    }
}

/// `q`, Esc and Ctrl-C end the view.
fn quits(code: KeyCode, modifiers: KeyModifiers) -> bool {
    matches!(code, KeyCode::Char('q' | 'Q') | KeyCode::Esc)
        || (code == KeyCode::Char('c') && modifiers.contains(KeyModifiers::CONTROL))
}

impl Drop for Screen {
    fn drop(&mut self) {
        if self.interactive {
            let _ = execute!(
                std::io::stdout(),
                cursor::Show,
                terminal::LeaveAlternateScreen
            );
            let _ = terminal::disable_raw_mode();
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use tracer_api::{CompareSide, Completeness, ProcessState, SideKind};

    use super::*;
    use crate::format::PLAIN;
    use crate::format::tests::{diff, frame};

    fn stat(line: u32, size: u64, size_diff: i64, count: u64) -> StatisticDiff {
        diff(
            (size, size_diff),
            (count, 0),
            vec![frame("a.c", line, None)],
        )
    }

    fn compare(statistics: Vec<StatisticDiff>) -> CompareAnswer {
        let side = CompareSide {
            kind: SideKind::TracingStart {
                at_ms: 0,
                since_ms: None,
            },
            completeness: Completeness::default(),
        };
        CompareAnswer {
            base: side.clone(),
            complete: true,
            cumulative: false,
            filters: std::collections::BTreeMap::new(),
            group_by: "lineno".into(),
            limit: 0,
            new: side,
            pid: Some(7),
            total: statistics.len(),
            statistics,
        }
    }

    #[test]
    fn top_lines_sort_by_size_growth_or_count_and_fit_the_rows() {
        let compare = compare(vec![
            stat(1, 10, 10, 1),
            stat(2, 300, 0, 3),
            stat(3, 200, 150, 9),
            stat(4, 200, 0, 2),
        ]);
        let lines = |sort, rows| -> Vec<String> {
            top_lines(&compare, sort, rows).iter().map(place).collect()
        };
        assert_eq!(
            lines(TopSort::Size, 10),
            ["a.c:2", "a.c:3", "a.c:4", "a.c:1"]
        );
        assert_eq!(lines(TopSort::Growth, 2), ["a.c:3", "a.c:1"]);
        assert_eq!(lines(TopSort::Count, 1), ["a.c:3"]);
    }

    #[test]
    fn a_frame_is_the_process_the_base_and_the_table() {
        let cli = crate::cli::Cli::try_parse_from(["tracer", "top", "12", "-s", "growth"]).unwrap();
        let crate::cli::Command::Top(args) = cli.command else {
            panic!("a top command");
        };
        let mut record = crate::format::tests::process(12, "keep", 4096, ProcessState::Alive);
        record.view.blocks = 2;
        let compare = compare(vec![stat(9, 4096, 4096, 2)]);
        let lines = super::frame(
            &args,
            &PLAIN,
            &record.view,
            &compare,
            3,
            Duration::from_secs(5),
            20,
            false,
        );
        assert_eq!(
            lines.join("\n"),
            [
                "tracer top: keep (pid 12, alive): current 4096 B, peak 4096 B, 2 blocks",
                "growth over 5 s (since snapshot 3), by lineno, sorted by growth, every 2 s",
                "",
                "   SIZE   CHANGE  BLOCKS  CHANGE  WHERE",
                " 4096 B  +4096 B       2      +0  a.c:9",
            ]
            .join("\n")
        );
    }

    #[test]
    fn q_escape_and_ctrl_c_quit() {
        assert!(quits(KeyCode::Char('q'), KeyModifiers::NONE));
        assert!(quits(KeyCode::Esc, KeyModifiers::NONE));
        assert!(quits(KeyCode::Char('c'), KeyModifiers::CONTROL));
        assert!(!quits(KeyCode::Char('c'), KeyModifiers::NONE));
    }
}
