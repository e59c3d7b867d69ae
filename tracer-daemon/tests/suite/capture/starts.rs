//! Starts: a program that starts in scope is traced from its first
//! allocation, its constructors' included, because tracerd holds its exec
//! until its probes are in place (`hold_exec`): in a scoped tracerd, which
//! registers probes per process, and for a program whose allocator is new
//! to tracerd (a static binary, musl's loader).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::allocators::{expect, family_of};
use crate::suite::support::{Program, TempDir, Tracerd, poll};

/// The sites of `fixtures/starts.c` at its end: the blocks it keeps (the
/// one it frees is gone).
const STARTS: &[(&str, i64, i64)] = &[
    ("STARTS_CTOR", 3, 300),
    ("STARTS_MAIN", 5, 1000),
    ("STARTS_FREED", 0, 0),
];

/// Runs `exe` to its end (about 50 ms) and returns its pid.
fn run(exe: &Path) -> u32 {
    let mut child = Command::new(exe).spawn().expect("spawn");
    let pid = child.id();
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    pid
}

/// The statistics by line of `pid`'s ended image, and its process entry.
fn ended(tracerd: &Tracerd, pid: u32) -> (Value, Value) {
    poll(Duration::from_secs(10), Duration::from_millis(20), || {
        let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
        if status == 200 && body["process"]["state"] == "exited" {
            Ok((
                body["statistics"].clone(),
                tracerd.get_ok(&format!("/pid/{pid}")),
            ))
        } else {
            Err(format!("{status} {body}"))
        }
    })
}

#[test]
fn a_scoped_program_started_100_times_is_traced_from_its_first_allocation_every_time() {
    let prog = Program::build("starts", &[]);
    // Scoped by a path through a symlinked directory: matched as the file
    // it names.
    let links = TempDir::new("starts-link");
    let dir = prog.exe.parent().expect("the program's directory");
    std::os::unix::fs::symlink(dir, links.path().join("bin")).expect("symlink");
    let named = links.path().join("bin").join("starts");
    let tracerd = Tracerd::start(&["--scope-exe", named.to_str().expect("utf-8")]);
    let scope = tracerd.get_ok("/scope");
    assert_eq!(scope["filtered"], true, "{scope}");
    assert_eq!(scope["all_processes"], false, "{scope}");
    let allocs = tracerd.counter("allocs");
    let pids: Vec<u32> = (0..100).map(|_| run(&prog.exe)).collect();
    // Another program, out of scope, allocates 1000 blocks meanwhile:
    // none is recorded.
    let other = Program::build("exits", &[]);
    let mut out = Command::new(&other.exe).arg("1000").spawn().expect("spawn");
    let out_pid = out.id();
    assert!(out.wait().expect("wait").success());
    let mut totals = BTreeSet::new();
    for &pid in &pids {
        let (stats, process) = ended(&tracerd, pid);
        expect(&prog, &stats, &format!("run of pid {pid}"), STARTS);
        totals.insert((process["allocs"].as_u64(), process["frees"].as_u64()));
    }
    // The C library's own allocations at start come first: every run
    // counts the same, and nothing else was recorded on the host.
    assert_eq!(totals.len(), 1, "the runs' allocs and frees: {totals:?}");
    let per_run = totals
        .first()
        .and_then(|(allocs, _)| *allocs)
        .expect("allocs");
    assert_eq!(tracerd.counter("allocs") - allocs, 100 * per_run);
    let (status, body) = tracerd.get(&format!("/pid/{out_pid}"));
    assert_eq!(status, 404, "{body}");
}

#[test]
fn programs_whose_allocator_is_new_to_tracerd_are_traced_from_their_first_allocation() {
    let tracerd = Tracerd::start(&[]);
    for (compiler, flags, family) in [
        ("cc", &["-static"][..], "glibc"),
        ("musl-gcc", &[][..], "musl"),
        ("musl-gcc", &["-static"][..], "musl"),
    ] {
        let what = format!("{compiler} {flags:?}");
        let prog = Program::build_with(compiler, "starts.c", flags);
        // The object that defines its allocator: the static executable
        // itself, or musl's libc.so, which is also its dynamic loader.
        let object = if flags.is_empty() {
            PathBuf::from("/lib/ld-musl-x86_64.so.1")
        } else {
            prog.exe.clone()
        };
        assert_eq!(
            family_of(&tracerd, &object),
            None,
            "{what}: probed before it ran"
        );
        let pid = run(&prog.exe);
        let (stats, _) = ended(&tracerd, pid);
        expect(&prog, &stats, &what, STARTS);
        assert_eq!(
            family_of(&tracerd, &object).as_deref(),
            Some(family),
            "{what}"
        );
    }
}
