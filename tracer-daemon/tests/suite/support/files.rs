//! Files the tests share, with root or without: scratch directories, and the
//! C fixtures under `tests/fixtures/` with their marker lines. Also compiled
//! into the unprivileged `symbolize` test binary (by `#[path]`).

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

/// A fresh scratch directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// `tracer-test-{tag}-{our pid}-{n}`, canonical: the path that DWARF
    /// (cc's getcwd) and `/proc/PID/maps` show.
    pub fn new(tag: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tracer-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir.canonicalize().expect("canonical temp dir"))
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

/// The absolute path of `tests/fixtures/{name}`.
pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The text of `tests/fixtures/{name}`.
pub fn fixture_text(name: &str) -> String {
    let path = fixture_path(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The line number (1-based) of the only line of `source` containing `marker`.
pub fn line_of(source: &str, marker: &str) -> u32 {
    let lines: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "marker {marker} must be on exactly one line"
    );
    u32::try_from(lines[0]).expect("a line number fits u32")
}
