//! Attaching: the allocator probes of every probed object, for every
//! process or one process at a time (a scoped tracerd); objects found
//! while tracing added and removed; the programs' runtime switches.
//!
//! Each program's probes in one object are one uprobe_multi link where the
//! kernel has them ([`super::multi`]; a sampling tracerd's allocating calls
//! one uprobe session link, where the kernel has those): closing it unregisters them all with
//! one wait for the kernel's grace periods, and links closed on several
//! threads wait at once. Elsewhere each probe is a perf event of its own,
//! which costs the kernel grace periods to detach (one probe after
//! another, measured in `docs/design/0011-measured-figures.md`: the kernel unregisters perf events' probes in turn
//! under its `event_mutex`). Either way links leave on their own threads
//! ([`detach_all`]) so that no lock waits for them, and are owned apart
//! from the programs ([`ProbeLinks`]) so that a stop takes them all at its
//! signal without waiting for the kernel lock.
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use aya::programs::{
    TracePoint, UProbe,
    trace_point::TracePointLink,
    uprobe::{UProbeAttachPoint, UProbeLink, UProbeScope},
};
use tracer_common::{
    MAP_SCOPE_TGIDS, MAP_SWITCHES, SESSION_KIND_SHIFT, SESSION_PROGRAM, session_kind,
};

use super::load::program_mut;
use super::multi::MultiPrograms;
use super::probes::{AttachedLibrary, ProbePoint, Target};
use super::{Capture, CaptureError};
use crate::sys::procfs::FileKey;
use crate::sys::uprobe_multi::{self, LinkKind, MultiAttach};

/// One attached link: the object, and its ticket in the [`ProbeLinks`]
/// that own the links.
pub(super) type Link = (FileKey, u64);

/// The link of one or more uprobes: dropping it detaches them.
enum ProbeLink {
    /// One probe, a perf event (aya's link).
    Perf(#[expect(dead_code, reason = "held: dropping it detaches")] UProbeLink),
    /// Every probe of one program in one object (and process): a
    /// uprobe_multi link's descriptor, and how many probes it holds.
    Multi {
        #[expect(dead_code, reason = "held: closing it detaches")]
        fd: OwnedFd,
        probes: usize,
    },
}

impl ProbeLink {
    /// The uprobes it holds.
    fn probes(&self) -> usize {
        match self {
            ProbeLink::Perf(_) => 1,
            ProbeLink::Multi { probes, .. } => *probes,
        }
    }
}

/// The attached probes' links, owned apart from the programs and behind a
/// lock of their own, so that a stop takes them out at its signal without
/// waiting for the kernel lock, which requests in flight may hold for
/// seconds. Dropping a link detaches it.
#[derive(Default)]
pub struct OwnedLinks {
    uprobes: HashMap<u64, ProbeLink>,
    tracepoints: Vec<TracePointLink>,
    next_ticket: u64,
    /// Set once everything was taken out ([`OwnedLinks::take_all`]): a
    /// link handed in afterwards is refused (and detached).
    closed: bool,
}

impl std::fmt::Debug for OwnedLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedLinks")
            .field("uprobes", &self.uprobes.len())
            .field("tracepoints", &self.tracepoints.len())
            .field("closed", &self.closed)
            .finish()
    }
}

/// [`OwnedLinks`], shared by the `Capture` and whoever stops tracerd.
pub type ProbeLinks = Arc<Mutex<OwnedLinks>>;

impl OwnedLinks {
    /// Takes every link out (see [`Detached`]) and refuses any later one.
    pub fn take_all(&mut self) -> Detached {
        self.closed = true;
        Detached {
            uprobes: self.uprobes.drain().map(|(_, link)| link).collect(),
            tracepoints: std::mem::take(&mut self.tracepoints),
        }
    }

    /// Whether [`OwnedLinks::take_all`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Keeps `link`; its ticket, or None (the link dropped, so detached)
    /// once closed.
    fn keep(&mut self, link: ProbeLink) -> Option<u64> {
        if self.closed {
            return None;
        }
        self.next_ticket += 1;
        self.uprobes.insert(self.next_ticket, link);
        Some(self.next_ticket)
    }
}

/// Locks the links (a panic while they were held leaves them usable:
/// every change is one insert or removal).
pub fn lock_links(links: &ProbeLinks) -> MutexGuard<'_, OwnedLinks> {
    links
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Capture {
    /// Attaches the probes of every probed object for every process (`pid`
    /// None) or for one process only: its probes are registered with the
    /// kernel for that process (a link or perf event with a pid), so the
    /// breakpoints are placed in its memory only and other processes pay
    /// nothing. Uretprobes first, then uprobes, so no entry is recorded
    /// whose return would be missed. Objects attached already for `pid`
    /// are left as they are.
    ///
    /// # Errors
    /// [`CaptureError::Attach`] (e.g. the process is gone); nothing of this
    /// attach stays attached then. [`CaptureError::Stopping`] once tracerd
    /// is stopping.
    pub fn attach(&mut self, pid: Option<u32>) -> Result<(), CaptureError> {
        if lock_links(&self.owned_links).is_closed() || self.stopping.is_raised() {
            return Err(CaptureError::Stopping);
        }
        let done: Vec<FileKey> = self
            .links
            .get(&pid)
            .map(|links| links.iter().map(|l| l.0).collect())
            .unwrap_or_default();
        let mut links = Vec::new();
        for index in 0..self.targets.len() {
            if done.contains(&self.targets[index].key) {
                continue;
            }
            if let Err(err) = self.attach_target(index, pid, &mut links) {
                self.detach_links(links);
                return Err(err);
            }
        }
        self.links.entry(pid).or_default().extend(links);
        Ok(())
    }

    /// Attaches target `index` for `pid` (see [`Capture::attach`]),
    /// appending its links to `links`; on an error the links attached so
    /// far are in `links`.
    fn attach_target(
        &mut self,
        index: usize,
        pid: Option<u32>,
        links: &mut Vec<Link>,
    ) -> Result<(), CaptureError> {
        let target = &self.targets[index];
        let (key, path) = (target.key, target.path.clone());
        let cookie = u64::from(target.family.source());
        let points = target.points.clone();
        let session = self.multi.as_ref().is_some_and(MultiPrograms::session);
        for exit_pass in [true, false] {
            for (name, probes) in by_program(&points, self.programs, exit_pass, session) {
                if let Some(multi) = &self.multi {
                    let link = attach_multi(multi, name, &path, &probes, cookie, pid, exit_pass);
                    let symbols: Vec<&str> = probes.iter().map(|probe| probe.symbol).collect();
                    self.keep_link(link, (name, &path, &symbols.join(",")), key, links)?;
                    continue;
                }
                for Probe { offset, symbol, .. } in probes {
                    let link = attach_perf(&mut self.ebpf, name, &path, offset, cookie, pid);
                    self.keep_link(link, (name, &path, symbol), key, links)?;
                }
            }
        }
        Ok(())
    }

    /// Hands `link` of object `key` to the [`ProbeLinks`] and its ticket to
    /// `links`; `what` (program, path, symbols) names it in an error.
    ///
    /// # Errors
    /// [`CaptureError::Attach`] when `link` is one;
    /// [`CaptureError::Stopping`] once the links were taken out (the link
    /// is detached).
    fn keep_link(
        &self,
        link: Result<ProbeLink, AttachError>,
        (program, path, symbols): (&str, &Path, &str),
        key: FileKey,
        links: &mut Vec<Link>,
    ) -> Result<(), CaptureError> {
        let link = link.map_err(|source| CaptureError::Attach {
            program: program.into(),
            target: format!("{}:{symbols}", path.display()),
            source,
        })?;
        let ticket = lock_links(&self.owned_links)
            .keep(link)
            .ok_or(CaptureError::Stopping)?;
        links.push((key, ticket));
        Ok(())
    }

    /// Detaches what [`Capture::attach`] attached for `pid` (None: the
    /// system-wide probes, which are gone when it returns: a scope change
    /// is complete when it answers). One process's probes leave on a
    /// thread of their own: each link's detach waits for grace periods of
    /// the kernel (about 0.07 s a uprobe_multi link, their waits
    /// overlapping; 0.1 s a probe for perf events), and an exec held until
    /// its probes are attached must not wait behind a process that ended.
    /// Detaching what is not attached does nothing.
    pub fn detach(&mut self, pid: Option<u32>) {
        if let Some(links) = self.links.remove(&pid) {
            if pid.is_some() {
                self.detach_links(links);
            } else {
                let owned = self.take_links(links);
                detach_all(owned);
            }
        }
    }

    /// Probes one more object, `library`, at `points` through `path` (see
    /// [`Target::path`]), for every process or pid attached now: an
    /// allocator found in a process (`lifecycle::allocators`). An object
    /// probed already is left as it is. A pid that cannot be attached
    /// (gone) is skipped.
    ///
    /// # Errors
    /// [`CaptureError::Attach`] when the system-wide probes cannot be
    /// attached; nothing of the object stays probed then.
    /// [`CaptureError::Stopping`] once the probes were taken out
    /// ([`Capture::take_probes`]).
    pub fn add_library(
        &mut self,
        library: AttachedLibrary,
        path: PathBuf,
        file: Option<std::fs::File>,
        points: Vec<ProbePoint>,
    ) -> Result<(), CaptureError> {
        if lock_links(&self.owned_links).is_closed() {
            return Err(CaptureError::Stopping);
        }
        let key = library.key;
        if self.targets.iter().any(|t| t.key == key) {
            return Ok(());
        }
        self.targets.push(Target {
            key,
            path,
            file,
            points,
            family: library.family,
        });
        let index = self.targets.len() - 1;
        let mut pids: Vec<Option<u32>> = self.links.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            let mut links = Vec::new();
            match self.attach_target(index, pid, &mut links) {
                Ok(()) => self.links.entry(pid).or_default().extend(links),
                Err(err) => {
                    self.detach_links(links);
                    if pid.is_none() {
                        self.remove_library(key);
                        return Err(err);
                    }
                    tracing::debug!(pid, %err, "could not probe a library for a process in scope");
                }
            }
        }
        self.libraries.push(library);
        Ok(())
    }

    /// Stops probing object `key` (no traced process maps it any more);
    /// its probes leave in the background. True if it was probed.
    pub fn remove_library(&mut self, key: FileKey) -> bool {
        let before = self.targets.len();
        self.targets.retain(|t| t.key != key);
        self.libraries.retain(|l| l.key != key);
        let mut doomed = Vec::new();
        for links in self.links.values_mut() {
            let (gone, kept): (Vec<Link>, Vec<Link>) =
                links.drain(..).partition(|link| link.0 == key);
            *links = kept;
            doomed.extend(gone);
        }
        self.detach_links(doomed);
        self.targets.len() != before
    }

    /// Takes `links` out of their programs and drops them on background
    /// threads ([`detach_all`]), without waiting.
    fn detach_links(&mut self, links: Vec<Link>) {
        let owned = self.take_links(links);
        if !owned.is_empty() {
            std::thread::spawn(move || detach_all(owned));
        }
    }

    /// The owned links of `links`, out of the [`ProbeLinks`] (dropping
    /// one detaches it); none of those taken out already.
    fn take_links(&mut self, links: Vec<Link>) -> Vec<ProbeLink> {
        let mut owned = lock_links(&self.owned_links);
        links
            .into_iter()
            .filter_map(|(_, ticket)| owned.uprobes.remove(&ticket))
            .collect()
    }

    /// The probes' links, shared: whoever stops tracerd takes them out
    /// with [`OwnedLinks::take_all`] without this `Capture`.
    pub fn probe_links(&self) -> ProbeLinks {
        self.owned_links.clone()
    }

    /// Hands the tracepoints' links to the [`ProbeLinks`] (at load).
    pub(super) fn own_tracepoints(
        &mut self,
        links: Vec<(&'static str, aya::programs::trace_point::TracePointLinkId)>,
    ) {
        let mut owned = Vec::new();
        for (name, link) in links {
            if let Ok(program) = program_mut::<TracePoint>(&mut self.ebpf, name)
                && let Ok(link) = program.take_link(link)
            {
                owned.push(link);
            }
        }
        lock_links(&self.owned_links).tracepoints = owned;
    }

    /// Takes every probe out, the allocator probes and the tracepoints:
    /// the [`Detached`] they are handed in detaches them when
    /// [`Detached::finish`]ed (or dropped). Nothing is attached afterwards.
    pub fn take_probes(&mut self) -> Detached {
        self.links.clear();
        lock_links(&self.owned_links).take_all()
    }

    /// What is attached: None for system-wide, else the pids.
    pub fn attached(&self) -> Vec<Option<u32>> {
        let mut keys: Vec<Option<u32>> = self.links.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    /// Sets the programs' runtime switches (`SWITCH_*` bits of tracer-common).
    pub fn set_switches(&mut self, bits: u64) {
        if let Err(err) = self.switches.set(0, bits, 0) {
            tracing::warn!(map = MAP_SWITCHES, %err, "cannot set the switches");
        }
    }

    /// Puts `pid` in (`true`) or out of `SCOPE_TGIDS`, the processes
    /// recorded while the scope filter is on. Putting in a pid that is in,
    /// or out one that is out, does nothing.
    pub fn set_in_scope(&mut self, pid: u32, in_scope: bool) {
        let done = if in_scope {
            self.scope_tgids.insert(pid, 1, 0)
        } else {
            self.scope_tgids.remove(&pid)
        };
        let absent = |err: &aya::maps::MapError| match err {
            aya::maps::MapError::KeyNotFound => true,
            aya::maps::MapError::SyscallError(err) => {
                err.io_error.raw_os_error() == Some(libc::ENOENT)
            }
            _ => false,
        };
        if let Err(err) = done
            && !absent(&err)
        {
            tracing::warn!(map = MAP_SCOPE_TGIDS, pid, %err, "cannot change the scope filter");
        }
    }

    /// The pids in `SCOPE_TGIDS` (a process's threads forked in scope
    /// included), sorted.
    pub fn in_scope(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.scope_tgids.keys().flatten().collect();
        pids.sort_unstable();
        pids
    }

    /// Whether `pid` is in `SCOPE_TGIDS` (one lookup).
    pub fn is_in_scope(&self, pid: u32) -> bool {
        self.scope_tgids.get(&pid, 0).is_ok()
    }
}

/// Why a link could not be made: aya's error or the kernel's.
type AttachError = Box<dyn std::error::Error + Send + Sync>;

/// One probe of a program in an object.
struct Probe {
    /// File offset of the probed instruction.
    offset: u64,
    /// The probed function.
    symbol: &'static str,
    /// The bits of its attach cookie above the family's source: a session
    /// probe's kind (`SessionKind << SESSION_KIND_SHIFT`), else 0.
    kind: u64,
}

/// The probes of one pass over `points` (uretprobes when `exit`, else
/// uprobes) by the program `programs` runs there, in order of first use:
/// (program, probes). With `session`, the calls of
/// [`SESSION_ENTRIES`](tracer_common::SESSION_ENTRIES) have
/// [`SESSION_PROGRAM`] at their entry and no uretprobe.
fn by_program(
    points: &[ProbePoint],
    programs: super::load::Programs,
    exit: bool,
    session: bool,
) -> Vec<(&'static str, Vec<Probe>)> {
    let mut groups: Vec<(&'static str, Vec<Probe>)> = Vec::new();
    for point in points {
        let spec = &point.spec;
        let kind = session.then(|| session_kind(spec.entry)).flatten();
        let (name, offset, kind) = match (exit, spec.exit, kind) {
            (true, _, Some(_)) | (true, None, _) => continue,
            (true, Some(name), None) => (programs.program_for(name, true), point.exit, 0),
            (false, _, Some(kind)) => (SESSION_PROGRAM, point.entry, kind << SESSION_KIND_SHIFT),
            (false, _, None) => (programs.program_for(spec.entry, false), point.entry, 0),
        };
        let probe = Probe {
            offset,
            symbol: spec.symbol,
            kind,
        };
        match groups.iter_mut().find(|(n, _)| *n == name) {
            Some((_, probes)) => probes.push(probe),
            None => groups.push((name, vec![probe])),
        }
    }
    groups
}

/// Attaches program `name` (loaded by aya) at `offset` of the object at
/// `path` with `cookie` as one perf event, for `pid` (None or 0: every
/// process); the link is taken out of the program at once.
fn attach_perf(
    ebpf: &mut aya::Ebpf,
    name: &'static str,
    path: &Path,
    offset: u64,
    cookie: u64,
    pid: Option<u32>,
) -> Result<ProbeLink, AttachError> {
    let scope = match pid.and_then(std::num::NonZeroU32::new) {
        Some(pid) => UProbeScope::OneProcess(pid),
        None => UProbeScope::AllProcesses,
    };
    let program = program_mut::<UProbe>(ebpf, name)?;
    let id = program.attach(
        UProbeAttachPoint {
            location: offset.into(),
            cookie: Some(cookie),
        },
        path,
        scope,
    )?;
    Ok(ProbeLink::Perf(program.take_link(id)?))
}

/// Attaches program `name` at every one of `probes` of the object at
/// `path`, each with `cookie` and its kind's bits, as uretprobes when
/// `ret`, for `pid` (None or 0: every process): one uprobe_multi link, or
/// one uprobe session link for [`SESSION_PROGRAM`].
fn attach_multi(
    multi: &MultiPrograms,
    name: &'static str,
    path: &Path,
    probes: &[Probe],
    cookie: u64,
    pid: Option<u32>,
    ret: bool,
) -> Result<ProbeLink, AttachError> {
    let program = multi
        .program(name)
        .ok_or_else(|| format!("program {name} is not loaded"))?;
    let path = CString::new(path.as_os_str().as_bytes())?;
    let offsets: Vec<u64> = probes.iter().map(|probe| probe.offset).collect();
    let cookies: Vec<u64> = probes.iter().map(|probe| cookie | probe.kind).collect();
    let kind = if name == SESSION_PROGRAM {
        LinkKind::Session
    } else {
        LinkKind::Multi
    };
    let fd = uprobe_multi::attach(&MultiAttach {
        program,
        kind,
        path: &path,
        offsets: &offsets,
        cookies: &cookies,
        ret,
        pid: pid.unwrap_or(0),
    })?;
    Ok(ProbeLink::Multi {
        fd,
        probes: offsets.len(),
    })
}

/// Probes taken out of their programs ([`Capture::take_probes`]): dropping
/// them detaches them. Each link costs the kernel grace periods of its
/// own: a uprobe_multi link one wait for all its probes, and links closed
/// on several threads wait at once; a perf event's uprobe or tracepoint
/// about 0.09 s here, under the kernel's `event_mutex`, so that they go one
/// after another whatever the threads (48 take 4.2 s). That is why a stop
/// starts with them, before its grace period.
#[derive(Default)]
pub struct Detached {
    uprobes: Vec<ProbeLink>,
    tracepoints: Vec<TracePointLink>,
}

impl Detached {
    /// The probes held: uprobes (several in a uprobe_multi link) and
    /// tracepoints.
    pub fn len(&self) -> usize {
        self.uprobes.iter().map(ProbeLink::probes).sum::<usize>() + self.tracepoints.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Detaches them all; returns when all are gone. The tracepoints,
    /// perf events that go one after another, leave on a thread of their
    /// own beside the uprobes' links.
    pub fn finish(self) {
        let Self {
            uprobes,
            tracepoints,
        } = self;
        std::thread::scope(|scope| {
            scope.spawn(move || drop(tracepoints));
            detach_all(uprobes);
        });
    }
}

/// Threads that detach links at once: closing a uprobe_multi link waits
/// about 0.07 s for the kernel's grace periods, and closes on several
/// threads wait at once (4 scoped processes with the installed allocators
/// probed, 1,364 uprobes in 572 links: 0.6 s on 64 threads, 2.4 s on 16).
/// Perf events gain nothing (see [`Detached`]).
const DETACH_THREADS: usize = 64;

/// Drops `links` on up to [`DETACH_THREADS`] threads and returns when all
/// are detached.
fn detach_all(links: Vec<ProbeLink>) {
    if links.len() <= 1 {
        drop(links);
        return;
    }
    let per_thread = links.len().div_ceil(DETACH_THREADS);
    let mut links = links;
    std::thread::scope(|scope| {
        while !links.is_empty() {
            let chunk: Vec<ProbeLink> = links.drain(..per_thread.min(links.len())).collect();
            scope.spawn(move || drop(chunk));
        }
    });
}
