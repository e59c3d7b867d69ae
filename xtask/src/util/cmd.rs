//! Running commands: cargo in the workspace, a command that must succeed,
//! the output of a probe command, and who we are.
use std::{
    env,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use super::paths::workspace_root;

/// `cargo ARGS` in the workspace root; fails unless it succeeds.
pub fn cargo<S: AsRef<OsStr>>(args: &[S]) -> anyhow::Result<()> {
    cargo_in(&workspace_root(), args, &[])
}

/// `cargo ARGS` in `dir` with extra environment variables; fails unless it
/// succeeds. The cargo that runs xtask, so the toolchain is the same.
pub fn cargo_in<S: AsRef<OsStr>>(
    dir: &Path,
    args: &[S],
    envs: &[(&str, &OsStr)],
) -> anyhow::Result<()> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let shown = display(args);
    let status = Command::new(&cargo)
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(dir)
        .status()
        .with_context(|| format!("running cargo {shown}"))?;
    if !status.success() {
        bail!("cargo {shown} failed ({status})");
    }
    Ok(())
}

/// Arguments joined by spaces, for messages.
pub fn display<S: AsRef<OsStr>>(args: &[S]) -> String {
    args.iter()
        .map(|a| a.as_ref().to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `command` with inherited output; fails unless it succeeds.
pub fn run_checked(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// Runs `command` and returns its stdout; fails with its stderr unless it
/// succeeds. `what` names it in messages.
pub fn stdout_of(command: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Output of a command, or None if it could not run or failed.
pub fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether xtask runs as root (the eBPF tasks need it).
pub fn is_root() -> bool {
    output("id", &["-u"]).is_some_and(|uid| uid.trim() == "0")
}

/// The first `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    env::var_os("PATH").and_then(|paths| {
        env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_of_returns_stdout_and_reports_stderr_on_failure() {
        let out = stdout_of(Command::new("sh").args(["-c", "echo hi"]), "echo").unwrap();
        assert_eq!(out, "hi\n");
        let err = stdout_of(
            Command::new("sh").args(["-c", "echo oops >&2; exit 3"]),
            "failing",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("failing failed"), "{err}");
        assert!(err.contains("oops"), "{err}");
    }

    #[test]
    fn output_is_none_for_a_failing_command() {
        assert_eq!(output("sh", &["-c", "exit 1"]), None);
        assert_eq!(output("sh", &["-c", "echo x"]).as_deref(), Some("x\n"));
    }
}
