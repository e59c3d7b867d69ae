//! Capture: the real tracerd with its real eBPF programs tracing C programs
//! compiled from `tests/fixtures/`, checked through the HTTP API with exact
//! sizes, counts and `file:line`.

mod alloc;
mod daemon;
mod lifecycle;
mod sampling;
mod stacks;
mod tables;
mod wrappers;

use super::support::Program;

/// `fixtures/{name}.c`, compiled (with `-pthread`, as every capture
/// fixture is).
fn build(name: &str) -> Program {
    Program::build(name, &["-pthread"])
}
