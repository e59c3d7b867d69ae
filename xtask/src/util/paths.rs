//! The workspace's paths: its root and cargo's target directory. (Scratch
//! directories are `tracer_testkit::TempDir`s.)
use std::{
    env,
    path::{Path, PathBuf},
};

pub use tracer_testkit::TempDir;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
    }
}
