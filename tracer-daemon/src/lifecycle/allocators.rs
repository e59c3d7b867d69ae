//! Allocator discovery: every object a process in scope maps with code
//! (`/proc/PID/maps`) is examined once, by (device, inode), for the
//! allocator entry points it defines (`capture::probes::object_probes`:
//! `.dynsym` and `.symtab`), and each that defines one is probed for every
//! process, through the descriptor tracerd holds open on it (so an object
//! inside a container's root, or since deleted, is the one probed). An
//! object found this way is no longer probed once no process maps it
//! ([`Allocators::unused`]). The glibc probed from the start stays, and so
//! do the allocator libraries installed on the host, probed at start before
//! any process maps them ([`installed_libraries`]): a program that links
//! one is traced from its first allocation.
use std::{
    collections::{BTreeSet, HashMap},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::capture::probes::{AttachedLibrary, Found, object_probes};
use crate::sys::modules::{Module, ModuleMaps};
use crate::sys::procfs::{self, FileKey};

/// Objects larger than this are not read for symbols (bytes).
const MAX_OBJECT_BYTES: u64 = 1 << 30;

/// How long an object found while tracing stays probed after the last
/// process that mapped it is gone: a program started again and again
/// keeps its probes (and is traced from its first allocation).
pub const UNUSED_GRACE: Duration = Duration::from_secs(10);

/// What discovery knows.
#[derive(Debug, Default)]
pub struct Allocators {
    /// Objects examined: true when probed (found here, not from the start).
    examined: HashMap<FileKey, bool>,
    /// Probed objects found here: the pids seen mapping each, and since
    /// when none does.
    users: HashMap<FileKey, Users>,
}

#[derive(Debug, Default)]
struct Users {
    pids: BTreeSet<u32>,
    unused_since: Option<Instant>,
}

impl Allocators {
    /// Discovery that knows `pinned` (the objects probed from the start)
    /// as examined.
    pub fn new(pinned: impl IntoIterator<Item = FileKey>) -> Self {
        Self {
            examined: pinned.into_iter().map(|key| (key, false)).collect(),
            users: HashMap::new(),
        }
    }

    /// The modules of `maps` not examined yet (each once), and the pid
    /// recorded as a user of the probed ones it maps.
    pub fn unexamined(&mut self, maps: &ModuleMaps) -> Vec<std::sync::Arc<Module>> {
        let mut new = Vec::new();
        for mapping in maps.mappings() {
            let key = mapping.module.key();
            match self.examined.get(&key) {
                Some(true) => {
                    if let Some(users) = self.users.get_mut(&key) {
                        users.pids.insert(maps.pid());
                        users.unused_since = None;
                    }
                }
                Some(false) => {}
                None => {
                    if !new.iter().any(|m: &std::sync::Arc<Module>| m.key() == key) {
                        new.push(mapping.module.clone());
                    }
                }
            }
        }
        new
    }

    /// Reads `module`'s symbols (no lock held): Some when it defines an
    /// allocator. An object that cannot be read is logged and None.
    pub fn examine(module: &Module, pid: u32) -> Option<Found> {
        Self::examine_open(
            module.file()?,
            Path::new(&**module.path()),
            module.key(),
            pid,
        )
    }

    /// Reads the symbols of `file`, open (object `key`, shown as `path`,
    /// found in process `pid`): Some when it defines an allocator, probed
    /// through a duplicate of the descriptor (`/proc/self/fd/N`), which the
    /// probes keep open. An object that cannot be read is logged and None.
    pub fn examine_open(
        file: &std::fs::File,
        path: &Path,
        key: FileKey,
        pid: u32,
    ) -> Option<Found> {
        let len = file.metadata().ok()?.len();
        if len > MAX_OBJECT_BYTES {
            return None;
        }
        let reader = match file.try_clone() {
            Ok(reader) => object::ReadCache::new(reader),
            Err(err) => {
                tracing::debug!(pid, object = %path.display(), %err, "cannot read an object for its allocator symbols");
                return None;
            }
        };
        let held = file.try_clone().ok()?;
        let through = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
        found(&reader, path, key, Some(pid), through, Some(held))
    }

    /// Reads the symbols of the file at `path` (a library installed on the
    /// host, probed through that path): Some when it defines an allocator.
    pub fn examine_file(path: &Path) -> Option<Found> {
        let key = FileKey::of_path(path)?;
        let file = std::fs::File::open(path).ok()?;
        if file.metadata().ok()?.len() > MAX_OBJECT_BYTES {
            return None;
        }
        let reader = object::ReadCache::new(file);
        found(&reader, path, key, None, path.to_path_buf(), None)
    }

    /// Whether `key` was examined already.
    pub fn knows(&self, key: FileKey) -> bool {
        self.examined.contains_key(&key)
    }

    /// Records `key`, probed from the start (an installed library): never
    /// examined again, never dropped as unused.
    pub fn pin(&mut self, key: FileKey) {
        self.examined.insert(key, false);
    }

    /// Records the outcome of examining `key` in process `pid`: probed
    /// (`probed`) or not (never examined again either way).
    pub fn examined(&mut self, key: FileKey, pid: u32, probed: bool) {
        self.examined.insert(key, probed);
        if probed {
            self.users.entry(key).or_default().pids.insert(pid);
        }
    }

    /// The objects found here that no process has mapped for
    /// [`UNUSED_GRACE`]: they are forgotten (examined again when mapped
    /// again) and returned, to be no longer probed. Each object's pids are
    /// checked in `/proc/PID/maps` until one still maps it.
    pub fn unused(&mut self, now: Instant) -> Vec<FileKey> {
        let mut doomed = Vec::new();
        for (key, users) in &mut self.users {
            // Pids before the first that still maps it are gone from it;
            // those after it are checked at a later sweep.
            users.pids = std::mem::take(&mut users.pids)
                .into_iter()
                .skip_while(|&pid| !maps_file(pid, *key))
                .collect();
            if users.pids.is_empty() {
                let since = *users.unused_since.get_or_insert(now);
                if now.duration_since(since) >= UNUSED_GRACE {
                    doomed.push(*key);
                }
            } else {
                users.unused_since = None;
            }
        }
        for key in &doomed {
            self.users.remove(key);
            self.examined.remove(key);
        }
        doomed
    }
}

/// What probing object `key` (its bytes `data`, shown as `path`, found in
/// process `pid`) takes, through `through` (held open by `file`): None
/// when it defines no allocator or is not an ELF object tracer reads.
fn found<'a, R: object::ReadRef<'a>>(
    data: R,
    path: &Path,
    key: FileKey,
    pid: Option<u32>,
    through: PathBuf,
    file: Option<std::fs::File>,
) -> Option<Found> {
    match object_probes(data) {
        Ok(Some(probes)) if !probes.points.is_empty() => Some(Found {
            library: AttachedLibrary::new(path.to_path_buf(), key, pid, &probes),
            path: through,
            file,
            probes,
        }),
        Ok(_) => None,
        Err(err) => {
            tracing::debug!(pid, object = %path.display(), %err, "not an ELF object tracer reads");
            None
        }
    }
}

/// Whether process `pid` maps file `key` now.
fn maps_file(pid: u32, key: FileKey) -> bool {
    procfs::read_maps(pid).is_ok_and(|entries| entries.iter().any(|e| e.file_key() == key))
}

/// File names of allocator libraries a program may link: jemalloc,
/// tcmalloc (and its variants), mimalloc (and its secure build), glibc and
/// musl.
const LIBRARY_PREFIXES: [&str; 6] = [
    "libjemalloc",
    "libtcmalloc",
    "libmimalloc",
    "libc.so.",
    "libc.musl-",
    "ld-musl-",
];

/// The library directories of the host, where the dynamic loader finds
/// what programs link: each of these, and its multiarch subdirectories
/// (`x86_64-linux-gnu` ...).
const LIBRARY_DIRS: [&str; 6] = [
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local/lib",
    "/usr/local/lib64",
];

/// The allocator libraries installed on the host ([`LIBRARY_DIRS`], names
/// of [`LIBRARY_PREFIXES`] holding `.so`), one path per (device, inode),
/// canonical: probed at start, before any process maps them, so that a
/// program linking one is traced from its first allocation (a uprobe is
/// per file, and the kernel places it in every mapping made later).
pub fn installed_libraries() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for dir in LIBRARY_DIRS {
        let Ok(dir) = std::fs::canonicalize(dir) else {
            continue;
        };
        let multiarch = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let name = name.to_str()?;
                (name.contains("-linux-") && e.path().is_dir()).then(|| e.path())
            });
        let all: Vec<PathBuf> = std::iter::once(dir.clone()).chain(multiarch).collect();
        for d in all {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    let mut seen: Vec<FileKey> = Vec::new();
    let mut found = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| {
                e.file_name().to_str().is_some_and(|name| {
                    name.contains(".so")
                        && LIBRARY_PREFIXES
                            .iter()
                            .any(|prefix| name.starts_with(prefix))
                })
            })
            .map(|e| e.path())
            .collect();
        names.sort();
        for path in names {
            let Ok(path) = std::fs::canonicalize(&path) else {
                continue;
            };
            let Some(key) = FileKey::of_path(&path) else {
                continue;
            };
            if path.is_file() && !seen.contains(&key) {
                seen.push(key);
                found.push(path);
            }
        }
    }
    found
}
