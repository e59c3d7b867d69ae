//! A stripped program: `fixtures/stripped.c` built as distributions build
//! (`-O2`, no `-g`, no frame pointers), then `strip --strip-all`, so none of
//! its frames has a line. Its two call paths into malloc (2,000 and 700
//! blocks of 300 B; its stdio buffers are judged apart and left out) must
//! stay two groups, not one `stripped:0` of 2,700, through every view:
//! `group_by=lineno` and `traceback` in JSON and text, and `format=pprof`
//! as `go tool pprof -top` and `-traces` read it. Built twice: with no
//! symbol at all (frames named `MODULE+0xOFFSET`) and with `-rdynamic`
//! (`.dynsym` keeps the exported names: `MODULE!FUNCTION+0xOFFSET`).
//! binutils judge the offsets: each must name a return address, the
//! instruction after a `call` to `malloc@plt`; and `readelf` the build id
//! the frames carry.

use std::{collections::BTreeMap, path::Path, process::Command};

use serde_json::Value;

use crate::suite::api::profiles::{pprof, save_profile, top, traces};
use crate::suite::support::{Fixture, Program, TempDir, Tracerd, output_ok};

/// The stdout of `command`, which must succeed.
fn stdout_of(command: &mut Command) -> String {
    String::from_utf8(output_ok(command).stdout).expect("utf-8")
}

/// `fixtures/stripped.c` at `-O2` without debug info or frame pointers
/// (`-rdynamic`: its functions exported), then stripped of every symbol
/// table but `.dynsym`.
fn build(rdynamic: bool) -> Program {
    let mut flags = vec!["-O2", "-g0", "-fomit-frame-pointer"];
    if rdynamic {
        flags.push("-rdynamic");
    }
    let program = Program::build("stripped", &flags);
    output_ok(Command::new("strip").arg("--strip-all").arg(&program.exe));
    let sections = stdout_of(Command::new("readelf").arg("-SW").arg(&program.exe));
    assert!(
        !sections.contains(".symtab") && !sections.contains(".debug_"),
        "not stripped: {sections}"
    );
    program
}

/// The GNU build id of `exe`, as `readelf -n` prints it.
fn build_id(exe: &Path) -> String {
    let notes = stdout_of(Command::new("readelf").arg("-n").arg(exe));
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {notes}"))
        .to_string()
}

/// The virtual address of the file offset `offset` of `exe`, by its
/// `PT_LOAD` segments (`readelf -lW`).
fn vaddr_of_offset(exe: &Path, offset: u64) -> u64 {
    let headers = stdout_of(Command::new("readelf").arg("-lW").arg(exe));
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex");
    headers
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (file_offset, vaddr, size) = (hex(f[1]), hex(f[2]), hex(f[4]));
            (file_offset..file_offset + size)
                .contains(&offset)
                .then(|| offset - file_offset + vaddr)
        })
        .unwrap_or_else(|| panic!("offset {offset:#x} is in no segment: {headers}"))
}

/// The address of the exported function `name` of `exe` (`nm -D`).
fn function_address(exe: &Path, name: &str) -> u64 {
    let symbols = stdout_of(Command::new("nm").args(["-D", "--defined-only"]).arg(exe));
    symbols
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).expect("hex"))
        })
        .unwrap_or_else(|| panic!("no {name} in {symbols}"))
}

/// Asserts that the instruction before `vaddr` in `exe` is a call to
/// `malloc` (`objdump -d`): `vaddr` is the return address of an
/// allocation.
fn assert_returns_from_malloc(exe: &Path, vaddr: u64, site: &str) {
    let listing = stdout_of(
        Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(exe),
    );
    let instructions: Vec<(u64, &str)> = listing
        .lines()
        .filter_map(|l| {
            let (address, text) = l.split_once(":\t")?;
            Some((u64::from_str_radix(address.trim(), 16).ok()?, text))
        })
        .collect();
    let at = instructions
        .iter()
        .position(|&(address, _)| address == vaddr)
        .unwrap_or_else(|| panic!("{site}: no instruction at {vaddr:#x}"));
    let (_, before) = instructions[at - 1];
    assert!(
        before.starts_with("call") && before.contains("<malloc@plt>"),
        "{site}: the instruction before {vaddr:#x} is {before:?}, not a call to malloc"
    );
}

/// The site of a frame name `EXE!FUNCTION+0xOFFSET` or `EXE+0xOFFSET`:
/// (function, offset).
fn site_of<'a>(name: &'a str, exe: &str) -> (Option<&'a str>, u64) {
    let site = name
        .strip_prefix(exe)
        .unwrap_or_else(|| panic!("{name} is not a site of {exe}"));
    let (head, hex) = site.rsplit_once("+0x").expect("an offset");
    let offset = u64::from_str_radix(hex, 16).expect("hex offset");
    assert_eq!(format!("{offset:x}"), hex, "lowercase, no leading zero");
    match head.strip_prefix('!') {
        Some(function) => (Some(function), offset),
        None => {
            assert!(head.is_empty(), "{name}");
            (None, offset)
        }
    }
}

/// The `(size, count)` and most recent frame of each statistic of `body`.
fn groups(body: &Value) -> Vec<(u64, u64, Value)> {
    body["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| {
            (
                s["size"].as_u64().expect("size"),
                s["count"].as_u64().expect("count"),
                s["traceback"][0].clone(),
            )
        })
        .collect()
}

/// pprof's profile of the blocks `only` selects of `pid`: the two sites
/// `names` (as pprof names them), each with its blocks, in `-top` and
/// `-traces`.
fn assert_pprof_has_the_two_sites(
    tracerd: &Tracerd,
    pid: u32,
    only: &str,
    names: &[&str],
    exe: &str,
) {
    let dir = TempDir::new("pprof-stripped");
    let profile = save_profile(
        tracerd,
        &format!("/pid/{pid}/statistics?format=pprof&{only}"),
        dir.path(),
        "stripped.pb.gz",
    );
    let profile = profile.to_str().expect("utf-8 path");
    // pprof's name of a site: FUNCTION+0xOFFSET, else all of it.
    let pprof_names: Vec<String> = names
        .iter()
        .map(|name| match site_of(name, exe) {
            (Some(function), offset) => format!("{function}+{offset:#x}"),
            (None, _) => (*name).to_string(),
        })
        .collect();
    let (total, flat) = top(&pprof(dir.path(), &["-top", profile]));
    assert_eq!(total, 810_000);
    let leaves: BTreeMap<String, i64> = pprof_names
        .iter()
        .cloned()
        .zip([600_000, 210_000])
        .collect();
    assert_eq!(flat, leaves, "go tool pprof -top");
    let samples = traces(&pprof(dir.path(), &["-traces", profile]));
    let leaves: Vec<(i64, &str)> = samples
        .iter()
        .map(|(value, frames)| (*value, frames[0].as_str()))
        .collect();
    assert_eq!(
        leaves,
        [
            (210_000, pprof_names[1].as_str()),
            (600_000, pprof_names[0].as_str())
        ],
        "go tool pprof -traces: {samples:?}"
    );
}

fn two_paths_stay_two_groups(rdynamic: bool) {
    let program = build(rdynamic);
    let exe = program.exe.to_str().expect("utf-8 path");
    let build_id = build_id(&program.exe);
    let tracerd = Tracerd::shared(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &program.exe, &[]);
    let pid = fx.pid();
    super::wait_unwinder(&tracerd, pid);
    fx.go();
    fx.expect_line("done");
    // The blocks whose most recent frame is in the program: matched by its
    // path, as a filter pattern matches the module of a frame with no line.
    let in_program = format!("include={exe}&limit=0");
    // Besides its two call paths the program holds the buffers the C
    // library gave its stdout and stdin (pipes: one block of 4096 B each,
    // made by the first `say` and the first `wait_go` of fixture.h). Their
    // walks go through the C library whole, so their frame 0 is the
    // program's own site that printed or read: in the program, at two
    // sites of their own. Judged here, then excluded by name, so that every
    // view below judges the blocks of the two call paths alone.
    let all = groups(&tracerd.get_ok(&format!(
        "/pid/{pid}/statistics?group_by=lineno&{in_program}"
    )));
    let sizes: Vec<(u64, u64)> = all.iter().map(|g| (g.0, g.1)).collect();
    assert_eq!(
        sizes,
        [(600_000, 2000), (210_000, 700), (4096, 1), (4096, 1)],
        "{all:?}"
    );
    let stdio: String = all[2..]
        .iter()
        .map(|(_, _, frame)| {
            let name = frame["filename"].as_str().expect("filename");
            assert!(name.starts_with(exe), "{frame}");
            let pattern: String = form_urlencoded::byte_serialize(name.as_bytes()).collect();
            format!("&exclude={pattern}")
        })
        .collect();
    let only = format!("{in_program}{stdio}");

    let by_line = groups(&tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&{only}")));
    let sizes: Vec<(u64, u64)> = by_line.iter().map(|g| (g.0, g.1)).collect();
    assert_eq!(sizes, [(600_000, 2000), (210_000, 700)], "{by_line:?}");
    let names: Vec<&str> = by_line
        .iter()
        .map(|g| g.2["filename"].as_str().expect("filename"))
        .collect();
    assert_ne!(names[0], names[1]);
    for ((_, _, frame), path) in by_line.iter().zip(["path_a", "path_b"]) {
        let name = frame["filename"].as_str().expect("filename");
        assert_eq!(frame["lineno"], 0, "{frame}");
        assert_eq!(frame["file"].as_str(), Some(exe), "{frame}");
        assert_eq!(frame["module"].as_str(), Some(exe), "{frame}");
        assert_eq!(
            frame["build_id"].as_str(),
            Some(build_id.as_str()),
            "{frame}"
        );
        let return_address = match site_of(name, exe) {
            (Some(function), offset) => {
                assert!(rdynamic, "{name}: a function in a program with none");
                assert_eq!(function, path, "{frame}");
                assert_eq!(frame["function"].as_str(), Some(path), "{frame}");
                function_address(&program.exe, path) + offset
            }
            (None, offset) => {
                assert!(!rdynamic, "{name}: .dynsym names {path}");
                vaddr_of_offset(&program.exe, offset)
            }
        };
        assert_returns_from_malloc(&program.exe, return_address, name);
    }

    // Whole tracebacks: two, apart from their first frame on.
    let by_traceback = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=traceback&{only}"));
    let tracebacks = groups(&by_traceback);
    let sizes: Vec<(u64, u64)> = tracebacks.iter().map(|g| (g.0, g.1)).collect();
    assert_eq!(sizes, [(600_000, 2000), (210_000, 700)], "{by_traceback}");
    let callers: Vec<&str> = by_traceback["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| s["traceback"][1]["filename"].as_str().expect("a caller"))
        .collect();
    for (group, name) in tracebacks.iter().zip(&names) {
        assert_eq!(group.2["filename"].as_str(), Some(*name));
    }
    // main calls each path from a call of its own.
    assert_ne!(callers[0], callers[1]);
    for caller in &callers {
        let (function, _) = site_of(caller, exe);
        assert_eq!(function, rdynamic.then_some("main"), "{caller}");
    }

    // tracemalloc's text names them.
    let (status, text) = tracerd.get_text(&format!(
        "/pid/{pid}/statistics?group_by=lineno&format=text&{only}"
    ));
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            format!("{}:0: size=586 KiB, count=2000, average=300 B", names[0]),
            format!("{}:0: size=205 KiB, count=700, average=300 B", names[1]),
        ]
    );

    // pprof: two functions, each with its blocks.
    assert_pprof_has_the_two_sites(&tracerd, pid, &only, &names, exe);
    fx.end();
}

#[test]
fn a_fully_stripped_programs_two_call_paths_are_two_module_offsets() {
    two_paths_stay_two_groups(false);
}

#[test]
fn a_stripped_programs_exported_functions_name_its_two_call_paths() {
    two_paths_stay_two_groups(true);
}
