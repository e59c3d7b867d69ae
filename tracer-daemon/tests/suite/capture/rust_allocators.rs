//! Rust programs on a crate's global allocator: the fixture
//! crate `fixtures/rust_allocators` built as a user builds a release
//! (`cargo build --release`, debug info, rustc's default frame-pointer
//! settings) with tikv-jemallocator (jemalloc linked into the executable,
//! `_rjem_*`) or the mimalloc crate (`mi_*`). The probed object is then the
//! executable itself. Each block is recorded once, with its exact size, at
//! the user's line in `main.rs`: the shim frames between it and the
//! allocator (`__rust_alloc`, `<Jemalloc as GlobalAlloc>::alloc`,
//! `alloc::raw_vec::*` ...) are dropped by the default `allocator_frames`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use serde_json::Value;

use super::allocators::{by_source, expect_at, family_of, wait_probed};
use crate::suite::{
    support::{Fixture, Tracerd, fixture_path, line_of, output_ok},
    unwind::wait_unwinder,
};

/// The fixture crate's directory, `tests/fixtures/rust_allocators`.
fn crate_dir() -> PathBuf {
    fixture_path("rust_allocators")
}

/// The fixture's source: the file its frames name (DWARF's compilation
/// directory, the crate's, joined with `src/main.rs`).
fn source() -> PathBuf {
    crate_dir().join("src/main.rs")
}

/// Builds the fixture with `--features {feature}`
/// ([`tracer_testkit::rust_fixture_build`]: `cargo build --release
/// --locked`, its own Cargo.lock) into a target directory of its own under
/// this test binary's scratch directory (`CARGO_TARGET_TMPDIR`), which is
/// kept between runs: jemalloc's C build takes about a minute the first
/// time, later runs only check that nothing changed. `cargo xtask test`
/// runs the same command for each feature in the background at its
/// start, so a whole run finds it built or waits on cargo's lock. Returns
/// the executable.
fn build(feature: &str) -> PathBuf {
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    output_ok(Command::new(cargo).args(tracer_testkit::rust_fixture_build(
        &crate_dir().join("Cargo.toml"),
        scratch,
        feature,
    )));
    eprintln!(
        "rust_allocators --features {feature}: built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    scratch.join(format!("rust_allocators-{feature}/release/rust_allocators"))
}

/// Each `(marker, count, size)` of `fixtures/rust_allocators/src/main.rs`
/// after "go": the `count` and `size` of the statistic at the marker's
/// line (none at all for 0 and 0).
const SITES: &[(&str, i64, i64)] = &[
    // 100 zeroed boxed slices of 3000 bytes, every other one dropped.
    ("RS_BOX", 50, 50 * 3000),
    // 80 Vec<u64> of capacity 400, every other one dropped.
    ("RS_WORDS", 40, 40 * 3200),
    // 30 Vec<u8> of 3300 bytes, each reallocated to 7000 by
    // reserve_exact: the blocks are the realloc's.
    ("RS_GROW_FROM", 0, 0),
    ("RS_GROW_TO", 30, 30 * 7000),
    // 60 Box<[u8; 3400]>, every other one dropped.
    ("RS_ARRAY", 30, 30 * 3400),
    // 40 boxes of a 64-byte aligned 3584-byte struct, every other one
    // dropped.
    ("RS_ALIGNED", 20, 20 * 3584),
    // 20 vec![Rgba(..); 950] of a user's 4-byte Clone type, every other
    // one dropped.
    ("RS_PIXELS", 10, 10 * 3800),
    // 25 strings of capacity 3900, all dropped.
    ("RS_TEMP", 0, 0),
];

/// Asserts [`SITES`] in `stats` (by line).
fn expect(stats: &Value, what: &str) {
    let src = source();
    let text = std::fs::read_to_string(&src).expect("read the fixture's source");
    expect_at(stats, &src, |marker| line_of(&text, marker), what, SITES);
}

/// Builds the fixture with `feature`, runs it under tracerd once the
/// executable is probed and the unwinder has its tables, and asserts every
/// site and the executable's allocator family in `/health`.
fn traced_exactly(feature: &str, family: &str) {
    // Built before tracerd starts: the build's own processes untraced.
    let exe = build(feature);
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn_ready(&exe, &[]);
    let pid = fx.pid();
    wait_probed(&tracerd, &exe);
    // tracerd knows the process from its first allocation (the runtime's,
    // before "ready") and compiles the unwinder's tables of its mappings
    // then; until they are in, a stack is walked by frame pointers, which
    // a release build omits: a realloc's traceback would end at alloc's
    // out-of-line finish_grow, short of the user's line.
    wait_unwinder(&tracerd, pid);
    fx.step("done");
    let stats =
        tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"))["statistics"]
            .clone();
    expect(&stats, feature);
    assert_eq!(
        family_of(&tracerd, &exe).as_deref(),
        Some(family),
        "{feature}: the executable's family"
    );
    // Every block held now is its allocator's. (glibc's malloc served
    // libc's own allocations at start, all freed since: its current is 0,
    // its peak not.)
    let memory = tracerd.get_ok(&format!("/pid/{pid}/traced-memory"));
    let current = memory["current"].as_i64().expect("current");
    let sources: Vec<(String, i64)> = by_source(&tracerd, pid)
        .into_iter()
        .filter(|(_, current, _)| *current != 0)
        .map(|(name, current, _)| (name, current))
        .collect();
    assert_eq!(
        sources,
        [(family.to_string(), current)],
        "{feature}: {memory}"
    );
    fx.end();
}

#[test]
fn rust_on_tikv_jemallocator_is_traced_exactly_at_the_users_lines() {
    traced_exactly("jemalloc", "jemalloc");
}

#[test]
fn rust_on_the_mimalloc_crate_is_traced_exactly_at_the_users_lines() {
    traced_exactly("mimalloc", "mimalloc");
}
