//! The unwinder, judged by gdb: fixtures built as distributions build
//! (`-O2`, no frame pointers), a shared library among them, run once under
//! gdb (a breakpoint at `malloc` for each fixture size prints `bt`) and once
//! under tracerd; each block's traceback must be gdb's backtrace after the
//! allocation machinery: the same functions, files and lines, frame by
//! frame, to the same depth.

mod distro;
mod gdb;
mod sites;
mod stripped;

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;

use crate::suite::support::{Fixture, TempDir, Tracerd, fixture_path, output_ok, poll};
use gdb::{Frame, backtraces};

/// The frames of tracer's traces of `size` bytes of process `pid`.
fn tracer_frames(tracerd: &Tracerd, pid: u32, size: u64) -> Vec<Vec<Frame>> {
    let body = tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0"));
    body["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .filter(|t| t["size"].as_u64() == Some(size))
        .map(|t| {
            t["traceback"]
                .as_array()
                .expect("traceback")
                .iter()
                .map(Frame::of_json)
                .collect()
        })
        .collect()
}

/// Runs `exe` traced by a tracerd started with `flags` until it has
/// allocated ("ready", the unwinder has its mappings, "go", "done"), then
/// compares each size's traceback with gdb's backtrace of the same
/// allocation.
fn judge(exe: &Path, sizes: &[u64], flags: &[&str]) {
    let scratch = TempDir::new("gdb");
    let gdb = backtraces(exe, sizes, scratch.path());
    let tracerd = Tracerd::start(flags);
    let mut fx = Fixture::spawn_traced(&tracerd, exe, &[]);
    let pid = fx.pid();
    wait_unwinder(&tracerd, pid);
    fx.go();
    fx.expect_line("done");
    let mut failures = Vec::new();
    for &size in sizes {
        let want = gdb
            .get(&size)
            .unwrap_or_else(|| panic!("gdb did not stop at a malloc of {size} bytes"));
        let want = gdb::after_allocator_frames(want);
        let got = tracer_frames(&tracerd, pid, size);
        assert_eq!(got.len(), 1, "one block of {size} bytes");
        if !gdb::same(&want, &got[0]) {
            failures.push(format!(
                "{size} bytes:\n{}",
                gdb::side_by_side(&want, &got[0])
            ));
        }
    }
    fx.end();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Waits until tracerd's unwinder has the tables of `pid`'s mappings
/// (`/maps`' `unwind_pids`): they are compiled once the process is seen,
/// and its allocations before that are walked by frame pointers.
pub(crate) fn wait_unwinder(tracerd: &Tracerd, pid: u32) {
    poll(Duration::from_secs(20), Duration::from_millis(20), || {
        let maps = tracerd.get_ok("/maps");
        let has = maps["unwind_pids"]
            .as_array()
            .is_some_and(|p| p.iter().any(|v| v.as_u64() == Some(u64::from(pid))));
        if has {
            Ok(())
        } else {
            Err(format!(
                "the unwinder has no mappings of {pid}: {}",
                maps["unwind"]
            ))
        }
    });
}

/// unwind_lib.c as the shared library `lib`, `-O2 -fomit-frame-pointer`.
fn build_lib(lib: &Path) {
    output_ok(
        Command::new("cc")
            .args([
                "-g",
                "-O2",
                "-fomit-frame-pointer",
                "-fPIC",
                "-shared",
                "-o",
            ])
            .arg(lib)
            .arg(fixture_path("unwind_lib.c")),
    );
}

/// unwind_gdb_chain.c with its shared library, both `-O2 -fomit-frame-pointer`.
fn build_chain(dir: &Path) -> std::path::PathBuf {
    build_lib(&dir.join("libunwindlib.so"));
    let exe = dir.join("unwind_gdb_chain");
    output_ok(
        Command::new("cc")
            .args(["-g", "-O2", "-fomit-frame-pointer", "-I"])
            .arg(fixture_path(""))
            .arg("-o")
            .arg(&exe)
            .arg(fixture_path("unwind_gdb_chain.c"))
            .arg(format!("-L{}", dir.display()))
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lunwindlib"),
    );
    exe
}

#[test]
fn c_without_frame_pointers_through_a_shared_library_matches_gdb() {
    let dir = TempDir::new("unwind-c");
    let exe = build_chain(dir.path());
    // lib_leaf allocates n + 1 of middle's n + 1: 70002; leaf 71000.
    judge(&exe, &[70002, 71000], &[]);
}

/// unwind_cpp.cpp as `g++ -O2` builds it (no frame pointers).
fn build_cpp(dir: &Path) -> std::path::PathBuf {
    let exe = dir.join("unwind_cpp");
    output_ok(
        Command::new("g++")
            .args(["-g", "-O2", "-o"])
            .arg(&exe)
            .arg(fixture_path("unwind_cpp.cpp")),
    );
    exe
}

#[test]
fn cpp_at_o2_matches_gdb_at_the_users_lines() {
    let dir = TempDir::new("unwind-cpp");
    let exe = build_cpp(dir.path());
    // new int[18000], vector<int>(18250), string(73500), make_unique<Big>,
    // vector<char>(74500) in a map.
    judge(&exe, &[72000, 73000, 73501, 72001, 74500], &[]);
}

#[test]
fn a_library_dlopened_while_traced_is_unwound_within_its_first_200_ms() {
    let dir = TempDir::new("unwind-dlopen");
    build_lib(&dir.path().join("libunwinddl.so"));
    let exe = dir.path().join("unwind_dlopen");
    output_ok(
        Command::new("cc")
            .args(["-g", "-O2", "-fomit-frame-pointer", "-rdynamic", "-I"])
            .arg(fixture_path(""))
            .arg("-o")
            .arg(&exe)
            .arg(fixture_path("unwind_dlopen.c"))
            .arg("-ldl"),
    );
    // lib_middle(75000) -> lib_leaf(75001) -> malloc.
    judge(&exe, &[75001], &[]);
}

/// unwind_rust.rs as `cargo build --release` with debug info builds it:
/// opt-level 3, no forced frame pointers, the system allocator.
fn build_rust(dir: &Path) -> std::path::PathBuf {
    let exe = dir.join("unwind_rust");
    output_ok(
        Command::new("rustc")
            .args(["-C", "opt-level=3", "-C", "debuginfo=2", "-o"])
            .arg(&exe)
            .arg(fixture_path("unwind_rust.rs")),
    );
    exe
}

#[test]
fn rust_release_matches_gdb_at_the_users_lines() {
    let dir = TempDir::new("unwind-rust");
    let exe = build_rust(dir.path());
    // Vec<u32>::with_capacity(19000), Box<[u8; 76001]>, String::push's
    // realloc to 144016, HashMap::with_capacity(3000) (4096 buckets of 16
    // bytes, 4096 + 16 control bytes). Rust's runtime puts 18 frames under
    // the user's line: nframe 32 holds them all.
    judge(&exe, &[76000, 76001, 144016, 69648], &["--nframe", "32"]);
}

#[test]
fn a_frame_is_always_in_an_executable_mapping() {
    // Frame-pointer garbage would name data or nothing: every frame tracer
    // reports for the no-frame-pointer chain is in a module, with a line.
    let dir = TempDir::new("unwind-maps");
    let exe = build_chain(dir.path());
    let tracerd = Tracerd::shared(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &exe, &[]);
    fx.go();
    fx.expect_line("done");
    let body: Value = tracerd.get_ok(&format!("/pid/{}/traces?limit=0", fx.pid()));
    let mut frames = 0;
    for trace in body["traces"].as_array().expect("traces") {
        for frame in trace["traceback"].as_array().expect("traceback") {
            frames += 1;
            assert!(frame["module"].is_string(), "a frame in no module: {frame}");
        }
    }
    assert!(frames > 0);
    fx.end();
}
