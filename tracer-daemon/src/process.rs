//! Processes: what tracerd learns about a traced process from `/proc`.
//!
//! - [`parse_maps`] / [`read_maps`]: the memory mappings of `/proc/PID/maps`.
//! - [`ProcessIdentity`]: (pid, start time), the identity that survives pid reuse.
//! - [`read_comm`], [`read_exe`]: the names shown by `GET /processes`.
//! - [`ModuleCache`] and [`ModuleMaps`]: the executable file-backed mappings of one
//!   process image, captured while the process lives, with each mapped file held open
//!   so that addresses can be symbolized after the process exited or the file was
//!   deleted or replaced on disk.
//!
//! Everything read from `/proc` is untrusted text: parsers return [`ProcError`] on
//! malformed input and never panic.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

/// Errors of the process stage. Each carries the pid and `/proc` path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// Reading a `/proc/PID/...` file failed (the process may have exited: see
    /// [`ProcError::is_process_gone`]).
    #[error("pid {pid}: cannot read {}: {source}", path.display())]
    Io {
        /// The process whose file was read.
        pid: u32,
        /// The file, e.g. `/proc/1234/maps`.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A `/proc/PID/...` file was read but its text is not what the kernel writes.
    #[error("pid {pid}: malformed {}: {reason}", path.display())]
    Malformed {
        /// The process whose file was read.
        pid: u32,
        /// The file, e.g. `/proc/1234/stat`.
        path: PathBuf,
        /// What is wrong, with the line number where it applies.
        reason: String,
    },
    /// [`parse_maps`] met a line that is not a `/proc/PID/maps` line.
    #[error("malformed maps text, line {line}: {reason}")]
    MalformedMaps {
        /// 1-based line number in the parsed text.
        line: usize,
        /// What is wrong with the line.
        reason: &'static str,
    },
    /// [`parse_stat_start_time`] met text that is not a `/proc/PID/stat` line.
    #[error("malformed stat text: {reason}")]
    MalformedStat {
        /// What is wrong with the text.
        reason: &'static str,
    },
}

impl ProcError {
    /// True when the error means the process no longer exists (`ENOENT`/`ESRCH` on
    /// its `/proc` entry): an expected race with process exit, not a fault.
    pub fn is_process_gone(&self) -> bool {
        match self {
            Self::Io { source, .. } => {
                source.kind() == io::ErrorKind::NotFound
                    || source.raw_os_error() == Some(libc::ESRCH)
            }
            _ => false,
        }
    }

    /// Attaches pid and path context to an error of the pure parsers.
    fn in_file(self, pid: u32, path: PathBuf) -> Self {
        match self {
            Self::MalformedMaps { line, reason } => Self::Malformed {
                pid,
                path,
                reason: format!("line {line}: {reason}"),
            },
            Self::MalformedStat { reason } => Self::Malformed {
                pid,
                path,
                reason: reason.to_owned(),
            },
            other => other,
        }
    }
}

/// `/proc/PID/NAME`.
fn proc_path(pid: u32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{name}"))
}

/// Reads a whole `/proc/PID/NAME` file as bytes.
fn read_proc_file(pid: u32, name: &str) -> Result<(PathBuf, Vec<u8>), ProcError> {
    let path = proc_path(pid, name);
    match std::fs::read(&path) {
        Ok(bytes) => Ok((path, bytes)),
        Err(source) => Err(ProcError::Io { pid, path, source }),
    }
}

// ---------------------------------------------------------------------------
// /proc/PID/maps
// ---------------------------------------------------------------------------

/// The permission column of a `/proc/PID/maps` line, e.g. `r-xp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Perms {
    /// `r`: readable.
    pub read: bool,
    /// `w`: writable.
    pub write: bool,
    /// `x`: executable.
    pub execute: bool,
    /// `s` (shared) rather than `p` (private, copy-on-write).
    pub shared: bool,
}

impl Perms {
    /// Parses exactly four characters `[r-][w-][x-][sp]`.
    fn parse(text: &str) -> Option<Self> {
        let [r, w, x, s] = <[u8; 4]>::try_from(text.as_bytes()).ok()?;
        let flag = |byte: u8, set: u8| match byte {
            b'-' => Some(false),
            b if b == set => Some(true),
            _ => None,
        };
        Some(Self {
            read: flag(r, b'r')?,
            write: flag(w, b'w')?,
            execute: flag(x, b'x')?,
            shared: match s {
                b's' => true,
                b'p' => false,
                _ => return None,
            },
        })
    }
}

/// One line of `/proc/PID/maps`: a virtual memory area of the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// First virtual address of the area (inclusive).
    pub start: u64,
    /// End virtual address of the area (exclusive).
    pub end: u64,
    /// Byte offset in the mapped file of the byte mapped at `start` (0 when anonymous).
    pub offset: u64,
    /// Access permissions.
    pub perms: Perms,
    /// Device of the mapped file as (major, minor); (0, 0) when anonymous.
    pub dev: (u32, u32),
    /// Inode of the mapped file on `dev`; 0 when anonymous.
    pub inode: u64,
    /// The path column: an absolute file path, a pseudo path such as `[heap]`,
    /// `[stack]`, `[vdso]` or `[anon:NAME]`, or `None` for an anonymous mapping.
    /// The kernel's ` (deleted)` suffix is removed (see `deleted`) and its `\012`
    /// escape is turned back into a newline.
    pub path: Option<Arc<str>>,
    /// The kernel marked the path ` (deleted)`: the file was unlinked (or replaced)
    /// after it was mapped.
    pub deleted: bool,
}

impl MapEntry {
    /// True when the area maps a file (an inode and an absolute path), as opposed to
    /// anonymous memory or a pseudo path like `[vdso]`.
    pub fn is_file_backed(&self) -> bool {
        self.inode != 0 && self.path.as_deref().is_some_and(|p| p.starts_with('/'))
    }

    /// The (device, inode) identity of the mapped file.
    pub fn file_key(&self) -> FileKey {
        FileKey {
            dev: self.dev,
            inode: self.inode,
        }
    }

    /// True when `addr` lies in `[start, end)`.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// The offset in the mapped file of the byte at virtual address `addr`
    /// (`addr - start + offset`), or `None` when `addr` is outside the area.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        if !self.contains(addr) {
            return None;
        }
        (addr - self.start).checked_add(self.offset)
    }
}

/// Splits off the next space-separated field, skipping leading spaces.
fn next_field(rest: &str) -> Option<(&str, &str)> {
    let rest = rest.trim_start_matches(' ');
    if rest.is_empty() {
        return None;
    }
    Some(rest.split_once(' ').unwrap_or((rest, "")))
}

/// Parses a non-empty run of hex digits (no sign, no `0x`) that fits in a u64.
fn parse_hex(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

/// Parses a non-empty run of decimal digits that fits in a u64.
fn parse_dec(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

const DELETED_SUFFIX: &str = " (deleted)";

/// Parses one non-empty line of `/proc/PID/maps`.
fn parse_maps_line(line: &str) -> Result<MapEntry, &'static str> {
    let (range, rest) = next_field(line).ok_or("missing address range")?;
    let (start, end) = range.split_once('-').ok_or("address range without '-'")?;
    let start = parse_hex(start).ok_or("bad start address")?;
    let end = parse_hex(end).ok_or("bad end address")?;
    if start > end {
        return Err("start address after end address");
    }
    let (perms, rest) = next_field(rest).ok_or("missing permissions")?;
    let perms = Perms::parse(perms).ok_or("bad permissions")?;
    let (offset, rest) = next_field(rest).ok_or("missing offset")?;
    let offset = parse_hex(offset).ok_or("bad offset")?;
    let (dev, rest) = next_field(rest).ok_or("missing device")?;
    let (major, minor) = dev.split_once(':').ok_or("device without ':'")?;
    let major = parse_hex(major)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or("bad device major")?;
    let minor = parse_hex(minor)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or("bad device minor")?;
    let (inode, rest) = next_field(rest).ok_or("missing inode")?;
    let inode = parse_dec(inode).ok_or("bad inode")?;
    // The rest, after the padding, is the path verbatim: it may contain spaces.
    let mut path = rest.trim_start_matches(' ');
    let mut deleted = false;
    if let Some(stripped) = path.strip_suffix(DELETED_SUFFIX) {
        path = stripped;
        deleted = true;
    }
    let path = if path.is_empty() {
        None
    } else if path.contains("\\012") {
        // The kernel escapes '\n' in paths (and only that) as "\012".
        Some(Arc::from(path.replace("\\012", "\n")))
    } else {
        Some(Arc::from(path))
    };
    Ok(MapEntry {
        start,
        end,
        offset,
        perms,
        dev: (major, minor),
        inode,
        path,
        deleted,
    })
}

/// Parses the text of `/proc/PID/maps`, one [`MapEntry`] per non-empty line, in the
/// order of the text (the kernel writes ascending addresses).
///
/// Accepts paths with spaces, the ` (deleted)` suffix and pseudo paths (`[heap]`,
/// `[stack]`, `[vdso]`, ...). Any malformed line fails the whole parse with
/// [`ProcError::MalformedMaps`]; no input makes it panic.
pub fn parse_maps(text: &str) -> Result<Vec<MapEntry>, ProcError> {
    let mut entries = Vec::new();
    for (index, line) in text.split('\n').enumerate() {
        if line.trim_matches(' ').is_empty() {
            continue;
        }
        let entry = parse_maps_line(line).map_err(|reason| ProcError::MalformedMaps {
            line: index + 1,
            reason,
        })?;
        entries.push(entry);
    }
    Ok(entries)
}

/// Reads and parses `/proc/PID/maps`. Bytes that are not UTF-8 (in paths) are
/// replaced with U+FFFD.
pub fn read_maps(pid: u32) -> Result<Vec<MapEntry>, ProcError> {
    let (path, bytes) = read_proc_file(pid, "maps")?;
    parse_maps(&String::from_utf8_lossy(&bytes)).map_err(|e| e.in_file(pid, path))
}

// ---------------------------------------------------------------------------
// /proc/PID/stat, comm, exe
// ---------------------------------------------------------------------------

/// The identity of a process across pid reuse: its pid plus its start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessIdentity {
    /// The process id (the thread group id, as `/proc/PID` names it).
    pub pid: u32,
    /// When the process started, in clock ticks (`sysconf(_SC_CLK_TCK)`, usually 100
    /// per second) since boot: field 22 (`starttime`) of `/proc/PID/stat`.
    pub start_time: u64,
}

impl ProcessIdentity {
    /// Reads the identity of the live process `pid` from `/proc/PID/stat`.
    pub fn read(pid: u32) -> Result<Self, ProcError> {
        Ok(Self {
            pid,
            start_time: read_start_time(pid)?,
        })
    }
}

/// Extracts field 22 (`starttime`, clock ticks since boot) from the text of
/// `/proc/PID/stat`.
///
/// Field 2 is `(comm)`, and comm may itself contain spaces and `)`; the fields after
/// it are found from the LAST `)` of the text, which the kernel's own formatting
/// guarantees closes comm.
pub fn parse_stat_start_time(text: &str) -> Result<u64, ProcError> {
    let close = text.rfind(')').ok_or(ProcError::MalformedStat {
        reason: "no ')' closing the comm field",
    })?;
    let after = text.get(close + 1..).unwrap_or("");
    // `after` starts with field 3 (state); field 22 is 19 fields later.
    let field = after
        .split_ascii_whitespace()
        .nth(22 - 3)
        .ok_or(ProcError::MalformedStat {
            reason: "fewer than 22 fields",
        })?;
    parse_dec(field).ok_or(ProcError::MalformedStat {
        reason: "field 22 (starttime) is not a decimal number",
    })
}

/// Reads the start time of process `pid`: field 22 of `/proc/PID/stat`, in clock
/// ticks since boot.
pub fn read_start_time(pid: u32) -> Result<u64, ProcError> {
    let (path, bytes) = read_proc_file(pid, "stat")?;
    parse_stat_start_time(&String::from_utf8_lossy(&bytes)).map_err(|e| e.in_file(pid, path))
}

/// Reads `/proc/PID/comm`: the command name (at most 15 bytes, set by the kernel
/// from the executable's name or by `prctl(PR_SET_NAME)`), without the trailing
/// newline; bytes that are not UTF-8 are replaced with U+FFFD.
pub fn read_comm(pid: u32) -> Result<String, ProcError> {
    let (_, bytes) = read_proc_file(pid, "comm")?;
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// Reads the link `/proc/PID/exe`, for display: the path of the process's
/// executable as the kernel reports it (with a ` (deleted)` suffix when the file
/// was unlinked), bytes that are not UTF-8 replaced with U+FFFD. Kernel threads
/// have none: that is an [`ProcError::Io`] with `NotFound`.
pub fn read_exe(pid: u32) -> Result<String, ProcError> {
    let path = proc_path(pid, "exe");
    match std::fs::read_link(&path) {
        Ok(exe) => Ok(exe.to_string_lossy().into_owned()),
        Err(source) => Err(ProcError::Io { pid, path, source }),
    }
}

// ---------------------------------------------------------------------------
// Modules: executable files mapped by processes, held open
// ---------------------------------------------------------------------------

/// The identity of a file on the host as `/proc/PID/maps` reports it:
/// device (major, minor) and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// Device as (major, minor).
    pub dev: (u32, u32),
    /// Inode number on that device.
    pub inode: u64,
}

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
    deleted: bool,
    file: Option<File>,
}

impl Module {
    /// A number unique to this open file for the daemon's lifetime: unlike the
    /// (dev, inode) key, never reused, so it is safe as a cache key for derived data.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The (device, inode) of the file, from `/proc/PID/maps`.
    pub fn key(&self) -> FileKey {
        self.key
    }

    /// The path of the file from `/proc/PID/maps` of the process that first mapped it
    /// (without the ` (deleted)` suffix): what frames report as the module.
    pub fn path(&self) -> &Arc<str> {
        &self.path
    }

    /// The file was already unlinked when it was captured.
    pub fn deleted(&self) -> bool {
        self.deleted
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

    fn new(key: FileKey, path: Arc<str>, deleted: bool, file: Option<File>) -> Self {
        Self {
            id: NEXT_MODULE_ID.fetch_add(1, Ordering::Relaxed),
            key,
            path,
            deleted,
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
}

impl ModuleMaps {
    /// Maps with no mappings (every address translates to nothing), e.g. for a
    /// process that exited before it could be captured.
    pub fn empty(pid: u32) -> Self {
        Self {
            pid,
            mappings: Vec::new(),
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
        for entry in entries {
            if !entry.perms.execute || !entry.is_file_backed() {
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
                    let module = Arc::new(Module::new(key, path, entry.deleted, file));
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
        ModuleMaps { pid, mappings }
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
// STYLE.md: tests may unwrap.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::{Rng as _, SeedableRng as _};

    const MAPS: &str = "\
55d0c8a00000-55d0c8a02000 r--p 00000000 fd:01 1234                       /usr/bin/cat
55d0c8a02000-55d0c8a07000 r-xp 00002000 fd:01 1234                       /usr/bin/cat
55d0c9000000-55d0c9021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000001000 r-xp 00001000 08:10 99                         /opt/my app/lib x.so (deleted)
7f0000001000-7f0000002000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd000fe000-7ffd00100000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parse_maps_reads_every_column() {
        let entries = parse_maps(MAPS).unwrap();
        assert_eq!(entries.len(), 8);
        assert_eq!(
            entries[1],
            MapEntry {
                start: 0x55d0c8a02000,
                end: 0x55d0c8a07000,
                offset: 0x2000,
                perms: Perms {
                    read: true,
                    write: false,
                    execute: true,
                    shared: false
                },
                dev: (0xfd, 0x01),
                inode: 1234,
                path: Some(Arc::from("/usr/bin/cat")),
                deleted: false,
            }
        );
        assert!(entries[1].is_file_backed());
        assert_eq!(entries[1].file_offset(0x55d0c8a02010), Some(0x2010));
        assert_eq!(entries[1].file_offset(0x55d0c8a07000), None);
    }

    #[test]
    fn parse_maps_keeps_spaces_and_strips_deleted() {
        let entries = parse_maps(MAPS).unwrap();
        assert_eq!(entries[3].path.as_deref(), Some("/opt/my app/lib x.so"));
        assert!(entries[3].deleted);
        assert_eq!(entries[3].dev, (8, 0x10));
        assert!(entries[3].is_file_backed());
    }

    #[test]
    fn parse_maps_pseudo_paths_and_anonymous() {
        let entries = parse_maps(MAPS).unwrap();
        assert_eq!(entries[2].path.as_deref(), Some("[heap]"));
        assert!(!entries[2].is_file_backed());
        // Anonymous with the kernel's trailing padding space.
        assert_eq!(entries[4].path, None);
        assert!(!entries[4].is_file_backed());
        assert_eq!(entries[5].path.as_deref(), Some("[stack]"));
        assert_eq!(entries[6].path.as_deref(), Some("[vdso]"));
        assert!(!entries[6].is_file_backed());
        assert_eq!(entries[7].start, 0xffffffffff600000);
        assert_eq!(
            entries[7].perms,
            Perms {
                read: false,
                write: false,
                execute: true,
                shared: false
            }
        );
    }

    #[test]
    fn parse_maps_unescapes_newline_in_path() {
        let text = "1000-2000 r-xp 00000000 fd:01 7 /tmp/a\\012b\n";
        let entries = parse_maps(text).unwrap();
        assert_eq!(entries[0].path.as_deref(), Some("/tmp/a\nb"));
    }

    #[test]
    fn parse_maps_path_named_deleted_only_once_stripped() {
        let text = "1000-2000 r-xp 00000000 fd:01 7 /tmp/x (deleted) (deleted)\n";
        let entries = parse_maps(text).unwrap();
        assert_eq!(entries[0].path.as_deref(), Some("/tmp/x (deleted)"));
        assert!(entries[0].deleted);
    }

    #[test]
    fn parse_maps_empty_text_is_empty() {
        assert_eq!(parse_maps("").unwrap(), Vec::new());
        assert_eq!(parse_maps("\n\n").unwrap(), Vec::new());
    }

    #[test]
    fn parse_maps_rejects_malformed_lines_with_line_number() {
        let cases = [
            ("1000 r-xp 0 fd:01 7 /x", "address range without '-'"),
            (
                "2000-1000 r-xp 0 fd:01 7 /x",
                "start address after end address",
            ),
            ("+10-2000 r-xp 0 fd:01 7 /x", "bad start address"),
            ("1000-2000 rwxq 0 fd:01 7 /x", "bad permissions"),
            ("1000-2000 r-x 0 fd:01 7 /x", "bad permissions"),
            ("1000-2000 r-xp zz fd:01 7 /x", "bad offset"),
            ("1000-2000 r-xp 0 fd01 7 /x", "device without ':'"),
            ("1000-2000 r-xp 0 1ffffffff:01 7 /x", "bad device major"),
            ("1000-2000 r-xp 0 fd:01 -7 /x", "bad inode"),
            ("1000-2000 r-xp 0 fd:01", "missing inode"),
            ("1000-2000", "missing permissions"),
            ("10000000000000000-2 r-xp 0 fd:01 7 /x", "bad start address"),
        ];
        for (line, reason) in cases {
            let text = format!("1000-2000 r-xp 0 fd:01 7 /ok\n{line}\n");
            match parse_maps(&text) {
                Err(ProcError::MalformedMaps { line: 2, reason: r }) => {
                    assert_eq!(r, reason, "{line}")
                }
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    /// Property: arbitrary bytes (and mutations of real maps text) never panic.
    #[test]
    fn parse_maps_never_panics_on_random_input() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x7261_6365);
        let alphabet = b"0123456789abcdefABCDEF-: rwxsp/()[]\n\\deleted\xff";
        for _ in 0..20_000 {
            let len = rng.random_range(0..120);
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    if rng.random_bool(0.7) {
                        alphabet[rng.random_range(0..alphabet.len())]
                    } else {
                        rng.random()
                    }
                })
                .collect();
            let _ = parse_maps(&String::from_utf8_lossy(&bytes));
        }
        let real = MAPS.as_bytes();
        for _ in 0..20_000 {
            let mut bytes = real.to_vec();
            for _ in 0..rng.random_range(1..6) {
                let at = rng.random_range(0..bytes.len());
                match rng.random_range(0..3) {
                    0 => bytes[at] = rng.random(),
                    1 => {
                        bytes.remove(at);
                    }
                    _ => bytes.truncate(at),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let _ = parse_maps(&String::from_utf8_lossy(&bytes));
        }
    }

    fn stat_line(comm: &str) -> String {
        // Fields 3..=22 then the rest, as the kernel writes them; starttime = 424242.
        format!(
            "4321 ({comm}) S 1 4321 4321 0 -1 4194560 100 0 0 0 3 1 0 0 20 0 1 0 424242 \
             8192000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
        )
    }

    #[test]
    fn stat_start_time_with_plain_comm() {
        assert_eq!(parse_stat_start_time(&stat_line("cat")).unwrap(), 424242);
    }

    #[test]
    fn stat_start_time_with_comm_containing_paren_and_spaces() {
        assert_eq!(parse_stat_start_time(&stat_line("a) b")).unwrap(), 424242);
        assert_eq!(
            parse_stat_start_time(&stat_line(") 1 2 3 (")).unwrap(),
            424242
        );
        assert_eq!(parse_stat_start_time(&stat_line("")).unwrap(), 424242);
    }

    #[test]
    fn stat_start_time_rejects_malformed_text() {
        assert!(matches!(
            parse_stat_start_time("4321 cat S 1"),
            Err(ProcError::MalformedStat { .. })
        ));
        assert!(matches!(
            parse_stat_start_time("4321 (cat) S 1 2 3"),
            Err(ProcError::MalformedStat { .. })
        ));
        let bad = stat_line("cat").replace("424242", "42x242");
        assert!(matches!(
            parse_stat_start_time(&bad),
            Err(ProcError::MalformedStat { .. })
        ));
    }

    #[test]
    fn stat_parse_never_panics_on_random_input() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(22);
        for _ in 0..20_000 {
            let len = rng.random_range(0..200);
            let bytes: Vec<u8> = (0..len)
                .map(|_| b"0123456789 ()ab\n\xff"[rng.random_range(0..17)])
                .collect();
            let _ = parse_stat_start_time(&String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn own_process_identity_comm_and_exe() {
        let pid = std::process::id();
        let identity = ProcessIdentity::read(pid).unwrap();
        assert_eq!(identity.pid, pid);
        assert!(identity.start_time > 0);
        // Start time never changes for a live process.
        assert_eq!(read_start_time(pid).unwrap(), identity.start_time);
        let exe = read_exe(pid).unwrap();
        let current_exe = std::env::current_exe().unwrap();
        assert_eq!(exe, current_exe.to_str().unwrap());
        let comm = read_comm(pid).unwrap();
        assert!(!comm.ends_with('\n'));
        let expected: String = current_exe
            .file_name()
            .unwrap()
            .to_string_lossy()
            .chars()
            .take(15)
            .collect();
        // The test harness names threads, not the process, so comm is the exe's name.
        assert_eq!(comm, expected);
    }

    #[test]
    fn missing_process_is_reported_gone() {
        // pid_max is at most 2^22, so this pid never exists.
        let err = read_maps(u32::MAX).unwrap_err();
        assert!(err.is_process_gone(), "{err}");
        assert!(err.to_string().contains("/proc/4294967295/maps"), "{err}");
    }

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
        let entry = entries.iter().find(|e| e.contains(addr)).unwrap();
        assert_eq!(entry.file_offset(addr), Some(file_offset));
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
            false,
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
        };
        assert!(maps.lookup(0xfff).is_none());
        assert_eq!(maps.lookup(0x1000).map(|(_, o)| o), Some(0));
        assert_eq!(maps.lookup(0x1fff).map(|(_, o)| o), Some(0xfff));
        assert!(maps.lookup(0x2000).is_none());
        assert_eq!(maps.lookup(0x3010).map(|(_, o)| o), Some(0x5010));
        assert!(maps.lookup(0x4000).is_none());
        assert!(maps.lookup(u64::MAX).is_none());
        assert!(ModuleMaps::empty(1).lookup(0x1000).is_none());
    }
}
