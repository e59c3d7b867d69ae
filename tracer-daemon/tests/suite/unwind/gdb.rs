//! gdb as the judge: a batch run of a fixture with a breakpoint at `malloc`
//! for each size asked, printing `bt` at each stop, parsed into frames.
use std::{collections::BTreeMap, path::Path, process::Command};

use serde_json::Value;

use crate::suite::support::stop_shared;

/// One frame as gdb or tracer names it: the function (without its
/// parameters), the source file's name (not its directory) and the line; 0
/// and empty where there is no line information.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: u64,
}

impl Frame {
    /// A frame of tracer's JSON.
    pub fn of_json(frame: &Value) -> Self {
        let file = frame["filename"].as_str().unwrap_or("");
        let line = frame["lineno"].as_u64().unwrap_or(0);
        Self {
            function: bare(frame["function"].as_str().unwrap_or("")),
            file: if line == 0 {
                String::new()
            } else {
                basename(file)
            },
            line,
        }
    }
}

fn basename(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// A function name without its parameter list (`allocate()` → `allocate`).
fn bare(name: &str) -> String {
    let name = name.trim();
    // The parameters are the last balanced (...) group; C++ operator() is
    // not among the frames compared.
    match name.rfind('(') {
        Some(at) if name.ends_with(')') => name[..at].trim_end().to_string(),
        _ => name.to_string(),
    }
}

/// Parses one `bt` line: `#N  [0xADDR in ]FUNC (ARGS) [at FILE:LINE | from LIB]`.
fn parse_bt_line(line: &str) -> Option<Frame> {
    let rest = line.strip_prefix('#')?;
    let rest = rest
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start();
    let rest = match rest.find(" in ") {
        Some(at) if rest.starts_with("0x") => &rest[at + 4..],
        _ => rest,
    };
    let (rest, file, line_no) = match rest.rfind(" at ") {
        Some(at) => {
            let place = &rest[at + 4..];
            let (file, line_no) = place.rsplit_once(':')?;
            (&rest[..at], basename(file), line_no.trim().parse().ok()?)
        }
        None => match rest.rfind(" from ") {
            Some(at) => (&rest[..at], String::new(), 0),
            None => (rest, String::new(), 0),
        },
    };
    // FUNC (ARGS): the arguments start at the first " (".
    let function = match rest.find(" (") {
        Some(at) => &rest[..at],
        None => rest,
    };
    Some(Frame {
        function: function.trim().to_string(),
        file,
        line: line_no,
    })
}

/// A breakpoint at `function` when its argument `register` (the size) is
/// one of `sizes`, printing the size and `bt`.
fn breakpoint(function: &str, register: &str, sizes: &[u64]) -> String {
    let condition = sizes
        .iter()
        .map(|s| format!("{register} == {s}"))
        .collect::<Vec<_>>()
        .join(" || ");
    format!(
        "break {function} if {condition}\ncommands\nsilent\nprintf \"STOP %lu\\n\", {register}\n\
         bt\nprintf \"END\\n\"\ncontinue\nend\n"
    )
}

/// Runs `exe` under gdb (stdin: two "go" lines), stopping at every `malloc`
/// of one of `sizes` bytes, and at every `realloc` to one of them; returns
/// each size's first backtrace (frame 0 is `malloc` or `realloc`).
pub fn backtraces(exe: &Path, sizes: &[u64], scratch: &Path) -> BTreeMap<u64, Vec<Frame>> {
    let input = scratch.join("go.txt");
    std::fs::write(&input, "go\ngo\n").expect("write gdb input");
    let script = scratch.join("bt.gdb");
    std::fs::write(
        &script,
        format!(
            "set pagination off\nset confirm off\nset debuginfod enabled off\n\
             set breakpoint pending on\nset print frame-arguments none\n\
             set backtrace past-main on\nset backtrace past-entry on\n\
             {}{}run < {}\nquit\n",
            breakpoint("malloc", "$rdi", sizes),
            breakpoint("realloc", "$rsi", sizes),
            input.display()
        ),
    )
    .expect("write gdb script");
    // gdb's breakpoint would be a uprobe's int3, which the kernel handles
    // without gdb: no tracerd may run meanwhile.
    stop_shared();
    let out = Command::new("gdb")
        .args(["-batch", "-nx", "-x"])
        .arg(&script)
        .arg(exe)
        .output()
        .expect("run gdb (cargo xtask setup installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = BTreeMap::new();
    let mut current: Option<(u64, Vec<Frame>)> = None;
    for line in text.lines() {
        if let Some(size) = line.strip_prefix("STOP ") {
            current = size.trim().parse().ok().map(|s| (s, Vec::new()));
        } else if line == "END" {
            if let Some((size, frames)) = current.take() {
                found.entry(size).or_insert(frames);
            }
        } else if let Some((_, frames)) = current.as_mut()
            && let Some(frame) = parse_bt_line(line)
        {
            frames.push(frame);
        }
    }
    assert!(
        !found.is_empty(),
        "gdb stopped nowhere:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    found
}

/// The leading frames gdb names that tracerd's default `allocator_frames`
/// drop: C++'s `operator new` and standard library, Rust's allocator shims
/// and its alloc, core, std and hashbrown crates.
const ALLOCATOR_FRAMES: [&str; 12] = [
    "operator new",
    "std::",
    "__gnu_cxx::",
    "alloc::",
    "core::",
    "hashbrown::",
    "__rust_",
    "__rdl_",
    "__rg_",
    "__rustc::",
    "<alloc::",
    "<core::",
];

/// gdb's frames after the allocation machinery, as tracerd's default
/// `allocator_frames` drops them: `malloc` (or `realloc`) itself, then the
/// leading frames of [`ALLOCATOR_FRAMES`].
pub fn after_allocator_frames(frames: &[Frame]) -> Vec<Frame> {
    frames
        .iter()
        .skip(1)
        .skip_while(|f| ALLOCATOR_FRAMES.iter().any(|p| f.function.starts_with(p)))
        .cloned()
        .collect()
}

/// A function's own name: its last `::` segment outside `<...>`, without
/// generic arguments. gdb names a Rust function by its DWARF path
/// (`core::ops::function::{impl#2}::call_once<(), ...>`), tracer by its
/// demangled symbol (`<&F as core::ops::function::FnOnce<A>>::call_once`,
/// `do_call::<F, R>`): both end in `call_once`. A closure is `{closure}`
/// (`{closure#0}` in DWARF, `{{closure}}` in a legacy symbol).
pub fn leaf(name: &str) -> &str {
    let b = name.as_bytes();
    let mut end = b.len();
    let mut depth = 0usize;
    let mut close = 0usize;
    let mut start = 0usize;
    let mut i = b.len();
    while i > 0 {
        i -= 1;
        match b[i] {
            // `->` in a function type is no bracket.
            b'>' if i > 0 && b[i - 1] == b'-' => {}
            b'>' => {
                if depth == 0 {
                    close = i;
                }
                depth += 1;
            }
            b'<' if depth > 0 => {
                depth -= 1;
                // Generic arguments that end the segment are not its name.
                if depth == 0 && close + 1 == end {
                    end = i;
                }
            }
            // An unclosed `<` (gdb's line cut inside the arguments).
            b'<' => end = i,
            b':' if depth == 0 && i > 0 && b[i - 1] == b':' => {
                if i + 1 >= end {
                    // `do_call::<..>`: the segment before the turbofish.
                    end = i - 1;
                    i -= 1;
                } else {
                    start = i + 1;
                    break;
                }
            }
            _ => {}
        }
    }
    let own = name[start..end.max(start)].trim();
    if own.starts_with("{closure#") || own == "{{closure}}" {
        return "{closure}";
    }
    own
}

/// Whether tracer's frames are gdb's: the same depth, and frame by frame
/// the same function (its [`leaf`] name), file and line wherever gdb has
/// line information (libc's entry functions, without it, have several
/// names).
pub fn same(gdb: &[Frame], tracer: &[Frame]) -> bool {
    gdb.len() == tracer.len() && gdb.iter().zip(tracer).all(|(g, t)| same_frame(g, t))
}

/// One frame of each: the same wherever gdb has a line.
fn same_frame(gdb: &Frame, tracer: &Frame) -> bool {
    gdb.line == 0
        || (gdb.file == tracer.file
            && gdb.line == tracer.line
            && leaf(&gdb.function) == leaf(&tracer.function))
}

/// Both sides, a frame a line, for a failure message.
pub fn side_by_side(gdb: &[Frame], tracer: &[Frame]) -> String {
    let n = gdb.len().max(tracer.len());
    (0..n)
        .map(|i| {
            let show = |f: Option<&Frame>| {
                f.map_or("-".to_string(), |f| {
                    format!("{} {}:{}", f.function, f.file, f.line)
                })
            };
            let differs = match (gdb.get(i), tracer.get(i)) {
                (Some(g), Some(t)) => !same_frame(g, t),
                _ => true,
            };
            format!(
                "{} #{i:<2} gdb {:<50} tracer {}",
                if differs { "!" } else { " " },
                show(gdb.get(i)),
                show(tracer.get(i))
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn bt_lines_parse_into_function_file_and_line() {
    assert_eq!(
        parse_bt_line("#1  0x00005555555551c1 in leaf (n=...) at /x/unwind_chain.c:18"),
        Some(Frame {
            function: "leaf".into(),
            file: "unwind_chain.c".into(),
            line: 18
        })
    );
    assert_eq!(
        parse_bt_line("#3  middle (...) at unwind_chain.c:33"),
        Some(Frame {
            function: "middle".into(),
            file: "unwind_chain.c".into(),
            line: 33
        })
    );
    assert_eq!(
        parse_bt_line("#0  0x00007ffff7e3c6f0 in malloc () from /lib/x86_64-linux-gnu/libc.so.6"),
        Some(Frame {
            function: "malloc".into(),
            file: String::new(),
            line: 0
        })
    );
    assert_eq!(bare("allocate()"), "allocate");
    for (name, own) in [
        (
            "core::ops::function::{impl#2}::call_once<(), (dyn core::ops::function::Fn<(), Output=i32>)>",
            "call_once",
        ),
        (
            "<&F as core::ops::function::FnOnce<A>>::call_once",
            "call_once",
        ),
        ("unwind_rust::allocate", "allocate"),
        ("a::b<fn() -> i32>::c<u8>", "c"),
        ("std::vector<int, std::allocator<int> >::vector", "vector"),
        ("main", "main"),
        (
            "std::panicking::catch_unwind::do_call::<&dyn core::ops::function::Fn<(), Output = i32> + core::marker::Sync, i32>",
            "do_call",
        ),
        (
            "std::panicking::catch_unwind::do_call<&(dyn core::ops::function::Fn<(), Output=i32> + core::marker::Sync), i32>",
            "do_call",
        ),
        ("core::ops::function::FnOnce::call_once<fn(),", "call_once"),
        ("std::rt::lang_start::{closure#0}<()>", "{closure}"),
        ("std::rt::lang_start::{{closure}}", "{closure}"),
    ] {
        assert_eq!(leaf(name), own, "{name}");
    }
    assert_eq!(bare("main"), "main");
}

/// The return address gdb prints for a frame (`#N  0x00007f... in ...`);
/// `None` for a frame printed without one (frame 0 at a line's start, or
/// an inlined call, which is at its caller's address).
fn parse_pc(line: &str) -> Option<u64> {
    let rest = line.strip_prefix('#')?;
    let rest = rest
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start();
    let hex = rest.strip_prefix("0x")?;
    let end = hex.find(' ')?;
    u64::from_str_radix(&hex[..end], 16).ok()
}

/// An executable mapping of a process: `[start, end)` maps `path` from
/// file offset `offset`.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

/// Where `address` is, as `path+0xFILE_OFFSET` (the same in two runs that
/// load a library at different addresses), or `?0xADDRESS` in no mapping.
pub fn place(mappings: &[Mapping], address: u64) -> String {
    mappings
        .iter()
        .find(|m| (m.start..m.end).contains(&address))
        .map_or_else(
            || format!("?{address:#x}"),
            |m| format!("{}+{:#x}", m.path, address - m.start + m.offset),
        )
}

/// Parses one line of `/proc/PID/maps` (`START-END PERMS OFFSET DEV INODE
/// PATH`) or of gdb's `info proc mappings` (`START END SIZE OFFSET PERMS
/// PATH`) into an executable mapping.
pub fn parse_mapping(line: &str) -> Option<Mapping> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let (start, end, perms, offset, path) = if let Some((s, e)) = fields.first()?.split_once('-') {
        (
            hex(s)?,
            hex(e)?,
            *fields.get(1)?,
            hex(fields.get(2)?)?,
            fields.get(5),
        )
    } else {
        (
            hex(fields.first()?)?,
            hex(fields.get(1)?)?,
            *fields.get(4)?,
            hex(fields.get(3)?)?,
            fields.get(5),
        )
    };
    perms.contains('x').then(|| Mapping {
        start,
        end,
        offset,
        path: path.map_or_else(String::new, |p| (*p).to_string()),
    })
}

/// A program run under gdb: what it runs and the stdin it reads.
pub struct Inferior<'a> {
    /// The program and its arguments.
    pub argv: &'a [String],
    /// Its standard input (a file), written whole before the run.
    pub stdin: &'a str,
    /// Its environment beyond gdb's (gdb's own `LINES` and `COLUMNS` only
    /// move its stack).
    pub env: &'a [(String, String)],
}

/// Runs `inferior` under gdb with address randomization off (gdb's
/// default), stopping at glibc's `malloc`, `calloc` and `realloc` of one of
/// `sizes` bytes once the program first reads its stdin (the work tracer
/// compares with a snapshot taken before that read); returns, for each
/// size, the places ([`place`]) of every such allocation's frames after
/// the allocator itself (an inlined call has its caller's), to `_start`.
/// The places come from the process's mappings at its exit (`info proc
/// mappings`): a library loaded in the run may have another address in
/// another run.
///
/// The breakpoints are at the functions' first instructions, where the
/// size is still in its register; glibc's own names (`__libc_malloc`) so
/// that the dynamic loader's private malloc is not among them. No tracerd
/// may run meanwhile: gdb's breakpoint would be a uprobe's int3, which the
/// kernel handles without gdb.
pub fn allocation_stacks(
    inferior: &Inferior,
    sizes: &[u64],
    scratch: &Path,
) -> BTreeMap<u64, Vec<Vec<String>>> {
    let input = scratch.join("stdin");
    std::fs::write(&input, inferior.stdin).expect("write gdb input");
    let any = |register: &str| {
        sizes
            .iter()
            .map(|s| format!("{register} == {s}"))
            .collect::<Vec<_>>()
            .join(" || ")
    };
    let stop = |function: &str, size: &str, condition: String| {
        format!(
            "break *{function} if {condition}\ncommands\nsilent\nprintf \"STOP %lu\\n\", {size}\n\
             bt\nprintf \"END\\n\"\ncontinue\nend\n"
        )
    };
    let args = inferior.argv[1..]
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let script = scratch.join("stacks.gdb");
    std::fs::write(
        &script,
        format!(
            "set pagination off\nset confirm off\nset debuginfod enabled off\n\
             set breakpoint pending on\nset print frame-arguments none\n\
             set backtrace past-main on\nset backtrace past-entry on\n\
             tbreak __libc_start_main\nrun {args} < {} > /dev/null\n\
             {}{}{}disable 2 3 4\ncatch syscall read\ncondition 5 $rdi == 0\n\
             commands\nsilent\nenable 2 3 4\ncontinue\nend\n\
             catch syscall exit_group\ncommands\nsilent\nprintf \"MAPS\\n\"\n\
             info proc mappings\nprintf \"ENDMAPS\\n\"\ncontinue\nend\ncontinue\nquit\n",
            input.display(),
            stop("__libc_malloc", "$rdi", any("$rdi")),
            stop("__libc_calloc", "$rdi * $rsi", any("$rdi * $rsi")),
            stop("__libc_realloc", "$rsi", any("$rsi")),
        ),
    )
    .expect("write gdb script");
    stop_shared();
    let mut command = Command::new("gdb");
    command
        .args(["-batch", "-nx", "-x"])
        .arg(&script)
        .arg(&inferior.argv[0]);
    for (k, v) in inferior.env {
        command.env(k, v);
    }
    let out = command
        .output()
        .expect("run gdb (cargo xtask setup installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found: BTreeMap<u64, Vec<Vec<u64>>> = BTreeMap::new();
    let mut current: Option<(u64, Vec<u64>, bool)> = None;
    let mut mappings = Vec::new();
    let mut in_maps = false;
    for line in text.lines() {
        if line == "MAPS" || line == "ENDMAPS" {
            in_maps = line == "MAPS";
        } else if in_maps {
            mappings.extend(parse_mapping(line));
        } else if let Some(size) = line.strip_prefix("STOP ") {
            current = size.trim().parse().ok().map(|s| (s, Vec::new(), false));
        } else if line == "END" {
            if let Some((size, pcs, _)) = current.take() {
                found.entry(size).or_default().push(pcs);
            }
        } else if let Some((_, pcs, ended)) = current.as_mut()
            && !*ended
            && line.starts_with('#')
            && !line.starts_with("#0 ")
        {
            let pc = parse_pc(line).or_else(|| pcs.last().copied());
            if let Some(pc) = pc {
                pcs.push(pc);
            }
            // The outermost frame; gdb may go on into what is not one.
            if line.contains(" _start ") {
                *ended = true;
            }
        }
    }
    assert!(
        !found.is_empty() && !mappings.is_empty(),
        "gdb stopped nowhere, or not at the exit:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    found
        .into_iter()
        .map(|(size, stacks)| {
            let placed = stacks
                .into_iter()
                .map(|pcs| pcs.into_iter().map(|pc| place(&mappings, pc)).collect())
                .collect();
            (size, placed)
        })
        .collect()
}

#[test]
fn mappings_parse_from_proc_and_from_gdb() {
    let proc = parse_mapping(
        "7ffff7c43000-7ffff7c4a000 r-xp 00002000 fe:01 123 /usr/lib/python3.11/_json.so",
    )
    .expect("proc line");
    let gdb = parse_mapping(
        "      0x7ffff7c45000     0x7ffff7c4c000     0x7000     0x2000  r-xp   /usr/lib/python3.11/_json.so",
    )
    .expect("gdb line");
    assert_eq!(
        place(&[proc], 0x7fff_f7c4_3ca9),
        "/usr/lib/python3.11/_json.so+0x2ca9"
    );
    assert_eq!(
        place(&[gdb], 0x7fff_f7c4_5ca9),
        "/usr/lib/python3.11/_json.so+0x2ca9"
    );
    assert!(
        parse_mapping("555555554000-55555555c000 r--p 00000000 fe:01 1 /usr/bin/sqlite3").is_none()
    );
}

#[test]
fn bt_lines_give_their_return_address() {
    assert_eq!(
        parse_pc("#3  0x00007ffff7fd21e3 in _dl_map_object (loader=...) at ./elf/dl-load.c:2139"),
        Some(0x7fff_f7fd_21e3)
    );
    assert_eq!(
        parse_pc("#10 _dl_start (arg=...) at ./elf/rtld.c:584"),
        None
    );
}
