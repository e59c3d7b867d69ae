//! Anonymous mappings as blocks of source `mmap` (`trace_mmap`, on by
//! default): exact sizes at each line after partial unmaps, a hole, an
//! `mremap`, a `MAP_FIXED` replacement and with 200 held at once; the
//! mappings that are not counted; and glibc's own mapping for a large `malloc`, counted once, as
//! glibc's.

use std::path::Path;

use serde_json::Value;

use super::allocators::{by_source, expect};
use crate::suite::{
    support::{Fixture, Program, Tracerd, fixture_path},
    unwind::wait_unwinder,
};

const PAGE: i64 = 4096;

#[test]
fn anonymous_mappings_are_blocks_split_and_moved_as_the_program_unmaps_and_remaps() {
    let tracerd = Tracerd::start(&[]);
    let prog = Program::build("mappings", &[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    let pid = fx.pid();
    // Mappings are recorded once the unwinder has the process's tables
    // (before, a frame-pointer walk from inside the C library's system call
    // wrapper would skip its caller).
    wait_unwinder(&tracerd, pid);
    fx.step("mapped");
    let stats = |query: &str| -> Value {
        tracerd.get_ok(&format!(
            "/pid/{pid}/statistics?group_by=lineno&limit=0{query}"
        ))["statistics"]
            .clone()
    };
    let mapped = [
        // 5 pages less the first and the last.
        ("MAP_A", 1, 3 * PAGE),
        // 8 pages less a hole of 2: two blocks.
        ("MAP_B", 2, 6 * PAGE),
        // Moved by mremap, whose block it is now: 6 pages less the last,
        // which a MAP_FIXED mapping replaced.
        ("MAP_C", 0, 0),
        ("REMAP_C", 1, 5 * PAGE),
        ("MAP_D", 0, 0),
        ("MAP_NONE", 0, 0),
        ("MAP_STACK_", 0, 0),
        ("MAP_FIXED_C", 0, 0),
        // 200 of 2 pages, every other one unmapped.
        ("MAP_MANY", 100, 100 * 2 * PAGE),
    ];
    let all = stats("");
    expect(&prog, &all, "mapped", &mapped);
    expect(
        &prog,
        &all,
        "mapped",
        &[("MAP_FIRST", 1, 100), ("MAP_MALLOC", 1, 1 << 20)],
    );
    // Only the mappings: exactly their four lines.
    let only = stats("&allocator=mmap");
    assert_eq!(only.as_array().map(Vec::len), Some(4), "{only}");
    expect(&prog, &only, "allocator=mmap", &mapped);
    // The large malloc is glibc's alone, though glibc mapped it.
    let glibc = stats("&allocator=glibc");
    expect(
        &prog,
        &glibc,
        "allocator=glibc",
        &[("MAP_MALLOC", 1, 1 << 20)],
    );
    expect(&prog, &glibc, "allocator=glibc", &[("MAP_A", 0, 0)]);
    let traces = tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0&allocator=mmap"));
    let mut sizes: Vec<i64> = traces["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .map(|t| {
            assert_eq!(t["source"], "mmap", "{t}");
            t["size"].as_i64().expect("size")
        })
        .collect();
    sizes.sort_unstable();
    let mut want = vec![2 * PAGE; 100];
    want.extend([3 * PAGE, 3 * PAGE, 3 * PAGE, 5 * PAGE]);
    assert_eq!(sizes, want);
    // Current: what is mapped now; peak: once the 200 were mapped (a's 3
    // pages, b's 6, c's 5 and 400).
    let mmap_totals = |tracerd: &Tracerd| {
        by_source(tracerd, pid)
            .into_iter()
            .find(|(name, _, _)| name == "mmap")
            .map(|(_, current, peak)| (current, peak))
    };
    assert_eq!(mmap_totals(&tracerd), Some((214 * PAGE, 414 * PAGE)));
    let memory = tracerd.get_ok(&format!("/pid/{pid}/traced-memory"));
    let sum: i64 = by_source(&tracerd, pid).iter().map(|(_, c, _)| c).sum();
    assert_eq!(Some(sum), memory["current"].as_i64(), "{memory}");

    fx.step("unmapped");
    let unmapped: Vec<(&str, i64, i64)> = mapped.iter().map(|&(m, _, _)| (m, 0, 0)).collect();
    expect(&prog, &stats(""), "unmapped", &unmapped);
    assert_eq!(stats("&allocator=mmap"), serde_json::json!([]));
    assert_eq!(mmap_totals(&tracerd), Some((0, 414 * PAGE)));
    assert_eq!(tracerd.counter("drop_mmap_regions"), 0);
    fx.end();
}

/// The `mmap` source's current bytes of `pid` (0 when it has none).
fn mmap_current(tracerd: &Tracerd, pid: u32) -> i64 {
    by_source(tracerd, pid)
        .into_iter()
        .find(|(name, _, _)| name == "mmap")
        .map_or(0, |(_, current, _)| current)
}

/// "arenas N SIZE" of `fixtures/pymalloc_arenas.py`: CPython's own count of
/// the arenas it holds and their size.
fn arenas(fx: &mut Fixture) -> (i64, i64) {
    let line = fx.read_line();
    let fields: Vec<i64> = line
        .strip_prefix("arenas ")
        .unwrap_or_else(|| panic!("not an arenas line: {line}"))
        .split(' ')
        .map(|f| f.parse().expect("a number"))
        .collect();
    (fields[0], fields[1])
}

#[test]
fn debian_python_s_pymalloc_arenas_are_its_mmap_blocks_as_cpython_counts_them() {
    python_arenas("300000", 10);
}

#[test]
fn a_python_holding_far_more_than_256_arenas_keeps_every_one_as_a_block() {
    // 6,000,000 strings: more than 300 arenas of 1 MiB, past the 256
    // mappings a process could hold before, none lost.
    python_arenas("6000000", 300);
}

/// Debian's python3 (no frame pointers) with its default allocator keeping
/// `strings` small strings: pymalloc maps an arena for small objects,
/// outside any malloc call. Its growth in mmap bytes is exactly the arenas
/// CPython says it added (at least `at_least`), each a block, none dropped.
fn python_arenas(strings: &str, at_least: i64) {
    let tracerd = Tracerd::start(&[]);
    let script = fixture_path("pymalloc_arenas.py");
    let script = script.to_str().expect("utf-8");
    let mut fx = Fixture::spawn(Path::new("/usr/bin/python3"), &[script, strings]);
    fx.expect_line("ready");
    let (before, size) = arenas(&mut fx);
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    wait_unwinder(&tracerd, pid);
    let base = mmap_current(&tracerd, pid);
    fx.go();
    fx.expect_line("done");
    let (after, size_after) = arenas(&mut fx);
    assert_eq!(size, size_after);
    assert!(after - before >= at_least, "{before} -> {after} arenas");
    let grown = mmap_current(&tracerd, pid) - base;
    assert_eq!(
        grown,
        (after - before) * size,
        "{before} -> {after} arenas of {size} bytes"
    );
    // Each arena is one block of the arena's size.
    let traces = tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0&allocator=mmap"));
    let arenas_traced = traces["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .filter(|t| t["size"].as_i64() == Some(size))
        .count();
    assert!(arenas_traced as i64 >= after - before, "{traces}");
    assert_eq!(tracerd.counter("drop_mmap_regions"), 0);
    assert_eq!(tracerd.get_ok(&format!("/pid/{pid}"))["drops"], 0);
    fx.end();
}
