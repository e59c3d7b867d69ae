//! The one way a C workload is compiled: gcc with debug info and frame
//! pointers (tracer walks frame pointers), the caller's optimisation and
//! link flags, the source written next to the executable; gcc's messages
//! are in the error when it fails.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// Writes `DIR/NAME.c`, compiles it to `DIR/NAME` with
/// `gcc -g -fno-omit-frame-pointer -o DIR/NAME DIR/NAME.c FLAGS`.
pub fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let src = dir.join(format!("{name}.c"));
    fs::write(&src, source).with_context(|| format!("writing {}", src.display()))?;
    let exe = dir.join(name);
    let out = Command::new("gcc")
        .args(["-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags)
        .output()
        .context("running gcc")?;
    if !out.status.success() {
        bail!(
            "compiling {name}.c failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(exe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::paths::TempDir;

    #[test]
    fn compiles_and_runs_a_program() {
        let dir = TempDir::new("cc-test").unwrap();
        let exe = compile_c(
            dir.path(),
            "answer",
            "int main(void) { return 42; }\n",
            &["-O2"],
        )
        .unwrap();
        let status = Command::new(exe).status().unwrap();
        assert_eq!(status.code(), Some(42));
    }

    #[test]
    fn a_compile_error_is_an_error() {
        let dir = TempDir::new("cc-test-bad").unwrap();
        let err = compile_c(dir.path(), "bad", "int main(void) { return }\n", &[]).unwrap_err();
        assert!(err.to_string().contains("bad.c:1:"), "{err}");
    }
}
