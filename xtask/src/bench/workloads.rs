//! The overhead part's workloads, compiled or generated into the bench
//! directory: churn (N malloc+free pairs in one thread, ns per pair), the
//! same churn linked with jemalloc, tcmalloc and mimalloc (the per-call
//! cost of tracer on each allocator, against the floor of the same probes), a
//! 2-thread stress with cross-thread frees (ns per pair), anonymous
//! mappings (an `mmap` + `munmap` of 64 KiB, ns per pair, one tenth as
//! many: the cost of the mmap source's syscall tracepoints), and real
//! programs: python3 doing a JSON round trip with `PYTHONMALLOC=malloc`,
//! sqlite3 building and querying a table, gcc compiling a C file (wall
//! time). And how one runs under a mode that wraps it (heaptrack, massif).
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::util::{cc::compile_c, cmd::which};

/// Every workload, in the table's order.
pub const ALL_WORKLOADS: [&str; 9] = [
    "churn",
    "churn-jemalloc",
    "churn-tcmalloc",
    "churn-mimalloc",
    "threads",
    "mmap",
    "python",
    "sqlite",
    "gcc",
];

/// The allocator libraries of the `churn-*` workloads: (workload, link
/// flag, library as `ldconfig` installs it).
pub const ALLOCATOR_CHURNS: [(&str, &str, &str); 3] = [
    (
        "churn-jemalloc",
        "-ljemalloc",
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    ),
    (
        "churn-tcmalloc",
        "-ltcmalloc",
        "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    ),
    (
        "churn-mimalloc",
        "-lmimalloc",
        "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
    ),
];

/// Flags of the C workloads of the overhead table.
pub const CFLAGS: &[&str] = &["-O2"];

const CHURN_C: &str = include_str!("../../workloads/churn.c");

/// `mmap` + `munmap` pairs of 64 KiB, anonymous, from the program itself
/// (the `mmap` source): after one `malloc` (so that the process is traced)
/// and 0.5 s (so that tracerd has its mappings: mappings are recorded only
/// then), ns per pair.
const MMAP_C: &str = include_str!("../../workloads/mmap.c");

const THREADS_C: &str = include_str!("../../workloads/threads.c");

const PYTHON_JSON: &str = "import json\n\
doc = [{'id': i, 'name': 'item-%d' % i, 'tags': ['a', 'b', 'c'], 'values': list(range(10))} for i in range(20000)]\n\
for _ in range(3):\n    doc = json.loads(json.dumps(doc))\n";

fn sqlite_script() -> String {
    let mut sql =
        String::from("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);\nBEGIN;\n");
    for i in 0..20_000 {
        sql.push_str(&format!(
            "INSERT INTO t(name, v) VALUES ('name-{i}', {i}.5);\n"
        ));
    }
    sql.push_str("COMMIT;\nCREATE INDEX t_name ON t(name);\n");
    sql.push_str("SELECT count(*), sum(v) FROM t WHERE name LIKE 'name-1%';\n");
    sql.push_str("SELECT name FROM t ORDER BY v DESC LIMIT 5;\n");
    sql
}

fn gcc_source() -> String {
    let mut c = String::from("#include <stdio.h>\n#include <string.h>\n");
    for i in 0..300 {
        c.push_str(&format!(
            "static int f{i}(int x) {{ int a[16]; for (int j = 0; j < 16; j++) a[j] = x * j + {i}; \
             int s = 0; for (int j = 0; j < 16; j++) s += a[j] ^ (s << 1); return s; }}\n"
        ));
    }
    c.push_str("int main(void) { int s = 0;\n");
    for i in 0..300 {
        c.push_str(&format!("  s += f{i}(s);\n"));
    }
    c.push_str("  printf(\"%d\\n\", s); return 0; }\n");
    c
}

/// A compiled or generated workload.
pub struct Workload {
    pub name: &'static str,
    /// The command (program first).
    argv: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Option<PathBuf>,
    /// Reports its own ns per pair on stdout (else wall time is measured).
    self_timed: bool,
    pub unit: &'static str,
}

impl Workload {
    /// Whether it reports its own ns per pair (churn, threads), else its
    /// wall time in ms is measured (the real programs).
    pub fn self_timed(&self) -> bool {
        self.self_timed
    }
}

/// Compiles and writes every workload into `dir`.
pub fn prepare(dir: &Path, pairs: u64) -> anyhow::Result<Vec<Workload>> {
    fs::create_dir_all(dir)?;
    let churn = compile_c(dir, "churn", CHURN_C, CFLAGS)?;
    let mut allocator_churns = Vec::new();
    for (name, flag, _) in ALLOCATOR_CHURNS {
        let exe = compile_c(dir, name, CHURN_C, &[CFLAGS, &[flag]].concat())?;
        allocator_churns.push(Workload {
            name,
            argv: vec![exe.display().to_string(), pairs.to_string()],
            env: vec![],
            stdin: None,
            self_timed: true,
            unit: "ns/pair",
        });
    }
    let threads = compile_c(dir, "threads", THREADS_C, &[CFLAGS, &["-pthread"]].concat())?;
    let mmap = compile_c(dir, "mmap", MMAP_C, CFLAGS)?;
    let py = dir.join("json_roundtrip.py");
    fs::write(&py, PYTHON_JSON)?;
    let sql = dir.join("table.sql");
    fs::write(&sql, sqlite_script())?;
    let gsrc = dir.join("unit.c");
    fs::write(&gsrc, gcc_source())?;
    let python = real_python();
    let s = |p: &Path| p.display().to_string();
    let mut all = vec![
        Workload {
            name: "churn",
            argv: vec![s(&churn), pairs.to_string()],
            env: vec![],
            stdin: None,
            self_timed: true,
            unit: "ns/pair",
        },
        Workload {
            name: "threads",
            argv: vec![s(&threads), pairs.to_string()],
            env: vec![],
            stdin: None,
            self_timed: true,
            unit: "ns/pair",
        },
        Workload {
            name: "mmap",
            argv: vec![s(&mmap), pairs.to_string()],
            env: vec![],
            stdin: None,
            self_timed: true,
            unit: "ns/pair",
        },
        Workload {
            name: "python",
            argv: vec![python, s(&py)],
            env: vec![("PYTHONMALLOC".into(), "malloc".into())],
            stdin: None,
            self_timed: false,
            unit: "ms",
        },
        Workload {
            name: "sqlite",
            argv: vec!["sqlite3".into(), ":memory:".into()],
            env: vec![],
            stdin: Some(sql),
            self_timed: false,
            unit: "ms",
        },
        Workload {
            name: "gcc",
            argv: vec![
                "gcc".into(),
                "-O2".into(),
                "-c".into(),
                s(&gsrc),
                "-o".into(),
                s(&dir.join("unit.o")),
            ],
            env: vec![],
            stdin: None,
            self_timed: false,
            unit: "ms",
        },
    ];
    // The allocator churns follow churn, as in ALL_WORKLOADS.
    all.splice(1..1, allocator_churns);
    Ok(all)
}

/// The python3 on PATH as the real interpreter, not a pyenv shim script
/// (`sys.executable`); `python3` when it cannot say.
pub fn real_python() -> String {
    let python =
        which("python3").map_or_else(|| "python3".to_string(), |p| p.display().to_string());
    Command::new(&python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| !p.is_empty())
        .unwrap_or(python)
}

/// Runs a workload once under `mode` (wrapped by heaptrack or massif for
/// those modes); returns its figure (ns/pair or ms).
pub fn run_once(mode: &str, workload: &Workload, dir: &Path) -> anyhow::Result<f64> {
    let mut argv: Vec<String> = Vec::new();
    match mode {
        "heaptrack" => {
            argv.extend(["heaptrack", "--raw", "-o"].map(String::from));
            argv.push(dir.join("heaptrack.out").display().to_string());
        }
        "massif" => {
            argv.extend(["valgrind", "--tool=massif", "-q"].map(String::from));
            argv.push(format!(
                "--massif-out-file={}",
                dir.join("massif.out").display()
            ));
        }
        _ => {}
    }
    argv.extend(workload.argv.iter().cloned());
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .envs(workload.env.iter().map(|(k, v)| (k, v)));
    command.stderr(Stdio::null());
    match &workload.stdin {
        Some(path) => command.stdin(fs::File::open(path)?),
        None => command.stdin(Stdio::null()),
    };
    let start = Instant::now();
    let out = command
        .output()
        .with_context(|| format!("running {}", argv.join(" ")))?;
    let elapsed = start.elapsed();
    if !out.status.success() {
        bail!("{} under {mode} failed: {}", workload.name, out.status);
    }
    if workload.self_timed {
        figure(&String::from_utf8_lossy(&out.stdout)).context("the workload printed no figure")
    } else {
        Ok(elapsed.as_secs_f64() * 1000.0)
    }
}

/// The last line of a self-timed workload's output that is a number.
fn figure(stdout: &str) -> Option<f64> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.trim().parse::<f64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_is_the_last_number_printed() {
        assert_eq!(figure("warming up\n12.5\n41.0\nbye\n"), Some(41.0));
        assert_eq!(figure("nothing\n"), None);
    }

    #[test]
    fn workloads_are_named_as_the_table_names_them() {
        let dir = crate::util::paths::TempDir::new("workloads-test");
        let names: Vec<&str> = prepare(dir.path(), 1000)
            .unwrap()
            .iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(names, ALL_WORKLOADS);
    }
}
