//! The one list of tracers whose probes or instrumentation distort a
//! measurement (every allocation of the host traps into them), and the
//! running processes that match it. `bench` and `bench-model` refuse to run
//! while one is found, unless `--force`.
use std::fs;

/// Prefixes of the `comm` (at most 15 characters) of tracer processes:
/// tracerd and the bench's floor, the bench's reference tools (bpftrace,
/// heaptrack, valgrind's tools run as `memcheck-amd64-`, `massif-amd64-li`)
/// and bcc's memleak (`memleak-bpfcc`).
pub const TRACERS: [&str; 8] = [
    "tracerd",
    "tracer-floor",
    "bpftrace",
    "heaptrack",
    "memleak",
    "valgrind",
    "memcheck-amd64-",
    "massif-amd64-",
];

/// Whether a process named `comm` is a tracer.
pub fn is_tracer(comm: &str) -> bool {
    TRACERS.iter().any(|t| comm.starts_with(t))
}

/// Running tracers, as `comm (pid N)`.
pub fn running() -> Vec<String> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<(u32, String)> = dir
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = fs::read_to_string(entry.path().join("comm")).ok()?;
            let comm = comm.trim();
            is_tracer(comm).then(|| (pid, comm.to_string()))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .map(|(pid, comm)| format!("{comm} (pid {pid})"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracer_names_match_by_prefix() {
        for comm in [
            "tracerd",
            "tracer-floor",
            "bpftrace",
            "heaptrack_inter",
            "memleak-bpfcc",
            "memcheck-amd64-",
            "massif-amd64-li",
        ] {
            assert!(is_tracer(comm), "{comm}");
        }
        for comm in ["xtask", "cargo", "bash", "tracer_daemon-1", "python3"] {
            assert!(!is_tracer(comm), "{comm}");
        }
    }
}
