//! What a process holds in the kernel: the ids of its BPF programs, maps
//! and links (from `/proc/PID/fdinfo`), and `bpftool`'s view of them.

use std::process::{Command, Stdio};

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
