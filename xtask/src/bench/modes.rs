//! The overhead part's modes and the system-wide tracers they start:
//! uninstrumented; `tracer-floor` (empty programs at tracerd's own probe
//! points: the physical floor); tracerd (exact); `tracerd-sampled`
//! (tracerd sampling one byte in [`SAMPLE_INTERVAL`] on average: what a
//! pair costs when almost no call is recorded); `baseline` (tracerd built
//! at another revision, with `--baseline`); a bpftrace script doing what
//! bcc's memleak does; heaptrack and `valgrind --tool=massif` (which wrap
//! each workload instead, see `workloads::run_once`). And what a running
//! tracer costs: CPU time, peak RSS, kernel map memory.
use std::{
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::baseline::Baseline;
use crate::util::paths::release_dir;
use tracer_testkit::{Running, TracerdProcess};

/// Every mode, in the table's order (`baseline` only with `--baseline`).
pub const ALL_MODES: [&str; 8] = [
    "none",
    "floor",
    "tracerd",
    "tracerd-sampled",
    "baseline",
    "memleak",
    "heaptrack",
    "massif",
];

/// The modes that run a tracerd, whose own costs are reported.
pub const DAEMON_MODES: [&str; 3] = ["tracerd", "tracerd-sampled", "baseline"];

/// The mean sampling interval of the mode `tracerd-sampled`, in bytes
/// (`--sample-interval`): 512 KiB, so that a churn pair's 64-byte block
/// is recorded about once in 8,192 pairs.
pub const SAMPLE_INTERVAL: u64 = 512 * 1024;

/// Where the bench's tracerd listens (the scale and scope parts call it).
pub const LISTEN: &str = "127.0.0.1:7467";

/// How long a tracer gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The modes of one round: `modes` as given, except that tracerd and
/// baseline trade places every other round, so that neither always runs
/// right after the same mode (drift and warm caches fall on both alike).
pub fn round_order<'a>(modes: &[&'a str], round: usize) -> Vec<&'a str> {
    let mut order = modes.to_vec();
    if round.is_multiple_of(2)
        && let (Some(a), Some(b)) = (
            order.iter().position(|m| *m == "tracerd"),
            order.iter().position(|m| *m == "baseline"),
        )
    {
        order.swap(a, b);
    }
    order
}

/// Starts `command` and waits until a line of its output contains `ready`.
pub fn start_until(
    mut command: Command,
    ready: &str,
    from_stderr: bool,
) -> anyhow::Result<Running> {
    if from_stderr {
        command.stdout(Stdio::null()).stderr(Stdio::piped());
    } else {
        command.stdout(Stdio::piped()).stderr(Stdio::null());
    }
    let mut tracer = Running::spawn(&mut command)
        .with_context(|| format!("starting {:?}", command.get_program()))?;
    let child = tracer.child();
    let pipe: Box<dyn std::io::Read + Send> = if from_stderr {
        Box::new(child.stderr.take().context("stderr")?)
    } else {
        Box::new(child.stdout.take().context("stdout")?)
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let ready = ready.to_string();
    // Reads the pipe until it closes, so the tracer never blocks on it.
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
    rx.recv_timeout(Duration::from_secs(120))
        .context("the tracer did not become ready")?;
    // Give the kernel a moment to finish installing breakpoints.
    std::thread::sleep(Duration::from_millis(300));
    Ok(tracer)
}

/// A tracerd (ours or the baseline's) on [`LISTEN`] with its state in
/// `state`, by the root suite's runner: ready once `/health` answers 200.
pub fn start_tracerd(tracerd: &Path, state: &Path, extra: &[&str]) -> anyhow::Result<Running> {
    let listen = LISTEN.parse().context("LISTEN")?;
    // Ours traces every process exactly unless `extra` says otherwise (the
    // workloads start after it); a baseline from before `--exact` did so
    // by default.
    let mut args: Vec<&str> = extra.to_vec();
    let baseline = tracerd.components().any(|c| c.as_os_str() == "baseline");
    if !baseline && !extra.contains(&"--exact") {
        args.extend(["--exact", "all"]);
    }
    let process = TracerdProcess::start_on(
        listen,
        tracerd,
        state,
        &args,
        Stdio::null(),
        Duration::from_secs(120),
    )
    .with_context(|| format!("starting {}", tracerd.display()))?;
    // Give the kernel a moment to finish installing breakpoints.
    std::thread::sleep(Duration::from_millis(300));
    Ok(process.into_running())
}

/// The objects the floor and tracerd probe from the start: the host's
/// glibc, then the allocator libraries of the churn-* workloads that are
/// installed.
fn probed_libraries() -> anyhow::Result<Vec<String>> {
    let mut libraries = vec![libc_path()?];
    for (_, _, library) in super::workloads::ALLOCATOR_CHURNS {
        if Path::new(library).exists() {
            libraries.push(library.to_string());
        }
    }
    Ok(libraries)
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

/// Starts the system-wide tracer of `mode` (None for the modes that have
/// none or wrap the workload).
pub fn start_mode(
    mode: &str,
    root: &Path,
    dir: &Path,
    baseline: Option<&Baseline>,
) -> anyhow::Result<Option<Running>> {
    let release = release_dir(root);
    match mode {
        "floor" => {
            // The host's glibc and the churn-* workloads' allocators.
            let mut command = Command::new(release.join("tracer-floor"));
            command.args(probed_libraries()?);
            start_until(command, "ready", false).map(Some)
        }
        "tracerd" | "tracerd-sampled" => {
            // The same objects probed from the start as under the floor:
            // a churn-* run is then traced from its first call, not from
            // when discovery finds its allocator.
            let mut extra = vec!["--log".to_string(), "info".to_string()];
            if mode == "tracerd-sampled" {
                extra.extend(["--sample-interval".to_string(), SAMPLE_INTERVAL.to_string()]);
            }
            for library in probed_libraries()? {
                extra.extend(["--libc".to_string(), library]);
            }
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            // A state directory per mode: a sampled tracerd's stored
            // snapshots are estimates, never mixed with exact ones.
            let state = dir.join(if mode == "tracerd" {
                "state"
            } else {
                "state-sampled"
            });
            start_tracerd(&release.join("tracerd"), &state, &extra).map(Some)
        }
        "baseline" => {
            let Some(baseline) = baseline else {
                bail!("the baseline mode needs --baseline REV");
            };
            // A state directory of its own: stored files of another
            // revision's format are never read by the other.
            start_tracerd(
                &baseline.tracerd(),
                &dir.join("state-baseline"),
                &["--log", "info"],
            )
            .map(Some)
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

/// CPU time (user + system, in clock ticks) and peak RSS (kB) of a pid.
pub fn cpu_and_rss(pid: u32) -> (u64, u64) {
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
    (ticks, tracer_testkit::status_kib(pid, "VmHWM").unwrap_or(0))
}

/// Kernel memory of a process's BPF maps in bytes (the `memlock:` of each
/// map fd in /proc/PID/fdinfo).
pub fn bpf_map_memory(pid: u32) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracerd_and_baseline_trade_places_every_other_round() {
        let modes = ["none", "tracerd", "baseline", "memleak"];
        assert_eq!(round_order(&modes, 1), modes);
        assert_eq!(
            round_order(&modes, 2),
            ["none", "baseline", "tracerd", "memleak"]
        );
        assert_eq!(round_order(&modes, 3), modes);
        // Without a baseline the order never changes.
        assert_eq!(round_order(&["none", "tracerd"], 2), ["none", "tracerd"]);
    }

    #[test]
    fn cpu_and_rss_of_this_process_are_positive() {
        let (_, hwm) = cpu_and_rss(std::process::id());
        assert!(hwm > 0);
    }

    #[test]
    fn memleak_script_probes_the_given_libc() {
        let script = memleak_script("/lib/libc.so.6");
        assert!(script.contains("uprobe:/lib/libc.so.6:malloc "));
        assert!(script.contains("uprobe:/lib/libc.so.6:free "));
    }
}
