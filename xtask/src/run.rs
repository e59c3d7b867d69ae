//! `cargo xtask run [-- TRACERD_ARGS]`: set up, build tracerd and the
//! `tracer` command in release mode, say where `tracer` is, and run tracerd
//! in the foreground with the given flags (needs root).
use std::{ffi::OsString, process::Command};

use anyhow::{Context as _, bail};

use crate::{
    setup::setup,
    util::{cmd::cargo, paths::release_dir, paths::workspace_root},
};

pub fn run(args: &[OsString]) -> anyhow::Result<()> {
    setup()?;
    // One cargo run for both: the README's next step is `tracer`.
    cargo(&[
        "build",
        "--release",
        "-p",
        "tracer-daemon",
        "-p",
        "tracer-cli",
    ])?;
    let release = release_dir(&workspace_root());
    let tracerd = release.join("tracerd");
    eprintln!(
        "xtask: the tracer command is {} (in another terminal: `{0} ps`); starting {}",
        release.join("tracer").display(),
        tracerd.display()
    );
    let status = Command::new(&tracerd)
        .args(args)
        .status()
        .with_context(|| format!("starting {}", tracerd.display()))?;
    if !status.success() {
        bail!("tracerd exited with {status}");
    }
    Ok(())
}
