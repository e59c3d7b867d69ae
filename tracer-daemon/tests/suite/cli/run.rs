//! `tracer run`: the program's allocations, peak and what it still held at
//! exit (its leaks), read from tracerd's records of the ended processes, at
//! their exact lines; the whole tree the command started (a shell's
//! commands, forks without exec, grandchildren, orphans that outlive it);
//! and tracer's exit status is always the command's.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{KEEP_BLOCKS, KEEP_BYTES, Ran, Started, finish, tracer};
use crate::suite::support::{Program, TempDir, Tracerd, signal};

#[test]
fn tracer_run_prints_the_bytes_and_blocks_a_program_still_held_at_exit() {
    let keep = Program::build("keep", &[]);
    let tracerd = Tracerd::shared(&[]);
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
            format!("  {KEEP_BLOCKS} allocations, 0 frees, peak {KEEP_BYTES}"),
            format!("  still held at exit (leaks): {KEEP_BYTES} in {KEEP_BLOCKS} blocks"),
            "  where it was held, by lineno (2 of 4):".to_string(),
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
fn tracer_run_exits_with_the_commands_status_or_128_plus_its_signal() {
    let tracerd = Tracerd::shared(&[]);
    for (script, code, said) in [
        ("exit 3", 3, ") exited with status 3\n"),
        ("kill -TERM $$", 143, ") was killed by signal 15\n"),
    ] {
        let ran = finish(&mut tracer(&tracerd, &["run", "--", "sh", "-c", script]));
        assert_eq!(ran.status.code(), Some(code), "{script}: {}", ran.stderr);
        assert!(
            ran.stdout.starts_with("tracer: sh (pid ") && ran.stdout.contains(said),
            "{script}: {}",
            ran.stdout
        );
    }
}

#[test]
fn tracer_run_keeps_the_commands_status_when_tracerd_is_gone_before_the_report() {
    let mut tracerd = Tracerd::start(&[]);
    // The command ends once tracerd is gone.
    let script = format!(
        "while kill -0 {} 2>/dev/null; do sleep 0.05; done; exit 4",
        tracerd.pid()
    );
    let started = Started::spawn(
        &mut tracer(&tracerd, &["run", "--", "sh", "-c", &script]),
        b"",
    );
    // tracer asks tracerd's health before it starts the command: wait for
    // the command, then stop tracerd.
    let tracer_pid = started.child.id();
    let start = Instant::now();
    while std::fs::read_to_string(format!("/proc/{tracer_pid}/task/{tracer_pid}/children"))
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no command started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    tracerd.kill9();
    let ran = started.wait(Duration::from_secs(60));
    assert_eq!(ran.status.code(), Some(4), "{}", ran.stderr);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    assert!(
        ran.stderr.starts_with("tracer: no report of sh (pid ")
            && ran.stderr.contains("tracerd is not running on"),
        "{}",
        ran.stderr
    );
}

/// `tracer run -- gzip`, as a user reported it: gzip maps the probed glibc and
/// never calls malloc. Its report is a normal one with zeros, never another
/// process's object, and tracer exits with gzip's status. tracerd keeps a
/// record of a process that never allocated only once it makes an image at
/// every exec (the kernel side's exec event):
/// until then this test fails on "0 allocations" (tracer says tracerd has
/// no record of it).
#[test]
fn tracer_run_of_a_program_that_never_allocates_reports_zero_allocations() {
    let dir = TempDir::new("gzip-input");
    let file = dir.path().join("big.txt");
    std::fs::write(&file, "tracer run gzip\n".repeat(50_000)).expect("write the input");
    let tracerd = Tracerd::shared(&[]);
    let ran = finish(&mut tracer(
        &tracerd,
        &[
            "run",
            "--",
            "gzip",
            "-9",
            "-c",
            file.to_str().expect("utf-8"),
        ],
    ));
    assert_eq!(ran.status.code(), Some(0), "{}", ran.stderr);
    let report = ran
        .stdout
        .split_once("tracer: gzip (pid ")
        .map(|(_, report)| report)
        .unwrap_or_else(|| panic!("no report: {}", ran.stderr));
    assert!(!report.contains("memfd") && !ran.stderr.contains("memfd"));
    let lines: Vec<&str> = report.lines().collect();
    assert!(lines[0].ends_with(") exited with status 0"), "{report}");
    assert_eq!(
        lines[1..],
        [
            "  0 allocations, 0 frees, peak 0 B",
            "  still held at exit (leaks): 0 B in 0 blocks"
        ],
        "{report}"
    );
}

/// The rows of `tracer run --bytes`'s table of a tree, each split at its
/// whitespace: PID, PPID, COMMAND, STATE, ALLOCATIONS, FREES, PEAK, HELD,
/// BLOCKS, then the NOTE's words.
fn tree_rows(ran: &Ran) -> Vec<Vec<String>> {
    let lines: Vec<&str> = ran.stdout.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.split_whitespace().take(3).eq(["PID", "PPID", "COMMAND"]))
        .unwrap_or_else(|| panic!("no table of processes: {}\n{}", ran.stdout, ran.stderr));
    lines[start + 1..]
        .iter()
        .take_while(|l| !l.starts_with("  together:"))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The rows of `tracer run`'s lines of process `pid` (its section's table
/// without the header), each split at its whitespace.
fn section(ran: &Ran, pid: &str) -> Vec<Vec<String>> {
    let lines: Vec<&str> = ran.stdout.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&format!("  pid {pid} (")))
        .unwrap_or_else(|| panic!("no lines of pid {pid}: {}", ran.stdout));
    lines[start + 2..]
        .iter()
        .take_while(|l| !l.starts_with("  pid "))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The pid in the first line, `tracer: CMD (pid N) ...`.
fn root_pid(ran: &Ran) -> String {
    ran.stdout
        .split_once("(pid ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(pid, _)| pid.to_string())
        .unwrap_or_else(|| panic!("no pid: {}", ran.stdout))
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn tracer_run_of_a_shell_lists_both_programs_it_ran_with_their_exact_counts_and_leaks() {
    shell_tree_is_exact(&[]);
}

/// tracerd's default traces on demand: `tracer run` asks it to trace its
/// tree exactly (`tracing/start?descendants=true`) and the counts are
/// the same, from each program's first allocation; at the end it lets
/// the tree go.
#[test]
fn tracer_run_traces_its_tree_exactly_under_the_default_exact_on_demand() {
    let tracerd = shell_tree_is_exact(&["--exact", "demand"]);
    let scope = tracerd.get_ok("/scope");
    assert_eq!(scope["exact"], "demand", "{scope}");
    assert_eq!(scope["on_demand"], serde_json::json!([]), "let go: {scope}");
    assert_eq!(scope["filtered"], false, "{scope}");
}

/// Runs a shell of two programs under `tracer run` with a tracerd started
/// with `extra`, and checks each program's exact counts and leaks.
fn shell_tree_is_exact(extra: &[&str]) -> crate::suite::support::SharedTracerd {
    let starts = Program::build("starts", &[]);
    let exits = Program::build("exits", &[]);
    let tracerd = Tracerd::shared(extra);
    let script = format!("{}; {} 7", starts.exe.display(), exits.exe.display());
    let ran = finish(&mut tracer(
        &tracerd,
        &["run", "--bytes", "--", "sh", "-c", &script],
    ));
    assert_eq!(ran.status.code(), Some(0), "{}", ran.stderr);
    let root = root_pid(&ran);
    let rows = tree_rows(&ran);
    let of = |comm: &str| -> Vec<&Vec<String>> { rows.iter().filter(|r| r[2] == comm).collect() };
    // The shell itself, first; a child it forked shows as `sh` too if it
    // allocated before its exec (an image of its own, `exec`).
    assert_eq!(
        (&rows[0][0], &rows[0][2]),
        (&root, &"sh".to_string()),
        "{}",
        ran.stdout
    );
    assert!(
        of("sh")
            .iter()
            .skip(1)
            .all(|r| r[3] == "exec" && r[1] == root),
        "{}",
        ran.stdout
    );
    // starts: 3 blocks of 100 bytes and 5 of 200 held, one of 50 freed.
    let [started] = of("starts")[..] else {
        panic!("starts listed once: {}", ran.stdout)
    };
    assert_eq!(started[1], root, "the shell's child: {}", ran.stdout);
    assert_eq!(
        started[3..9],
        strings(&["exited", "9", "1", "1350", "1300", "8"]),
        "{}",
        ran.stdout
    );
    let [exited] = of("exits")[..] else {
        panic!("exits listed once: {}", ran.stdout)
    };
    assert!(
        exited[0] == root || exited[1] == root,
        "the shell's, or the shell after its exec: {}",
        ran.stdout
    );
    assert_eq!(
        exited[3..9],
        strings(&["exited", "7", "0", "700", "700", "7"]),
        "{}",
        ran.stdout
    );
    // Where each held its blocks at exit, at its own lines.
    let at =
        |program: &Program, marker: &str| format!("{}:{}", program.src(), program.line(marker));
    assert_eq!(
        section(&ran, &started[0]),
        [
            strings(&["1000", "5", "200", &at(&starts, "STARTS_MAIN */")]),
            strings(&["300", "3", "100", &at(&starts, "STARTS_CTOR */")]),
        ],
        "{}",
        ran.stdout
    );
    assert_eq!(
        section(&ran, &exited[0]),
        [strings(&["700", "7", "100", &at(&exits, "EXIT_ALLOC")])],
        "{}",
        ran.stdout
    );
    tracerd
}

#[test]
fn tracer_run_follows_forks_without_exec_and_their_children() {
    let tree = Program::build("forktree", &[]);
    let tracerd = Tracerd::shared(&[]);
    let exe = tree.exe.to_str().expect("utf-8");
    let ran = finish(&mut tracer(
        &tracerd,
        &["run", "--bytes", "--", exe, "wait"],
    ));
    assert_eq!(ran.status.code(), Some(0), "{}", ran.stderr);
    let root = root_pid(&ran);
    let rows = tree_rows(&ran);
    assert_eq!(rows.len(), 3, "{}", ran.stdout);
    let (child, grandchild) = (rows[1][0].clone(), rows[2][0].clone());
    assert_eq!(
        rows.iter().map(|r| r[1..9].to_vec()).collect::<Vec<_>>(),
        [
            strings(&[
                &ran_pid(&ran),
                "forktree",
                "exited",
                "2",
                "0",
                "200",
                "200",
                "2"
            ]),
            strings(&[&root, "forktree", "exited", "3", "0", "600", "600", "3"]),
            strings(&[&child, "forktree", "exited", "4", "0", "1200", "1200", "4"]),
        ],
        "{}",
        ran.stdout
    );
    // Indented by depth.
    let column = |pid: &str| {
        ran.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(pid))
            .and_then(|l| l.find("forktree"))
            .expect("a row")
    };
    assert_eq!(
        (
            column(&child) - column(&root),
            column(&grandchild) - column(&root)
        ),
        (2, 4),
        "{}",
        ran.stdout
    );
    let at = |marker: &str| format!("{}:{}", tree.src(), tree.line(marker));
    for (pid, size, count, marker) in [
        (&root, "200", "2", "TREE_PARENT"),
        (&child, "600", "3", "TREE_CHILD"),
        (&grandchild, "1200", "4", "TREE_GRANDCHILD"),
    ] {
        assert_eq!(
            section(&ran, pid)[0][..2],
            strings(&[size, count]),
            "{}",
            ran.stdout
        );
        assert_eq!(section(&ran, pid)[0][3], at(marker), "{}", ran.stdout);
    }
}

/// tracer's own pid, as the PPID of what it adopted: the parent of the
/// command (the root's PPID).
fn ran_pid(ran: &Ran) -> String {
    tree_rows(ran)[0][1].clone()
}

/// Kills, on drop, every process running `exe` (an orphan the test's
/// command left, which no child handle reaches).
struct KillRunning(PathBuf);

impl Drop for KillRunning {
    fn drop(&mut self) {
        for pid in running(&self.0) {
            signal(pid, "KILL");
        }
    }
}

fn running(exe: &Path) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe))
        .collect()
}

/// The tree `tracer run` printed of forktree's `orphan`: the command, its
/// child and its grandchild (of state `state`), with their blocks, under
/// one another and none adopted; the grandchild's pid.
fn assert_orphan_tree(ran: &Ran, state: &str) -> String {
    let (root, tracer_pid) = (root_pid(ran), ran_pid(ran));
    let rows = tree_rows(ran);
    assert_eq!(rows.len(), 3, "{}", ran.stdout);
    let (child, grandchild) = (rows[1][0].clone(), rows[2][0].clone());
    assert_eq!(
        rows,
        [
            strings(&[
                &root,
                &tracer_pid,
                "forktree",
                "exited",
                "2",
                "0",
                "200",
                "200",
                "2"
            ]),
            strings(&[
                &child, &root, "forktree", "exited", "3", "0", "600", "600", "3"
            ]),
            strings(&[
                &grandchild,
                &child,
                "forktree",
                state,
                "4",
                "0",
                "1200",
                "1200",
                "4"
            ]),
        ],
        "{}",
        ran.stdout
    );
    assert!(!ran.stdout.contains("adopted"), "{}", ran.stdout);
    grandchild
}

#[test]
fn tracer_run_waits_for_an_orphan_that_outlives_the_command_up_to_its_bound() {
    let tree = Program::build("forktree", &[]);
    let _orphans = KillRunning(tree.exe.clone());
    let tracerd = Tracerd::shared(&[]);
    let exe = tree.exe.to_str().expect("utf-8");

    // The grandchild's parent exits at once, and main only waits for that
    // parent: tracer, reaper of the command's orphans, waits for the
    // grandchild (300 ms after the command ended). tracerd knows each
    // process from its fork, its parent from the kernel's fork event, so
    // the tree is whole: the middle child under the command, the
    // grandchild under the middle child (no one adopted), each with its
    // blocks.
    let start = Instant::now();
    let ran = finish(&mut tracer(
        &tracerd,
        &["run", "--bytes", "--", exe, "orphan", "100"],
    ));
    assert_eq!(ran.status.code(), Some(0), "{}", ran.stderr);
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(running(&tree.exe), [0u32; 0], "the grandchild ended first");
    let grandchild = assert_orphan_tree(&ran, "exited");
    assert_eq!(
        section(&ran, &grandchild)[0][..2],
        strings(&["1200", "4"]),
        "{}",
        ran.stdout
    );

    // One that lives on: shown as it is after the bound, left running.
    let start = Instant::now();
    let ran = finish(&mut tracer(
        &tracerd,
        &[
            "run",
            "--bytes",
            "--wait-descendants",
            "1",
            "--",
            exe,
            "orphan",
            "60000",
        ],
    ));
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(ran.status.code(), Some(0), "{}", ran.stderr);
    let grandchild = assert_orphan_tree(&ran, "running");
    let orphan: u32 = grandchild.parse().expect("a pid");
    assert!(
        ran.stderr.contains(&format!(
            "(pid {orphan}) still running 1 s after {exe} ended"
        )),
        "{}",
        ran.stderr
    );
    assert_eq!(running(&tree.exe), [orphan], "left running");
    assert!(
        section(&ran, &orphan.to_string())[0][..2] == strings(&["1200", "4"]),
        "{}",
        ran.stdout
    );
}
