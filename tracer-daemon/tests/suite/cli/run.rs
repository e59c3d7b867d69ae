//! `tracer run -- keep`: the program's allocations, peak and what it still
//! held at exit (its leaks), read from tracerd's record of the ended
//! process, at its exact lines; tracer exits with the program's status.

use std::time::Duration;

use super::{KEEP_BLOCKS, KEEP_BYTES, Started, tracer};
use crate::suite::support::{Program, Tracerd};

#[test]
fn tracer_run_prints_the_bytes_and_blocks_a_program_still_held_at_exit() {
    let keep = Program::build("keep", &[]);
    let tracerd = Tracerd::start(&[]);
    let exe = keep.exe.to_str().expect("utf-8 path");
    // keep.c waits for two "go" lines: the first lets it allocate, the
    // second lets it return from main holding everything.
    let ran = Started::spawn(
        &mut tracer(&tracerd, &["run", "--bytes", "--limit", "2", "--", exe]),
        b"go\ngo\n",
    )
    .wait(Duration::from_secs(120));
    assert_eq!(ran.status.code(), Some(0), "{}", ran.stderr);
    let src = keep.src();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(
        lines[..2],
        ["ready", "done"],
        "the program's own output first"
    );
    let pid = lines[2]
        .strip_prefix(&format!("tracer: {exe} (pid "))
        .and_then(|rest| rest.strip_suffix(") exited with status 0"))
        .unwrap_or_else(|| panic!("{}", ran.stdout));
    assert_eq!(
        lines[3..6],
        [
            format!("  allocations: {KEEP_BLOCKS}, frees: 0, peak: {KEEP_BYTES}"),
            format!("  still held at exit (leaks): {KEEP_BYTES} in {KEEP_BLOCKS} blocks"),
            "  where it was held, by lineno (2 of 3):".to_string(),
        ],
        "{}",
        ran.stdout
    );
    let rows: Vec<Vec<&str>> = lines[6..]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let site = format!("{src}:{}", keep.line("ALLOC_SITE"));
    let calloc = format!("{src}:{}", keep.line("calloc(20000"));
    assert_eq!(
        rows,
        [
            vec!["SIZE", "BLOCKS", "AVERAGE", "WHERE"],
            vec!["5120000", "20000", "256", site.as_str()],
            vec!["160000", "1", "160000", calloc.as_str()],
        ],
        "{}",
        ran.stdout
    );
    // tracerd's own record of the ended process says the same.
    let record = tracerd.get_ok(&format!("/pid/{pid}"));
    assert_eq!(
        (&record["state"], &record["current"], &record["blocks"]),
        (
            &serde_json::json!("exited"),
            &serde_json::json!(KEEP_BYTES),
            &serde_json::json!(KEEP_BLOCKS)
        )
    );
}

#[test]
fn tracer_run_exits_with_the_programs_status() {
    let tracerd = Tracerd::start(&[]);
    let ran = Started::spawn(
        &mut tracer(&tracerd, &["run", "--", "sh", "-c", "exit 7"]),
        b"",
    )
    .wait(Duration::from_secs(120));
    assert_eq!(ran.status.code(), Some(7), "{}", ran.stderr);
    assert!(
        ran.stdout.contains(") exited with status 7\n"),
        "{}",
        ran.stdout
    );
}
