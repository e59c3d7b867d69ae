//! The one way a C program under test is compiled.
use std::{ffi::OsStr, io, path::Path, process::Command};

/// Runs `COMPILER -g -fno-omit-frame-pointer -o EXE SOURCE FLAGS...`: debug
/// info for the lines tracer shows, frame pointers for the walks that use
/// them; `FLAGS` come last, so an `-O2` there wins and libraries (`-l`)
/// follow the source.
///
/// # Errors
/// The compiler cannot run, or fails: the error holds its messages.
pub fn compile<F: AsRef<OsStr>>(
    compiler: &str,
    source: &Path,
    exe: &Path,
    flags: &[F],
) -> io::Result<()> {
    let out = Command::new(compiler)
        .args(["-g", "-fno-omit-frame-pointer", "-o"])
        .arg(exe)
        .arg(source)
        .args(flags)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running {compiler}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{compiler} {} failed ({}):\n{}",
        source.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    )))
}

/// The features of the Rust fixture crate
/// (`tracer-daemon/tests/fixtures/rust_allocators`) that the root suite
/// builds: its `rust_allocators` tests, one each.
pub const RUST_FIXTURE_FEATURES: [&str; 2] = ["jemalloc", "mimalloc"];

/// The arguments of `cargo` that build the Rust fixture crate with
/// `--features {feature}` (release, `--locked`, its own Cargo.lock), into
/// `{scratch}/rust_allocators-{feature}`, `scratch` being the suite's
/// `CARGO_TARGET_TMPDIR`; the executable is then
/// `{scratch}/rust_allocators-{feature}/release/rust_allocators`. The
/// suite runs them, and `cargo xtask test` runs them first at low priority:
/// one command, so that the suite's build finds the fixture up to date.
pub fn rust_fixture_build(
    manifest: &Path,
    scratch: &Path,
    feature: &str,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = ["build", "--release", "--locked", "--quiet"]
        .into_iter()
        .map(Into::into)
        .collect();
    args.push("--features".into());
    args.push(feature.into());
    args.push("--manifest-path".into());
    args.push(manifest.into());
    args.push("--target-dir".into());
    args.push(scratch.join(format!("rust_allocators-{feature}")).into());
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TempDir;

    #[test]
    fn compiles_and_runs_a_program() {
        let dir = TempDir::new("cc-test");
        let (source, exe) = (dir.path().join("answer.c"), dir.path().join("answer"));
        std::fs::write(&source, "int main(void) { return 42; }\n").expect("write");
        compile("cc", &source, &exe, &["-O2"]).expect("compiles");
        let status = Command::new(exe).status().expect("runs");
        assert_eq!(status.code(), Some(42));
    }

    #[test]
    fn a_compile_error_holds_the_compilers_message() {
        let dir = TempDir::new("cc-test-bad");
        let source = dir.path().join("bad.c");
        std::fs::write(&source, "int main(void) { return }\n").expect("write");
        let err = compile::<&str>("cc", &source, &dir.path().join("bad"), &[]).unwrap_err();
        assert!(err.to_string().contains("bad.c:1:"), "{err}");
    }
}
