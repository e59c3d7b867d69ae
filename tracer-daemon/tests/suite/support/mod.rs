//! What the root integration tests share: the real tracerd, the C fixtures
//! (compiled from `tests/fixtures/`, run and stepped through their line
//! protocol), Debian's services (nginx, PostgreSQL), scratch files, process
//! control, and readers of the answers.
//! Everything started here is stopped by pid on drop, even when a test
//! fails.

mod files;
mod fixture;
mod json;
mod kernel;
mod process;
mod services;
mod shared;
mod tracerd;

pub use files::{TempDir, fixture_path, fixture_text, line_of};
pub use fixture::{Fixture, Program};
pub use json::{sample, snapshot_ids, stat_at, u64_of};
pub use kernel::{
    bpf_ids, bpftool_json, bpftool_shows, jited_image, left_after, private_stack_frames,
    uprobe_events_of,
};
pub use process::{
    cgroup_v2, free_port, kill_if_running, output_ok, poll, require_root, running, signal, stop,
};
pub use services::{Frozen, Held, Nginx, Postgres};
pub use shared::{SharedTracerd, stop_shared};
pub use tracerd::{Tracerd, token_file};
