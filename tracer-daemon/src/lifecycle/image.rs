//! One process image: from the kernel's `New` event (its first allocation)
//! to its `Exec` or `Exit` event, and its last state after that.
//!
//! An image is named by its [`ImageId`] (pid and the kernel's generation)
//! and also carries its start time (`/proc/PID/stat` field 22), so that a
//! reused pid is never mistaken for it. Its [`ImageState`] is a type, not a
//! string: `alive`, then `exited` or `exec`.
use std::{sync::Arc, time::SystemTime};

use serde::Serialize;
use tracer_common::ProcStats;

use super::blocks::RawBlock;
use crate::capture::ImageId;
use crate::sys::{modules::ModuleMaps, procfs};

/// How an image ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EndReason {
    /// The process called exec: a new image replaced this one.
    Exec,
    /// The process exited.
    Exit,
}

/// Where an image is in its life, as the API shows it (`state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageState {
    /// Traced now.
    Alive,
    /// The process exited; its last state is kept for a while.
    Exited,
    /// The process called exec; this image's last state is kept for a while.
    Exec,
}

impl ImageState {
    /// The word the API uses: `alive`, `exited`, `exec`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ImageState::Alive => "alive",
            ImageState::Exited => "exited",
            ImageState::Exec => "exec",
        }
    }

    /// True for [`ImageState::Alive`].
    #[must_use]
    pub fn is_alive(self) -> bool {
        self == ImageState::Alive
    }
}

impl std::fmt::Display for ImageState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The final state of an ended image, captured from the kernel maps at the
/// moment it ended (before its blocks were removed from them).
#[derive(Clone, Debug)]
pub struct Ended {
    /// Exec or exit.
    pub reason: EndReason,
    /// When tracerd handled the end (wall clock).
    pub at: SystemTime,
    /// The image's final totals, from the kernel's event.
    pub stats: ProcStats,
    /// Its blocks live at the end, shared: a query of the ended image
    /// copies the handle, not millions of blocks, under the registry's lock.
    pub blocks: Arc<[RawBlock]>,
}

/// One traced process image.
#[derive(Clone, Debug)]
pub struct ProcessImage {
    /// Its pid and generation.
    pub id: ImageId,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22);
    /// 0 if the process was gone before it could be read.
    pub start_time: u64,
    /// The parent's pid (`/proc/PID/stat` field 4) when first seen, as the
    /// host sees it; None if the process was gone before it could be read,
    /// or has no parent. An image started by exec may carry its
    /// predecessor's ([`crate::lifecycle::Registry::add`]): exec keeps the
    /// parent.
    pub ppid: Option<u32>,
    /// `/proc/PID/comm` when first seen.
    pub comm: String,
    /// `/proc/PID/exe` when first seen.
    pub exe: Option<String>,
    /// Its pid in its own pid namespace (a container's), from
    /// `/proc/PID/status`, when first seen.
    pub nspid: Option<u32>,
    /// Its cgroup v2 path (`/proc/PID/cgroup`) when first seen.
    pub cgroup: Option<String>,
    /// The unprivileged user who may see it (`procfs::read_owner` when
    /// first seen: all its uids that user's, and dumpable); None: only
    /// operators. While it lives, `/proc/PID` must still say so
    /// (`service::Viewer::sees_image`): a process can make itself
    /// non-dumpable or change its uids later.
    pub owner: Option<u32>,
    /// When tracerd saw its first allocation (wall clock).
    pub first_seen: SystemTime,
    /// Its executable mappings, captured while it lived (refreshed at
    /// queries while it lives); None if it was gone before they were read.
    pub maps: Option<Arc<ModuleMaps>>,
    /// Set once the image ended.
    pub ended: Option<Ended>,
}

impl ProcessImage {
    /// Reads what symbolization and display need from `/proc/PID/...` now,
    /// while the process lives.
    pub fn capture(id: ImageId) -> Self {
        let pid = id.pid;
        Self {
            comm: procfs::read_comm(pid).unwrap_or_default(),
            exe: procfs::read_exe(pid).ok(),
            maps: ModuleMaps::capture(pid).ok().map(Arc::new),
            ..Self::capture_forked(id)
        }
    }

    /// Reads what [`ProcessImage::capture`] does but the command, the
    /// executable and the mappings: those of an image that started at a
    /// fork are its parent's (`Registry::add_forked`), and the child may
    /// run another program by the time `/proc` is read.
    pub fn capture_forked(id: ImageId) -> Self {
        let pid = id.pid;
        let status = procfs::read_status(pid);
        let (start_time, ppid) = procfs::read_start_time_and_ppid(pid).unwrap_or((0, None));
        Self {
            id,
            start_time,
            ppid,
            comm: String::new(),
            exe: None,
            nspid: status.as_ref().and_then(|(text, _)| procfs::nspid_of(text)),
            cgroup: procfs::read_cgroup(pid),
            owner: status
                .as_ref()
                .and_then(|(text, uid)| procfs::owner_of(text, *uid)),
            first_seen: SystemTime::now(),
            maps: None,
            ended: None,
        }
    }

    /// An image known only from a kernel event: nothing read from `/proc`
    /// (its `New` event was lost, or it was gone before it could be read).
    pub fn unknown(id: ImageId) -> Self {
        Self {
            id,
            start_time: 0,
            ppid: None,
            comm: String::new(),
            exe: None,
            nspid: None,
            cgroup: None,
            owner: None,
            first_seen: SystemTime::now(),
            maps: None,
            ended: None,
        }
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.id.pid
    }

    /// Alive, or how it ended.
    #[must_use]
    pub fn state(&self) -> ImageState {
        match self.ended.as_ref().map(|e| e.reason) {
            None => ImageState::Alive,
            Some(EndReason::Exit) => ImageState::Exited,
            Some(EndReason::Exec) => ImageState::Exec,
        }
    }

    /// True for an image that an exec replaced before it made a single
    /// allocation: most often a fork's child that exec'd at once (a shell
    /// starting a command), which held and holds nothing.
    #[must_use]
    pub fn replaced_unused(&self) -> bool {
        self.ended
            .as_ref()
            .is_some_and(|e| e.reason == EndReason::Exec && e.stats.allocs == 0)
    }

    /// True when `/proc/PID` shows that the process is gone: no such pid, or
    /// another process (another start time). An image whose start time was
    /// never read counts as gone only when the pid is free.
    pub fn is_gone(&self) -> bool {
        match procfs::read_start_time(self.id.pid) {
            Ok(now) => self.start_time != 0 && now != self.start_time,
            Err(_) => true,
        }
    }

    /// True while the image has not ended and `/proc/PID` still shows the
    /// same process (same start time).
    pub fn is_alive(&self) -> bool {
        self.ended.is_none()
            && (self.start_time == 0
                || procfs::read_start_time(self.id.pid).ok() == Some(self.start_time))
    }

    /// Re-reads the mappings of a live image (libraries loaded by dlopen
    /// since it was first seen); keeps the old ones if that fails.
    pub fn refresh_maps(&mut self) {
        if self.is_alive()
            && let Ok(maps) = ModuleMaps::capture(self.id.pid)
        {
            self.maps = Some(Arc::new(maps));
        }
    }
}
