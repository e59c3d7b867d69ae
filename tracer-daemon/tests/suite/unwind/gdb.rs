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

/// Runs `exe` under gdb (stdin: two "go" lines), stopping at every `malloc`
/// of one of `sizes` bytes; returns each size's backtrace (frame 0 is
/// `malloc`).
pub fn backtraces(exe: &Path, sizes: &[u64], scratch: &Path) -> BTreeMap<u64, Vec<Frame>> {
    let input = scratch.join("go.txt");
    std::fs::write(&input, "go\ngo\n").expect("write gdb input");
    let condition = sizes
        .iter()
        .map(|s| format!("$rdi == {s}"))
        .collect::<Vec<_>>()
        .join(" || ");
    let script = scratch.join("bt.gdb");
    std::fs::write(
        &script,
        format!(
            "set pagination off\nset confirm off\nset debuginfod enabled off\n\
             set breakpoint pending on\nset print frame-arguments none\n\
             set backtrace past-main on\nset backtrace past-entry on\n\
             break malloc if {condition}\ncommands\nsilent\nprintf \"STOP %lu\\n\", $rdi\n\
             bt\nprintf \"END\\n\"\ncontinue\nend\nrun < {}\nquit\n",
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

/// gdb's frames after the allocation machinery, as tracerd's default
/// `allocator_frames` drops them: `malloc` itself, then leading `operator
/// new`, `std::` and `__gnu_cxx::` frames.
pub fn after_machinery(frames: &[Frame]) -> Vec<Frame> {
    frames
        .iter()
        .skip(1)
        .skip_while(|f| {
            f.function.starts_with("operator new")
                || f.function.starts_with("std::")
                || f.function.starts_with("__gnu_cxx::")
        })
        .cloned()
        .collect()
}

/// Whether tracer's frames are gdb's: the same depth, and frame by frame
/// the same function, file and line wherever gdb has line information
/// (libc's entry functions, without it, have several names).
pub fn same(gdb: &[Frame], tracer: &[Frame]) -> bool {
    gdb.len() == tracer.len()
        && gdb.iter().zip(tracer).all(|(g, t)| {
            g.line == 0 || (g.file == t.file && g.line == t.line && g.function == t.function)
        })
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
            format!(
                "  #{i:<2} gdb {:<50} tracer {}",
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
    assert_eq!(bare("main"), "main");
}
