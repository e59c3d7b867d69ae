//! `cargo xtask test`: set up, then run every test (as root: the
//! integration tests load eBPF programs).
//!
//! Tests that need no root run first, in parallel: every crate but the
//! daemon (the model's differential tests included), then the daemon's
//! unit tests. Then the integration tests, one at a time: they attach
//! probes host-wide. Arguments after `--` (e.g. a test-name filter) go to
//! every test binary.
use std::ffi::OsString;

use anyhow::bail;

use crate::{
    setup::setup,
    util::cmd::{cargo, is_root},
};

/// `cargo ARGS -- EXTRA`.
fn command(args: &[&str], extra: &[OsString]) -> Vec<OsString> {
    args.iter()
        .map(OsString::from)
        .chain(extra.iter().cloned())
        .collect()
}

pub fn run(extra: &[OsString]) -> anyhow::Result<()> {
    setup()?;
    if !is_root() {
        bail!("the integration tests load eBPF programs: run `cargo xtask test` as root");
    }
    // tracer-ebpf is built by aya-build for the BPF target only.
    cargo(&command(
        &[
            "test",
            "--workspace",
            "--exclude",
            "tracer-ebpf",
            "--exclude",
            "tracer-daemon",
            "--",
        ],
        extra,
    ))?;
    cargo(&command(
        &["test", "-p", "tracer-daemon", "--lib", "--bins", "--"],
        extra,
    ))?;
    cargo(&command(
        &[
            "test",
            "-p",
            "tracer-daemon",
            "--test",
            "*",
            "--",
            "--test-threads=1",
        ],
        extra,
    ))
}
