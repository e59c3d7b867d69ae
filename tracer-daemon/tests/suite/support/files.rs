//! Files the tests share, with root or without: scratch directories
//! (`tracer_testkit`'s), and the C fixtures under `tests/fixtures/` with
//! their marker lines. Also compiled
//! into the unprivileged `symbolize` test binary (by `#[path]`).

use std::path::{Path, PathBuf};

pub use tracer_testkit::TempDir;

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
