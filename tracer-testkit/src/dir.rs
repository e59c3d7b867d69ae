//! Scratch directories.
use std::{
    io,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

/// A fresh scratch directory under the system's temporary directory,
/// removed (with what it holds) on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// `{temp}/tracer-test-{tag}-{our pid}-{n}`, emptied if it was there,
    /// created, and canonical: the path that DWARF (the compiler's getcwd)
    /// and `/proc/PID/maps` show.
    ///
    /// # Errors
    /// The directory cannot be created or resolved.
    pub fn try_new(tag: &str) -> io::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tracer-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir.canonicalize()?))
    }

    /// [`TempDir::try_new`] for a test.
    ///
    /// # Panics
    /// When the directory cannot be created: the test cannot go on.
    #[must_use]
    pub fn new(tag: &str) -> Self {
        Self::try_new(tag).unwrap_or_else(|e| panic!("a scratch directory for {tag}: {e}"))
    }

    #[must_use]
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
    fn two_directories_of_one_tag_are_apart_and_removed_on_drop() {
        let (a, b) = (TempDir::new("dir-test"), TempDir::new("dir-test"));
        assert_ne!(a.path(), b.path());
        assert!(a.path().is_dir() && a.path().is_absolute());
        std::fs::write(a.path().join("f"), b"x").expect("write");
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
    }
}
