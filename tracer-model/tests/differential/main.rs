//! The differential tests of the model against CPython 3.11, as one test
//! binary (`cargo test -p tracer-model --test differential`) so that cargo
//! links it once and its tests run in parallel. Each area is a module;
//! the oracles are Python scripts in `support/`, run by `oracle`.
//!
//! No test needs root: the oracles read stdin and write stdout, and the
//! only files written are under the system's temporary directory
//! (`common::TempDir`).

mod common;
mod oracle;

mod filter;
mod format;
mod interop;
mod model;
mod sites;
