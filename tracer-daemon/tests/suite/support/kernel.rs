//! What a process holds in the kernel: the ids of its BPF programs, maps
//! and links (from `/proc/PID/fdinfo`), `bpftool`'s view of them, and the
//! uprobe events it registered.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

/// Ids of the BPF programs, maps and links `pid` holds, as (kind, id), from
/// the `prog_id:`/`map_id:`/`link_id:` lines of its `/proc/PID/fdinfo`;
/// sorted, without repeats; empty when the process is gone.
pub fn bpf_ids(pid: u32) -> Vec<(&'static str, u32)> {
    let mut ids = Vec::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            for (prefix, kind) in [
                ("prog_id:", "prog"),
                ("map_id:", "map"),
                ("link_id:", "link"),
            ] {
                if let Some(id) = line
                    .strip_prefix(prefix)
                    .and_then(|v| v.trim().parse().ok())
                {
                    ids.push((kind, id));
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn bpftool(kind: &str, id: u32, json: bool) -> std::process::Output {
    let mut command = Command::new("bpftool");
    if json {
        command.arg("-j");
    }
    command
        .args([kind, "show", "id", &id.to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("run bpftool (cargo xtask setup installs it)")
}

/// Whether `bpftool {kind} show id {id}` finds the object.
pub fn bpftool_shows(kind: &str, id: u32) -> bool {
    bpftool(kind, id, false).status.success()
}

/// `bpftool -j {kind} show id {id}`, when it answers JSON.
pub fn bpftool_json(kind: &str, id: u32) -> Option<Value> {
    serde_json::from_slice(&bpftool(kind, id, true).stdout).ok()
}

/// The uprobe events tracerd `pid` registered (aya names them
/// `aya_{pid}_...`), from tracefs' `uprobe_events`.
pub fn uprobe_events_of(pid: u32) -> Vec<String> {
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events")
        .or_else(|_| std::fs::read_to_string("/sys/kernel/debug/tracing/uprobe_events"))
        .unwrap_or_default();
    events
        .lines()
        .filter(|l| l.contains(&format!("aya_{pid}_")))
        .map(str::to_string)
        .collect()
}

/// Of `held` (from [`bpf_ids`] while its process ran), what `bpftool`
/// still shows once `within` has passed, or sooner when nothing is left:
/// the kernel frees programs, maps and links once their last reference
/// goes, after an RCU grace period.
pub fn left_after(held: &[(&'static str, u32)], within: Duration) -> Vec<(&'static str, u32)> {
    let deadline = Instant::now() + within;
    let mut left = held.to_vec();
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|(kind, id)| bpftool_shows(kind, *id));
        std::thread::sleep(Duration::from_millis(100));
    }
    left
}
