//! A C workload of xtask: its source (a file of `xtask/workloads/`, read
//! in with `include_str!`) written next to the executable, compiled by
//! `tracer_testkit::compile` (gcc, with debug info and frame pointers: tracer
//! walks them) with the caller's optimisation and link flags.
use std::{fs, path::Path, path::PathBuf};

use anyhow::Context as _;

/// Writes `DIR/NAME.c`, compiles it to `DIR/NAME` with
/// `gcc -g -fno-omit-frame-pointer -o DIR/NAME DIR/NAME.c FLAGS`.
pub fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let src = dir.join(format!("{name}.c"));
    fs::write(&src, source).with_context(|| format!("writing {}", src.display()))?;
    let exe = dir.join(name);
    tracer_testkit::compile("gcc", &src, &exe, flags)?;
    Ok(exe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::paths::TempDir;

    #[test]
    fn writes_compiles_and_runs_a_program() {
        let dir = TempDir::new("cc-test");
        let exe = compile_c(
            dir.path(),
            "answer",
            "int main(void) { return 42; }\n",
            &["-O2"],
        )
        .unwrap();
        assert!(dir.path().join("answer.c").is_file());
        let status = std::process::Command::new(exe).status().unwrap();
        assert_eq!(status.code(), Some(42));
    }
}
