//! Modules: the executable files a process maps, held open.
//!
//! [`ModuleCache`] and [`ModuleMaps`]: the executable file-backed mappings
//! of one process image, captured from `/proc/PID/maps` while the process
//! lives, with each mapped file held open (once per device and inode,
//! shared by every process that maps it), so that addresses can be
//! symbolized after the process exited or the file was deleted or replaced
//! on disk.
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use super::procfs::{FileKey, MapEntry, ProcError, proc_path, read_maps};

/// Source of [`Module::id`]: never reused while the daemon runs.
static NEXT_MODULE_ID: AtomicU64 = AtomicU64::new(1);

/// One executable file (program or shared library) mapped by traced processes,
/// held open so that it can be read after the processes exit and even after the
/// file is deleted or replaced on disk.
///
/// Shared (`Arc`) by every [`ModuleMaps`] that maps it and by the [`ModuleCache`];
/// the file is closed when the last of them drops it.
#[derive(Debug)]
pub struct Module {
    id: u64,
    key: FileKey,
    path: Arc<str>,
    file: Option<File>,
}

impl Module {
    /// A number unique to this open file for the daemon's lifetime: unlike the
    /// (dev, inode) key, never reused, so it is safe as a cache key for derived data.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The (device, inode) of the file, from `/proc/PID/maps`: the key of
    /// everything derived from the file once (its unwind table).
    pub fn key(&self) -> FileKey {
        self.key
    }

    /// The path of the file from `/proc/PID/maps` of the process that first mapped it
    /// (without the ` (deleted)` suffix): what frames report as the module.
    pub fn path(&self) -> &Arc<str> {
        &self.path
    }

    /// The open file, or `None` when it could not be opened at capture time.
    pub fn file(&self) -> Option<&File> {
        self.file.as_ref()
    }

    /// `/proc/self/fd/N` for the open file: a path that reaches this exact file for
    /// as long as this `Module` lives, whatever happens to its original path.
    /// `None` when the file could not be opened.
    pub fn fd_path(&self) -> Option<PathBuf> {
        self.file
            .as_ref()
            .map(|file| PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())))
    }

    fn new(key: FileKey, path: Arc<str>, file: Option<File>) -> Self {
        Self {
            id: NEXT_MODULE_ID.fetch_add(1, Ordering::Relaxed),
            key,
            path,
            file,
        }
    }
}

/// One executable file-backed mapping of a [`ModuleMaps`].
#[derive(Clone, Debug)]
pub struct ModuleMapping {
    /// First virtual address (inclusive).
    pub start: u64,
    /// End virtual address (exclusive).
    pub end: u64,
    /// Offset in the module's file of the byte mapped at `start`.
    pub offset: u64,
    /// The mapped file.
    pub module: Arc<Module>,
}

/// The executable file-backed mappings of one process image, captured from
/// `/proc/PID/maps` while the process lived: translates a virtual address of that
/// image into (module, file offset) with `file offset = addr - start + offset`.
///
/// Holds its modules open; keep it for as long as addresses of that image may need
/// symbolizing, then drop it. An `exec` replaces the image: capture again.
#[derive(Clone, Debug)]
pub struct ModuleMaps {
    pid: u32,
    /// Sorted by `start`.
    mappings: Vec<ModuleMapping>,
    /// Executable mappings of no file (JIT code, the vDSO): (start, end),
    /// sorted. Frames there are stepped with frame pointers.
    anonymous: Vec<(u64, u64)>,
}

impl ModuleMaps {
    /// Maps with no mappings (every address translates to nothing), e.g. for a
    /// process that exited before it could be captured.
    pub fn empty(pid: u32) -> Self {
        Self {
            pid,
            mappings: Vec::new(),
            anonymous: Vec::new(),
        }
    }

    /// Captures the executable mappings of the live process `pid` through the
    /// process-wide [`ModuleCache::global`] (see [`ModuleCache::capture`]).
    pub fn capture(pid: u32) -> Result<Self, ProcError> {
        ModuleCache::global().capture(pid)
    }

    /// The pid the maps were captured from.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The executable file-backed mappings, sorted by start address.
    pub fn mappings(&self) -> &[ModuleMapping] {
        &self.mappings
    }

    /// The executable mappings of no file (JIT code, the vDSO), sorted.
    pub fn anonymous(&self) -> &[(u64, u64)] {
        &self.anonymous
    }

    /// Whether `addr` lies in an executable mapping (of a file, or
    /// anonymous).
    #[must_use]
    pub fn is_executable(&self, addr: u64) -> bool {
        if self.lookup(addr).is_some() {
            return true;
        }
        let index = self.anonymous.partition_point(|&(start, _)| start <= addr);
        index
            .checked_sub(1)
            .and_then(|i| self.anonymous.get(i))
            .is_some_and(|&(_, end)| addr < end)
    }

    /// The module mapped at virtual address `addr` and the offset of `addr` in its
    /// file, or `None` when no captured executable mapping contains `addr`.
    pub fn lookup(&self, addr: u64) -> Option<(&Arc<Module>, u64)> {
        // The last mapping starting at or before addr is the only candidate.
        let index = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        if addr >= mapping.end {
            return None;
        }
        let file_offset = (addr - mapping.start).checked_add(mapping.offset)?;
        Some((&mapping.module, file_offset))
    }
}

/// Default number of recently used modules a [`ModuleCache`] keeps open after no
/// [`ModuleMaps`] uses them any more.
pub const DEFAULT_MODULE_CACHE_CAPACITY: usize = 256;

/// Opens each mapped file once per (device, inode) and shares it between captures.
///
/// Two bounds keep files of exited processes from being held forever: a module is
/// open while some [`ModuleMaps`] holds it, plus, for reuse by the next capture (a
/// program started again and again, a library every process maps), while it is
/// among the `capacity` most recently used modules. Share one cache (`Arc`) between
/// all captures. Thread-safe.
#[derive(Debug)]
pub struct ModuleCache {
    inner: Mutex<CacheInner>,
}

#[derive(Debug)]
struct CacheInner {
    /// How many modules `recent` may hold.
    capacity: usize,
    /// Every module some `ModuleMaps` may still hold, for reuse while it lives.
    live: HashMap<FileKey, Weak<Module>>,
    /// `live` is pruned of dead entries when it reaches this length.
    prune_at: usize,
    /// The most recently used modules, held open: (module, last use tick).
    recent: HashMap<FileKey, (Arc<Module>, u64)>,
    tick: u64,
}

impl CacheInner {
    /// The live module for `key`, marked as just used.
    fn get(&mut self, key: FileKey) -> Option<Arc<Module>> {
        let module = self.live.get(&key)?.upgrade()?;
        self.touch(&module);
        Some(module)
    }

    /// Records `module` (opened outside the lock) unless another capture raced us
    /// and recorded one for the same key first: returns the one to use.
    fn insert(&mut self, module: Arc<Module>) -> Arc<Module> {
        if let Some(existing) = self.get(module.key) {
            return existing;
        }
        if self.live.len() >= self.prune_at {
            self.live.retain(|_, weak| weak.strong_count() > 0);
            self.prune_at = (self.live.len() * 2).max(64);
        }
        self.live.insert(module.key, Arc::downgrade(&module));
        self.touch(&module);
        module
    }

    /// Marks `module` as the most recently used, holding it open, and closes the
    /// least recently used beyond `capacity` (unless some `ModuleMaps` holds them).
    fn touch(&mut self, module: &Arc<Module>) {
        if self.capacity == 0 {
            return;
        }
        self.tick += 1;
        if let Some(entry) = self.recent.get_mut(&module.key) {
            entry.1 = self.tick;
            return;
        }
        self.recent
            .insert(module.key, (Arc::clone(module), self.tick));
        // A linear scan, only when a new module enters a full cache: capacity is
        // small (hundreds) and new modules are rare next to reuses.
        while self.recent.len() > self.capacity {
            let oldest = self
                .recent
                .iter()
                .min_by_key(|(_, (_, tick))| *tick)
                .map(|(key, _)| *key);
            match oldest {
                Some(key) => self.recent.remove(&key),
                None => break,
            };
        }
    }
}

impl Default for ModuleCache {
    fn default() -> Self {
        Self::new(DEFAULT_MODULE_CACHE_CAPACITY)
    }
}

impl ModuleCache {
    /// A cache that keeps at most `capacity` unused modules open (0: none; modules
    /// are then open only while some [`ModuleMaps`] holds them).
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(CacheInner {
                capacity,
                live: HashMap::new(),
                prune_at: 64,
                recent: HashMap::new(),
                tick: 0,
            }),
        }
    }

    /// The process-wide cache behind [`ModuleMaps::capture`], keeping up to
    /// [`DEFAULT_MODULE_CACHE_CAPACITY`] unused modules open: one cache per daemon
    /// shares each file between all traced processes.
    pub fn global() -> &'static ModuleCache {
        static GLOBAL: LazyLock<ModuleCache> = LazyLock::new(ModuleCache::default);
        &GLOBAL
    }

    /// Number of modules the cache itself holds open (at most `capacity`).
    pub fn held(&self) -> usize {
        self.lock().recent.len()
    }

    /// Number of modules still open, held by the cache or by some [`ModuleMaps`].
    pub fn live(&self) -> usize {
        self.lock()
            .live
            .values()
            .filter(|weak| weak.strong_count() > 0)
            .count()
    }

    fn lock(&self) -> MutexGuard<'_, CacheInner> {
        // The data stays consistent even if a holder panicked: every update is a
        // single map operation.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads `/proc/PID/maps` of the live process `pid` and captures its executable
    /// file-backed mappings (see [`ModuleCache::capture_entries`]).
    pub fn capture(&self, pid: u32) -> Result<ModuleMaps, ProcError> {
        let entries = read_maps(pid)?;
        Ok(self.capture_entries(pid, &entries))
    }

    /// Captures the executable file-backed mappings among `entries` (the parsed
    /// `/proc/PID/maps` of `pid`), opening each file not yet open through
    /// `/proc/PID/map_files/START-END`, else `/proc/PID/root/PATH`, else `PATH`
    /// (the latter two only if the inode matches). A file that cannot be opened is
    /// still recorded, without a file, so its addresses resolve to the module path.
    pub fn capture_entries(&self, pid: u32, entries: &[MapEntry]) -> ModuleMaps {
        let mut mappings = Vec::new();
        let mut anonymous = Vec::new();
        for entry in entries {
            if !entry.perms.execute {
                continue;
            }
            if !entry.is_file_backed() {
                // JIT code, the vDSO; not [vsyscall], which is the kernel's.
                if entry.path.as_deref() != Some("[vsyscall]") {
                    anonymous.push((entry.start, entry.end));
                }
                continue;
            }
            let Some(path) = entry.path.clone() else {
                continue;
            };
            let key = entry.file_key();
            let cached = self.lock().get(key);
            let module = match cached {
                Some(module) => module,
                None => {
                    let file = open_mapped_file(pid, entry, &path);
                    let opened = file.is_some();
                    let module = Arc::new(Module::new(key, path, file));
                    if opened {
                        self.lock().insert(module)
                    } else {
                        // Not cached: the next capture tries to open it again.
                        module
                    }
                }
            };
            mappings.push(ModuleMapping {
                start: entry.start,
                end: entry.end,
                offset: entry.offset,
                module,
            });
        }
        mappings.sort_by_key(|m| m.start);
        anonymous.sort_unstable();
        ModuleMaps {
            pid,
            mappings,
            anonymous,
        }
    }
}

/// Opens the file mapped by `entry` in process `pid`, checking that it is the mapped
/// inode (a path may name another file by now).
fn open_mapped_file(pid: u32, entry: &MapEntry, path: &str) -> Option<File> {
    let candidates = [
        Some(proc_path(
            pid,
            &format!("map_files/{:x}-{:x}", entry.start, entry.end),
        )),
        (!entry.deleted).then(|| proc_path(pid, &format!("root{path}"))),
        (!entry.deleted).then(|| PathBuf::from(path)),
    ];
    for candidate in candidates.iter().flatten() {
        match open_checked(candidate, entry.inode) {
            Ok(file) => return Some(file),
            Err(error) => {
                tracing::debug!(pid, target = %candidate.display(), %error, "cannot open mapped file");
            }
        }
    }
    None
}

fn open_checked(path: &Path, inode: u64) -> io::Result<File> {
    let file = File::open(path)?;
    let found = file.metadata()?.ino();
    if found != inode {
        return Err(io::Error::other(format!(
            "inode {found} is not the mapped inode {inode}"
        )));
    }
    Ok(file)
}

#[cfg(test)]
// CONTRIBUTING.md: tests may unwrap.
#[cfg(test)]
// CONTRIBUTING.md: tests may unwrap.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn capture_translates_own_code_address_to_file_offset() {
        let cache = ModuleCache::new(4);
        let pid = std::process::id();
        let maps = cache.capture(pid).unwrap();
        let addr = capture_translates_own_code_address_to_file_offset as *const () as usize as u64;
        let (module, file_offset) = maps.lookup(addr).unwrap();
        let exe = std::env::current_exe().unwrap();
        assert_eq!(&**module.path(), exe.to_str().unwrap());
        // The same translation from the raw maps entry.
        let entries = read_maps(pid).unwrap();
        let entry = entries
            .iter()
            .find(|e| e.start <= addr && addr < e.end)
            .unwrap();
        assert_eq!(addr - entry.start + entry.offset, file_offset);
        assert!(entry.perms.execute);
        // The module is held open and its fd path reaches the same inode.
        let fd_path = module.fd_path().unwrap();
        assert_eq!(std::fs::metadata(fd_path).unwrap().ino(), entry.inode);
        assert!(maps.lookup(0).is_none());
    }

    #[test]
    fn capture_opens_each_file_once_and_bounds_what_it_holds() {
        let cache = ModuleCache::new(1);
        let pid = std::process::id();
        let first = cache.capture(pid).unwrap();
        let second = cache.capture(pid).unwrap();
        assert_eq!(first.mappings().len(), second.mappings().len());
        assert!(!first.mappings().is_empty());
        for (a, b) in first.mappings().iter().zip(second.mappings()) {
            assert!(Arc::ptr_eq(&a.module, &b.module));
        }
        let distinct: std::collections::HashSet<u64> =
            first.mappings().iter().map(|m| m.module.id()).collect();
        assert_eq!(cache.live(), distinct.len());
        assert_eq!(cache.held(), 1);
        drop(first);
        drop(second);
        // Only the one most recently used module stays open.
        assert_eq!(cache.live(), 1);
        let none = ModuleCache::new(0);
        drop(none.capture(pid).unwrap());
        assert_eq!(none.live(), 0);
        assert_eq!(none.held(), 0);
    }

    #[test]
    fn module_maps_lookup_boundaries() {
        let module = Arc::new(Module::new(
            FileKey {
                dev: (1, 2),
                inode: 3,
            },
            Arc::from("/x"),
            None,
        ));
        let maps = ModuleMaps {
            pid: 1,
            mappings: vec![
                ModuleMapping {
                    start: 0x1000,
                    end: 0x2000,
                    offset: 0x0,
                    module: Arc::clone(&module),
                },
                ModuleMapping {
                    start: 0x3000,
                    end: 0x4000,
                    offset: 0x5000,
                    module: Arc::clone(&module),
                },
            ],
            anonymous: vec![(0x8000, 0x9000)],
        };
        assert!(maps.lookup(0xfff).is_none());
        // Executable: in a file's mapping or an anonymous one, ends excluded.
        let executable: Vec<u64> = [
            0xfff, 0x1000, 0x2000, 0x3fff, 0x7fff, 0x8000, 0x8fff, 0x9000,
        ]
        .into_iter()
        .filter(|&a| maps.is_executable(a))
        .collect();
        assert_eq!(executable, [0x1000, 0x3fff, 0x8000, 0x8fff]);
        assert!(maps.lookup(0x8000).is_none());
        assert_eq!(maps.lookup(0x1000).map(|(_, o)| o), Some(0));
        assert_eq!(maps.lookup(0x1fff).map(|(_, o)| o), Some(0xfff));
        assert!(maps.lookup(0x2000).is_none());
        assert_eq!(maps.lookup(0x3010).map(|(_, o)| o), Some(0x5010));
        assert!(maps.lookup(0x4000).is_none());
        assert!(maps.lookup(u64::MAX).is_none());
        assert!(ModuleMaps::empty(1).lookup(0x1000).is_none());
    }
}
