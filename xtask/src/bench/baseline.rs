//! `--baseline REV`: another revision of tracer, checked out in a git
//! worktree of its own under `target/baseline/<short-rev>` (kept and reused
//! while it stays at that commit) and built there with its own target
//! directory, so that `bench` and `bench-model` measure it side by side
//! with the working tree's build in one run.
use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::util::{
    cmd::{cargo_in, stdout_of},
    daemon::BUILD_TRACERD,
    paths::target_dir,
};

/// A revision checked out for comparison.
#[derive(Clone, Debug)]
pub struct Baseline {
    /// As given (`main`, `HEAD~3`, a hash).
    pub rev: String,
    /// The full commit hash it resolved to.
    pub commit: String,
    /// The abbreviated hash: the worktree's name and the reports' label.
    pub short: String,
    /// The worktree.
    pub dir: PathBuf,
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = stdout_of(
        Command::new("git").arg("-C").arg(dir).args(args),
        &format!("git {}", args.join(" ")),
    )?;
    Ok(out.trim().to_string())
}

impl Baseline {
    /// Resolves `rev` in the repository at `root` and makes sure its
    /// worktree exists at that commit.
    pub fn prepare(root: &Path, rev: &str) -> anyhow::Result<Self> {
        let commit = git(
            root,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                &format!("{rev}^{{commit}}"),
            ],
        )
        .with_context(|| format!("--baseline {rev:?} is not a revision of this repository"))?;
        let short = git(root, &["rev-parse", "--short", &commit])?;
        let dir = target_dir(root).join("baseline").join(&short);
        let baseline = Self {
            rev: rev.to_string(),
            commit,
            short,
            dir,
        };
        baseline.checkout(root)?;
        Ok(baseline)
    }

    /// The worktree at `commit`: reused if it is there already, moved to
    /// the commit if it is elsewhere, else added (detached).
    fn checkout(&self, root: &Path) -> anyhow::Result<()> {
        if self.dir.join(".git").exists() {
            if git(&self.dir, &["rev-parse", "HEAD"])? == self.commit {
                return Ok(());
            }
            git(
                &self.dir,
                &["checkout", "--quiet", "--detach", &self.commit],
            )?;
            return Ok(());
        }
        if self.dir.exists() {
            bail!(
                "{} exists but is not a git worktree: remove it",
                self.dir.display()
            );
        }
        eprintln!(
            "xtask: checking out the baseline {} ({}) in {}",
            self.rev,
            self.short,
            self.dir.display()
        );
        // A worktree removed by hand stays registered until pruned.
        git(root, &["worktree", "prune"])?;
        let dir = self
            .dir
            .to_str()
            .context("the target directory is not UTF-8")?;
        git(
            root,
            &["worktree", "add", "--quiet", "--detach", dir, &self.commit],
        )?;
        Ok(())
    }

    /// How reports name it: `main (528ed33)`, or the hash alone when that
    /// is how it was given.
    pub fn label(&self) -> String {
        if self.commit.starts_with(&self.rev) || self.rev == self.short {
            self.short.clone()
        } else {
            format!("{} ({})", self.rev, self.short)
        }
    }

    /// The baseline's own target directory.
    fn target(&self) -> PathBuf {
        self.dir.join("target")
    }

    /// `cargo ARGS` in the worktree, into its own target directory.
    fn cargo(&self, args: &[&str]) -> anyhow::Result<()> {
        eprintln!("xtask: baseline {}: cargo {}", self.short, args.join(" "));
        let target = self.target();
        cargo_in(
            &self.dir,
            args,
            &[("CARGO_TARGET_DIR", OsStr::new(target.as_os_str()))],
        )
        .with_context(|| format!("building the baseline {} ({})", self.rev, self.short))
    }

    /// Where [`Self::build_tracerd`] puts tracerd.
    pub fn tracerd(&self) -> PathBuf {
        self.target().join("release/tracerd")
    }

    /// Builds the baseline's release tracerd (and the eBPF object it
    /// embeds).
    pub fn build_tracerd(&self) -> anyhow::Result<PathBuf> {
        self.cargo(&BUILD_TRACERD)?;
        Ok(self.tracerd())
    }

    /// Builds the baseline's `bench_model` example: the model crate's, or,
    /// in revisions from before the model had a crate of its own, the
    /// daemon's. Chosen by which file exists, so a build error of the first
    /// is reported as such rather than hidden by a try of the second.
    pub fn build_bench_model(&self) -> anyhow::Result<PathBuf> {
        let package = bench_model_package(&self.dir).with_context(|| {
            format!(
                "the baseline {} ({}) has no bench_model example",
                self.rev, self.short
            )
        })?;
        self.cargo(&[
            "build",
            "--release",
            "-p",
            package,
            "--example",
            "bench_model",
        ])?;
        Ok(self.target().join("release/examples/bench_model"))
    }
}

/// The package of a tree at `dir` that has the `bench_model` example.
fn bench_model_package(dir: &Path) -> Option<&'static str> {
    ["tracer-model", "tracer-daemon"]
        .into_iter()
        .find(|package| dir.join(package).join("examples/bench_model.rs").is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::paths::TempDir;

    #[test]
    fn bench_model_comes_from_the_model_crate_else_the_daemon() {
        let dir = TempDir::new("baseline-test");
        assert_eq!(bench_model_package(dir.path()), None);
        let daemon = dir.path().join("tracer-daemon/examples");
        std::fs::create_dir_all(&daemon).unwrap();
        std::fs::write(daemon.join("bench_model.rs"), "").unwrap();
        assert_eq!(bench_model_package(dir.path()), Some("tracer-daemon"));
        let model = dir.path().join("tracer-model/examples");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("bench_model.rs"), "").unwrap();
        assert_eq!(bench_model_package(dir.path()), Some("tracer-model"));
    }

    #[test]
    fn the_label_names_the_revision_as_given_and_its_hash() {
        let baseline = |rev: &str| Baseline {
            rev: rev.to_string(),
            commit: "528ed3313a6c887ef904d17ce419e581d58f04b6".to_string(),
            short: "528ed33".to_string(),
            dir: PathBuf::new(),
        };
        assert_eq!(baseline("main").label(), "main (528ed33)");
        assert_eq!(baseline("528ed33").label(), "528ed33");
        assert_eq!(baseline("528ed3313a6c").label(), "528ed33");
    }

    #[test]
    fn an_unknown_revision_is_refused() {
        let root = crate::util::paths::workspace_root();
        let err = Baseline::prepare(&root, "no-such-revision-xtask-test").unwrap_err();
        assert!(format!("{err:#}").contains("is not a revision"), "{err:#}");
    }
}
