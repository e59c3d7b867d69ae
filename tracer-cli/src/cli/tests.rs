//! Tests of the command line: flags map to the API's parameters.
use super::*;

fn parse(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("tracer").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn strings(pairs: &Pairs) -> Vec<String> {
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

#[test]
fn stat_flags_map_to_the_statistics_parameters() {
    let Command::Stat(stat) = parse(&[
        "stat",
        "42",
        "--group-by",
        "filename",
        "--cumulative",
        "--limit",
        "5",
        "-i",
        "*/a.c:12",
        "--include",
        "b.c@7",
        "-x",
        "*/libc*",
        "--all-frames",
        "--allocator",
        "jemalloc",
        "--exclude-allocator",
        "mmap",
        "--keep-allocator-frames",
    ])
    .command
    else {
        panic!("not stat")
    };
    assert_eq!(stat.pid, 42);
    assert_eq!(
        strings(&stat.pairs(false)),
        [
            "group_by=filename",
            "cumulative=true",
            "allocator_frames=keep",
            "limit=5",
            "include=*/a.c:12",
            "include=b.c@7",
            "exclude=*/libc*",
            "allocator=jemalloc",
            "exclude_allocator=mmap",
            "all_frames=true",
        ]
    );
    assert_eq!(
        strings(&stat.pairs(true)).last().map(String::as_str),
        Some("format=text")
    );
}

#[test]
fn stat_defaults_are_lineno_and_twenty_lines() {
    let Command::Stat(stat) = parse(&["stat", "7"]).command else {
        panic!("not stat")
    };
    assert_eq!(strings(&stat.pairs(false)), ["group_by=lineno", "limit=20"]);
}

#[test]
fn diff_takes_a_base_or_a_duration_not_both() {
    let Command::Diff(diff) = parse(&["diff", "9", "--since", "10m", "--table"]).command else {
        panic!("not diff")
    };
    assert!(diff.output.table);
    assert_eq!(
        strings(&diff.pairs(true)),
        ["since=10m", "group_by=lineno", "limit=20", "format=text"]
    );
    let Command::Diff(diff) = parse(&["diff", "9", "--base", "before", "--new", "3"]).command
    else {
        panic!("not diff")
    };
    assert_eq!(
        strings(&diff.pairs(false)),
        ["base=before", "new=3", "group_by=lineno", "limit=20"]
    );
    let err = Cli::try_parse_from(["tracer", "diff", "9", "--base", "1", "--since", "1m"])
        .expect_err("both refused");
    assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
}

#[test]
fn top_compares_every_line_against_its_base() {
    let Command::Top(top) = parse(&[
        "top",
        "5",
        "-n",
        "3",
        "--interval",
        "0.5",
        "-g",
        "traceback",
    ])
    .command
    else {
        panic!("not top")
    };
    assert_eq!(top.iterations, Some(3));
    assert_eq!(top.interval, Duration::from_millis(500));
    assert_eq!(
        strings(&top.pairs(17)),
        ["base=17", "group_by=traceback", "limit=0"]
    );
    assert!(Cli::try_parse_from(["tracer", "top", "5", "--interval", "0"]).is_err());
    assert!(Cli::try_parse_from(["tracer", "top", "5", "--interval", "x"]).is_err());
}

#[test]
fn run_keeps_the_commands_own_flags() {
    let Command::Run(run) = parse(&["run", "--limit", "3", "--", "ls", "-l", "--all"]).command
    else {
        panic!("not run")
    };
    assert_eq!(run.limit, 3);
    assert_eq!(run.command, ["ls", "-l", "--all"]);
    assert_eq!(run.wait_descendants, Duration::from_secs(10));
    let Command::Run(run) = parse(&["run", "--wait-descendants", "0", "sh"]).command else {
        panic!("not run")
    };
    assert_eq!(run.wait_descendants, Duration::ZERO);
    assert!(Cli::try_parse_from(["tracer", "run", "--wait-descendants", "-1", "sh"]).is_err());
    assert!(Cli::try_parse_from(["tracer", "run"]).is_err());
}

#[test]
fn global_options_go_anywhere() {
    let cli = parse(&["ps", "--json", "--addr", "127.0.0.1:9", "--token", "t"]);
    assert!(cli.json);
    assert_eq!(cli.addr, "127.0.0.1:9");
    assert_eq!(cli.token.as_deref(), Some("t"));
    assert!(Cli::try_parse_from(["tracer", "ps", "--token", "a", "--token-file", "/f"]).is_err());
}

#[test]
fn file_formats_are_told_by_their_first_bytes() {
    assert_eq!(
        FileFormat::sniff(b"\x89TRSNAP\n\x02"),
        Some(FileFormat::Tracer)
    );
    assert_eq!(
        FileFormat::sniff(b"\x80\x04\x95"),
        Some(FileFormat::Tracemalloc)
    );
    assert_eq!(FileFormat::sniff(b"{}"), None);
    assert_eq!(FileFormat::sniff(b""), None);
}

#[test]
fn the_command_line_is_consistent() {
    use clap::CommandFactory as _;
    Cli::command().debug_assert();
}
