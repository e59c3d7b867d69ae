//! The tables and words of typed answers, as text; typed values the
//! commands' tests share.
use tracer_api::ProcessState;

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
        exact: None,
        watch: None,
    }
}

/// A frame of `file` at `line`, in `function` when given.
pub fn frame(file: &str, line: u32, function: Option<&str>) -> Frame {
    Frame {
        filename: file.into(),
        lineno: line,
        function: function.map(str::to_string),
        ..Frame::default()
    }
}

/// A statistic of `size` bytes in `count` blocks at `traceback`.
pub fn stat(size: u64, count: u64, traceback: Vec<Frame>) -> Statistic {
    Statistic {
        count,
        label: None,
        size,
        text: String::new(),
        traceback,
    }
}

/// A diff of a group at `traceback`.
pub fn diff(
    (size, size_diff): (u64, i64),
    (count, count_diff): (u64, i64),
    traceback: Vec<Frame>,
) -> StatisticDiff {
    StatisticDiff {
        count,
        count_diff,
        label: None,
        size,
        size_diff,
        text: String::new(),
        traceback,
    }
}

/// A statistics answer of one process with `statistics`, all of them.
pub fn answer(statistics: Vec<Statistic>) -> tracer_api::StatisticsAnswer {
    tracer_api::StatisticsAnswer {
        target: tracer_api::StatisticsTarget::Process {
            allocator_frames: tracer_api::AllocatorFrames::Drop,
            pid: 1,
            process: None,
            totals: tracer_api::Totals::PerBlock,
        },
        completeness: Completeness {
            complete: true,
            ..Completeness::default()
        },
        cumulative: false,
        filters: std::collections::BTreeMap::new(),
        group_by: "lineno".into(),
        limit: 10,
        total: statistics.len(),
        statistics,
        traceback_limit: 1,
        traces: 0,
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
    let f = |file, line, function| frame(file, line, Some(function));
    assert_eq!(
        place(&stat(0, 0, vec![f("/src/a.c", 12, "f")])),
        "/src/a.c:12"
    );
    assert_eq!(place(&stat(0, 0, vec![f("/src/a.c", 0, "f")])), "/src/a.c");
    let labelled = Statistic {
        label: Some("alloc_a".into()),
        ..stat(0, 0, vec![f("/src/a.c", 10, "alloc_a")])
    };
    assert_eq!(place(&labelled), "alloc_a");
    assert_eq!(
        place(&stat(
            0,
            0,
            vec![f("/src/a.c", 10, "alloc_a"), f("/src/a.c", 25, "main")]
        )),
        "/src/a.c:10 in alloc_a\n/src/a.c:25 in main"
    );
    assert_eq!(place(&stat(0, 0, Vec::new())), "<unknown>");
    // A diff is placed as its statistic is.
    assert_eq!(
        place(&diff((0, 0), (0, 0), vec![frame("b.c", 3, None)])),
        "b.c:3"
    );
}

#[test]
fn a_statistics_table_aligns_its_columns() {
    let stats = [
        stat(5_120_000, 20000, vec![frame("/t/keep.c", 9, None)]),
        stat(8192, 2, vec![frame("./libio/filedoalloc.c", 101, None)]),
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
fn a_statistics_table_of_an_answer_is_the_text_it_was() {
    // As tracerd sends it: the table reads the typed answer.
    let body = r#"{"allocator_frames":"drop","complete":true,"cumulative":false,"cut_tracebacks":0,"cut_tracebacks_by_pid":{},"drops":0,"drops_by_pid":{},"filters":{},"group_by":"traceback","limit":10,"pid":42,"process":null,"statistics":[{"count":3,"size":3072,"text":"t","traceback":[{"filename":"/src/a.c","lineno":10,"function":"alloc_a"},{"filename":"/src/a.c","lineno":25,"function":"main"}]},{"count":1,"label":"g","size":100,"text":"t","traceback":[]}],"total":2,"totals":"per_stack","traceback_limit":8,"traces":4}"#;
    let answer: tracer_api::StatisticsAnswer = serde_json::from_str(body).unwrap();
    let exact = Style {
        bytes: true,
        ..PLAIN
    };
    assert_eq!(
        table_text(&statistics_table(&answer.statistics, &exact)),
        [
            " SIZE  BLOCKS  AVERAGE  WHERE",
            " 3072       3     1024  /src/a.c:10 in alloc_a",
            "                        /src/a.c:25 in main",
            "  100       1      100  g",
        ]
        .join("\n")
    );
}

#[test]
fn a_diff_table_signs_the_changes() {
    let stats = [diff(
        (5_120_000, 5_120_000),
        (20000, 20000),
        vec![frame("/t/keep.c", 9, None)],
    )];
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
    let shrunk = [diff((0, -2048), (0, -2), vec![frame("/t/free.c", 4, None)])];
    assert_eq!(
        table_text(&diff_table(&shrunk, &PLAIN)),
        [
            " SIZE   CHANGE  BLOCKS  CHANGE  WHERE",
            "  0 B  -2048 B       0      -2  /t/free.c:4",
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
    let note = |drops: u64, cut_tracebacks: u64| {
        losses(&Completeness {
            complete: false,
            drops,
            cut_tracebacks,
            ..Completeness::default()
        })
    };
    assert_eq!(note(7, 0), "7 events lost");
    assert_eq!(note(0, 44), "44 tracebacks cut");
    assert_eq!(note(7, 44), "7 events lost, 44 tracebacks cut");
    // An older tracerd gives no cut tracebacks.
    let older: Completeness = serde_json::from_str(r#"{"complete":false,"drops":3}"#).unwrap();
    assert_eq!(losses(&older), "3 events lost");
}

#[test]
fn a_table_fits_the_terminals_width() {
    let stats = [stat(
        64_000,
        1000,
        vec![frame("/a/long/path/to/the/sources/names.c", 9, None)],
    )];
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
