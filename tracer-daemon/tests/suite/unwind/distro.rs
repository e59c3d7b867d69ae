//! Debian's own binaries, built without frame pointers: sqlite3 building a
//! table, python3 (`PYTHONMALLOC=malloc`) running a script, and `git log
//! -p`. Each runs once traced (a snapshot before its work, then the blocks
//! its work allocated) and once under gdb (a backtrace at each allocation
//! of a sampled size). Both runs have address randomization off, and a
//! frame is compared as its file and file offset (a library the program
//! loads may still have another address in each run):
//!
//! - each sampled block's traceback is, frame for frame, the stack of
//!   one of gdb's stops of its size, as deep as gdb's to `nframe` = 32
//!   (tracer with `allocator_frames=keep`: gdb drops nothing);
//! - no frame of any live block of the whole run lies outside an
//!   executable mapping of the process (`/proc/PID/maps`, read while it
//!   lives).

use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use super::gdb::{Inferior, Mapping, allocation_stacks, parse_mapping, place};
use crate::suite::support::{TempDir, Tracerd, kill_if_running, output_ok, poll};

/// Sizes sampled per program.
const SAMPLES: usize = 12;

/// Most new blocks of a sampled size.
const FEW: usize = 4;

/// How a workload shows that its work is done.
enum Done {
    /// It prints this line (and then waits for stdin).
    Line(&'static str),
    /// It blocks writing to its stdout, a pipe nobody reads.
    BlockedWriting,
}

/// A Debian program and the work it is given.
struct Workload {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    /// What it prints before it waits for its work (none: it reads stdin
    /// at once).
    ready: Option<&'static str>,
    /// Its work, on stdin.
    input: String,
    /// Whether stdin is closed after the work (the program reads to EOF).
    close_stdin: bool,
    done: Done,
}

/// The program running traced, with address randomization off (`setarch
/// -R`); killed by pid on drop.
struct Traced {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
}

impl Traced {
    fn spawn(work: &Workload) -> Self {
        let mut child = Command::new("setarch")
            .args(["x86_64", "-R"])
            .args(&work.argv)
            .envs(work.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn setarch");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads lines until `want`.
    fn wait_line(&mut self, want: &str) {
        let stdout = self.stdout.as_mut().expect("stdout");
        loop {
            let mut line = String::new();
            let n = stdout.read_line(&mut line).expect("read program output");
            assert!(n > 0, "the program ended before it said {want:?}");
            if line.trim() == want {
                return;
            }
        }
    }

    /// Waits until the program sits in `write(1, ...)` on its full pipe.
    fn wait_blocked_writing(&self) {
        let path = format!("/proc/{}/syscall", self.pid());
        poll(Duration::from_secs(60), Duration::from_millis(100), || {
            let first = std::fs::read_to_string(&path).unwrap_or_default();
            std::thread::sleep(Duration::from_millis(200));
            let second = std::fs::read_to_string(&path).unwrap_or_default();
            // Syscall 1 (write) to fd 1, the same call both times.
            if first.starts_with("1 0x1 ") && first == second {
                Ok(())
            } else {
                Err(format!("not blocked writing: {second}"))
            }
        });
    }

    fn write(&mut self, input: &str) {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin
            .write_all(input.as_bytes())
            .expect("write program input");
        stdin.flush().expect("flush");
    }

    /// Lets the program finish (EOF on stdin, its output drained).
    fn finish(&mut self) {
        drop(self.stdin.take());
        if let Some(mut stdout) = self.stdout.take() {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut stdout, &mut sink);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        kill_if_running(&mut self.child);
    }
}

/// A traceback as its frames' addresses.
fn addresses(traceback: &Value) -> Vec<u64> {
    traceback
        .as_array()
        .expect("traceback")
        .iter()
        .map(|f| f["address"].as_u64().expect("address"))
        .collect()
}

/// The (size, addresses) of every live trace of a `traces` answer.
fn traces_of(body: &Value) -> Vec<(u64, Vec<u64>)> {
    body["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .map(|t| {
            (
                t["size"].as_u64().expect("size"),
                addresses(&t["traceback"]),
            )
        })
        .collect()
}

/// The executable mappings of `/proc/PID/maps`.
fn executable_mappings(pid: u32) -> Vec<Mapping> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("read maps")
        .lines()
        .filter_map(parse_mapping)
        .collect()
}

/// What the traced run found: the blocks its work allocated, and the
/// frames of all its live blocks outside an executable mapping.
struct TracedRun {
    new_blocks: Vec<(u64, Vec<String>)>,
    frames: usize,
    outside: Vec<u64>,
}

fn run_traced(work: &Workload) -> TracedRun {
    let tracerd = Tracerd::start(&["--nframe", "32"]);
    let mut program = Traced::spawn(work);
    let pid = program.pid();
    if let Some(ready) = work.ready {
        program.wait_line(ready);
    }
    tracerd.wait_traced(pid);
    super::wait_unwinder(&tracerd, pid);
    // Libraries loaded before "ready" reach the unwinder by their mmap's
    // event, or at the latest by its refresh each second.
    std::thread::sleep(Duration::from_millis(1500));
    let (status, snapshot) = tracerd.post(&format!("/pid/{pid}/snapshots?allocator_frames=keep"));
    assert_eq!(status, 201, "{snapshot}");
    let id = snapshot["id"].as_u64().expect("snapshot id");
    program.write(&work.input);
    if work.close_stdin {
        drop(program.stdin.take());
    }
    match work.done {
        Done::Line(line) => program.wait_line(line),
        Done::BlockedWriting => program.wait_blocked_writing(),
    }
    let now =
        traces_of(&tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0&allocator_frames=keep")));
    let before = traces_of(&tracerd.get_ok(&format!("/snapshots/{id}/traces?limit=0")));
    let mappings = executable_mappings(pid);
    program.finish();
    drop(tracerd);
    // The blocks now that were not there before (as many of each trace).
    let mut seen: HashMap<&(u64, Vec<u64>), usize> = HashMap::new();
    for trace in &before {
        *seen.entry(trace).or_default() += 1;
    }
    let mut new_blocks = Vec::new();
    for trace in &now {
        match seen.get_mut(trace) {
            Some(n) if *n > 0 => *n -= 1,
            _ => new_blocks.push((
                trace.0,
                trace.1.iter().map(|&a| place(&mappings, a)).collect(),
            )),
        }
    }
    let all: Vec<u64> = now.iter().flat_map(|(_, a)| a.iter().copied()).collect();
    let outside = all
        .iter()
        .copied()
        .filter(|&a| !mappings.iter().any(|m| (m.start..m.end).contains(&a)))
        .collect();
    TracedRun {
        new_blocks,
        frames: all.len(),
        outside,
    }
}

/// Up to [`SAMPLES`] sizes held by few new blocks (at most
/// [`FEW`]: gdb stops at every allocation of a sampled size), spread over
/// the sizes, each with its blocks' frames.
fn sample(new_blocks: &[(u64, Vec<String>)]) -> BTreeMap<u64, Vec<Vec<String>>> {
    let mut by_size: BTreeMap<u64, Vec<Vec<String>>> = BTreeMap::new();
    for (size, frames) in new_blocks {
        by_size.entry(*size).or_default().push(frames.clone());
    }
    let few: Vec<(u64, Vec<Vec<String>>)> = by_size
        .into_iter()
        .filter(|(_, blocks)| blocks.len() <= FEW)
        .collect();
    let step = few.len().div_ceil(SAMPLES).max(1);
    few.into_iter().step_by(step).collect()
}

/// Runs `work` traced, then under gdb; see the module's doc.
fn judge(work: &Workload) {
    let run = run_traced(work);
    assert!(run.frames > 0, "no frames");
    assert!(
        run.outside.is_empty(),
        "{} of {} frames outside an executable mapping: {:x?}",
        run.outside.len(),
        run.frames,
        run.outside
    );
    let samples = sample(&run.new_blocks);
    assert!(
        samples.len() >= SAMPLES / 2,
        "too few sampled blocks: {} of {} new blocks",
        samples.len(),
        run.new_blocks.len()
    );
    let scratch = TempDir::new("distro-gdb");
    let sizes: Vec<u64> = samples.keys().copied().collect();
    let gdb = allocation_stacks(
        &Inferior {
            argv: &work.argv,
            stdin: &work.input,
            env: &work.env,
        },
        &sizes,
        scratch.path(),
    );
    let mut failures = Vec::new();
    for (size, blocks) in &samples {
        let stops = gdb.get(size).map(Vec::as_slice).unwrap_or_default();
        for frames in blocks {
            let matches = stops.iter().any(|stack| {
                let depth = stack.len().min(32);
                frames.len() == depth && frames[..] == stack[..depth]
            });
            if !matches {
                failures.push(format!(
                    "{size} bytes: tracer {:?}\n  gdb's {} stops: {:?}",
                    frames,
                    stops.len(),
                    stops.iter().take(4).collect::<Vec<_>>()
                ));
            }
        }
    }
    let depths: Vec<usize> = samples.values().flatten().map(Vec::len).collect();
    eprintln!(
        "{}: {} frames of live blocks, none outside; {} new blocks, {} sampled \
         at {} sizes (depths {depths:?}), {} gdb stops",
        work.argv[0],
        run.frames,
        run.new_blocks.len(),
        depths.len(),
        samples.len(),
        gdb.values().map(Vec::len).sum::<usize>()
    );
    assert!(
        failures.is_empty(),
        "{} of {} sampled blocks are not gdb's stacks:\n{}",
        failures.len(),
        depths.len(),
        failures.join("\n")
    );
}

#[test]
fn debian_sqlite3_matches_gdb() {
    judge(&Workload {
        argv: vec!["/usr/bin/sqlite3".into(), "-batch".into()],
        env: vec![],
        ready: None,
        input: "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);\n\
                CREATE INDEX t_name ON t(name);\n\
                WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000)\n\
                INSERT INTO t SELECT x, 'name-' || x, x * 1.5 FROM c;\n\
                SELECT count(*), sum(v) FROM t;\n\
                .print done\n"
            .into(),
        close_stdin: false,
        done: Done::Line("done"),
    });
}

/// The script python3 runs: "ready", then on a line of stdin a table, its
/// JSON and a regex search, "done", and a wait.
const PYTHON_SCRIPT: &str = "import json, re, sys
print('ready', flush=True)
sys.stdin.readline()
table = {}
for i in range(300):
    table['key-%d' % i] = {'n': i, 's': 'v' * (i % 50), 'l': list(range(i % 7))}
text = json.dumps(table)
back = json.loads(text)
words = re.findall(r'key-[0-9]+', text)
print('done', flush=True)
sys.stdin.readline()
";

#[test]
fn debian_python3_matches_gdb() {
    let dir = TempDir::new("distro-python");
    let script = dir.path().join("work.py");
    std::fs::write(&script, PYTHON_SCRIPT).expect("write script");
    judge(&Workload {
        argv: vec!["/usr/bin/python3".into(), script.display().to_string()],
        env: vec![
            ("PYTHONMALLOC".into(), "malloc".into()),
            ("PYTHONHASHSEED".into(), "0".into()),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ],
        ready: Some("ready"),
        input: "go\n".into(),
        close_stdin: false,
        done: Done::Line("done"),
    });
}

/// A repository of 40 commits, each rewriting a 300-line file: `git log
/// -p` prints far more than a pipe holds.
fn repository(dir: &Path) {
    let git = |args: &[&str]| {
        output_ok(
            Command::new("/usr/bin/git")
                .arg("-C")
                .arg(dir)
                .args(args)
                .env("HOME", dir)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_AUTHOR_NAME", "tracer")
                .env("GIT_AUTHOR_EMAIL", "tracer@localhost")
                .env("GIT_COMMITTER_NAME", "tracer")
                .env("GIT_COMMITTER_EMAIL", "tracer@localhost")
                .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
                .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z"),
        );
    };
    git(&["init", "-q", "-b", "main"]);
    for commit in 0..40 {
        let text: String = (0..300)
            .map(|line| format!("line {line} of commit {commit}: {}\n", line * commit))
            .collect();
        std::fs::write(dir.join(format!("file{}.txt", commit % 4)), text).expect("write file");
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", &format!("commit {commit}")]);
    }
}

#[test]
fn debian_git_log_p_matches_gdb() {
    let dir = TempDir::new("distro-git");
    repository(dir.path());
    let home = dir.path().display().to_string();
    judge(&Workload {
        argv: vec![
            "/usr/bin/git".into(),
            "-C".into(),
            home.clone(),
            "log".into(),
            "-p".into(),
            "--stdin".into(),
        ],
        env: vec![
            ("HOME".into(), home),
            ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
            ("GIT_PAGER".into(), "cat".into()),
        ],
        ready: None,
        input: "HEAD\n".into(),
        close_stdin: true,
        done: Done::BlockedWriting,
    });
}
