//! Capture: the real tracerd with its real eBPF programs tracing C programs
//! compiled from `tests/fixtures/`, checked through the HTTP API with exact
//! sizes, counts and `file:line`, on the host and in a podman container.

mod alloc;
mod allocators;
mod batch;
mod capacity;
mod container;
mod cut;
mod daemon;
mod lifecycle;
mod mappings;
mod preemption;
mod rust_allocators;
mod sampling;
mod stack_totals;
mod stacks;
mod starts;
mod tables;
mod wrappers;

use serde_json::Value;

use super::support::{Fixture, Program, Tracerd};

/// `fixtures/{name}.c`, compiled (with `-pthread`, as every capture
/// fixture is).
fn build(name: &str) -> Program {
    Program::build(name, &["-pthread"])
}

/// Runs `exe` traced: a snapshot at "ready", then "go" until "done".
/// Returns the fixture (waiting), the snapshot's summary and the compare
/// against it grouped by line (`limit=0`).
fn snapshot_step_compare(tracerd: &Tracerd, exe: &std::path::Path) -> (Fixture, Value, Value) {
    let mut fx = Fixture::spawn_traced(tracerd, exe, &[]);
    let pid = fx.pid();
    let (status, base) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{base}");
    fx.step("done");
    let compare = tracerd.get_ok(&format!("/pid/{pid}/compare?group_by=lineno&limit=0"));
    (fx, base, compare)
}
