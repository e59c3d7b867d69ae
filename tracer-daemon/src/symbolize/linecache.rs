//! Source lines for `Traceback.format()`, as Python's `linecache.getline`
//! finds them (tracemalloc calls it for every frame): the files are read
//! here, their bytes made lines by the model
//! ([`tracer_model::source_lines`], as `tokenize.open` and `readlines`
//! would). A relative name is looked up from tracerd's working directory
//! only (Python would also search `sys.path`).
//!
//! tracerd runs as root and anyone who can reach its API can choose file
//! names (a traced program's debug info, or an uploaded snapshot), so a
//! file is read only if any local user could read it anyway: a regular
//! file, world-readable, in world-searchable directories (checked on its
//! canonical path, so symlinks cannot lead elsewhere), of at most
//! [`MAX_SOURCE_BYTES`], and not on one of the kernel's own file systems
//! ([`KERNEL_FS`]: `/proc`, `/sys` and the like), whose files say more to
//! root than their permission bits let others see (`/proc/PID/maps` of
//! another user's process, `/proc/kallsyms` with real addresses). Anything
//! else has no source lines.
use std::{
    collections::HashMap,
    fs::File,
    io::Read as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// Largest source file read, in bytes.
pub const MAX_SOURCE_BYTES: u64 = 16 * 1024 * 1024;

/// The lines of the files read so far (one cache per request: files change).
#[derive(Debug, Default)]
pub struct LineCache {
    files: HashMap<String, Vec<String>>,
}

impl LineCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// `linecache.getline(filename, lineno)`: the line with its end of line
    /// (`\n`), or an empty string.
    pub fn getline(&mut self, filename: &str, lineno: u32) -> String {
        let lines = self
            .files
            .entry(filename.to_string())
            .or_insert_with(|| read_lines(filename));
        tracer_model::line_of(lines, lineno)
    }
}

/// `linecache.updatecache`: the file's lines, each ending with `\n`, or none.
fn read_lines(filename: &str) -> Vec<String> {
    if !tracer_model::has_source(filename) {
        return Vec::new();
    }
    let Some(bytes) = read_public_file(Path::new(filename)) else {
        return Vec::new();
    };
    tracer_model::source_lines(&bytes)
}

/// The kernel's own file systems, by `statfs` magic (linux/magic.h):
/// procfs, sysfs, debugfs, tracefs, securityfs, cgroup v1 and v2, bpffs,
/// devpts, configfs, efivarfs, pstore. Their files are never source.
const KERNEL_FS: [i64; 12] = [
    0x9fa0,
    0x6265_6572,
    0x6462_6720,
    0x7472_6163,
    0x7363_6673,
    0x0027_e0eb,
    0x6367_7270,
    0xcafe_4a11,
    0x1cd1,
    0x6265_6570,
    0xde5e_81e4,
    0x6165_676c,
];

/// Whether `file` lives on one of the [`KERNEL_FS`] (or its file system
/// cannot be told: then it is not read either).
fn on_kernel_fs(file: &File) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a valid descriptor and a buffer of the size fstatfs writes.
    if unsafe { libc::fstatfs(file.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return true;
    }
    // SAFETY: fstatfs succeeded, so it filled the buffer.
    #[allow(
        clippy::useless_conversion,
        reason = "f_type is i64 on x86-64, narrower elsewhere"
    )]
    let kind = i64::from(unsafe { stat.assume_init() }.f_type);
    KERNEL_FS.contains(&kind)
}

/// Reads `path` if any local user could: see the module docs.
fn read_public_file(path: &Path) -> Option<Vec<u8>> {
    let canonical = std::fs::canonicalize(path).ok()?;
    let mut dir: PathBuf = canonical.parent()?.to_path_buf();
    loop {
        let mode = std::fs::metadata(&dir).ok()?.mode();
        if mode & 0o001 == 0 {
            return None;
        }
        if !dir.pop() {
            break;
        }
    }
    // O_NONBLOCK: a FIFO swapped in after the checks cannot block us.
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&canonical)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file()
        || meta.mode() & 0o004 == 0
        || meta.len() > MAX_SOURCE_BYTES
        || on_kernel_fs(&file)
    {
        return None;
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.by_ref()
        .take(MAX_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return None;
    }
    Some(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    #[test]
    fn files_of_the_kernel_s_own_file_systems_have_no_source_lines() {
        // World-readable files that say more to root than to their reader:
        // a process's mappings, the CPUs, the kernel's symbols.
        let mut cache = LineCache::new();
        for (path, line) in [
            ("/proc/self/maps", 1),
            ("/proc/self/status", 1),
            ("/proc/kallsyms", 1),
            ("/sys/devices/system/cpu/online", 1),
        ] {
            assert_eq!(cache.getline(path, line), "", "{path}");
        }
        // A world-readable file elsewhere still has its lines.
        assert!(!cache.getline("/etc/passwd", 1).is_empty());
    }

    #[test]
    fn private_files_and_pseudo_names_have_no_lines() {
        let mut cache = LineCache::new();
        assert_eq!(cache.getline("<unknown>", 1), "");
        assert_eq!(cache.getline("/etc/shadow", 1), "", "not world-readable");
        assert_eq!(cache.getline("/dev/zero", 1), "", "not a regular file");
        assert_eq!(cache.getline("/nonexistent/x.c", 1), "");
        let dir = std::env::temp_dir().join(format!("tracer-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.c");
        std::fs::write(&file, "int a;\n  int b;  \r\nlast").unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let name = file.to_str().unwrap();
        assert_eq!(cache.getline(name, 2), "  int b;  \n");
        assert_eq!(cache.getline(name, 3), "last\n");
        assert_eq!(cache.getline(name, 0), "");
        assert_eq!(cache.getline(name, 4), "");
        let private = dir.join("p.c");
        std::fs::write(&private, "secret\n").unwrap();
        std::fs::set_permissions(
            &private,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        assert_eq!(LineCache::new().getline(private.to_str().unwrap(), 1), "");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
