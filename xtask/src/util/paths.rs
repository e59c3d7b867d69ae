//! The workspace's paths: its root, cargo's target directory, and scratch
//! directories removed when dropped.
use std::{
    env,
    path::{Path, PathBuf},
};

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, else `ROOT/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Where the release `tracerd` of the workspace at `root` is built.
pub fn release_dir(root: &Path) -> PathBuf {
    target_dir(root).join("release")
}

/// A scratch directory under the system's temporary directory, named after
/// a tag and this process, emptied at creation and removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let dir = env::temp_dir().join(format!("tracer-xtask-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
    }

    #[test]
    fn temp_dir_is_removed_on_drop() {
        let dir = TempDir::new("paths-test").unwrap();
        let path = dir.path().to_path_buf();
        assert!(path.is_dir());
        drop(dir);
        assert!(!path.exists());
    }
}
