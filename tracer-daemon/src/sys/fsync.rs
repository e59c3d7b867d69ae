//! Atomic file writes: the one way tracerd replaces a file (stored
//! snapshots, the id reservation, the last-stop record). The bytes go to a
//! temporary file in the same directory, which is fsynced, renamed over the
//! final name, and the directory fsynced: after any crash (SIGKILL, power
//! loss) the file is either the whole old version or the whole new one.
//!
//! tracerd's state is its own: files are created 0600 and directories 0700
//! whatever the umask (under systemd the unit's `UMask=0077` gives the
//! same), and a file is read back only if it is a regular one
//! ([`read_regular`]): a FIFO or device in the state directory must not
//! hang the start.
use std::{
    fs::{self, File, OpenOptions},
    io::{Read as _, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// Mode of every file tracerd creates in its state directory.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory tracerd creates for its state.
pub const DIR_MODE: u32 = 0o700;

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
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(FILE_MODE)
            .open(&temp)
            .map_err(step("creating", &temp))?;
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

/// Creates `dir` and any missing parent with mode [`DIR_MODE`] (less the
/// umask); an existing directory is left as it is.
///
/// # Errors
/// What the OS said.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

/// Reads the whole of `path` if it is a regular file. It is opened without
/// blocking and without following a symbolic link, and its type is checked
/// on the open file: a FIFO, socket, device or link is refused with
/// [`std::io::ErrorKind::InvalidInput`] before anything is read from it.
///
/// # Errors
/// What the OS said, or InvalidInput naming the file's type.
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let (mut file, meta) = open_regular(path)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Opens `path` for reading if it is a regular file, as [`read_regular`]
/// does (without blocking, without following a symbolic link, its type
/// checked on the open file), and returns it with its metadata, read from
/// the open file (so they are the metadata of the file that will be read).
///
/// # Errors
/// What the OS said (NotFound when there is no such file), or InvalidInput
/// naming the file's type.
pub fn open_regular(path: &Path) -> std::io::Result<(File, fs::Metadata)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a symbolic link, not a regular file",
                )
            } else {
                e
            }
        })?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file (a {})", type_name(kind)),
        ));
    }
    Ok((file, meta))
}

fn type_name(kind: fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_dir() {
        "directory"
    } else {
        "special file"
    }
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

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt as _;
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn state_is_created_0700_and_0600_whatever_the_umask() {
        let dir = std::env::temp_dir().join(format!("tracer-private-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        // SAFETY: umask only changes this process's file creation mask: a
        // shell's usual 022, under which files came out 0644 and 0755.
        let old = unsafe { libc::umask(0o022) };
        let made = create_private_dir(&dir.join("state/snapshots"));
        let written = made.and_then(|()| {
            write_atomically(&dir.join("state/record.json"), b"{}").map_err(|e| e.source)
        });
        // SAFETY: as above, restoring the mask.
        unsafe { libc::umask(old) };
        written.unwrap();
        assert_eq!(mode(&dir.join("state")), 0o700);
        assert_eq!(mode(&dir.join("state/snapshots")), 0o700);
        assert_eq!(mode(&dir.join("state/record.json")), 0o600);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_regular_files_are_read_and_a_fifo_does_not_block() {
        let dir = std::env::temp_dir().join(format!("tracer-regular-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("plain"), b"bytes").unwrap();
        assert_eq!(read_regular(&dir.join("plain")).unwrap(), b"bytes");
        let fifo =
            std::ffi::CString::new(dir.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that lives for the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let err = read_regular(&dir.join("fifo")).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(err.to_string(), "not a regular file (a FIFO)");
        std::os::unix::fs::symlink(dir.join("plain"), dir.join("link")).unwrap();
        assert_eq!(
            read_regular(&dir.join("link")).unwrap_err().to_string(),
            "a symbolic link, not a regular file"
        );
        assert_eq!(
            read_regular(&dir).unwrap_err().to_string(),
            "not a regular file (a directory)"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
