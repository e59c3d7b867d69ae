//! `cargo xtask run [-- TRACERD_ARGS]`: set up, build tracerd in release
//! mode and run it in the foreground with the given flags (needs root).
use std::{ffi::OsString, process::Command};

use anyhow::{Context as _, bail};

use crate::{
    setup::setup,
    util::{cmd::cargo, paths::release_dir, paths::workspace_root},
};

pub fn run(args: &[OsString]) -> anyhow::Result<()> {
    setup()?;
    cargo(&["build", "--release", "-p", "tracer-daemon"])?;
    let tracerd = release_dir(&workspace_root()).join("tracerd");
    let status = Command::new(&tracerd)
        .args(args)
        .status()
        .with_context(|| format!("starting {}", tracerd.display()))?;
    if !status.success() {
        bail!("tracerd exited with {status}");
    }
    Ok(())
}
