//! Execs held until their probes are in place (`hold_exec`): a process
//! that starts in scope is traced from its first allocation, the dynamic
//! loader's and its constructors' included, even when its allocator is new
//! to tracerd.
//!
//! The kernel holds each `execve` at the opening of its program and of its
//! interpreter (`sys::fanotify`), before the new image runs. While it
//! waits, [`ExecHolder::exec_held`] examines what the image will run: the
//! file itself (a static allocator, musl's `libc.so` as interpreter) and,
//! for a dynamic program, the objects its loader will map at start
//! (`elf::ldso`, resolved in the process's root, so a container's own
//! glibc is found), and probes each that defines an allocator. In a scoped
//! tracerd, a process that matches is put in the kernel's scope filter
//! (a scope of executables or cgroups), or attached (a scope of pids: its
//! perf events follow it through the exec), before it runs; one that
//! execs out of a filtered scope is taken out. The objects also get their
//! unwind tables, so that the new image's first stacks are walked whole
//! (its mappings come from the kernel's own VMAs until tracerd has read
//! them: `tracer_common::vma`). The hold answers within [`HOLD_LIMIT`]
//! whatever happens: work still running then goes on without the process,
//! as it did without the hold.
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Service;
use super::allocators::Discoverer;
use super::state::lock;
use crate::elf::ldso;
use crate::elf::unwind::compile_file;
use crate::lifecycle::allocators::Allocators;
use crate::sys::procfs::FileKey;

/// What the exec holds read without the service's locks, owned by the
/// service and driven from `tasks.rs` ([`ExecHolder::exec_held`]).
pub(super) struct ExecHolds {
    /// The objects each program held at its exec needs at start
    /// ([`ExecHolder::exec_held`]).
    pub(super) objects: std::sync::Mutex<ExecObjects>,
    /// Whether the scope in force is every process (read by the exec
    /// holds' fast path without the scope's lock).
    pub(super) scope_is_all: std::sync::atomic::AtomicBool,
    /// Raised when what an exec needs of tracerd may have changed (the
    /// scope, an object no longer probed): the exec holds hold every
    /// program again ([`ExecHolder::holds_epoch`]).
    pub(super) epoch: std::sync::atomic::AtomicU64,
}

impl Default for ExecHolds {
    fn default() -> Self {
        Self {
            objects: std::sync::Mutex::default(),
            scope_is_all: std::sync::atomic::AtomicBool::new(true),
            epoch: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

/// Longest an exec is held: it is let go then, whatever is still running
/// for it.
pub const HOLD_LIMIT: Duration = Duration::from_millis(500);

/// Most objects read for one program's start (its `DT_NEEDED` closure).
const MAX_NEEDED: usize = 128;

/// Most programs whose objects are remembered ([`ExecObjects`]).
const MAX_PROGRAMS: usize = 4096;

/// The objects each program examined at a hold runs on at start (itself
/// included; none for a script), by the program's (device, inode): a
/// program run again finds them all known and costs a lookup.
#[derive(Debug, Default)]
pub(super) struct ExecObjects {
    needs: HashMap<FileKey, Vec<FileKey>>,
}

/// What the exec holds' threads (`tasks.rs`) ask: whether an exec needs
/// nothing, and the probes and tables put in place before a held exec
/// goes on, over the service's `ExecHolds`.
pub struct ExecHolder<'a> {
    service: &'a Service,
}

impl<'a> ExecHolder<'a> {
    /// The exec holds' work over `service`'s state.
    #[must_use]
    pub fn new(service: &'a Service) -> Self {
        Self { service }
    }

    /// Process `pid` is held opening `file` for exec (its program, or its
    /// interpreter): probes the allocators the new image will run on that
    /// tracerd does not probe yet and, when tracerd is scoped, puts the
    /// process in the kernel's scope filter or takes it out (executables,
    /// cgroups: decided at the program's open), or attaches its probes
    /// (pids). Nothing for tracerd itself, a process out of scope, or once
    /// stopping.
    pub fn exec_held(&self, pid: u32, file: &File) {
        if pid == std::process::id() || self.service.stopping() {
            return;
        }
        let Some(key) = FileKey::of_file(file) else {
            return;
        };
        // A script's own open is not its image: its interpreter's is.
        if is_script(file) {
            self.remember(key, Vec::new());
            return;
        }
        let scope = self.service.state.locks().scope().scope.clone();
        // A program's interpreter (a shared object) says nothing of the
        // scope: its program's open, just before, decided.
        let matches = scope.matches_exec(pid, key);
        let in_scope = if !scope.is_filtered() {
            matches
        } else if ldso::is_shared_object(file) {
            self.filter_has(pid)
        } else {
            let mut held = self.service.state.locks().kernel();
            held.kernel.set_in_scope(pid, matches);
            matches
        };
        if !in_scope {
            return;
        }
        self.probe_before_exec(pid, file, key);
        if !scope.is_all() && !scope.is_filtered() {
            let mut held = self.service.state.locks().kernel();
            if let Err(err) = held.kernel.attach(Some(pid)) {
                tracing::debug!(pid, %err, "could not attach to a process in scope at its exec");
            }
        }
    }

    /// Whether an exec of object `key` needs nothing of tracerd, decided
    /// without waiting for any lock (a lock held elsewhere: false): every
    /// process is in scope, and the object and everything it needs at
    /// start were examined at an earlier exec. The exec can go at once,
    /// without a trip to the worker thread.
    pub fn exec_needs_nothing(&self, key: FileKey) -> bool {
        if !self
            .service
            .exec_holds
            .scope_is_all
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return false;
        }
        let Some(allocators) = &self.service.discovery.allocators else {
            return true;
        };
        let Ok(memo) = self.service.exec_holds.objects.try_lock() else {
            return false;
        };
        let Some(needs) = memo.needs.get(&key) else {
            return false;
        };
        let Ok(known) = allocators.try_lock() else {
            return false;
        };
        needs.iter().all(|k| known.knows(*k)) && self.have_tables(needs, false)
    }

    /// Whether every one of `objects` was offered to the unwinder (it has
    /// a table, or was refused one); with `wait` false, false while the
    /// kernel lock is not free to read at once.
    fn have_tables(&self, objects: &[FileKey], wait: bool) -> bool {
        let held = if wait {
            Some(self.service.state.locks().kernel_shared())
        } else {
            self.service.state.locks().try_kernel_shared()
        };
        held.is_some_and(|held| {
            objects
                .iter()
                .all(|k| held.kernel.unwind_file(*k).is_some())
        })
    }

    /// Compiles and loads the unwind tables of `objects` that have none,
    /// before the process runs: its first allocations (the loader's, the
    /// constructors') are then walked with them. Compiling holds no lock.
    pub(super) fn tables_before_exec(&self, objects: &[(FileKey, &File)]) {
        let missing: Vec<(FileKey, &File)> = {
            let held = self.service.state.locks().kernel_shared();
            objects
                .iter()
                .filter(|(key, _)| held.kernel.unwind_file(*key).is_none())
                .copied()
                .collect()
        };
        for (key, file) in missing {
            if self.service.stopping() {
                return;
            }
            let table = file
                .try_clone()
                .map_err(|e| e.to_string())
                .and_then(|file| compile_file(file).map_err(|e| e.to_string()));
            let mut held = self.service.state.locks().kernel();
            held.kernel
                .load_unwind_file(key, table.as_ref().map_err(String::as_str));
        }
    }

    /// Raised when the scope changes or an object stops being probed: a
    /// program let go at once before ([`ExecHolder::exec_needs_nothing`]) may
    /// need tracerd again.
    pub fn holds_epoch(&self) -> u64 {
        self.service
            .exec_holds
            .epoch
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Remembers what the program `key` runs at start: `objects`, itself
    /// included (none for a script, whose interpreter's open decides).
    fn remember(&self, key: FileKey, objects: Vec<FileKey>) {
        let mut memo = lock(&self.service.exec_holds.objects);
        if memo.needs.len() >= MAX_PROGRAMS {
            memo.needs.clear();
        }
        memo.needs.insert(key, objects);
    }

    /// Whether `pid` is in the kernel's scope filter now.
    fn filter_has(&self, pid: u32) -> bool {
        self.service.state.locks().kernel().kernel.is_in_scope(pid)
    }

    /// Probes the allocators among `file` (object `key`) and the objects
    /// it needs at start that discovery has not examined.
    fn probe_before_exec(&self, pid: u32, file: &File, key: FileKey) {
        let Some(allocators) = &self.service.discovery.allocators else {
            return;
        };
        let known = |keys: &[FileKey]| {
            let held = lock(allocators);
            keys.iter().all(|k| held.knows(*k))
        };
        let remembered = lock(&self.service.exec_holds.objects)
            .needs
            .get(&key)
            .cloned();
        if remembered.is_some_and(|needs| known(&needs) && self.have_tables(&needs, true)) {
            return;
        }
        let root = ldso::Root::of_pid(pid).ok();
        let own_path = fd_path(file);
        let in_root = own_path.as_deref().and_then(|path| path_in_root(pid, path));
        // Each object is named as /proc/PID/maps names it to tracerd: the
        // kernel's path of the open file, from tracerd's root.
        let mut objects: Vec<(PathBuf, FileKey, Option<File>)> =
            vec![(own_path.unwrap_or_default(), key, None)];
        if let Some(root) = &root {
            for needed in ldso::needed_objects(root, file, in_root.as_deref(), MAX_NEEDED) {
                if let Some(k) = FileKey::of_file(&needed.file) {
                    let path = fd_path(&needed.file).unwrap_or(needed.path);
                    objects.push((path, k, Some(needed.file)));
                }
            }
        }
        self.remember(key, objects.iter().map(|o| o.1).collect());
        for (path, object_key, opened) in &objects {
            let object_key = *object_key;
            if self.service.stopping() {
                return;
            }
            if lock(allocators).knows(object_key) {
                continue;
            }
            let object = opened.as_ref().unwrap_or(file);
            let Some(found) = Allocators::examine_open(object, path, object_key, pid) else {
                lock(allocators).examined(object_key, pid, false);
                continue;
            };
            let family = found.probes.family;
            let points = found.probes.points.len();
            let added = Discoverer::new(self.service).probe_library(found);
            match &added {
                Ok(()) => {
                    tracing::info!(pid, object = %path.display(), family = family.name(), points, "probing an allocator before its process runs");
                }
                Err(err) => {
                    tracing::warn!(pid, object = %path.display(), %err, "cannot probe an allocator");
                }
            }
            lock(allocators).examined(object_key, pid, added.is_ok());
        }
        // After the probes: a block missed is worse than a stack cut.
        let files: Vec<(FileKey, &File)> = objects
            .iter()
            .map(|(_, object_key, opened)| (*object_key, opened.as_ref().unwrap_or(file)))
            .collect();
        self.tables_before_exec(&files);
    }
}

/// Whether `file` starts with `#!` (an interpreter script).
fn is_script(file: &File) -> bool {
    let mut magic = [0u8; 2];
    file.read_exact_at(&mut magic, 0).is_ok() && magic == *b"#!"
}

/// The path of an open file in tracerd's view (`/proc/self/fd/N`).
fn fd_path(file: &File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd as _;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// `path` (in tracerd's view) as process `pid` sees it, below its root
/// (`/proc/PID/root`); None when the file is not under that root.
fn path_in_root(pid: u32, path: &Path) -> Option<PathBuf> {
    let root = std::fs::read_link(format!("/proc/{pid}/root")).ok()?;
    let rest = path.strip_prefix(&root).ok()?;
    Some(Path::new("/").join(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_under_the_process_root_is_seen_from_that_root() {
        let pid = std::process::id();
        assert_eq!(
            path_in_root(pid, Path::new("/usr/bin/env")),
            Some(PathBuf::from("/usr/bin/env"))
        );
    }

    #[test]
    fn scripts_are_told_from_programs() {
        let dir = std::env::temp_dir().join(format!("exec-hold-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let script = dir.join("s");
        std::fs::write(&script, "#!/bin/sh\n").expect("write");
        assert!(is_script(&File::open(&script).expect("open")));
        assert!(!is_script(&File::open("/proc/self/exe").expect("exe")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
