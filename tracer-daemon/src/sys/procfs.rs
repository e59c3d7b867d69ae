//! Readers of `/proc`: what the kernel says about a process, as text parsed
//! without trust.
//!
//! - [`parse_maps`] / [`read_maps`]: the memory mappings of `/proc/PID/maps`.
//! - [`read_start_time`]: with the pid, the identity that survives pid
//!   reuse (`/proc/PID/stat` field 22); [`read_start_time_and_ppid`] also
//!   gives the parent's pid (field 4), from the same read.
//! - [`read_comm`], [`read_exe`]: the names shown by `GET /processes`.
//! - [`cgroup_v2_path`], [`all_pids`], [`is_process`]: what scoping needs.
//! - [`self_rss`], [`bpf_maps_of_self`]: tracerd's own memory.
//!
//! Everything read from `/proc` is untrusted text: parsers return
//! [`ProcError`] on malformed input and never panic. Facts only, no policy.
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod bpf_maps;

pub use bpf_maps::{BpfMapInfo, bpf_maps_of_self};
mod memory;
pub use memory::read_memory;

/// Errors of the process stage. Each carries the pid and `/proc` path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// Reading a `/proc/PID/...` file failed (the process may have exited).
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
    /// `/proc/PID/maps` lists no mapping: the process has exited and is a
    /// zombie until its parent reaps it (its address space is gone), or it
    /// is a kernel thread. Its mappings read earlier are still its last.
    #[error("pid {pid}: /proc/{pid}/maps is empty (an exited process, or a kernel thread)")]
    NoMappings {
        /// The process whose file was read.
        pid: u32,
    },
    /// [`parse_stat_start_time`] or [`parse_stat_ppid`] met text that is not
    /// a `/proc/PID/stat` line.
    #[error("malformed stat text: {reason}")]
    MalformedStat {
        /// What is wrong with the text.
        reason: &'static str,
    },
}

impl ProcError {
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
pub(crate) fn proc_path(pid: u32, name: &str) -> PathBuf {
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
// /proc/PID/maps

/// The identity of a file on the host as `/proc/PID/maps` reports it:
/// device (major, minor) and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// Device as (major, minor).
    pub dev: (u32, u32),
    /// Inode number on that device.
    pub inode: u64,
}

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

impl FileKey {
    /// The key of the file at `path` (`stat`), as `/proc/PID/maps` of a
    /// process mapping it would show it; None when it cannot be read.
    pub fn of_path(path: &Path) -> Option<Self> {
        Some(Self::of_meta(&std::fs::metadata(path).ok()?))
    }

    /// The key of an open file (`fstat`); None when it cannot be read.
    pub fn of_file(file: &std::fs::File) -> Option<Self> {
        Some(Self::of_meta(&file.metadata().ok()?))
    }

    fn of_meta(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Self {
            dev: (libc::major(meta.dev()), libc::minor(meta.dev())),
            inode: meta.ino(),
        }
    }
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
/// replaced with U+FFFD. Errors: [`ProcError::NoMappings`] when it lists no
/// mapping (a zombie: a process that exited keeps its `/proc/PID` until it is
/// reaped, with an empty `maps`, and its mappings must not be taken for none).
pub fn read_maps(pid: u32) -> Result<Vec<MapEntry>, ProcError> {
    let (path, bytes) = read_proc_file(pid, "maps")?;
    let entries = parse_maps(&String::from_utf8_lossy(&bytes)).map_err(|e| e.in_file(pid, path))?;
    if entries.is_empty() {
        return Err(ProcError::NoMappings { pid });
    }
    Ok(entries)
}

// /proc/PID/stat, comm, exe

/// Field `n` (numbered from 1, `n` > 2) of the text of `/proc/PID/stat`.
///
/// Field 2 is `(comm)`, and comm may itself contain spaces and `)`; the fields after
/// it are found from the LAST `)` of the text, which the kernel's own formatting
/// guarantees closes comm.
fn stat_field(text: &str, n: usize, name: &'static str) -> Result<u64, ProcError> {
    let close = text.rfind(')').ok_or(ProcError::MalformedStat {
        reason: "no ')' closing the comm field",
    })?;
    let after = text.get(close + 1..).unwrap_or("");
    // `after` starts with field 3 (state).
    let field = after
        .split_ascii_whitespace()
        .nth(n - 3)
        .ok_or(ProcError::MalformedStat { reason: name })?;
    parse_dec(field).ok_or(ProcError::MalformedStat { reason: name })
}

/// Extracts field 22 (`starttime`, clock ticks since boot) from the text of
/// `/proc/PID/stat` (see [`stat_field`]).
pub fn parse_stat_start_time(text: &str) -> Result<u64, ProcError> {
    stat_field(
        text,
        22,
        "field 22 (starttime) is missing or not a decimal number",
    )
}

/// Extracts field 4 (`ppid`, the parent's pid as the host's pid namespace
/// sees it) from the text of `/proc/PID/stat` (see [`stat_field`]). 0 is
/// what the kernel writes for a process without a parent (pid 1, kthreadd).
pub fn parse_stat_ppid(text: &str) -> Result<u32, ProcError> {
    const REASON: &str = "field 4 (ppid) is missing or not a decimal pid";
    let ppid = stat_field(text, 4, REASON)?;
    u32::try_from(ppid).map_err(|_| ProcError::MalformedStat { reason: REASON })
}

/// True when the text of `/proc/PID/stat` says the process is a zombie
/// (field 3, its state, is `Z`): it exited and its parent has not reaped
/// it; its `/proc/PID/maps` is empty.
pub fn stat_is_zombie(text: &str) -> bool {
    text.rfind(')')
        .and_then(|close| text.get(close + 1..))
        .and_then(|after| after.split_ascii_whitespace().next())
        == Some("Z")
}

/// True if `pid` is a zombie ([`stat_is_zombie`]); false when it cannot be
/// read (gone).
pub fn is_zombie(pid: u32) -> bool {
    read_proc_file(pid, "stat")
        .is_ok_and(|(_, bytes)| stat_is_zombie(&String::from_utf8_lossy(&bytes)))
}

/// `PF_KTHREAD` in the flags of `/proc/PID/stat` (field 9): a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

/// True if `pid` is a kernel thread (`PF_KTHREAD` in field 9 of
/// `/proc/PID/stat`): it runs no user code, so it has no allocator to
/// probe. False when it cannot be read (gone).
pub fn is_kernel_thread(pid: u32) -> bool {
    read_proc_file(pid, "stat").is_ok_and(|(_, bytes)| {
        stat_field(&String::from_utf8_lossy(&bytes), 9, "field 9 (flags)")
            .is_ok_and(|flags| flags & PF_KTHREAD != 0)
    })
}

/// Process ids of every user process now: [`all_pids`] without the kernel
/// threads ([`is_kernel_thread`]).
pub fn user_pids() -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|&pid| !is_kernel_thread(pid))
        .collect()
}

/// Reads the start time of process `pid`: field 22 of `/proc/PID/stat`, in clock
/// ticks since boot.
pub fn read_start_time(pid: u32) -> Result<u64, ProcError> {
    let (path, bytes) = read_proc_file(pid, "stat")?;
    parse_stat_start_time(&String::from_utf8_lossy(&bytes)).map_err(|e| e.in_file(pid, path))
}

/// Reads the start time (field 22, clock ticks since boot) and the parent's
/// pid (field 4; None when it is 0: no parent) of process `pid` from one
/// read of `/proc/PID/stat`, so that both are of the same process.
pub fn read_start_time_and_ppid(pid: u32) -> Result<(u64, Option<u32>), ProcError> {
    let (path, bytes) = read_proc_file(pid, "stat")?;
    let text = String::from_utf8_lossy(&bytes);
    let start_time = parse_stat_start_time(&text).map_err(|e| e.in_file(pid, path.clone()))?;
    let ppid = parse_stat_ppid(&text).map_err(|e| e.in_file(pid, path))?;
    Ok((start_time, (ppid != 0).then_some(ppid)))
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

// Scoping: which processes exist, and in which cgroup

/// The cgroup v2 path in the text of `/proc/PID/cgroup` (the `0::` line).
pub fn cgroup_v2_path(text: &str) -> Option<&str> {
    text.lines().find_map(|line| line.strip_prefix("0::"))
}

/// The cgroup v2 path of process `pid` (`/proc/PID/cgroup`); None if the
/// process is gone or has no cgroup v2 line.
pub fn read_cgroup(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_path(pid, "cgroup")).ok()?;
    cgroup_v2_path(&text).map(str::to_string)
}

/// The process's id in its own pid namespace: the last id of the `NSpid:`
/// line of a `/proc/PID/status` text (the host pid itself outside any
/// namespace).
pub fn nspid_of(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The user who may look into process `pid` as the kernel's ptrace rule
/// would let them: its real, effective and saved uids (`Uid:` of
/// `/proc/PID/status`) are one user's, and it is dumpable (the kernel then
/// gives the files of `/proc/PID` that user as owner; a setuid or setgid
/// program, or one that made itself non-dumpable, has them owned by root —
/// not the directory `/proc/PID` itself, which keeps the effective uid).
/// None when no unprivileged user may (those, or a process that is gone):
/// operators only.
pub fn read_owner(pid: u32) -> Option<u32> {
    let (status, file_uid) = read_status(pid)?;
    owner_of(&status, file_uid)
}

/// `/proc/PID/status`: its text and the uid that owns the file (fstat of
/// the same open file), for [`owner_of`] and [`nspid_of`] from one read.
pub fn read_status(pid: u32) -> Option<(String, u32)> {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt as _;
    let mut file = std::fs::File::open(proc_path(pid, "status")).ok()?;
    let file_uid = file.metadata().ok()?.uid();
    let mut status = String::new();
    file.read_to_string(&mut status).ok()?;
    Some((status, file_uid))
}

/// [`read_owner`] from a `/proc/PID/status` text and the uid that owns that
/// file: the uid when the `Uid:` line's real, effective and saved ids are
/// all it, else None.
pub fn owner_of(status: &str, file_uid: u32) -> Option<u32> {
    let mut ids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .map(|v| v.parse::<u32>().ok());
    let (real, effective, saved) = (ids.next()??, ids.next()??, ids.next()??);
    (real == file_uid && effective == file_uid && saved == file_uid).then_some(file_uid)
}

/// The container id in a cgroup v2 path, as container runtimes name their
/// cgroups: the 64-hex-digit id in `.../docker-ID.scope`,
/// `.../libpod-ID.scope`, `.../cri-containerd-ID.scope`, `.../crio-ID.scope`
/// or a path component `/docker/ID`; None when the path holds none.
pub fn container_id(cgroup: &str) -> Option<String> {
    cgroup.split('/').rev().find_map(|part| {
        let part = part.strip_suffix(".scope").unwrap_or(part);
        let id = part.rsplit(['-', ':']).next()?;
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
    })
}

/// Process ids of every process now (the numeric entries of `/proc`).
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// True if `pid` is a process (its own thread-group leader), not a thread:
/// the `Tgid:` line of `/proc/PID/status`.
pub fn is_process(pid: u32) -> bool {
    std::fs::read_to_string(proc_path(pid, "status"))
        .ok()
        .is_some_and(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
                == Some(pid)
        })
}

/// True while `/proc/PID` exists.
pub fn exists(pid: u32) -> bool {
    proc_path(pid, "").exists()
}

// tracerd itself

/// tracerd's own resident memory in bytes, from `/proc/self/statm`.
pub fn self_rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

/// The page size in bytes (`sysconf(_SC_PAGESIZE)`; 4096 if it fails).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

#[cfg(test)]
// CONTRIBUTING.md: tests may unwrap.
#[allow(clippy::unwrap_used)]
mod tests;
