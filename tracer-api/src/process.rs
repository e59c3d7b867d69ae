//! Processes and their traced memory: `/processes`, `/pid/{pid}`,
//! `/pid/{pid}/traced-memory`, `/traced-memory`, `clear-traces`,
//! `reset-peak` and `/pid/{pid}/object/{address}`.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{AllocatorFrames, Frame};

/// Where a process image is in its life (`state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessState {
    /// Traced now.
    Alive,
    /// The process exited; its last state is kept for a while.
    Exited,
    /// The process called exec; this image's last state is kept for a while.
    Exec,
}

impl ProcessState {
    /// The word the API uses: `alive`, `exited`, `exec`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Alive => "alive",
            ProcessState::Exited => "exited",
            ProcessState::Exec => "exec",
        }
    }

    /// True for [`ProcessState::Alive`].
    #[must_use]
    pub fn is_alive(self) -> bool {
        self == ProcessState::Alive
    }
}

/// A process image as the API shows it (`GET /pid/{pid}`, sent as this
/// struct: keys in this order). Sizes in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessView {
    /// Process id.
    pub pid: u32,
    /// The image's generation (the kernel's): tells apart the images of
    /// one pid (before and after an exec, or a reused pid).
    pub generation: u32,
    /// The parent's pid: the forking process's for an image that started
    /// at a fork (the kernel's `New` event), else `/proc/PID/stat` field 4
    /// when first seen (as the host sees it); null when unknown (gone
    /// before it could be read) or none.
    pub ppid: Option<u32>,
    /// `/proc/PID/comm` when first seen.
    pub comm: String,
    /// `/proc/PID/exe` when first seen.
    pub exe: Option<String>,
    /// Its pid in its own pid namespace (`NSpid` of `/proc/PID/status`):
    /// inside a container, the pid the container sees; else `pid`.
    pub nspid: Option<u32>,
    /// Its cgroup v2 path (`/proc/PID/cgroup`) when first seen.
    pub cgroup: Option<String>,
    /// The container id in `cgroup` (a runtime's 64-hex-digit id), if any.
    pub container_id: Option<String>,
    /// The unprivileged user who may see it (all its uids theirs and
    /// dumpable, from `/proc/PID` when first seen); null: only operators.
    pub owner_uid: Option<u32>,
    /// Alive, or how the image ended.
    pub state: ProcessState,
    /// Unix ms tracerd learned of the image (its fork or exec; for a
    /// process running before tracerd, its first allocation seen).
    pub first_seen_ms: u64,
    /// Unix ms the image ended, if it did.
    pub ended_ms: Option<u64>,
    /// Bytes in live blocks (`get_traced_memory()[0]`), from the kernel's
    /// totals of the image less the blocks `clear_traces()` removed.
    pub current: u64,
    /// Peak of `current` in bytes (`get_traced_memory()[1]`).
    pub peak: u64,
    /// Live blocks.
    pub blocks: u64,
    /// Allocations seen.
    pub allocs: u64,
    /// Frees of traced blocks seen.
    pub frees: u64,
    /// Frees of untraced pointers.
    pub unknown_frees: u64,
    /// Blocks not traced because a kernel map was full.
    pub drops: u64,
    /// Blocks recorded with a cut traceback since its tracing began (the
    /// kernel's `ProcStats::cut`: its stack not stored, or its walk stopped
    /// for want of mappings or readable memory).
    pub cut_tracebacks: u64,
    /// True when no event of this image was lost and no traceback cut
    /// (`drops == 0 && cut_tracebacks == 0`).
    pub complete: bool,
}

/// A process with its tracing state (`is_tracing()`,
/// `get_traceback_limit()`): an entry of `GET /processes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStatus {
    /// The process; `current`, `peak` and `blocks` as tracemalloc reports
    /// them (zeros while not tracing).
    #[serde(flatten)]
    pub view: ProcessView,
    /// `is_tracing()` of its image.
    pub is_tracing: bool,
    /// `get_traceback_limit()` of its image, in frames.
    pub traceback_limit: u32,
    /// Since when and why it is traced exactly; absent for an image that
    /// ended or a process no longer traced exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<ExactTracing>,
    /// What the watch reads of it (`/proc/PID/statm`), beside the exact
    /// figures: `current` is the bytes of the blocks it allocated since
    /// exact tracing began and still holds; `watch.anon` all its resident
    /// anonymous memory (allocators' free lists, blocks from before,
    /// stacks and mappings included). Absent when not watched (ended, or
    /// the watch is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchFigures>,
}

/// Why a process is traced exactly (`exact.reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExactReason {
    /// `exact = "all"`: every process is.
    All,
    /// The scope names it (`scope_*` settings, `PUT /scope`).
    Scope,
    /// A query of its pid started it (`exact = "demand"`).
    Query,
    /// The watch saw it grow steadily (`auto_exact`).
    Watch,
}

impl ExactReason {
    /// The word the API uses: `all`, `scope`, `query`, `watch`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ExactReason::All => "all",
            ExactReason::Scope => "scope",
            ExactReason::Query => "query",
            ExactReason::Watch => "watch",
        }
    }
}

/// Since when and why a process is traced exactly (every allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactTracing {
    /// Unix ms its exact tracing began (for `all` and `scope`: tracerd's
    /// start); what it allocated before is not traced, as with
    /// `tracemalloc.start()`.
    pub since_ms: u64,
    /// Why.
    pub reason: ExactReason,
}

/// What the watch reads of a process: its memory as the kernel counts it
/// (`/proc/PID/statm`), at every interval, for every process. Bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchFigures {
    /// Resident bytes at the last read (`VmRSS`).
    pub rss: u64,
    /// Resident anonymous bytes at the last read (`RssAnon`).
    pub anon: u64,
    /// Anonymous bytes gained (negative: lost) over the watch's window,
    /// from its oldest read to the last one.
    pub anon_growth: i64,
    /// Milliseconds between those two reads.
    pub growth_over_ms: u64,
    /// Unix ms of the last read.
    pub read_at_ms: u64,
    /// Unix ms of the first read of this process.
    pub watched_since_ms: u64,
}

/// A process as the watch shows it (`GET /processes`' `watched`): every
/// user process, traced exactly or not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchedProcess {
    /// Process id.
    pub pid: u32,
    /// `/proc/PID/comm` now.
    pub comm: String,
    /// Its memory and growth.
    pub watch: WatchFigures,
    /// Since when and why it is traced exactly; null: watched only.
    pub exact: Option<ExactTracing>,
}

/// `GET /processes` (through a Value: keys sorted, the entries' too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessList {
    /// Every traced process the viewer may see, ended ones while kept.
    pub processes: Vec<ProcessStatus>,
    /// `exact`: `demand` (processes traced exactly when asked or growing)
    /// or `all`.
    #[serde(default)]
    pub exact: String,
    /// Every process the watch reads that the viewer may see, traced
    /// exactly or not, by pid (empty with the watch off).
    #[serde(default)]
    pub watched: Vec<WatchedProcess>,
}

/// Current and peak bytes of one allocator family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceMemory {
    /// Bytes in live blocks.
    pub current: u64,
    /// Peak of `current` in bytes.
    pub peak: u64,
}

/// `GET /pid/{pid}/traced-memory`: `get_traced_memory()` and the same by
/// allocator family (through a Value: keys sorted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracedMemory {
    /// Live blocks.
    pub blocks: u64,
    /// Current and peak bytes by allocator family (`glibc`, `jemalloc`,
    /// ...), from the kernel's totals per family; of a live image only
    /// (`{}` once it ended).
    pub by_source: BTreeMap<String, SourceMemory>,
    /// Bytes in live blocks (`get_traced_memory()[0]`).
    pub current: u64,
    /// Peak of `current` in bytes (`get_traced_memory()[1]`).
    pub peak: u64,
    /// Process id.
    pub pid: u32,
    /// Alive, or how the image ended.
    pub state: ProcessState,
}

/// `GET /traced-memory`: `get_traced_memory()` summed over the live
/// processes (sent as this struct).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemMemory {
    /// Sum of current bytes.
    pub current: u64,
    /// Sum of peaks in bytes.
    pub peak: u64,
    /// Sum of live blocks.
    pub blocks: u64,
    /// Live processes summed.
    pub processes: usize,
}

/// `POST /pid/{pid}/clear-traces` (through a Value: keys sorted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearedTraces {
    /// Live blocks after the clear (as `get_traced_memory()` counts them).
    pub blocks: u64,
    /// Blocks removed from the kernel's live maps.
    pub cleared_blocks: u64,
    /// Bytes in live blocks after the clear.
    pub current: u64,
    /// Peak bytes after the clear.
    pub peak: u64,
    /// Process id.
    pub pid: u32,
}

/// `POST /pid/{pid}/reset-peak` (through a Value: keys sorted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakReset {
    /// Bytes in live blocks.
    pub current: u64,
    /// The peak in bytes, now `current`.
    pub peak: u64,
    /// Process id.
    pub pid: u32,
}

/// `GET /pid/{pid}/object/{address}`: `get_object_traceback()` (through a
/// Value: keys sorted). `F` is a frame: tracerd's model frame, or [`Frame`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectTraceback<F = Frame> {
    /// The block's address in the process.
    pub address: u64,
    /// Whether the allocation machinery's leading frames were dropped.
    pub allocator_frames: AllocatorFrames,
    /// Process id.
    pub pid: u32,
    /// The block's requested size in bytes.
    pub size: u64,
    /// `str(trace)`.
    pub text: String,
    /// Frames the stack had when the traceback was cut to nframe; null when
    /// it was not cut.
    pub total_nframe: Option<u32>,
    /// The allocation's frames, most recent first.
    pub traceback: Vec<F>,
}
