//! `tracer-floor`: attaches empty eBPF programs at exactly the points
//! tracerd probes (same libraries, same offsets, uprobes and uretprobes),
//! prints `ready`, and holds them until it is stopped (SIGTERM/SIGINT).
//!
//! What a workload costs under it is the physical floor of the probes: the
//! traps, the kernel's uprobe machinery and an empty program. `cargo xtask
//! bench` measures tracerd against it.
use std::path::PathBuf;

use anyhow::Context as _;
use tracer_daemon::capture::{Capture, CaptureConfig};

fn main() -> anyhow::Result<()> {
    let libc: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let capture = Capture::load_floor(CaptureConfig {
        nframe: 1,
        walk_frames: 1,
        unwind_table_rows: 0,
        unwind_table_pages: 64,
        unwind_processes: 16,
        max_live_blocks: 1024,
        live_table_blocks: 0,
        process_share: 100,
        trace_mmap: false,
        max_stacks: 256,
        max_procs: 64,
        max_inflight: 1,
        inflight_slots: 1,
        events_ring_bytes: 4096,
        libc,
        sample_interval: 0,
        system_wide: true,
    })
    .context("attaching the empty programs (needs root)")?;
    for library in capture.libraries() {
        eprintln!(
            "tracer-floor: {} {}",
            library.path.display(),
            library.probes.join(" ")
        );
    }
    println!("ready");
    loop {
        std::thread::park();
    }
}
