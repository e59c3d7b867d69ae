//! The text `tracer run` prints once the command's tree has ended: how the
//! command ended; for a command that ran alone, its allocations, frees,
//! peak and what it still held at exit (its leaks), then where it held
//! them, by line; for a tree, one row per process image (pid, parent,
//! command indented by depth, how it ended, its figures), the totals, then
//! for each process that still held blocks when it ended, where, by line:
//! one report per process, as valgrind's `--trace-children=yes` gives one
//! per process (a line of one program is not a line of another, and their
//! leaks do not add up into one place).

use comfy_table::Cell;
use tracer_api::{ProcessState, StatisticsAnswer};

use super::{
    children::Ending,
    tree::{Member, Record, is_untraced},
};
use crate::{
    commands::incomplete,
    format::{Complete as _, Style, statistics_table, table_text},
};

/// What the report is made of.
pub struct Outcome<'a> {
    /// The command as typed (its first word).
    pub shown: &'a str,
    /// The command's pid.
    pub root: u32,
    /// How the command ended.
    pub ending: Ending,
    /// Its tree ([`super::tree::build`]); the command's own images first.
    pub members: &'a [Member],
    /// The statistics answers of the members that held blocks at their
    /// end, by index in `members`.
    pub tables: &'a [(usize, StatisticsAnswer)],
    /// The grouping of those statistics (`lineno` ...).
    pub group_by: &'a str,
    /// tracer's own pid (the parent of adopted processes).
    pub tracer_pid: u32,
}

/// The report, lines joined.
pub fn render(outcome: &Outcome<'_>, style: &Style) -> String {
    let mut out = vec![style.bold(&format!(
        "tracer: {} (pid {}) {}",
        outcome.shown,
        outcome.root,
        outcome.ending.describe()
    ))];
    match outcome.members {
        [] => out.push(format!("  {NO_RECORD}")),
        [only] if only.record.pid() == outcome.root => {
            alone(&mut out, only, style);
            for (_, stats) in outcome.tables {
                out.push(where_held("  where it was held", stats, outcome.group_by));
                out.push(table_text(&statistics_table(&stats.statistics, style)));
            }
        }
        members => {
            tree(&mut out, outcome, members, style);
            for (index, stats) in outcome.tables {
                let Some(member) = members.get(*index) else {
                    continue;
                };
                let record = &member.record;
                let state = match record.state() {
                    ProcessState::Alive => "still running, holds now",
                    _ => "exited, still held",
                };
                let head = format!(
                    "  pid {} ({}), {state} {} in {} blocks",
                    record.pid(),
                    record.comm(),
                    style.size(record.figure(|v| v.current)),
                    record.figure(|v| v.blocks),
                );
                out.push(where_held(&head, stats, outcome.group_by));
                out.push(table_text(&statistics_table(&stats.statistics, style)));
            }
        }
    }
    out.join("\n")
}

/// What is said of a process tracerd has no record of.
const NO_RECORD: &str = "no record in tracerd: no allocation of it was seen (it made none, or it is outside tracerd's scope, or its allocator is not one tracerd probes)";

/// The summary of a command that ran alone.
fn alone(out: &mut Vec<String>, member: &Member, style: &Style) {
    let record = &member.record;
    if is_untraced(record) {
        out.push(format!("  {NO_RECORD}"));
        return;
    }
    out.push(format!(
        "  {} allocations, {} frees, peak {}",
        record.figure(|v| v.allocs),
        record.figure(|v| v.frees),
        style.size(record.figure(|v| v.peak))
    ));
    let held = record.figure(|v| v.current);
    let leaked = format!(
        "  still held at exit (leaks): {} in {} blocks",
        style.size(held),
        record.figure(|v| v.blocks)
    );
    out.push(style.signed(&leaked, held));
    if let Some(why) = incomplete(record) {
        out.push(format!("  {why}"));
    }
}

/// `HEAD, by GROUP (N of TOTAL):`.
fn where_held(head: &str, stats: &StatisticsAnswer, group_by: &str) -> String {
    format!(
        "{head}, by {group_by} ({} of {}):",
        stats.statistics.len(),
        stats.total
    )
}

/// How an image ended, as the table says it.
fn state(record: &Record) -> &'static str {
    if is_untraced(record) {
        return "untraced";
    }
    match record.state() {
        ProcessState::Alive => "running",
        ProcessState::Exec => "exec",
        ProcessState::Exited => "exited",
    }
}

/// The table of a tree's images and the totals.
fn tree(out: &mut Vec<String>, outcome: &Outcome<'_>, members: &[Member], style: &Style) {
    let pids: std::collections::BTreeSet<u32> = members.iter().map(|m| m.record.pid()).collect();
    out.push(format!(
        "  it and its descendants: {} processes, {} images (a process has one per program it ran)",
        pids.len(),
        members.len()
    ));
    let notes = members
        .iter()
        .any(|m| m.adopted || incomplete(&m.record).is_some());
    let mut header = vec![
        "PID",
        "PPID",
        "COMMAND",
        "STATE",
        "ALLOCATIONS",
        "FREES",
        "PEAK",
        "HELD",
        "BLOCKS",
    ];
    if notes {
        header.push("NOTE");
    }
    let mut table = style.table(
        &header,
        &[
            "PID",
            "PPID",
            "ALLOCATIONS",
            "FREES",
            "PEAK",
            "HELD",
            "BLOCKS",
        ],
    );
    let (mut allocs, mut frees, mut held, mut blocks) = (0, 0, 0, 0);
    for member in members {
        let r = &member.record;
        let figures = if is_untraced(r) {
            vec!["-".to_string(); 5]
        } else {
            allocs += r.figure(|v| v.allocs);
            frees += r.figure(|v| v.frees);
            if r.state() == ProcessState::Exited {
                held += r.figure(|v| v.current);
                blocks += r.figure(|v| v.blocks);
            }
            vec![
                r.figure(|v| v.allocs).to_string(),
                r.figure(|v| v.frees).to_string(),
                style.size(r.figure(|v| v.peak)),
                style.size(r.figure(|v| v.current)),
                r.figure(|v| v.blocks).to_string(),
            ]
        };
        let ppid = r.ppid().map_or_else(|| "-".to_string(), |p| p.to_string());
        let mut row = vec![
            Cell::new(r.pid()),
            Cell::new(ppid),
            Cell::new(format!("{}{}", "  ".repeat(member.depth), r.comm())),
            Cell::new(state(r)),
        ];
        row.extend(figures.into_iter().map(Cell::new));
        if notes {
            let mut note = Vec::new();
            if member.adopted {
                note.push("adopted".to_string());
            }
            if !r.complete() {
                note.push(format!("incomplete ({})", crate::format::losses(r)));
            }
            row.push(Cell::new(note.join(", ")));
        }
        table.add_row(row);
    }
    out.push(table_text(&table));
    out.push(format!(
        "  together: {allocs} allocations, {frees} frees; still held at exit (leaks): {} in {blocks} blocks",
        style.size(held)
    ));
    out.push(
        "  HELD, BLOCKS: what each held when it ended (at an exec: what the exec discarded; running: now)"
            .to_string(),
    );
    if members.iter().any(|m| m.adopted) {
        out.push(format!(
            "  adopted: its parent had ended when tracerd first saw it, and tracer (pid {}) became its parent",
            outcome.tracer_pid
        ));
    }
    if members.iter().any(|m| incomplete(&m.record).is_some()) {
        out.push(
            "  incomplete: allocator events of it were lost (kernel maps full: its figures undercount), or tracebacks cut (blocks with a part of their stack)"
                .to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::PLAIN;
    use crate::format::tests::{answer, frame, stat};

    fn member(record: Record, depth: usize, adopted: bool) -> Member {
        Member {
            record,
            depth,
            latest: true,
            adopted,
        }
    }

    fn process(pid: u32, ppid: u32, comm: &str, state: &str, allocs: u64, held: u64) -> Record {
        let state = serde_json::from_value(serde_json::json!(state)).unwrap();
        let mut status = crate::format::tests::process(pid, comm, held, state);
        let view = &mut status.view;
        view.ppid = Some(ppid);
        (view.allocs, view.frees, view.peak, view.blocks) = (allocs, 1, held + 100, allocs - 1);
        Record::Traced(Box::new(status))
    }

    fn view(record: &mut Record) -> &mut tracer_api::ProcessView {
        match record {
            Record::Traced(status) => &mut status.view,
            Record::Untraced(_) => unreachable!("a traced record"),
        }
    }

    fn stats(place: &str, size: u64, count: u64) -> StatisticsAnswer {
        answer(vec![stat(size, count, vec![frame(place, 9, None)])])
    }

    #[test]
    fn a_command_alone_gets_its_summary_and_lines() {
        let members = [member(
            process(5, 50, "names", "exited", 1001, 64_000),
            0,
            false,
        )];
        let tables = [(0, stats("/t/names.c", 64_000, 1000))];
        let outcome = Outcome {
            shown: "./names",
            root: 5,
            ending: Ending::Code(0),
            members: &members,
            tables: &tables,
            group_by: "lineno",
            tracer_pid: 50,
        };
        assert_eq!(
            render(&outcome, &PLAIN),
            [
                "tracer: ./names (pid 5) exited with status 0",
                "  1001 allocations, 1 frees, peak 62.6 KiB",
                "  still held at exit (leaks): 62.5 KiB in 1000 blocks",
                "  where it was held, by lineno (1 of 1):",
                "     SIZE  BLOCKS  AVERAGE  WHERE",
                " 62.5 KiB    1000     64 B  /t/names.c:9",
            ]
            .join("\n")
        );
    }

    #[test]
    fn a_program_that_allocated_nothing_reads_zero_allocations() {
        let mut record = process(6, 50, "gzip", "exited", 1, 0);
        let lost = view(&mut record);
        (lost.allocs, lost.frees, lost.peak) = (0, 0, 0);
        (lost.complete, lost.drops) = (false, 3);
        let members = [member(record, 0, false)];
        let outcome = Outcome {
            shown: "gzip",
            root: 6,
            ending: Ending::Signal(15),
            members: &members,
            tables: &[],
            group_by: "lineno",
            tracer_pid: 50,
        };
        assert_eq!(
            render(&outcome, &Style { bytes: true, ..PLAIN }),
            [
                "tracer: gzip (pid 6) was killed by signal 15",
                "  0 allocations, 0 frees, peak 0",
                "  still held at exit (leaks): 0 in 0 blocks",
                "  incomplete, 3 events lost (lost events: the kernel maps were full, these figures undercount; cut tracebacks: blocks with a part of their stack)",
            ]
            .join("\n")
        );
    }

    #[test]
    fn a_command_tracerd_has_no_record_of_is_said_so_without_figures() {
        let members = [member(
            super::super::tree::untraced(7, Some(50), "true", 0),
            0,
            false,
        )];
        for members in [&members[..], &[]] {
            let outcome = Outcome {
                shown: "true",
                root: 7,
                ending: Ending::Code(0),
                members,
                tables: &[],
                group_by: "lineno",
                tracer_pid: 50,
            };
            assert_eq!(
                render(&outcome, &PLAIN),
                format!("tracer: true (pid 7) exited with status 0\n  {NO_RECORD}")
            );
        }
    }

    #[test]
    fn a_tree_lists_each_image_then_the_lines_of_each_that_held_blocks() {
        let shell = process(10, 50, "sh", "exec", 40, 2048);
        let mut lost = process(12, 10, "b", "exited", 8, 700);
        (view(&mut lost).complete, view(&mut lost).drops) = (false, 2);
        let members = [
            member(shell, 0, false),
            member(process(10, 50, "a", "exited", 6, 500), 0, false),
            member(lost, 1, false),
            member(
                super::super::tree::untraced(13, Some(50), "true", 0),
                1,
                true,
            ),
            member(process(14, 50, "sleep", "alive", 3, 20), 1, true),
        ];
        let tables = [
            (1, stats("/t/a.c", 500, 5)),
            (2, stats("/t/b.c", 700, 7)),
            (4, stats("/t/sleep.c", 20, 2)),
        ];
        let outcome = Outcome {
            shown: "sh",
            root: 10,
            ending: Ending::Code(3),
            members: &members,
            tables: &tables,
            group_by: "lineno",
            tracer_pid: 50,
        };
        assert_eq!(
            render(&outcome, &Style { bytes: true, ..PLAIN }),
            [
                "tracer: sh (pid 10) exited with status 3",
                "  it and its descendants: 4 processes, 5 images (a process has one per program it ran)",
                " PID  PPID  COMMAND  STATE     ALLOCATIONS  FREES  PEAK  HELD  BLOCKS  NOTE",
                "  10    50  sh       exec               40      1  2148  2048      39",
                "  10    50  a        exited              6      1   600   500       5",
                "  12    10    b      exited              8      1   800   700       7  incomplete (2 events lost)",
                "  13    50    true   untraced            -      -     -     -       -  adopted",
                "  14    50    sleep  running             3      1   120    20       2  adopted",
                "  together: 57 allocations, 4 frees; still held at exit (leaks): 1200 in 12 blocks",
                "  HELD, BLOCKS: what each held when it ended (at an exec: what the exec discarded; running: now)",
                "  adopted: its parent had ended when tracerd first saw it, and tracer (pid 50) became its parent",
                "  incomplete: allocator events of it were lost (kernel maps full: its figures undercount), or tracebacks cut (blocks with a part of their stack)",
                "  pid 10 (a), exited, still held 500 in 5 blocks, by lineno (1 of 1):",
                " SIZE  BLOCKS  AVERAGE  WHERE",
                "  500       5      100  /t/a.c:9",
                "  pid 12 (b), exited, still held 700 in 7 blocks, by lineno (1 of 1):",
                " SIZE  BLOCKS  AVERAGE  WHERE",
                "  700       7      100  /t/b.c:9",
                "  pid 14 (sleep), still running, holds now 20 in 2 blocks, by lineno (1 of 1):",
                " SIZE  BLOCKS  AVERAGE  WHERE",
                "   20       2       10  /t/sleep.c:9",
            ]
            .join("\n")
        );
    }
}
