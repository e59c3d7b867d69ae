//! What drives a tracerd under test, one way for every harness: the root
//! suite (`tracer-daemon/tests/integration.rs`), the daemon's unprivileged
//! test binaries, the model's differential tests, and xtask's bench, load,
//! soak and hostile tasks.
//!
//! - [`TempDir`]: a scratch directory, removed on drop;
//! - [`Running`], [`signal`], [`free_port`], [`poll`]: child processes
//!   stopped by pid (SIGTERM, then SIGKILL), even when the caller fails;
//! - [`compile`]: the C compiler, with debug info and frame pointers;
//!   [`rust_fixture_build`]: cargo's build of the Rust fixture crate;
//! - [`Client`]: the HTTP client of tracerd's API (reqwest);
//! - [`TracerdProcess`]: a tracerd on a free loopback port, ready once
//!   `/health` answers 200, stopped by pid.
//!
//! Errors are `std::io::Error`s that say what failed; the tests' wrappers
//! turn them into panics, xtask into its `anyhow` chain.

mod cc;
mod dir;
mod http;
mod process;
mod tracerd;

pub use cc::{RUST_FIXTURE_FEATURES, compile, rust_fixture_build};
pub use dir::TempDir;
pub use http::{Client, Response};
pub use process::{Running, free_port, kill_child, poll, signal, status_kib, stop_child};
pub use tracerd::TracerdProcess;
