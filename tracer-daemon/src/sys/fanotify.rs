//! Execs held by the kernel until tracerd answers: fanotify(7)'s
//! `FAN_OPEN_EXEC_PERM` on every filesystem of tracerd's mount table.
//!
//! `execve(2)` opens the program it runs, and the ELF interpreter the
//! program names (`PT_INTERP`: the dynamic loader, or musl's `libc.so`),
//! for exec; with a permission mark on the file's filesystem the opening
//! process waits in the kernel, before its new image runs one instruction,
//! until the listener writes a response. [`ExecWatch`] reads those events
//! ([`HeldExec`]: the process and the file, open) and answers each with
//! `FAN_ALLOW` exactly once; it never denies. The libraries the loader maps
//! later are plain opens and are not held.
//!
//! Marks are per filesystem (`FAN_MARK_FILESYSTEM`: every mount of it,
//! bind mounts and chroots included): [`ExecWatch::mark_filesystems`] marks
//! each one `/proc/self/mountinfo` lists that can hold programs, and is
//! called again when the mount table changes ([`ExecWatch::mounts_fd`]
//! polls `POLLPRI`). A filesystem mounted in another mount namespace only
//! (and nowhere in tracerd's) is not seen.
//!
//! If tracerd dies, the kernel answers every pending event itself (allow)
//! when the fanotify descriptor closes: a crash never blocks an exec.
use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Filesystem types that hold no programs: not marked.
const NO_PROGRAMS: [&str; 19] = [
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "tracefs",
    "debugfs",
    "securityfs",
    "bpf",
    "mqueue",
    "pstore",
    "configfs",
    "fusectl",
    "hugetlbfs",
    "binfmt_misc",
    "autofs",
    "nsfs",
    "efivarfs",
    "rpc_pipefs",
];

/// The fanotify group of tracerd's exec holds.
#[derive(Debug)]
pub struct ExecWatch {
    fd: OwnedFd,
    /// `/proc/self/mountinfo`, polled for `POLLPRI` (the mount table changed).
    mounts: File,
    /// Device numbers (`st_dev`) of the filesystems marked (or refused).
    marked: Mutex<HashSet<u64>>,
}

/// One exec the kernel holds: process `pid` (its tgid) opens `file` for
/// exec. Answer it with [`ExecWatch::allow`]; until then the process waits.
#[derive(Debug)]
pub struct HeldExec {
    /// The process that execs (fanotify's `pid`: the thread group id).
    pub pid: u32,
    /// The file it opens for exec (the program, or its interpreter), open
    /// read-only; the kernel identifies the event by this descriptor.
    pub file: File,
    answered: AtomicBool,
}

impl ExecWatch {
    /// A new fanotify group (`FAN_CLASS_CONTENT`, non-blocking, its queue
    /// unlimited: a held exec is never dropped) and the
    /// mount table's descriptor; nothing is marked yet.
    ///
    /// # Errors
    /// What `fanotify_init(2)` says: `EPERM` without CAP_SYS_ADMIN,
    /// `EINVAL`/`ENOSYS` on a kernel without permission events.
    pub fn new() -> io::Result<Self> {
        let flags = libc::FAN_CLOEXEC
            | libc::FAN_CLASS_CONTENT
            | libc::FAN_NONBLOCK
            | libc::FAN_UNLIMITED_QUEUE;
        let event_flags = libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC;
        // SAFETY: fanotify_init takes two integers and returns a new
        // descriptor or -1.
        let raw = unsafe { libc::fanotify_init(flags, event_flags as libc::c_uint) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a descriptor fanotify_init just returned, owned by
        // nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mounts = File::open("/proc/self/mountinfo")?;
        Ok(Self {
            fd,
            mounts,
            marked: Mutex::new(HashSet::new()),
        })
    }

    /// The group's descriptor: readable when an exec is held.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// `/proc/self/mountinfo`'s descriptor: `POLLPRI` when the mount table
    /// changed (then call [`ExecWatch::mark_filesystems`]).
    pub fn mounts_fd(&self) -> RawFd {
        self.mounts.as_raw_fd()
    }

    /// Marks every filesystem of `/proc/self/mountinfo` not marked yet
    /// (by `st_dev` of its mount point) whose type can hold programs, for
    /// `FAN_OPEN_EXEC_PERM`. Returns how many it marked now; a mount that
    /// cannot be marked is logged at debug and skipped.
    pub fn mark_filesystems(&self) -> usize {
        use std::io::{Read as _, Seek as _};
        let mut text = String::new();
        let mut mounts = &self.mounts;
        if mounts.rewind().is_err() || mounts.read_to_string(&mut text).is_err() {
            return 0;
        }
        let mut done = self
            .marked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut marked = 0;
        for (mount_point, fstype) in text.lines().filter_map(mount_point_and_type) {
            if NO_PROGRAMS.contains(&fstype.as_str()) {
                continue;
            }
            let Ok(meta) = std::fs::metadata(&mount_point) else {
                continue;
            };
            if done.contains(&meta.dev()) {
                continue;
            }
            match self.mark(&mount_point) {
                Ok(()) => {
                    done.insert(meta.dev());
                    marked += 1;
                }
                Err(err) => {
                    tracing::debug!(mount = %mount_point, fstype, %err, "cannot hold execs on a filesystem");
                    // Not tried again at every change of the table.
                    done.insert(meta.dev());
                }
            }
        }
        marked
    }

    fn mark(&self, mount_point: &str) -> io::Result<()> {
        self.fanotify_mark(
            libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
            libc::FAN_OPEN_EXEC_PERM,
            Some(mount_point),
        )
    }

    /// `fanotify_mark(2)` of this group with `flags` and `mask` on `path`
    /// (None: no path, as `FAN_MARK_FLUSH` takes).
    fn fanotify_mark(&self, flags: libc::c_uint, mask: u64, path: Option<&str>) -> io::Result<()> {
        let path = path
            .map(std::ffi::CString::new)
            .transpose()
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let path_ptr = path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
        // SAFETY: the descriptor is this group's; the path is null or a
        // NUL-terminated string that lives through the call.
        let rc = unsafe {
            libc::fanotify_mark(self.fd.as_raw_fd(), flags, mask, libc::AT_FDCWD, path_ptr)
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The execs held now (none when nothing is pending: the group is
    /// non-blocking). Each must be answered with [`ExecWatch::allow`].
    ///
    /// # Errors
    /// A read error other than `EAGAIN`.
    pub fn read(&self) -> io::Result<Vec<HeldExec>> {
        let mut held = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::WouldBlock {
                    return Ok(held);
                }
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            let n = usize::try_from(n).unwrap_or(0);
            if n == 0 {
                return Ok(held);
            }
            parse_events(&buf[..n], &mut held);
        }
    }

    /// Stops holding the execs of `exec`'s file (an ignore mark on its
    /// inode, cleared by the kernel when the file is written, and by
    /// [`ExecWatch::hold_all_again`]): a program that needs nothing of
    /// tracerd is not held again. Returns false when the kernel refused.
    pub fn stop_holding(&self, exec: &HeldExec) -> bool {
        self.fanotify_mark(
            libc::FAN_MARK_ADD | libc::FAN_MARK_IGNORED_MASK,
            libc::FAN_OPEN_EXEC_PERM,
            Some(&format!("/proc/self/fd/{}", exec.file.as_raw_fd())),
        )
        .is_ok()
    }

    /// Holds the execs of every file again ([`ExecWatch::stop_holding`]
    /// undone: every inode mark flushed; the filesystems' marks stay).
    pub fn hold_all_again(&self) {
        if let Err(err) = self.fanotify_mark(libc::FAN_MARK_FLUSH, 0, None) {
            tracing::debug!(%err, "cannot flush the exec holds' ignore marks");
        }
    }

    /// Lets `exec` go on (`FAN_ALLOW`), once: a second call does nothing.
    pub fn allow(&self, exec: &HeldExec) {
        if exec.answered.swap(true, Ordering::AcqRel) {
            return;
        }
        let response = libc::fanotify_response {
            fd: exec.file.as_raw_fd(),
            response: libc::FAN_ALLOW,
        };
        // SAFETY: response is a plain struct read for its size; the
        // descriptor is this group's.
        let n = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&raw const response).cast::<libc::c_void>(),
                size_of::<libc::fanotify_response>(),
            )
        };
        if n < 0 {
            tracing::debug!(pid = exec.pid, err = %io::Error::last_os_error(), "answering a held exec");
        }
    }
}

impl HeldExec {
    /// True once [`ExecWatch::allow`] answered it.
    pub fn answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }
}

/// Appends the events of `buf` (whole `fanotify_event_metadata` records)
/// to `held`; a record without a descriptor (none is held) is skipped.
fn parse_events(buf: &[u8], held: &mut Vec<HeldExec>) {
    let header = size_of::<libc::fanotify_event_metadata>();
    let mut at = 0;
    while let Some(record) = buf.get(at..at + header) {
        // SAFETY: record holds `header` bytes; read_unaligned copes with
        // alignment and the struct is plain integers.
        let meta: libc::fanotify_event_metadata =
            unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
        let len = meta.event_len as usize;
        if len < header {
            return;
        }
        at += len;
        if meta.fd < 0 {
            continue;
        }
        // SAFETY: the kernel opened this descriptor for us with the event;
        // nothing else owns it.
        let file = unsafe { File::from_raw_fd(meta.fd) };
        held.push(HeldExec {
            pid: u32::try_from(meta.pid).unwrap_or(0),
            file,
            answered: AtomicBool::new(false),
        });
    }
}

/// The mount point (octal escapes undone) and filesystem type of one
/// `/proc/self/mountinfo` line.
fn mount_point_and_type(line: &str) -> Option<(String, String)> {
    let (before, after) = line.split_once(" - ")?;
    let mount_point = before.split(' ').nth(4)?;
    let fstype = after.split(' ').next()?;
    Some((unescape(mount_point), fstype.to_string()))
}

/// Undoes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = field.get(i + 1..i + 4)
            && let Ok(value) = u8::from_str_radix(octal, 8)
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_the_unescaped_mount_point_and_type() {
        let line =
            "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw,errors=continue";
        assert_eq!(
            mount_point_and_type(line),
            Some(("/mnt/a b".to_string(), "ext3".to_string()))
        );
        assert_eq!(mount_point_and_type("garbage"), None);
        assert_eq!(unescape("a\\134b\\04"), "a\\b\\04");
    }

    #[test]
    fn truncated_event_records_are_ignored() {
        let mut held = Vec::new();
        parse_events(&[1, 2, 3], &mut held);
        // A header whose length is below the header's own.
        let mut buf = vec![0u8; size_of::<libc::fanotify_event_metadata>()];
        buf[0] = 4;
        parse_events(&buf, &mut held);
        assert!(held.is_empty());
    }
}
