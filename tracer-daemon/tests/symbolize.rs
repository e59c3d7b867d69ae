//! Symbolization of real processes, in-process and without root: small C
//! programs (`fixtures/return_addresses.c`, `fixtures/inlined.c`) compiled
//! here with `cc -g -fno-omit-frame-pointer`, run until they print the
//! return addresses they see, captured while alive, killed, and only then
//! symbolized — from the files held open by the capture, even though the
//! binaries are deleted or replaced on disk by then. Without line info a
//! frame is named by its site, whose offset binutils (`nm`, `readelf`)
//! judge; every frame carries its module's build id (`readelf -n`).

// CONTRIBUTING.md: tests may unwrap.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use tracer_daemon::symbolize::{SymFrame, Symbolizer};
use tracer_daemon::sys::modules::{ModuleCache, ModuleMaps};

// Scratch directories and the fixture files, shared with the root suite.
#[path = "suite/support/files.rs"]
mod files;

use files::{TempDir, fixture_path, fixture_text};

/// `fixtures/return_addresses.c`: `record()` keeps its own return address:
/// the instruction after a call to it, which here is the first instruction
/// of the NEXT line, so only `addr - 1` finds the calling line.
const O0_FIXTURE: &str = "return_addresses.c";

/// `fixtures/short_names.c`: functions `a`, `b` and `i` (also Itanium
/// type codes) each record their own return address.
const SHORT_NAMES_FIXTURE: &str = "short_names.c";

/// `fixtures/inlined.c`: at -O2, `leaf` and `middle` are inlined into
/// `outer`: the one return address in `outer` is three frames deep.
const INLINE_FIXTURE: &str = "inlined.c";

/// Copies the fixture `source` into a fresh directory as `prog.c` and
/// compiles it there (so DWARF has comp_dir = that directory and name
/// `prog.c`, a relative name the symbolizer must join) into `prog`.
fn compile(tag: &str, source: &str, flags: &[&str]) -> (TempDir, PathBuf) {
    let dir = TempDir::new(tag);
    fs::copy(fixture_path(source), dir.path().join("prog.c")).unwrap();
    let status = Command::new("cc")
        .args(flags)
        .args(["-fno-omit-frame-pointer", "-o", "prog", "prog.c"])
        .current_dir(dir.path())
        .status()
        .expect("running cc");
    assert!(status.success(), "cc {flags:?} failed");
    let binary = dir.path().join("prog");
    (dir, binary)
}

/// 1-based line of the only line of the fixture `source` with the comment
/// `/* MARKER */`.
fn line_of(source: &str, marker: &str) -> u32 {
    files::line_of(&fixture_text(source), &format!("/* {marker} */"))
}

/// A running fixture, killed (by its own pid) and reaped on drop.
struct Fixture {
    child: Child,
}

impl Fixture {
    /// Starts `binary` and reads the `count` addresses it prints.
    fn start(binary: &Path, count: usize) -> (Self, Vec<u64>) {
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut addrs = Vec::new();
        for _ in 0..count {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            let hex = line.trim().trim_start_matches("0x");
            addrs.push(u64::from_str_radix(hex, 16).unwrap());
        }
        (Self { child }, addrs)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `binary`, captures its maps while alive, then kills it and returns the
/// maps and the printed addresses.
fn capture_and_kill(cache: &ModuleCache, binary: &Path, count: usize) -> (ModuleMaps, Vec<u64>) {
    let (fixture, addrs) = Fixture::start(binary, count);
    let maps = cache.capture(fixture.pid()).unwrap();
    fixture.kill();
    (maps, addrs)
}

/// A frame with a line (`site_start` None) or named by its site (then
/// `site_start` is where the site starts in `filename`), of a module whose
/// build id is `build_id`.
struct Expected<'a> {
    module: &'a Path,
    build_id: &'a str,
}

impl Expected<'_> {
    fn frame(&self, filename: &str, lineno: u32, function: Option<&str>, address: u64) -> SymFrame {
        let module = self.module.to_str().unwrap();
        SymFrame {
            filename: Arc::from(filename),
            lineno,
            function: function.map(Arc::from),
            module: Some(Arc::from(module)),
            address,
            site_start: (lineno == 0).then_some(module.len()),
            build_id: Some(Arc::from(self.build_id)),
        }
    }
}

/// The stdout of `program args`, which must succeed.
fn stdout_of(program: &str, args: &[&str], file: &Path) -> String {
    let output = Command::new(program).args(args).arg(file).output().unwrap();
    assert!(output.status.success(), "{program} {args:?} {file:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// The GNU build id of `binary` as `readelf -n` prints it.
fn build_id(binary: &Path) -> String {
    stdout_of("readelf", &["-n"], binary)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .expect("a build id")
}

/// The virtual address (`readelf -lW`'s `PT_LOAD` segments) of the return
/// address `addr` of the process `maps` were captured from, in `binary`.
fn return_vaddr(maps: &ModuleMaps, binary: &Path, addr: u64) -> u64 {
    let (_, probe_offset) = maps.lookup(addr - 1).unwrap();
    let offset = probe_offset + 1;
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    stdout_of("readelf", &["-lW"], binary)
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (file_offset, vaddr, size) = (hex(f[1]), hex(f[2]), hex(f[4]));
            (file_offset..file_offset + size)
                .contains(&offset)
                .then(|| offset - file_offset + vaddr)
        })
        .unwrap()
}

/// The address of the function `name` in `binary`'s symbol table (`nm`).
fn function_vaddr(binary: &Path, name: &str) -> u64 {
    stdout_of("nm", &["--defined-only"], binary)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap()
}

/// Paths of the files this process holds open (the targets of /proc/self/fd/*).
fn open_files() -> Vec<String> {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| fs::read_link(entry.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn o0_return_addresses_resolve_to_call_lines_after_exit_and_replacement() {
    let (dir, binary) = compile("o0", O0_FIXTURE, &["-g", "-O0"]);
    let build_id = build_id(&binary);
    let expected = Expected {
        module: &binary,
        build_id: &build_id,
    };
    let cache = ModuleCache::new(8);
    let (maps, addrs) = capture_and_kill(&cache, &binary, 2);
    // The file at that path is now something else entirely: the open file still
    // holds the program that ran.
    fs::write(dir.path().join("other"), b"not an ELF file").unwrap();
    fs::rename(dir.path().join("other"), &binary).unwrap();

    let symbolizer = Symbolizer::new();
    let frames = symbolizer.symbolize(&maps, &addrs);
    let source = dir.path().join("prog.c");
    let source = source.to_str().unwrap();
    assert_eq!(
        frames,
        vec![
            vec![expected.frame(
                source,
                line_of(O0_FIXTURE, "MAIN_CALL"),
                Some("main"),
                addrs[0]
            )],
            vec![expected.frame(
                source,
                line_of(O0_FIXTURE, "HELPER_CALL"),
                Some("helper"),
                addrs[1]
            )],
        ]
    );
    assert_eq!(frames[0][0].lineno, 16);
    assert_eq!(frames[1][0].lineno, 12);
}

#[test]
fn repeated_addresses_come_from_the_cache() {
    let (_dir, binary) = compile("cache", O0_FIXTURE, &["-g", "-O0"]);
    let cache = ModuleCache::new(8);
    let (maps, addrs) = capture_and_kill(&cache, &binary, 2);
    let symbolizer = Symbolizer::new();

    let first = symbolizer.symbolize(&maps, &addrs);
    let stats = symbolizer.stats();
    assert_eq!((stats.cache_hits, stats.cache_misses), (0, 2));
    assert_eq!(stats.cached_addresses, 2);
    assert_eq!(stats.loaded_modules, 1);

    // Same addresses again, twice in one request: no new blazesym work.
    let again = symbolizer.symbolize(&maps, &[addrs[0], addrs[1], addrs[0]]);
    let stats = symbolizer.stats();
    assert_eq!((stats.cache_hits, stats.cache_misses), (3, 2));
    assert_eq!(
        again,
        vec![first[0].clone(), first[1].clone(), first[0].clone()]
    );
}

#[test]
fn files_of_exited_processes_are_closed_once_unused() {
    let (_dir, binary) = compile("release", O0_FIXTURE, &["-g", "-O0"]);
    let binary_name = binary.to_str().unwrap().to_owned();
    let cache = ModuleCache::new(0);
    let (maps, addrs) = capture_and_kill(&cache, &binary, 2);
    fs::remove_file(&binary).unwrap();
    let symbolizer = Symbolizer::new();
    let frames = symbolizer.symbolize(&maps, &addrs);
    assert_eq!(frames[0][0].lineno, line_of(O0_FIXTURE, "MAIN_CALL"));
    // Held by the maps (and by blazesym): the deleted binary is still open.
    let deleted = format!("{binary_name} (deleted)");
    assert!(open_files().contains(&deleted));
    assert_eq!(symbolizer.stats().loaded_modules, 1);

    drop(maps);
    symbolizer.release_unused();
    assert_eq!(symbolizer.stats().loaded_modules, 0);
    assert_eq!(cache.live(), 0);
    assert!(!open_files().contains(&deleted));
}

#[test]
fn inlined_calls_are_frames_of_their_own_innermost_first() {
    let (dir, binary) = compile("inline", INLINE_FIXTURE, &["-g", "-O2"]);
    let build_id = build_id(&binary);
    let expected = Expected {
        module: &binary,
        build_id: &build_id,
    };
    let cache = ModuleCache::default();
    let (maps, addrs) = capture_and_kill(&cache, &binary, 1);
    let symbolizer = Symbolizer::new();
    let frames = symbolizer.symbolize(&maps, &addrs);
    let source = dir.path().join("prog.c");
    let source = source.to_str().unwrap();
    assert_eq!(
        frames,
        vec![vec![
            expected.frame(
                source,
                line_of(INLINE_FIXTURE, "LEAF_CALL"),
                Some("leaf"),
                addrs[0]
            ),
            expected.frame(
                source,
                line_of(INLINE_FIXTURE, "MIDDLE_CALL"),
                Some("middle"),
                addrs[0]
            ),
            expected.frame(
                source,
                line_of(INLINE_FIXTURE, "OUTER_CALL"),
                Some("outer"),
                addrs[0]
            ),
        ]]
    );
    assert_eq!(
        frames[0].iter().map(|f| f.lineno).collect::<Vec<_>>(),
        vec![11, 17, 23]
    );
}

#[test]
fn without_debug_info_the_frame_is_named_by_its_function_and_offset() {
    let (_dir, binary) = compile("nodebug", O0_FIXTURE, &["-O0"]);
    let build_id = build_id(&binary);
    let expected = Expected {
        module: &binary,
        build_id: &build_id,
    };
    let cache = ModuleCache::default();
    let (maps, addrs) = capture_and_kill(&cache, &binary, 2);
    let symbolizer = Symbolizer::new();
    let module = binary.to_str().unwrap();
    // The offset of the return address from the function's start, as
    // readelf and nm place both.
    let name = |function: &str, addr: u64| {
        let offset = return_vaddr(&maps, &binary, addr) - function_vaddr(&binary, function);
        format!("{module}!{function}+{offset:#x}")
    };
    assert_eq!(
        symbolizer.symbolize(&maps, &addrs),
        vec![
            vec![expected.frame(&name("main", addrs[0]), 0, Some("main"), addrs[0])],
            vec![expected.frame(&name("helper", addrs[1]), 0, Some("helper"), addrs[1])],
        ]
    );
}

#[test]
fn stripped_binary_frames_are_named_by_their_offset_in_the_module() {
    let (_dir, binary) = compile("stripped", O0_FIXTURE, &["-g", "-O0", "-s"]);
    let build_id = build_id(&binary);
    let expected = Expected {
        module: &binary,
        build_id: &build_id,
    };
    let cache = ModuleCache::default();
    let (maps, addrs) = capture_and_kill(&cache, &binary, 2);
    let symbolizer = Symbolizer::new();
    let module = binary.to_str().unwrap();
    // The offset of the return address in the module's file.
    let name = |addr: u64| {
        let (_, probe_offset) = maps.lookup(addr - 1).unwrap();
        format!("{module}+{:#x}", probe_offset + 1)
    };
    let frames = symbolizer.symbolize(&maps, &addrs);
    assert_eq!(
        frames,
        vec![
            vec![expected.frame(&name(addrs[0]), 0, None, addrs[0])],
            vec![expected.frame(&name(addrs[1]), 0, None, addrs[1])],
        ]
    );
    assert_ne!(frames[0][0].filename, frames[1][0].filename);
}

#[test]
fn addresses_outside_every_module_are_unknown() {
    let (_dir, binary) = compile("unknown", O0_FIXTURE, &["-g", "-O0"]);
    let cache = ModuleCache::default();
    let (maps, addrs) = capture_and_kill(&cache, &binary, 2);
    let symbolizer = Symbolizer::new();
    // 0 (no call precedes it), a kernel address, and one past the end of the
    // module's last executable mapping (its addr - 1, the end, is outside).
    let last = maps
        .mappings()
        .iter()
        .filter(|m| m.module.path().as_ref() == binary.to_str().unwrap())
        .map(|m| m.end)
        .max()
        .unwrap();
    let frames = symbolizer.symbolize(&maps, &[0, 0xffff_ffff_ff60_0000, last + 1, addrs[0]]);
    assert_eq!(
        frames[..3],
        [
            vec![SymFrame::unknown(0)],
            vec![SymFrame::unknown(0xffff_ffff_ff60_0000)],
            vec![SymFrame::unknown(last + 1)],
        ]
    );
    assert_eq!(&*frames[1][0].filename, "<unknown>");
    assert_eq!(frames[1][0].lineno, 0);
    assert_eq!(frames[3][0].function.as_deref(), Some("main"));
    // The end itself: addr - 1 is the mapping's last byte, so it is in the module.
    let at_end = symbolizer.symbolize(&maps, &[last]);
    assert_eq!(
        at_end[0][0].module.as_deref(),
        Some(binary.to_str().unwrap())
    );
}

#[test]
fn plain_c_names_are_never_demangled_as_itanium_types() {
    // With DWARF, and with the symbol table only: the name is the C name.
    for (tag, flags) in [
        ("short-g", &["-g", "-O0"][..]),
        ("short-nodebug", &["-O0"][..]),
    ] {
        let (_dir, binary) = compile(tag, SHORT_NAMES_FIXTURE, flags);
        let cache = ModuleCache::new(4);
        let (maps, addrs) = capture_and_kill(&cache, &binary, 3);
        let frames = Symbolizer::new().symbolize(&maps, &addrs);
        let names: Vec<Option<&str>> = frames
            .iter()
            .map(|per_address| per_address[0].function.as_deref())
            .collect();
        assert_eq!(names, [Some("a"), Some("b"), Some("i")], "{tag}");
    }
}
