//! PostgreSQL 15 (Debian's: stripped, no frame pointers, its exported
//! functions named by `.dynsym`, its memory contexts' methods static): a
//! backend forked by the postmaster for a `pgbench -c 2 -T 5` client, after
//! `pgbench -i -s 1`, read while it is frozen in the middle of the run.

use std::{process::Child, time::Duration};

use super::{
    NFRAME, assert_frame_0_is_the_wrappers_caller, assert_groups_are_traces_grouped,
    assert_no_cut_walk, settle_within,
};
use crate::suite::support::{Frozen, Postgres, Tracerd, kill_if_running, output_ok, poll};

/// PostgreSQL's allocation layer (palloc, the memory contexts): its
/// patterns among tracerd's default `allocator_frames`.
const ALLOCATOR_FRAMES: [&str; 12] = [
    "palloc",
    "palloc0",
    "palloc_*",
    "palloc0_*",
    "repalloc",
    "repalloc_*",
    "MemoryContextAlloc*",
    "MemoryContextStrdup",
    "pstrdup",
    "pnstrdup",
    "psprintf",
    "AllocSetContextCreate*",
];

/// `pgbench -c 2 -T 5`, killed by pid on drop.
struct Bench(Child);

impl Drop for Bench {
    fn drop(&mut self) {
        kill_if_running(&mut self.0);
    }
}

/// tracerd (nframe 64), a cluster initialized by `pgbench -i -s 1`, then
/// `pgbench -c 2 -T 5`: calls `judge` with a backend of that run, traced
/// with its unwind tables, two seconds into it, frozen.
fn with_a_backend(judge: impl FnOnce(&Tracerd, u32)) {
    let tracerd = Tracerd::shared(&["--nframe", NFRAME]);
    let postgres = Postgres::start();
    output_ok(&mut postgres.pgbench(&["-i", "-s", "1"]));
    let mut bench = Bench(
        postgres
            .pgbench(&["-c", "2", "-T", "5"])
            .spawn()
            .expect("spawn pgbench"),
    );
    // pgbench's first connection (its checks) ends at once, and may still
    // live beside the run's first: a backend of the run is the newest of
    // two that live at the same time.
    let backend = poll(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match postgres.backends()[..] {
            [_, .., newest] => Ok(newest),
            _ => Err("no two backends serve pgbench".to_string()),
        },
    );
    tracerd.wait_traced(backend);
    // A backend lives as long as pgbench's 5 s: the unwinder may have it
    // within 2 s (its blocks must be whole either way).
    settle_within(&tracerd, backend, Duration::from_secs(2));
    std::thread::sleep(Duration::from_millis(500));
    {
        let _frozen = Frozen::new(backend);
        judge(&tracerd, backend);
    }
    let (ok, stderr) = finish(&mut bench.0);
    assert!(ok, "pgbench failed: {stderr}");
}

/// Waits for `child`, whose stderr is a pipe; returns (exited 0, its
/// stderr).
fn finish(child: &mut Child) -> (bool, String) {
    let mut text = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
    }
    let ok = child.wait().is_ok_and(|s| s.success());
    (ok, text)
}

#[test]
fn no_block_of_a_postgres_backend_has_a_cut_traceback() {
    with_a_backend(assert_no_cut_walk);
}

#[test]
fn a_postgres_backends_groups_by_traceback_are_its_traces_grouped() {
    with_a_backend(|tracerd, backend| {
        let groups = assert_groups_are_traces_grouped(tracerd, backend);
        eprintln!("backend {backend}: {} groups by traceback", groups.len());
    });
}

#[test]
fn frame_0_of_a_postgres_backends_blocks_is_the_caller_of_palloc() {
    with_a_backend(|tracerd, backend| {
        assert_frame_0_is_the_wrappers_caller(tracerd, backend, &ALLOCATOR_FRAMES, 20);
    });
}
