//! Tests of the table compiler: the flattening on synthetic spans
//! (`flatten`), every rule on a hand-written CFI fixture (`rules`), the
//! differential against binutils' `readelf --debug-dump=frames-interp` on
//! real files and compiled fixtures (`readelf`), and robustness on random
//! and bit-flipped input (`robust`). The shared pieces are here: the
//! table's invariants, the fixtures compiled with `cc`, the real files.

use std::path::{Path, PathBuf};
use std::process::Command;

use tracer_common::{UNWIND_END, UNWIND_PAGE_SHIFT, UNWIND_UNKNOWN};

use super::{FileTable, MAX_FILE_ROWS};

mod flatten;
mod readelf;
mod robust;
mod rules;
mod synth;

/// Checks what every table must be (the `FileTable` contract): each page
/// has rows, the first at `pc` 0, `pc`s strictly increasing, no two
/// neighbours with the same rule, some row that is not `UNWIND_UNKNOWN`,
/// kinds known, at most [`MAX_FILE_ROWS`] rows in all.
pub(super) fn assert_invariants(table: &FileTable) {
    assert!(table.rows() <= MAX_FILE_ROWS);
    for (page, rows) in &table.pages {
        assert_eq!(rows.first().map(|r| r.pc), Some(0), "page {page:#x}");
        assert!(
            rows.iter().any(|r| r.kind != UNWIND_UNKNOWN),
            "page {page:#x} has only unknown rows"
        );
        for row in rows {
            assert!(row.kind <= UNWIND_END, "page {page:#x}: {row:?}");
        }
        for pair in rows.windows(2) {
            assert!(pair[0].pc < pair[1].pc, "page {page:#x}: {pair:?}");
            let same = (pair[0].kind, pair[0].rbp_slot, pair[0].cfa_offset)
                == (pair[1].kind, pair[1].rbp_slot, pair[1].cfa_offset);
            assert!(!same, "page {page:#x}: unmerged {pair:?}");
        }
    }
    // Pages are keyed by page number: every key fits the file-offset space.
    if let Some((&last, _)) = table.pages.last_key_value() {
        assert!(u64::from(last) < (u64::MAX >> UNWIND_PAGE_SHIFT));
    }
}

/// A scratch directory under the system temp dir, removed on drop.
pub(super) struct Scratch(PathBuf);

impl Scratch {
    /// `tracer-unwind-{tag}-{our pid}`, fresh.
    pub(super) fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tracer-unwind-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    /// The directory.
    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `tests/fixtures/{name}` of the daemon crate.
pub(super) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Compiles the fixture `source` with `cc {flags}` into `{dir}/{out}`.
pub(super) fn build(dir: &Scratch, source: &str, flags: &[&str], out: &str) -> PathBuf {
    let binary = dir.path().join(out);
    let status = Command::new("cc")
        .args(flags)
        .arg("-I")
        .arg(fixture(""))
        .arg("-o")
        .arg(&binary)
        .arg(fixture(source))
        .status()
        .expect("running cc");
    assert!(status.success(), "cc {flags:?} {source} failed");
    binary
}

/// Real files of this machine that the tests read (libc always; the others
/// when installed).
pub(super) fn system_files() -> Vec<PathBuf> {
    let libc = PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6");
    assert!(libc.exists(), "no {}", libc.display());
    let mut files = vec![libc];
    for other in [
        "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "/usr/bin/sqlite3",
        "/usr/bin/python3.11",
        "/usr/bin/git",
    ] {
        let path = PathBuf::from(other);
        if path.exists() {
            files.push(path);
        }
    }
    files
}
