//! Preemption: eight processes with distinct deep stacks allocate at once
//! on the host's CPUs for a minute, and no block carries a traceback its
//! process did not have. Run with full preemption where the kernel lets
//! the test set it (`/sys/kernel/debug/sched/preempt`, restored after);
//! elsewhere in the kernel's own mode, which the output names. And no
//! allocator program keeps its frame where another task could write it: the
//! kernel's JIT images of them set up no per-CPU private stack.

use std::{io::Write as _, process::Command, time::Duration};

use serde_json::Value;

use super::build;
use crate::suite::support::{
    Fixture, Program, Tracerd, bpf_ids, bpftool_json, jited_image, poll, private_stack_frames,
    u64_of,
};

/// The dynamic preemption switch (PREEMPT_DYNAMIC kernels).
const PREEMPT: &str = "/sys/kernel/debug/sched/preempt";

/// How long the processes allocate.
const SECONDS: &str = "60";

/// The preemption mode for the test: full when it could be set (the
/// previous mode is written back on drop), else the kernel's own.
struct PreemptMode {
    /// The mode the test runs in ("full", "none", ... or "unknown").
    mode: String,
    /// The mode to write back on drop (the test changed it).
    restore: Option<String>,
    /// The test mounted debugfs (unmounted on drop).
    mounted: bool,
    /// What happened, for the test's output.
    note: String,
}

impl PreemptMode {
    fn full() -> Self {
        let mut mounted = false;
        if !std::path::Path::new("/sys/kernel/debug/sched").exists() {
            mounted = Command::new("mount")
                .args(["-t", "debugfs", "debugfs", "/sys/kernel/debug"])
                .status()
                .is_ok_and(|s| s.success());
        }
        let before = std::fs::read_to_string(PREEMPT).map(|text| current_mode(&text));
        match std::fs::write(PREEMPT, "full") {
            Ok(()) => {
                let previous = before.ok().flatten();
                Self {
                    mode: "full".to_string(),
                    note: format!(
                        "set full through {PREEMPT} (was {})",
                        previous.as_deref().unwrap_or("unknown")
                    ),
                    restore: previous,
                    mounted,
                }
            }
            Err(err) => {
                let mode = before.ok().flatten().or_else(mode_from_kernel_log);
                Self {
                    mode: mode.unwrap_or_else(|| "unknown".to_string()),
                    note: format!("cannot set full ({PREEMPT}: {err}): the kernel's own mode"),
                    restore: None,
                    mounted,
                }
            }
        }
    }

    /// Whether a program can be preempted in this mode (unknown: maybe).
    fn preempts(&self) -> bool {
        !matches!(self.mode.as_str(), "none" | "voluntary")
    }
}

impl Drop for PreemptMode {
    fn drop(&mut self) {
        if let Some(previous) = &self.restore
            && let Err(err) = std::fs::write(PREEMPT, previous)
        {
            eprintln!("preemption: cannot restore {previous:?} in {PREEMPT}: {err}");
        }
        if self.mounted {
            let _ = Command::new("umount").arg("/sys/kernel/debug").status();
        }
    }
}

/// Writes `line` to stderr past the test harness's capture: the mode the
/// test ran in shows in every run's output, not only a failing one's.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The mode in parentheses of the switch's text (`none voluntary (full) lazy`).
fn current_mode(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('(')?.strip_suffix(')'))
        .map(str::to_string)
}

/// The kernel's mode as its log last named it: `Dynamic Preempt: MODE` at
/// boot, or `PREEMPT(MODE)` in the header of a warning.
fn mode_from_kernel_log() -> Option<String> {
    let out = Command::new("dmesg").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().rev().find_map(|line| {
        if let Some(rest) = line.split("Dynamic Preempt: ").nth(1) {
            return rest.split_whitespace().next().map(str::to_string);
        }
        let rest = line.split("PREEMPT(").nth(1)?;
        rest.split(')').next().map(str::to_string)
    })
}

/// Pattern `p`'s chain of the fixture: the step function at each level,
/// outermost first (as `preempt.c` builds it).
fn chain(p: usize) -> Vec<usize> {
    let mult = [1, 3, 5, 7][p % 4];
    (0..22 + 2 * p).map(|i| (i * mult + p) % 8).collect()
}

/// The tracebacks pattern `p` has, as (function, line), most recent call
/// first and down to main: one per allocation site.
fn tracebacks(prog: &Program, p: usize) -> Vec<Vec<(String, u64)>> {
    let at = |f: &str, marker: &str| (f.to_string(), u64::from(prog.line(marker)));
    let steps = chain(p);
    let mut below = Vec::new();
    let (leaf, callers) = steps.split_last().expect("a chain");
    below.push(at(&format!("step{leaf}"), &format!("LEAF{leaf} */")));
    for k in callers.iter().rev() {
        below.push(at(&format!("step{k}"), &format!("STEP{k} */")));
    }
    below.push(at("run", "RUN */"));
    below.push(at("main", "MAIN */"));
    ["KEEP_ALLOC */", "RING_ALLOC */"]
        .iter()
        .map(|site| {
            let mut frames = vec![at("alloc_block", site)];
            frames.extend(below.iter().cloned());
            frames
        })
        .collect()
}

/// The frames of `traceback` in the fixture's source, as (function, line),
/// and whether they are all its leading frames (none of another file
/// before the last of them).
fn own_frames(prog: &Program, traceback: &Value) -> (Vec<(String, u64)>, bool) {
    let frames = traceback.as_array().expect("traceback");
    let own: Vec<(String, u64)> = frames
        .iter()
        .take_while(|f| f["filename"].as_str() == Some(prog.src()))
        .map(|f| {
            (
                f["function"].as_str().unwrap_or("").to_string(),
                f["lineno"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let leading = frames
        .iter()
        .skip(own.len())
        .all(|f| f["filename"].as_str() != Some(prog.src()));
    (own, leading)
}

#[test]
fn concurrent_processes_never_get_another_process_s_stack() {
    let prog = build("preempt");
    let mode = PreemptMode::full();
    say(&format!(
        "preemption: running in mode {} ({}); kernel {}",
        mode.mode,
        mode.note,
        std::fs::read_to_string("/proc/sys/kernel/version")
            .unwrap_or_default()
            .trim()
    ));
    let patterns: Vec<usize> = (0..8).collect();
    let mut fixtures: Vec<Fixture> = patterns
        .iter()
        .map(|p| Fixture::spawn_ready(&prog.exe, &[&p.to_string(), SECONDS]))
        .collect();
    let scope: Vec<String> = fixtures.iter().map(|f| f.pid().to_string()).collect();
    // Only these processes, each walked whole (at most 41 frames).
    let tracerd = Tracerd::start(&["--nframe", "64", "--scope-pid", &scope.join(",")]);
    for fx in &mut fixtures {
        fx.go();
    }
    let held: Vec<u64> = fixtures
        .iter_mut()
        .map(|fx| {
            let line = fx.read_line();
            line.strip_prefix("done ")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("fixture said {line:?}"))
        })
        .collect();

    let mut frame0_only = 0u64;
    for ((p, fx), held) in patterns.iter().zip(&fixtures).zip(&held) {
        let pid = fx.pid();
        let want = tracebacks(&prog, *p);
        let body = poll(Duration::from_secs(10), Duration::from_millis(100), || {
            let (status, body) =
                tracerd.get(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
            match status {
                200 => Ok(body),
                _ => Err(format!("pid {pid}: {status} {body}")),
            }
        });
        let stats = body["statistics"].as_array().expect("statistics");
        let mut blocks = 0;
        for stat in stats {
            let count = stat["count"].as_u64().expect("count");
            blocks += count;
            let (own, leading) = own_frames(&prog, &stat["traceback"]);
            assert!(
                leading,
                "pattern {p}: frames of the fixture after others: {stat}"
            );
            if want.contains(&own) {
                continue;
            }
            // A walk dropped by preemption keeps the call site only.
            let site = own.first().map(|(f, _)| f.as_str());
            assert!(
                own.len() == 1
                    && site == Some("alloc_block")
                    && want.iter().any(|w| w[0] == own[0]),
                "pattern {p} (pid {pid}): {count} blocks with a traceback it does not have: \
                 {own:?}; its tracebacks: {want:?}"
            );
            frame0_only += count;
        }
        assert_eq!(
            blocks, *held,
            "pattern {p} (pid {pid}): blocks traced: {body}"
        );
    }

    let counters = &tracerd.maps()["counters"];
    let preempted = u64_of(counters, "drop_stack_preempted");
    say(&format!(
        "preemption: mode {}: {} blocks held, {frame0_only} with their call site only, \
         {preempted} stacks dropped by preemption",
        mode.mode,
        held.iter().sum::<u64>(),
    ));
    assert_eq!(u64_of(counters, "drop_stack"), 0, "{counters}");
    assert_eq!(u64_of(counters, "drop_stack_share"), 0, "{counters}");
    assert!(
        frame0_only <= preempted,
        "{frame0_only} blocks lost their stack, {preempted} drops by preemption counted"
    );
    if !mode.preempts() {
        assert_eq!(preempted, 0, "mode {}: {counters}", mode.mode);
        assert_eq!(frame0_only, 0);
    }
    for fx in &mut fixtures {
        fx.end();
    }
}

/// The allocator programs (kprobe-type: uprobes and uretprobes) run
/// preemptible, so none may keep its frame in a per-CPU private stack,
/// which Linux 6.14 and later give a program of that type whose frame is
/// 64 bytes or more: another task on the same CPU would write it. Their
/// JIT images (read from the kernel, disassembled by objdump) must not set
/// one up. The tracepoint programs, which run with preemption off, keep
/// theirs: they show the check sees a private stack where there is one.
#[test]
fn no_allocator_program_keeps_its_frame_in_a_per_cpu_private_stack() {
    let mut sleeper = std::process::Command::new("sleep")
        .arg("120")
        .spawn()
        .expect("spawn sleep");
    let tracerd = Tracerd::start(&["--scope-pid", &sleeper.id().to_string()]);
    let mut uprobes = Vec::new();
    let mut tracepoints = Vec::new();
    for (kind, id) in bpf_ids(tracerd.pid()) {
        if kind != "prog" {
            continue;
        }
        let info = bpftool_json("prog", id).expect("bpftool prog show");
        let name = info["name"].as_str().unwrap_or("").to_string();
        let image = jited_image(id).unwrap_or_else(|e| panic!("JIT image of {name}: {e}"));
        let frames = private_stack_frames(&image);
        match info["type"].as_str() {
            Some("kprobe") => uprobes.push((name, frames)),
            Some("tracepoint") => tracepoints.push((name, frames)),
            _ => {}
        }
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    say(&format!(
        "private stacks: allocator programs {uprobes:?}; tracepoints {tracepoints:?}"
    ));
    // Every allocator entry and return program of tracer_common::PROBES,
    // each loaded once (the calls of one shape share theirs).
    let expected: std::collections::BTreeSet<&str> = tracer_common::PROBES
        .iter()
        .flat_map(|spec| std::iter::once(spec.entry).chain(spec.exit))
        .collect();
    let loaded: std::collections::BTreeSet<&str> =
        uprobes.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(loaded, expected, "allocator programs: {uprobes:?}");
    assert_eq!(
        uprobes.len(),
        expected.len(),
        "allocator programs: {uprobes:?}"
    );
    let private: Vec<_> = uprobes.iter().filter(|(_, n)| *n != 0).collect();
    assert!(
        private.is_empty(),
        "allocator programs on a private stack: {private:?}"
    );
    // The control: on x86-64 from Linux 6.14 the JIT gives the lifecycle
    // tracepoints (frames of 64 bytes or more, no tail call) a private
    // stack.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut version = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    if (major, minor) >= (6, 14) {
        let with: Vec<_> = tracepoints.iter().filter(|(_, n)| *n != 0).collect();
        assert!(
            tracepoints.iter().any(|(_, n)| *n != 0),
            "kernel {release}: no tracepoint program has a private stack, so the check \
             cannot see one: {tracepoints:?} ({with:?})"
        );
    }
}
