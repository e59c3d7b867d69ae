//! Which glibc files tracerd probes from its start (as the dynamic loader
//! finds them) and what is known of each object probed; where the probes
//! go in an object is `crate::elf::probes`.
use std::{
    collections::HashSet,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
};

pub use crate::elf::probes::{
    Family, ObjectProbes, ProbePoint, compare_skip, entry_skip, object_probes,
};

use super::CaptureError;
use crate::sys::procfs::FileKey;

/// One probed object (a library or an executable): where it is, whose
/// allocator it is, and the probes on it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AttachedLibrary {
    /// The object's path: the canonical host path of a glibc probed from
    /// the start, else the path `/proc/PID/maps` gave it in the process it
    /// was found in (a container's path is inside its root).
    pub path: PathBuf,
    /// Its (device, inode), as `/proc/PID/maps` shows it.
    #[serde(skip)]
    pub key: crate::sys::procfs::FileKey,
    /// Whose allocator it is.
    pub family: Family,
    /// The process it was found in (None: probed from the start).
    pub found_in: Option<u32>,
    /// `symbol@file_offset` of each attached uprobe (aliases share one).
    pub probes: Vec<String>,
}

impl AttachedLibrary {
    /// The description of an object probed at `points`.
    pub fn new(
        path: PathBuf,
        key: crate::sys::procfs::FileKey,
        found_in: Option<u32>,
        probes: &ObjectProbes,
    ) -> Self {
        Self {
            path,
            key,
            family: probes.family,
            found_in,
            probes: probes
                .points
                .iter()
                .map(|p| match p.entry - p.function {
                    0 => format!("{}@{:#x}", p.spec.symbol, p.entry),
                    skip => format!("{}+{skip}@{:#x}", p.spec.symbol, p.entry),
                })
                .collect(),
        }
    }
}

/// An object to probe: what allocator discovery (`lifecycle::allocators`) found in a process, for
/// `ProbeMaps::add_library`.
#[derive(Debug)]
pub struct Found {
    /// What the API reports of it.
    pub library: AttachedLibrary,
    /// The path its probes attach through (`/proc/self/fd/N` of `file`,
    /// or a host path).
    pub path: PathBuf,
    /// The descriptor `path` names, held open while the object is probed
    /// (later attaches, for a process entering the scope, go through it).
    pub file: Option<std::fs::File>,
    /// Its allocator and probe points.
    pub probes: ObjectProbes,
}

/// The files probed from the start, for every process: `configured` if
/// given, else every distinct `libc.so.6` the dynamic loader resolves (the
/// one mapped into tracerd itself, /proc/self/maps, and those `ldconfig -p`
/// lists, ld.so.cache). Distinct means a distinct (device, inode): symlinks
/// collapse. Every other allocator is found in the processes that map it
/// (`lifecycle::allocators`).
///
/// # Errors
/// [`CaptureError::NoLibc`] when no glibc is found.
pub fn find_libc(configured: &[PathBuf]) -> Result<Vec<PathBuf>, CaptureError> {
    let mut candidates: Vec<PathBuf> = configured.to_vec();
    if candidates.is_empty() {
        if let Ok(maps) = fs::read_to_string("/proc/self/maps") {
            for line in maps.lines() {
                if let Some(path) = line.split_whitespace().nth(5)
                    && is_libc_name(path)
                {
                    candidates.push(PathBuf::from(path));
                }
            }
        }
        if let Ok(out) = Command::new("ldconfig").arg("-p").output() {
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines() {
                // "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6"
                let line = line.trim();
                let Some((name, path)) = line.split_once(" => ") else {
                    continue;
                };
                let name = name.split_whitespace().next().unwrap_or_default();
                if !host_abi_matches(line) {
                    continue;
                }
                if name == "libc.so.6" {
                    candidates.push(PathBuf::from(path.trim()));
                }
            }
        }
    }
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for candidate in &candidates {
        let Ok(canonical) = fs::canonicalize(candidate) else {
            continue;
        };
        let Ok(meta) = fs::metadata(&canonical) else {
            continue;
        };
        if seen.insert((meta.dev(), meta.ino())) {
            found.push(canonical);
        }
    }
    if found.is_empty() {
        let looked = if configured.is_empty() {
            "/proc/self/maps, ldconfig -p".to_string()
        } else {
            configured
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(CaptureError::NoLibc { looked });
    }
    Ok(found)
}

fn is_libc_name(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "libc.so.6" || (n.starts_with("libc-2.") && n.ends_with(".so")))
}

fn host_abi_matches(ldconfig_line: &str) -> bool {
    if cfg!(target_arch = "x86_64") {
        ldconfig_line.contains("x86-64")
    } else if cfg!(target_arch = "aarch64") {
        ldconfig_line.contains("AArch64")
    } else {
        true
    }
}

/// [`object_probes`] of the library at `path`, which must define `malloc`
/// and `free` (the glibc tracerd probes from its start).
///
/// # Errors
/// [`CaptureError::Libc`] if the file cannot be read, or lacks `malloc` or `free`.
pub fn probe_points(path: &Path) -> Result<ObjectProbes, CaptureError> {
    let err = |reason: String| CaptureError::Libc {
        path: path.to_path_buf(),
        reason,
    };
    let data = fs::read(path).map_err(|e| err(e.to_string()))?;
    let probes = object_probes(data.as_slice())
        .map_err(err)?
        .ok_or_else(|| err("no symbol malloc and free".into()))?;
    for needed in ["malloc", "free"] {
        if !probes.points.iter().any(|p| p.spec.symbol == needed) {
            return Err(err(format!("no symbol {needed}")));
        }
    }
    Ok(probes)
}

#[cfg(test)]
mod tests;

/// One probed object: its probe points and the path they are attached
/// through.
#[derive(Debug)]
pub(super) struct Target {
    /// The object's (device, inode).
    pub(super) key: FileKey,
    /// The path the kernel resolves to the object when a probe is
    /// attached: a host path, or `/proc/self/fd/N` of a descriptor tracerd
    /// holds open (an object inside a container's root).
    pub(super) path: PathBuf,
    /// The descriptor `path` names, held open while the object is probed
    /// (None: a host path).
    #[expect(dead_code, reason = "held open for `path`, never read")]
    pub(super) file: Option<std::fs::File>,
    /// Where its probes go.
    pub(super) points: Vec<ProbePoint>,
    /// Its allocator's family: every probe's attach cookie, which the
    /// programs record as each block's source.
    pub(super) family: Family,
}
