//! The dynamic loader's search, replayed from outside: which shared objects
//! `ld.so` of a process's root would load at start for a dynamic ELF
//! executable (the closure of `DT_NEEDED`), found while tracerd holds the
//! exec (fanotify), so they can be examined before the program runs.
//!
//! - [`Root`]: a process's root (`/proc/PID/root`: a container's or a
//!   chroot), held open; every path is resolved inside it with `openat2(2)`
//!   `RESOLVE_IN_ROOT`, so absolute symlinks and `..` never escape it.
//! - [`needed_objects`]: the closure, in the loader's breadth-first order,
//!   searched as glibc's `ld.so` does for a non-setuid program: a name with
//!   `/` as a path; `DT_RPATH` (of the needing object, then of the
//!   executable, unless the needing object has `DT_RUNPATH`); `DT_RUNPATH`;
//!   the root's `/etc/ld.so.cache`; the default directories. A candidate is
//!   taken only when it is an ELF of the executable's class and machine.
//! - [`parse_ld_so_cache`]: glibc's `/etc/ld.so.cache`, parsed without trust.
//!
//! Not replayed (the answer may miss or add objects): `LD_LIBRARY_PATH`,
//! `LD_PRELOAD` and `/etc/ld.so.preload`, `glibc-hwcaps` subdirectories
//! (the cache's first entry for a name is taken, whatever its hwcaps),
//! `$LIB` and `$PLATFORM` (entries using them are skipped), relative search
//! directories (relative to the process's working directory: skipped),
//! `DF_1_NODEFLIB`, the `RPATH` of intermediate loaders, and other default
//! directories than x86-64's. Facts only, no policy.
//!
//! Every file read is untrusted (the root belongs to the traced program):
//! sizes are capped, offsets checked, nothing panics. Objects are read with
//! `pread` through `object`'s `ReadCache`, only the parts the loader reads
//! (headers, the dynamic section, its strings): never mapped, so a file
//! truncated meanwhile reads short instead of raising `SIGBUS`.
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use object::read::elf::{Dyn as _, FileHeader, ProgramHeader as _};
use object::read::{ReadCache, ReadRef, StringTable};
use object::{Endianness, FileKind, elf};

/// Objects larger than this (bytes) are not read.
const MAX_OBJECT_BYTES: u64 = 1 << 30;
/// `/etc/ld.so.cache` is read up to this many bytes.
const MAX_CACHE_BYTES: u64 = 64 << 20;
/// Candidate files opened per [`needed_objects`] call, at most.
const MAX_CANDIDATES: usize = 4096;
/// `DT_NEEDED` names kept per object, and search directories per `RPATH`.
const MAX_NAMES: usize = 1024;
const MAX_DIRS: usize = 64;
/// glibc's default directories on x86-64 (Debian multiarch first).
pub const DEFAULT_DIRS: [&str; 6] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// A process's root directory (`/proc/PID/root`, or any directory), held
/// open as an `O_PATH` dirfd: paths opened through it resolve inside it.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
}

impl Root {
    /// `/proc/PID/root` of `pid`, opened `O_PATH|O_DIRECTORY|O_CLOEXEC`:
    /// the process's root (a container's or chroot's) as the kernel sees it.
    ///
    /// # Errors
    /// The process is gone, or tracerd may not read its root (`EACCES`).
    pub fn of_pid(pid: u32) -> io::Result<Root> {
        Self::of_dir(Path::new(&format!("/proc/{pid}/root")))
    }

    /// Any directory as a root (tests), opened `O_PATH|O_DIRECTORY|O_CLOEXEC`.
    ///
    /// # Errors
    /// `dir` does not exist or is not a directory.
    pub fn of_dir(dir: &Path) -> io::Result<Root> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(dir)?;
        Ok(Root { fd: file.into() })
    }

    /// Opens `path` (absolute, as the process sees it) for reading, resolved
    /// inside the root: `openat2(2)` with `RESOLVE_IN_ROOT` (absolute symlinks
    /// and `..` stay inside) and `RESOLVE_NO_MAGICLINKS` (no `/proc/*/fd`
    /// escapes), `O_RDONLY|O_CLOEXEC`, plus `O_NONBLOCK|O_NOCTTY` so that a
    /// FIFO or terminal planted in the root cannot block or adopt tracerd.
    ///
    /// # Errors
    /// The path does not exist in the root, contains a NUL byte
    /// (`InvalidInput`), would resolve through a magic link (`ELOOP`), or the
    /// kernel has no `openat2` (`ENOSYS`, before Linux 5.6).
    pub fn open(&self, path: &Path) -> io::Result<File> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
        // SAFETY: open_how is three u64s (non-exhaustive: no literal); zero is valid.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = u64::from(flags.cast_unsigned());
        how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
        let mut tries = 0;
        loop {
            // SAFETY: `c_path` is NUL-terminated and `how` initialized, both
            // alive for the call; the size passed is `how`'s own.
            let ret = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.fd.as_raw_fd(),
                    c_path.as_ptr(),
                    &raw const how,
                    size_of::<libc::open_how>(),
                )
            };
            if ret >= 0 {
                let fd = RawFd::try_from(ret).map_err(|_| io::Error::other("bad fd"))?;
                // SAFETY: openat2 returned a new descriptor that nothing else owns.
                return Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
            let err = io::Error::last_os_error();
            tries += 1;
            // EAGAIN: a rename raced RESOLVE_IN_ROOT's check; worth a retry.
            if tries >= 3 || !matches!(err.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) {
                return Err(err);
            }
        }
    }
}

/// One object the loader would load: its path in the root (where the search
/// found it, e.g. `/lib/x86_64-linux-gnu/libc.so.6`) and the file, open.
#[derive(Debug)]
pub struct Needed {
    /// The path inside the root at which the object was found.
    pub path: PathBuf,
    /// The object, open for reading.
    pub file: File,
}

/// What the loader reads of one ELF object.
#[derive(Debug, Default)]
struct Dynamic {
    is64: bool,
    machine: u16,
    has_dynamic: bool,
    needed: Vec<Vec<u8>>,
    rpath: Option<Vec<u8>>,
    runpath: Option<Vec<u8>>,
    interp: Option<Vec<u8>>,
    /// `DT_SONAME` is present: a shared object (a dynamic loader opened
    /// for exec is one), not a program.
    has_soname: bool,
}

/// Whether `file` is an ELF shared object with a `DT_SONAME`: what the
/// kernel opens for exec as a program's interpreter (glibc's `ld.so`,
/// musl's `libc.so`), as opposed to a program (a position-independent
/// program has no soname). False for what cannot be read.
pub fn is_shared_object(file: &File) -> bool {
    read_elf(file).is_some_and(|elf| elf.has_soname)
}

/// The shared objects a dynamic executable `exe` (an open file) needs at
/// start, in the loader's breadth-first order, each once by
/// (`st_dev`, `st_ino`), the exe itself and its `PT_INTERP` excluded: the
/// closure of `DT_NEEDED`, searched in `root` (see the module doc for the
/// order and what is not replayed). `exe_path`: the exe's path inside the
/// root (symlinks resolved, as `/proc/self/exe` gives it), for `$ORIGIN`
/// (`None`: entries with `$ORIGIN` are skipped). At most `limit` objects.
/// An executable that is not ELF, is static (no `PT_DYNAMIC`) or cannot be
/// parsed gives an empty Vec. A name that is not found is skipped. At most
/// 4096 candidate files are opened per call.
pub fn needed_objects(
    root: &Root,
    exe: &File,
    exe_path: Option<&Path>,
    limit: usize,
) -> Vec<Needed> {
    let mut out = Vec::new();
    let Some(main) = read_elf(exe) else {
        return out;
    };
    if !main.has_dynamic {
        return out;
    }
    let mut search = Search {
        root,
        is64: main.is64,
        machine: main.machine,
        cache: None,
        seen: HashSet::new(),
        opened: 0,
    };
    let mut names: HashSet<Vec<u8>> = HashSet::new();
    search.seen.extend(file_id(exe));
    if let Some(interp) = &main.interp {
        if let Ok(file) = root.open(Path::new(OsStr::from_bytes(interp))) {
            search.seen.extend(file_id(&file));
        }
        // ld.so knows itself by its file name too (libc's DT_NEEDED on it).
        names.extend(interp.rsplit(|&b| b == b'/').next().map(<[u8]>::to_vec));
    }
    let exe_origin = exe_path.and_then(Path::parent).map(Path::to_path_buf);
    let mut exe_dirs = Vec::new();
    if let (None, Some(rpath)) = (&main.runpath, &main.rpath) {
        expand_list(rpath, exe_origin.as_deref(), &mut exe_dirs);
    }
    let mut queue = VecDeque::from([(main, exe_origin, true)]);
    while let Some((obj, origin, is_main)) = queue.pop_front() {
        for name in &obj.needed {
            if out.len() >= limit {
                return out;
            }
            // Loaded names are matched first; a name not found is searched
            // again for the next object that needs it (its own RPATH).
            if name.is_empty() || names.contains(name.as_slice()) {
                continue;
            }
            let mut dirs = Vec::new();
            if obj.runpath.is_none() {
                if let Some(rpath) = &obj.rpath {
                    expand_list(rpath, origin.as_deref(), &mut dirs);
                }
                if !is_main {
                    dirs.extend(exe_dirs.iter().cloned());
                }
            }
            if let Some(runpath) = &obj.runpath {
                expand_list(runpath, origin.as_deref(), &mut dirs);
            }
            let Some((path, file, elf)) = search.find(name, origin.as_deref(), &dirs) else {
                continue;
            };
            names.insert(name.clone());
            if file_id(&file).is_some_and(|id| !search.seen.insert(id)) {
                continue; // already loaded under another name
            }
            let origin = path.parent().map(Path::to_path_buf);
            out.push(Needed { path, file });
            queue.push_back((elf, origin, false));
        }
    }
    out
}

/// The search state of one [`needed_objects`] call.
struct Search<'r> {
    root: &'r Root,
    is64: bool,
    machine: u16,
    /// `/etc/ld.so.cache` of the root, read at the first cache lookup: the
    /// first path of each name among entries of the exe's flags.
    cache: Option<HashMap<Vec<u8>, PathBuf>>,
    /// (dev, ino) of every object loaded so far.
    seen: HashSet<(u64, u64)>,
    opened: usize,
}

impl Search<'_> {
    /// The first acceptable candidate for `name`: as a path when it has a
    /// `/`, else in `dirs`, the cache, the default directories.
    fn find(
        &mut self,
        name: &[u8],
        origin: Option<&Path>,
        dirs: &[PathBuf],
    ) -> Option<(PathBuf, File, Dynamic)> {
        if self.opened >= MAX_CANDIDATES {
            return None;
        }
        if name.contains(&b'/') {
            let path = expand_origin(name, origin)?;
            return path
                .starts_with(b"/")
                .then(|| self.candidate(PathBuf::from(OsStr::from_bytes(&path))))?;
        }
        let name_os = OsStr::from_bytes(name);
        for dir in dirs {
            if let Some(found) = self.candidate(dir.join(name_os)) {
                return Some(found);
            }
        }
        let flags = match (self.is64, self.machine) {
            (true, elf::EM_X86_64) => Some(0x0303), // FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
            (true, elf::EM_AARCH64) => Some(0x0a03), // FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64
            (false, elf::EM_386) => Some(0x0003),   // FLAG_ELF_LIBC6
            _ => None,                              // any: the ELF check decides
        };
        let root = self.root;
        let cached = self
            .cache
            .get_or_insert_with(|| {
                let mut first = HashMap::new();
                for (key, path, f) in read_cache(root) {
                    if flags.is_none_or(|want| f == want) {
                        first
                            .entry(key.into_bytes())
                            .or_insert_with(|| PathBuf::from(path));
                    }
                }
                first
            })
            .get(name)
            .cloned();
        if let Some(found) = cached.and_then(|path| self.candidate(path)) {
            return Some(found);
        }
        DEFAULT_DIRS
            .iter()
            .find_map(|dir| self.candidate(Path::new(dir).join(name_os)))
    }

    /// `path` opened in the root, when it is an ELF of the exe's class and machine.
    fn candidate(&mut self, path: PathBuf) -> Option<(PathBuf, File, Dynamic)> {
        if self.opened >= MAX_CANDIDATES || !path.is_absolute() {
            return None;
        }
        self.opened += 1;
        let file = self.root.open(&path).ok()?;
        let elf = read_elf(&file)?;
        (elf.is64 == self.is64 && elf.machine == self.machine).then_some((path, file, elf))
    }
}

/// (`st_dev`, `st_ino`) of an open file.
fn file_id(file: &File) -> Option<(u64, u64)> {
    file.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// The root's `/etc/ld.so.cache`, parsed; empty when absent or unreadable.
fn read_cache(root: &Root) -> Vec<(String, String, u32)> {
    let Ok(file) = root.open(Path::new("/etc/ld.so.cache")) else {
        return Vec::new();
    };
    let mut data = Vec::new();
    if !file.metadata().is_ok_and(|m| m.is_file())
        || file.take(MAX_CACHE_BYTES).read_to_end(&mut data).is_err()
    {
        return Vec::new();
    }
    parse_ld_so_cache(&data)
}

/// Appends the absolute directories of a `:`-separated `RPATH`/`RUNPATH`,
/// `$ORIGIN` replaced; relative ones and unsupported tokens are skipped.
fn expand_list(list: &[u8], origin: Option<&Path>, out: &mut Vec<PathBuf>) {
    for entry in list.split(|&b| b == b':').take(MAX_DIRS) {
        if let Some(dir) = expand_origin(entry, origin).filter(|d| d.starts_with(b"/")) {
            out.push(PathBuf::from(OsStr::from_bytes(&dir)));
        }
    }
}

/// `entry` with `$ORIGIN` and `${ORIGIN}` replaced by `origin`; `None` when
/// it has another `$` token, or `$ORIGIN` without an origin.
fn expand_origin(entry: &[u8], origin: Option<&Path>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = entry;
    while let Some(at) = rest.iter().position(|&b| b == b'$') {
        let (head, tail) = rest.split_at_checked(at)?;
        out.extend_from_slice(head);
        rest = match tail.strip_prefix(b"${ORIGIN}") {
            Some(after) => after,
            // Unbraced, the name ends at the first non-identifier byte.
            None => tail.strip_prefix(b"$ORIGIN").filter(|after| {
                !after
                    .first()
                    .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
            })?,
        };
        out.extend_from_slice(origin?.as_os_str().as_bytes());
    }
    out.extend_from_slice(rest);
    Some(out)
}

/// Reads what the loader needs of an open file: a regular file of at most
/// 1 GiB, read in the parts parsed (`ReadCache`); `None` when it is not an
/// ELF.
fn read_elf(file: &File) -> Option<Dynamic> {
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_OBJECT_BYTES {
        return None;
    }
    let cache = ReadCache::new(file);
    let data = &cache;
    match FileKind::parse(data).ok()? {
        FileKind::Elf64 => parse_elf::<elf::FileHeader64<Endianness>, _>(data),
        FileKind::Elf32 => parse_elf::<elf::FileHeader32<Endianness>, _>(data),
        _ => None,
    }
}

/// Class, machine, `PT_INTERP` and the dynamic section's `DT_NEEDED`,
/// `DT_RPATH`, `DT_RUNPATH` of an ELF image.
fn parse_elf<'data, H: FileHeader<Endian = Endianness>, R: ReadRef<'data>>(
    data: R,
) -> Option<Dynamic> {
    let header = H::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let mut out = Dynamic {
        is64: header.is_type_64(),
        machine: header.e_machine(endian),
        ..Dynamic::default()
    };
    let phdrs = header.program_headers(endian, data).unwrap_or_default();
    let mut dynamic = None;
    for ph in phdrs {
        if let Ok(Some(interp)) = ph.interpreter(endian, data) {
            out.interp = Some(interp.to_vec());
        }
        if let Ok(Some(dyns)) = ph.dynamic(endian, data) {
            dynamic = dynamic.or(Some(dyns));
        }
    }
    let Some(dyns) = dynamic else {
        return Some(out);
    };
    out.has_dynamic = true;
    let dyns = dyns
        .iter()
        .take_while(|d| d.tag32(endian) != Some(elf::DT_NULL));
    let value = |tag| {
        dyns.clone()
            .find(|d| d.tag32(endian) == Some(tag))
            .map(|d| d.d_val(endian).into())
    };
    // DT_STRTAB is an address: find the PT_LOAD holding it; else the
    // string table the dynamic section links to.
    let strings = value(elf::DT_STRTAB)
        .zip(value(elf::DT_STRSZ))
        .and_then(|(addr, size): (u64, u64)| {
            phdrs
                .iter()
                .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
                .find_map(|ph| {
                    let into = addr.checked_sub(ph.p_vaddr(endian).into())?;
                    if into.checked_add(size)? > ph.p_filesz(endian).into() {
                        return None;
                    }
                    let start = ph.p_offset(endian).into().checked_add(into)?;
                    Some(StringTable::new(data, start, start.checked_add(size)?))
                })
        })
        .or_else(|| {
            let sections = header.sections(endian, data).ok()?;
            let (_, link) = sections.dynamic(endian, data).ok()??;
            sections.strings(endian, data, link).ok()
        });
    let Some(strings) = strings else {
        return Some(out);
    };
    for d in dyns {
        let value: u64 = d.d_val(endian).into();
        let Some(value) = u32::try_from(value)
            .ok()
            .and_then(|offset| strings.get(offset).ok())
        else {
            continue;
        };
        match d.tag32(endian) {
            Some(elf::DT_NEEDED) if out.needed.len() < MAX_NAMES => out.needed.push(value.to_vec()),
            Some(elf::DT_RPATH) => out.rpath = Some(value.to_vec()),
            Some(elf::DT_RUNPATH) => out.runpath = Some(value.to_vec()),
            Some(elf::DT_SONAME) => out.has_soname = true,
            _ => {}
        }
    }
    Some(out)
}

/// glibc's `/etc/ld.so.cache` (`glibc-ld.so.cache1.1`, also after an old
/// `ld.so-1.7.0` block): each entry as (soname key, e.g. `libc.so.6`; path
/// value, e.g. `/lib/x86_64-linux-gnu/libc.so.6`; flags, e.g. `0x0303` for
/// x86-64 libc6), in file order. Malformed data gives the entries that could
/// be read before it (entries with a bad or non-UTF-8 string are skipped);
/// the old format's own entries are not read. Never panics.
#[must_use]
pub fn parse_ld_so_cache(data: &[u8]) -> Vec<(String, String, u32)> {
    const OLD: &[u8] = b"ld.so-1.7.0";
    const NEW: &[u8] = b"glibc-ld.so.cache1.1";
    let mut out = Vec::new();
    let start = if data.starts_with(OLD) {
        // struct cache_file: magic[11], pad, u32 nlibs, 12-byte entries;
        // the new table follows, aligned to 8.
        let end = read_u32(data, 12, false).and_then(|n| {
            usize::try_from(n)
                .ok()?
                .checked_mul(12)?
                .checked_add(16 + 7)
        });
        let Some(end) = end else { return out };
        end & !7
    } else {
        0
    };
    let Some(new) = data.get(start..).filter(|new| new.starts_with(NEW)) else {
        return out;
    };
    // struct cache_file_new: magic+version[20], u32 nlibs, u32 len_strings,
    // u8 flags (2 little, 3 big endian), ... 48 bytes; 24-byte entries
    // {i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap}. Strings are
    // NUL-terminated, at offsets from the start of this header.
    let big = new.get(28) == Some(&3);
    let Some(nlibs) = read_u32(new, 20, big) else {
        return out;
    };
    let string = |offset: u32| {
        let tail = new.get(usize::try_from(offset).ok()?..)?;
        let len = tail.iter().position(|&b| b == 0)?;
        String::from_utf8(tail.get(..len)?.to_vec()).ok()
    };
    for i in 0..usize::try_from(nlibs).unwrap_or(usize::MAX) {
        let Some(at) = i.checked_mul(24).and_then(|o| o.checked_add(48)) else {
            break;
        };
        let (Some(flags), Some(key), Some(value)) = (
            read_u32(new, at, big),
            read_u32(new, at.saturating_add(4), big),
            read_u32(new, at.saturating_add(8), big),
        ) else {
            break;
        };
        if let (Some(key), Some(value)) = (string(key), string(value)) {
            out.push((key, value, flags));
        }
    }
    out
}

/// The u32 at byte `at` of `data`, if it is all there.
fn read_u32(data: &[u8], at: usize, big: bool) -> Option<u32> {
    let bytes: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if big {
        u32::from_be_bytes(bytes)
    } else {
        u32::from_le_bytes(bytes)
    })
}

#[cfg(test)]
mod tests;
