//! `cargo xtask bench`: tracerd's overhead, side by side with the reference
//! tools, in one run.
//!
//! Workloads (compiled or generated here): churn (N malloc+free pairs, one
//! thread, ns per pair), a 2-thread stress with cross-thread frees (ns per
//! pair), and real programs: python3 doing a JSON round-trip with
//! `PYTHONMALLOC=malloc`, sqlite3 building and querying a table, gcc
//! compiling a C file (wall time).
//!
//! Modes: uninstrumented; `tracer-floor` (empty programs at tracerd's own
//! probe points: the physical floor); tracerd (exact); a bpftrace script doing
//! what bcc's memleak does; heaptrack; `valgrind --tool=massif`. Runs are
//! interleaved (every mode once per round) and each figure is the median of
//! the rounds. Prints a markdown table and writes JSON.
use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// Options of `cargo xtask bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Rounds; every figure is the median over them (at least 5 for the report).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// malloc+free pairs per churn run.
    #[arg(long, default_value_t = 200_000)]
    pub pairs: u64,
    /// Only these modes (comma-separated: none,floor,tracerd,memleak,heaptrack,massif).
    #[arg(long, value_delimiter = ',')]
    pub modes: Vec<String>,
    /// Only these workloads (comma-separated: churn,threads,python,sqlite,gcc).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Skip the scale part (4,000,000 live blocks, a 1,000,000-block snapshot).
    #[arg(long)]
    pub no_scale: bool,
    /// Skip the scope part (an untraced process while another is traced).
    #[arg(long)]
    pub no_scope: bool,
    /// Skip the snapshot-engine part (statistics and compare_to of
    /// 1,000,000 traces against CPython's tracemalloc, `bench-model`).
    #[arg(long)]
    pub no_model: bool,
    /// Traces per snapshot in the snapshot-engine part.
    #[arg(long, default_value_t = 1_000_000)]
    pub model_traces: u64,
    /// Run even while other tracers are attached (their cost is added to
    /// every mode, so differences stay meaningful but ratios do not).
    #[arg(long)]
    pub force: bool,
    /// Where the JSON report goes.
    #[arg(long, default_value = "target/bench/overhead.json")]
    pub json: PathBuf,
}

const ALL_MODES: [&str; 6] = ["none", "floor", "tracerd", "memleak", "heaptrack", "massif"];
const ALL_WORKLOADS: [&str; 5] = ["churn", "threads", "python", "sqlite", "gcc"];

const KEEP_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    void **keep = malloc(n * sizeof(void *));
    for (long i = 0; i < n; i++) keep[i] = malloc(16 + (i & 15));
    printf("done\n");
    fflush(stdout);
    getchar();
    return keep[0] == NULL;
}
"#;

const CHURN_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    void *volatile sink;
    struct timespec a, b;
    for (int i = 0; i < 1000; i++) { sink = malloc(64); free(sink); }
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) { sink = malloc(64); free(sink); }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
"#;

const THREADS_C: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define BATCH 256
static long rounds;
static void *slots[2][BATCH];
static pthread_barrier_t barrier;
static void *worker(void *arg) {
    long t = (long)arg;
    for (long r = 0; r < rounds; r++) {
        for (int i = 0; i < BATCH; i++) slots[t][i] = malloc(32 + (i & 63));
        pthread_barrier_wait(&barrier);
        /* free the other thread's blocks */
        for (int i = 0; i < BATCH; i++) free(slots[1 - t][i]);
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}
int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 200000;
    rounds = pairs / (2 * BATCH);
    pthread_t th[2];
    struct timespec a, b;
    pthread_barrier_init(&barrier, NULL, 2);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long t = 0; t < 2; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (rounds * 2 * BATCH));
    return 0;
}
"#;

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
struct Workload {
    name: &'static str,
    /// The command (program first).
    argv: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Option<PathBuf>,
    /// Reports its own ns per pair on stdout (else wall time is measured).
    self_timed: bool,
    unit: &'static str,
}

fn prepare(dir: &Path, pairs: u64) -> anyhow::Result<Vec<Workload>> {
    fs::create_dir_all(dir)?;
    let cc = |name: &str, source: &str, extra: &[&str]| -> anyhow::Result<PathBuf> {
        let src = dir.join(format!("{name}.c"));
        fs::write(&src, source)?;
        let exe = dir.join(name);
        let status = Command::new("gcc")
            .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&exe)
            .arg(&src)
            .args(extra)
            .status()
            .context("gcc")?;
        if !status.success() {
            bail!("compiling {name}.c failed");
        }
        Ok(exe)
    };
    let churn = cc("churn", CHURN_C, &[])?;
    let threads = cc("threads", THREADS_C, &["-pthread"])?;
    let py = dir.join("json_roundtrip.py");
    fs::write(&py, PYTHON_JSON)?;
    let sql = dir.join("table.sql");
    fs::write(&sql, sqlite_script())?;
    let gsrc = dir.join("unit.c");
    fs::write(&gsrc, gcc_source())?;
    let python = which("python3").context("python3")?;
    // The real interpreter, not a pyenv shim script.
    let python = Command::new(&python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| python.display().to_string());
    let s = |p: &Path| p.display().to_string();
    Ok(vec![
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
    ])
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// A tracer running for a mode, stopped (by pid) on drop.
struct Tracer {
    child: Child,
    pid: u32,
}

impl Tracer {
    fn stop(mut self) {
        signal(self.pid, "INT");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        signal(self.pid, "KILL");
        let _ = self.child.wait();
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            signal(self.pid, "KILL");
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Starts `command` and waits until a line of its output contains `ready`.
fn start_until(mut command: Command, ready: &str, from_stderr: bool) -> anyhow::Result<Tracer> {
    let mut child = if from_stderr {
        command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?
    } else {
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?
    };
    let pid = child.id();
    let pipe: Box<dyn std::io::Read + Send> = if from_stderr {
        Box::new(child.stderr.take().context("stderr")?)
    } else {
        Box::new(child.stdout.take().context("stdout")?)
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let ready = ready.to_string();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = String::new();
        let mut said = false;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if !said && line.contains(&ready) {
                        said = true;
                        let _ = tx.send(());
                    }
                }
            }
        }
    });
    let tracer = Tracer { child, pid };
    rx.recv_timeout(Duration::from_secs(120))
        .context("the tracer did not become ready")?;
    // Give the kernel a moment to finish installing breakpoints.
    std::thread::sleep(Duration::from_millis(300));
    Ok(tracer)
}

fn libc_path() -> anyhow::Result<String> {
    let out = Command::new("ldconfig")
        .arg("-p")
        .output()
        .context("ldconfig -p")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("libc.so.6 ") && l.contains("x86-64"))
        .and_then(|l| l.split_once(" => ").map(|(_, p)| p.trim().to_string()))
        .context("libc.so.6 not in ldconfig -p")
}

/// The bpftrace script that does what bcc's memleak does: uprobe and
/// uretprobe on malloc, calloc and realloc, uprobe on free, the size, a
/// timestamp and a user stack id per allocation kept in a map by address.
fn memleak_script(libc: &str) -> String {
    format!(
        "uprobe:{l}:malloc {{ @size[tid] = arg0; }}\n\
         uretprobe:{l}:malloc /@size[tid]/ {{ @allocs[retval] = (@size[tid], nsecs, ustack); delete(@size[tid]); }}\n\
         uprobe:{l}:calloc {{ @size[tid] = arg0 * arg1; }}\n\
         uretprobe:{l}:calloc /@size[tid]/ {{ @allocs[retval] = (@size[tid], nsecs, ustack); delete(@size[tid]); }}\n\
         uprobe:{l}:realloc {{ delete(@allocs[arg0]); @size[tid] = arg1; }}\n\
         uretprobe:{l}:realloc /@size[tid]/ {{ @allocs[retval] = (@size[tid], nsecs, ustack); delete(@size[tid]); }}\n\
         uprobe:{l}:free {{ delete(@allocs[arg0]); }}\n\
         END {{ clear(@allocs); clear(@size); }}\n",
        l = libc
    )
}

/// Starts the system-wide tracer of `mode` (None for the others).
fn start_mode(mode: &str, root: &Path, dir: &Path) -> anyhow::Result<Option<Tracer>> {
    let release = crate::target_dir(root).join("release");
    match mode {
        "floor" => {
            let command = Command::new(release.join("tracer-floor"));
            start_until(command, "ready", false).map(Some)
        }
        "tracerd" => {
            let mut command = Command::new(release.join("tracerd"));
            command
                .args(["--listen", "127.0.0.1:7467", "--state-dir"])
                .arg(dir.join("state"))
                .args(["--log", "info"]);
            start_until(command, "tracerd ready", true).map(Some)
        }
        "memleak" => {
            let script = dir.join("memleak.bt");
            fs::write(&script, memleak_script(&libc_path()?))?;
            let mut command = Command::new("bpftrace");
            command.arg(&script);
            start_until(command, "Attaching", false).map(Some)
        }
        _ => Ok(None),
    }
}

/// Runs a workload once under `mode`; returns its figure (ns/pair or ms).
fn run_once(mode: &str, workload: &Workload, dir: &Path) -> anyhow::Result<f64> {
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
        let text = String::from_utf8_lossy(&out.stdout);
        let figure = text
            .lines()
            .rev()
            .find_map(|l| l.trim().parse::<f64>().ok())
            .context("the workload printed no figure")?;
        Ok(figure)
    } else {
        Ok(elapsed.as_secs_f64() * 1000.0)
    }
}

/// CPU time (user + system, in clock ticks) and peak RSS (kB) of a pid.
fn cpu_and_rss(pid: u32) -> (u64, u64) {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = fields
        .get(11)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks, hwm)
}

/// Kernel memory of tracerd's BPF maps in bytes (the `memlock:` of each
/// map fd in /proc/PID/fdinfo).
fn bpf_map_memory(pid: u32) -> u64 {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .filter(|text| text.contains("map_type:"))
        .filter_map(|text| {
            text.lines()
                .find(|l| l.starts_with("memlock:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn other_tracers() -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            let comm = comm.trim();
            if [
                "tracerd",
                "bpftrace",
                "tracer-floor",
                "heaptrack",
                "memleak",
            ]
            .contains(&comm)
            {
                found.push(format!(
                    "{comm} (pid {})",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
    }
    found
}

/// Runs the suite; `root` is the workspace root.
pub fn run(root: &Path, args: &BenchArgs) -> anyhow::Result<()> {
    let others = other_tracers();
    if !others.is_empty() && !args.force {
        bail!(
            "other tracers are running ({}): they would slow every mode; stop them first",
            others.join(", ")
        );
    }
    for (given, valid, what) in [
        (&args.modes, &ALL_MODES[..], "mode"),
        (&args.workloads, &ALL_WORKLOADS[..], "workload"),
    ] {
        if let Some(bad) = given.iter().find(|g| !valid.contains(&g.as_str())) {
            bail!("unknown {what} {bad:?}; valid: {}", valid.join(", "));
        }
    }
    let dir = crate::target_dir(root).join("bench");
    let modes: Vec<&str> = ALL_MODES
        .iter()
        .copied()
        .filter(|m| args.modes.is_empty() || args.modes.iter().any(|x| x == m))
        .collect();
    let workloads: Vec<Workload> = prepare(&dir, args.pairs)?
        .into_iter()
        .filter(|w| args.workloads.is_empty() || args.workloads.iter().any(|x| x == w.name))
        .collect();
    // results[workload][mode] = figures over rounds
    let mut results: BTreeMap<&str, BTreeMap<&str, Vec<f64>>> = BTreeMap::new();
    let mut tracerd_cpu_ticks: Vec<u64> = Vec::new();
    let mut tracerd_rss_kb = 0u64;
    let mut tracerd_map_bytes = 0u64;
    for round in 1..=args.rounds.max(1) {
        eprintln!("bench: round {round}/{}", args.rounds);
        for &mode in &modes {
            let tracer = start_mode(mode, root, &dir)?;
            let before = tracer.as_ref().map(|t| cpu_and_rss(t.pid));
            for workload in &workloads {
                let figure = run_once(mode, workload, &dir)?;
                results
                    .entry(workload.name)
                    .or_default()
                    .entry(mode)
                    .or_default()
                    .push(figure);
            }
            if let (Some(t), Some((ticks0, _))) = (&tracer, before)
                && mode == "tracerd"
            {
                let (ticks1, hwm) = cpu_and_rss(t.pid);
                tracerd_cpu_ticks.push(ticks1.saturating_sub(ticks0));
                tracerd_rss_kb = tracerd_rss_kb.max(hwm);
                tracerd_map_bytes = tracerd_map_bytes.max(bpf_map_memory(t.pid));
            }
            if let Some(t) = tracer {
                t.stop();
            }
        }
    }
    report(
        args,
        &modes,
        &workloads,
        &mut results,
        &tracerd_cpu_ticks,
        tracerd_rss_kb,
        tracerd_map_bytes,
    )?;
    let mut extra = serde_json::Map::new();
    if !args.no_scope {
        extra.insert("scope".into(), scope_part(root, &dir, args)?);
    }
    if !args.no_scale {
        extra.insert("scale".into(), scale_part(root, &dir)?);
    }
    let text = fs::read_to_string(&args.json)?;
    let mut json: serde_json::Value = serde_json::from_str(&text)?;
    if let Some(object) = json.as_object_mut() {
        object.extend(extra);
    }
    fs::write(&args.json, serde_json::to_string_pretty(&json)?)?;
    Ok(())
}

/// A minimal HTTP/1.1 client for tracerd on loopback (the bench needs two
/// calls; no client library for that).
fn http(method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect("127.0.0.1:7467")?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Runs the keep-N fixture until it has allocated; returns the child.
fn keep_blocks(exe: &Path, n: u64) -> anyhow::Result<Child> {
    let mut child = Command::new(exe)
        .arg(n.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "done" {
        bail!("the keep fixture said {line:?}");
    }
    Ok(child)
}

fn finish(mut child: Child) {
    drop(child.stdin.take());
    let _ = child.wait();
}

/// 4,000,000 live blocks at once, and the time to snapshot 1,000,000.
fn scale_part(root: &Path, dir: &Path) -> anyhow::Result<serde_json::Value> {
    let src = dir.join("keep.c");
    fs::write(&src, KEEP_C)?;
    let exe = dir.join("keep");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()?;
    if !status.success() {
        bail!("compiling keep.c failed");
    }
    let mut command = Command::new(crate::target_dir(root).join("release/tracerd"));
    command
        .args(["--listen", "127.0.0.1:7467", "--state-dir"])
        .arg(dir.join("state"))
        .args(["--max-live-blocks", &(8u32 << 20).to_string()]);
    let tracer = start_until(command, "tracerd ready", true)?;
    let pid = tracer.pid;
    let maps_before = bpf_map_memory(pid);
    let child = keep_blocks(&exe, 4_000_000)?;
    let (_, maps) = http("GET", "/maps")?;
    let maps: serde_json::Value = serde_json::from_str(&maps)?;
    let blocks = maps["live_allocs_by_pid"][child.id().to_string()]
        .as_u64()
        .unwrap_or(0);
    let entries = maps["maps"]["LIVE_ALLOCS"]["entries"].as_u64().unwrap_or(0);
    let in_table = maps["maps"]["LIVE_KEYS"]["entries"].as_u64().unwrap_or(0);
    // The fast table is allocated at start (in maps_before): its keys
    // (64-byte buckets of 7) and values (32 bytes) count for its blocks.
    let table_slots = maps["maps"]["LIVE_KEYS"]["capacity"].as_u64().unwrap_or(0);
    let table_bytes = table_slots / 7 * 64 + table_slots * 32;
    let maps_after = bpf_map_memory(pid);
    let per_block =
        (maps_after.saturating_sub(maps_before) + table_bytes) as f64 / blocks.max(1) as f64;
    let exited = Instant::now();
    finish(child);
    // The exited process's blocks leave the kernel map (one pass, batched).
    loop {
        let (_, maps) = http("GET", "/maps")?;
        let maps: serde_json::Value = serde_json::from_str(&maps)?;
        if maps["live_allocs_by_pid"]
            .as_object()
            .is_some_and(|m| m.values().all(|v| v.as_u64() < Some(100_000)))
        {
            break;
        }
        if exited.elapsed() > Duration::from_secs(60) {
            bail!("the exited process's blocks are still in LIVE_ALLOCS after 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cleanup_ms = exited.elapsed().as_secs_f64() * 1000.0;
    let child = keep_blocks(&exe, 1_000_000)?;
    let start = Instant::now();
    let (status, body) = http("POST", &format!("/pid/{}/snapshots", child.id()))?;
    let snapshot_ms = start.elapsed().as_secs_f64() * 1000.0;
    if status != 201 {
        bail!("snapshot failed ({status}): {body}");
    }
    let summary: serde_json::Value = serde_json::from_str(&body)?;
    let start = Instant::now();
    let (status, _) = http(
        "GET",
        &format!("/pid/{}/statistics?group_by=lineno&limit=10", child.id()),
    )?;
    let statistics_ms = start.elapsed().as_secs_f64() * 1000.0;
    finish(child);
    tracer.stop();
    println!("\n### Scale\n");
    println!(
        "- live blocks of one process held at once: {blocks} ({in_table} in the fast table of {table_slots}; LIVE_ALLOCS entries in all: {entries})"
    );
    println!(
        "- kernel memory per live block: {per_block:.0} bytes (BPF maps' memlock, before/after, plus the preallocated table's {table_bytes} bytes)"
    );
    println!("- its 4,000,000 blocks left the kernel map {cleanup_ms:.0} ms after it exited");
    println!(
        "- POST /pid/N/snapshots of {} live blocks: {snapshot_ms:.0} ms; GET statistics (lineno) of them: {statistics_ms:.0} ms (status {status})",
        summary["traces"]
    );
    Ok(serde_json::json!({
        "blocks_held": blocks,
        "live_allocs_entries": entries,
        "live_table_entries": in_table,
        "live_table_bytes": table_bytes,
        "kernel_bytes_per_block": per_block,
        "exit_cleanup_ms": cleanup_ms,
        "snapshot_1m_ms": snapshot_ms,
        "snapshot_traces": summary["traces"],
        "statistics_1m_ms": statistics_ms,
    }))
}

/// Churn of a process outside the scope while another process is traced:
/// against uninstrumented, median of the rounds.
fn scope_part(root: &Path, dir: &Path, args: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let churn = dir.join("churn");
    let run = || -> anyhow::Result<f64> {
        let out = Command::new(&churn).arg(args.pairs.to_string()).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<f64>()
            .context("churn figure")
    };
    let mut none = Vec::new();
    let mut scoped = Vec::new();
    let mut traced = Vec::new();
    let mut sleeper = Command::new("sleep").arg("600").spawn()?;
    run()?; // warm-up
    for _ in 0..args.rounds.max(1) {
        none.push(run()?);
        let release = crate::target_dir(root).join("release");
        let mut command = Command::new(release.join("tracerd"));
        command
            .args(["--listen", "127.0.0.1:7467", "--state-dir"])
            .arg(dir.join("state"))
            .args(["--scope-pid", &sleeper.id().to_string()]);
        let tracer = start_until(command, "tracerd ready", true)?;
        scoped.push(run()?);
        // The same churn in scope, for contrast.
        let (status, body) = http("PUT", "/scope")?;
        if status != 200 {
            bail!("PUT /scope failed ({status}): {body}");
        }
        traced.push(run()?);
        tracer.stop();
    }
    signal(sleeper.id(), "KILL");
    let _ = sleeper.wait();
    let (none, scoped, traced) = (median(&mut none), median(&mut scoped), median(&mut traced));
    println!("\n### Scope\n");
    println!(
        "- churn outside the scope while another process is traced: {scoped:.1} ns/pair vs {none:.1} uninstrumented ({:.2}x); traced: {traced:.1} ns/pair",
        scoped / none
    );
    Ok(serde_json::json!({
        "uninstrumented_ns_per_pair": none,
        "out_of_scope_ns_per_pair": scoped,
        "ratio": scoped / none,
        "traced_ns_per_pair": traced,
    }))
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &BenchArgs,
    modes: &[&str],
    workloads: &[Workload],
    results: &mut BTreeMap<&str, BTreeMap<&str, Vec<f64>>>,
    tracerd_cpu_ticks: &[u64],
    tracerd_rss_kb: u64,
    tracerd_map_bytes: u64,
) -> anyhow::Result<()> {
    let mut medians: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (workload, by_mode) in results.iter_mut() {
        for (mode, figures) in by_mode.iter_mut() {
            medians
                .entry(workload.to_string())
                .or_default()
                .insert(mode.to_string(), median(figures));
        }
    }
    println!(
        "\n### Overhead, median of {} rounds (slowdown vs uninstrumented)\n",
        args.rounds
    );
    print!("| workload | unit |");
    for mode in modes {
        print!(" {mode} |");
    }
    println!();
    print!("|---|---|");
    for _ in modes {
        print!("---|");
    }
    println!();
    for workload in workloads {
        let Some(by_mode) = medians.get(workload.name) else {
            continue;
        };
        let base = by_mode.get("none").copied();
        print!("| {} | {} |", workload.name, workload.unit);
        for mode in modes {
            match (by_mode.get(*mode), base) {
                (Some(v), Some(b)) if *mode != "none" => print!(" {v:.1} ({:.2}x) |", v / b),
                (Some(v), _) => print!(" {v:.1} |"),
                _ => print!(" - |"),
            }
        }
        println!();
    }
    let mut goals = serde_json::Map::new();
    if let Some(churn) = medians.get("churn")
        && let (Some(none), Some(ours)) = (churn.get("none"), churn.get("tracerd"))
    {
        let added = ours - none;
        println!("\nchurn: tracerd adds {added:.0} ns per malloc+free pair");
        goals.insert("tracerd_added_ns_per_pair".into(), added.into());
        if let Some(memleak) = churn.get("memleak") {
            let theirs = memleak - none;
            let ratio = added / theirs;
            println!(
                "  memleak-style bpftrace adds {theirs:.0} ns: tracerd/memleak = {ratio:.2} (goal <= 0.35)"
            );
            goals.insert("memleak_added_ns_per_pair".into(), theirs.into());
            goals.insert("ratio_vs_memleak".into(), ratio.into());
        }
        if let Some(floor) = churn.get("floor") {
            let floor_added = floor - none;
            let ratio = added / floor_added;
            println!(
                "  empty programs at the same points add {floor_added:.0} ns: tracerd/floor = {ratio:.2} (goal <= 1.5)"
            );
            goals.insert("floor_added_ns_per_pair".into(), floor_added.into());
            goals.insert("ratio_vs_floor".into(), ratio.into());
        }
    }
    let ticks_per_s = 100.0;
    let mut cpu = tracerd_cpu_ticks.to_vec();
    cpu.sort_unstable();
    let cpu_median_ms = cpu
        .get(cpu.len() / 2)
        .map_or(0.0, |t| *t as f64 / ticks_per_s * 1000.0);
    println!(
        "tracerd: {cpu_median_ms:.0} ms CPU per round of all workloads (median), peak RSS {} MiB, kernel maps {} MiB",
        tracerd_rss_kb / 1024,
        tracerd_map_bytes / (1024 * 1024)
    );
    let json = serde_json::json!({
        "rounds": args.rounds,
        "pairs": args.pairs,
        "medians": medians,
        "goals": goals,
        "tracerd": {
            "cpu_ms_per_round_median": cpu_median_ms,
            "peak_rss_kib": tracerd_rss_kb,
            "bpf_map_bytes": tracerd_map_bytes,
        },
    });
    if let Some(parent) = args.json.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(&args.json, serde_json::to_string_pretty(&json)?)?;
    println!("\nJSON: {}", args.json.display());
    Ok(())
}
