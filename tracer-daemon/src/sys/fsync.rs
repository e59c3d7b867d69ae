//! Atomic file writes: the one way tracerd replaces a file (stored
//! snapshots, the id reservation, the last-stop record). The bytes go to a
//! temporary file in the same directory, which is fsynced, renamed over the
//! final name, and the directory fsynced: after any crash (SIGKILL, power
//! loss) the file is either the whole old version or the whole new one.
use std::{
    fs::{self, File},
    io::Write as _,
    path::{Path, PathBuf},
};

/// A step of an atomic write that failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}: {source}", path.display())]
pub struct WriteError {
    /// What was being done: "creating", "writing", "syncing", "renaming".
    pub action: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// What the OS said.
    #[source]
    pub source: std::io::Error,
}

fn step<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> WriteError + 'a {
    move |source| WriteError {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Replaces `path` with `bytes` atomically (see the module doc). A failed
/// write leaves the old file as it was and no temporary file behind.
///
/// # Errors
/// [`WriteError`] naming the step and the file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = File::create(&temp).map_err(step("creating", &temp))?;
        file.write_all(bytes).map_err(step("writing", &temp))?;
        file.sync_all().map_err(step("syncing", &temp))?;
        drop(file);
        fs::rename(&temp, path).map_err(step("renaming", &temp))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Fsyncs a directory, so that a rename or removal in it is durable.
///
/// # Errors
/// [`WriteError`] with action "syncing".
pub fn sync_dir(dir: &Path) -> Result<(), WriteError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(step("syncing", dir))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("tracer-fsync-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("record.json");
        write_atomically(&path, b"old").unwrap();
        write_atomically(&path, b"new and longer").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new and longer");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("record.json")]);
        let err = write_atomically(&dir.join("missing/x"), b"x").unwrap_err();
        assert_eq!(err.action, "creating");
        fs::remove_dir_all(&dir).unwrap();
    }
}
