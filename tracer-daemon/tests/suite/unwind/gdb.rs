//! gdb as the judge: a batch run of a fixture with a breakpoint at `malloc`
//! for each size asked, printing `bt` at each stop, parsed into frames.
use std::{collections::BTreeMap, path::Path, process::Command};

use serde_json::Value;

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
const MACHINERY: [&str; 12] = [
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
/// leading frames of [`MACHINERY`].
pub fn after_machinery(frames: &[Frame]) -> Vec<Frame> {
    frames
        .iter()
        .skip(1)
        .skip_while(|f| MACHINERY.iter().any(|p| f.function.starts_with(p)))
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
    assert_eq!(
        leaf(
            "core::ops::function::{impl#2}::call_once<(), (dyn core::ops::function::Fn<(), Output=i32>)>"
        ),
        "call_once"
    );
    assert_eq!(
        leaf("<&F as core::ops::function::FnOnce<A>>::call_once"),
        "call_once"
    );
    assert_eq!(leaf("unwind_rust::allocate"), "allocate");
    assert_eq!(leaf("a::b<fn() -> i32>::c<u8>"), "c");
    assert_eq!(
        leaf("std::vector<int, std::allocator<int> >::vector"),
        "vector"
    );
    assert_eq!(leaf("main"), "main");
    assert_eq!(
        leaf(
            "std::panicking::catch_unwind::do_call::<&dyn core::ops::function::Fn<(), Output = i32> + core::marker::Sync, i32>"
        ),
        "do_call"
    );
    assert_eq!(
        leaf(
            "std::panicking::catch_unwind::do_call<&(dyn core::ops::function::Fn<(), Output=i32> + core::marker::Sync), i32>"
        ),
        "do_call"
    );
    assert_eq!(
        leaf("core::ops::function::FnOnce::call_once<fn(),"),
        "call_once"
    );
    assert_eq!(leaf("std::rt::lang_start::{closure#0}<()>"), "{closure}");
    assert_eq!(leaf("std::rt::lang_start::{{closure}}"), "{closure}");
    assert_eq!(bare("main"), "main");
}
