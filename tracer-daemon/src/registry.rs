//! The registry of traced process images: one per (pid, generation), from the
//! `New` event of its first allocation to its `Exec`/`Exit` event, and kept
//! for a while after it ended so that its last state can still be queried.
//!
//! A pid is never enough to name a process: an exec replaces the image and a
//! pid is reused after an exit. The kernel side gives every image a
//! generation (`ProcStats::gen_`) and tags every block with it; here an image
//! is also identified by its start time (`/proc/PID/stat` field 22).
use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use serde::Serialize;
use tracer_common::{ProcEventKind, ProcStats};

use crate::sys::modules::ModuleMaps;
use crate::sys::procfs as process;

/// A live block as read from `LIVE_ALLOCS`: size in bytes and its stack.
#[derive(Clone, Debug)]
pub struct RawBlock {
    /// Requested size in bytes.
    pub size: u64,
    /// Return addresses, frame 0 first; when the stack was not stored, only
    /// frame 0 (kept with every block).
    pub stack: Option<Arc<[u64]>>,
}

/// How an image ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EndReason {
    /// The process called exec: a new image replaced this one.
    Exec,
    /// The process exited.
    Exit,
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
    /// Its blocks live at the end.
    pub blocks: Vec<RawBlock>,
}

/// One traced process image.
#[derive(Clone, Debug)]
pub struct ProcessImage {
    /// The process id (thread group id).
    pub pid: u32,
    /// The kernel's generation of this image.
    pub gen_: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22);
    /// 0 if the process was gone before it could be read.
    pub start_time: u64,
    /// `/proc/PID/comm` when first seen.
    pub comm: String,
    /// `/proc/PID/exe` when first seen.
    pub exe: Option<String>,
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
    pub fn capture(pid: u32, gen_: u32) -> Self {
        let start_time = process::read_start_time(pid).unwrap_or(0);
        let comm = process::read_comm(pid).unwrap_or_default();
        let exe = process::read_exe(pid).ok();
        let maps = ModuleMaps::capture(pid).ok().map(Arc::new);
        Self {
            pid,
            gen_,
            start_time,
            comm,
            exe,
            first_seen: SystemTime::now(),
            maps,
            ended: None,
        }
    }

    /// True when `/proc/PID` shows that the process is gone: no such pid, or
    /// another process (another start time). An image whose start time was
    /// never read counts as gone only when the pid is free.
    pub fn is_gone(&self) -> bool {
        match process::read_start_time(self.pid) {
            Ok(now) => self.start_time != 0 && now != self.start_time,
            Err(_) => true,
        }
    }

    /// True while the image has not ended and `/proc/PID` still shows the
    /// same process (same start time).
    pub fn is_alive(&self) -> bool {
        self.ended.is_none()
            && (self.start_time == 0
                || process::read_start_time(self.pid).ok() == Some(self.start_time))
    }

    /// Re-reads the mappings of a live image (libraries loaded by dlopen
    /// since it was first seen); keeps the old ones if that fails.
    pub fn refresh_maps(&mut self) {
        if self.is_alive()
            && let Ok(maps) = ModuleMaps::capture(self.pid)
        {
            self.maps = Some(Arc::new(maps));
        }
    }
}

/// All images: the live one of each pid, and ended ones for `retention`.
#[derive(Debug)]
pub struct Registry {
    live: HashMap<u32, ProcessImage>,
    ended: VecDeque<ProcessImage>,
    retention: Duration,
    /// Live images whose process was gone at the last check.
    gone: HashSet<(u32, u32)>,
    /// When live images were last checked against `/proc`.
    last_check: Option<SystemTime>,
}

/// How often [`Registry::expire`] checks the live images against `/proc`
/// (one read of `/proc/PID/stat` each): the orphan sweep's period.
pub const GONE_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// An end to apply: the image (pid, gen) ended, with its final totals.
#[derive(Clone, Copy, Debug)]
pub struct EndEvent {
    /// Process id.
    pub pid: u32,
    /// The generation that ended.
    pub gen_: u32,
    /// Exec or exit.
    pub reason: EndReason,
    /// Final totals from the kernel.
    pub stats: ProcStats,
}

impl EndEvent {
    /// From a kernel event kind; None for `New`.
    pub fn new(kind: ProcEventKind, pid: u32, gen_: u32, stats: ProcStats) -> Option<Self> {
        let reason = match kind {
            ProcEventKind::New | ProcEventKind::ExecAny | ProcEventKind::Fork => return None,
            ProcEventKind::Exec => EndReason::Exec,
            ProcEventKind::Exit => EndReason::Exit,
        };
        Some(Self {
            pid,
            gen_,
            reason,
            stats,
        })
    }
}

impl Registry {
    /// An empty registry keeping ended images for `retention`.
    pub fn new(retention: Duration) -> Self {
        Self {
            live: HashMap::new(),
            ended: VecDeque::new(),
            retention,
            gone: HashSet::new(),
            last_check: None,
        }
    }

    /// Adds a new image (from a `New` event). An image of the same pid with
    /// another generation that is still listed as live lost its end event;
    /// it is moved to the ended ones with no blocks.
    pub fn add(&mut self, image: ProcessImage) {
        if let Some(old) = self.live.insert(image.pid, image)
            && let Some(new) = self.live.get(&old.pid)
            && new.gen_ != old.gen_
        {
            let mut old = old;
            old.ended = Some(Ended {
                reason: EndReason::Exit,
                at: SystemTime::now(),
                stats: ProcStats::default(),
                blocks: Vec::new(),
            });
            self.ended.push_back(old);
        }
    }

    /// True if (pid, gen) is the live image of pid.
    pub fn has_live(&self, pid: u32, gen_: u32) -> bool {
        self.live.get(&pid).is_some_and(|i| i.gen_ == gen_)
    }

    /// Ends image (pid, gen) with its final blocks. An image never seen
    /// (its `New` event was lost) is recorded from what the event says.
    pub fn end(&mut self, event: EndEvent, blocks: Vec<RawBlock>) {
        let mut image = match self.live.get(&event.pid) {
            Some(image) if image.gen_ == event.gen_ => self
                .live
                .remove(&event.pid)
                .unwrap_or_else(|| unknown_image(event)),
            _ => unknown_image(event),
        };
        image.ended = Some(Ended {
            reason: event.reason,
            at: SystemTime::now(),
            stats: event.stats,
            blocks,
        });
        self.ended.push_back(image);
    }

    /// Drops ended images older than the retention, and ends the live
    /// images whose process is gone (see [`Registry::end_gone`]) every
    /// [`GONE_CHECK_INTERVAL`].
    pub fn expire(&mut self, now: SystemTime) {
        let due = self.last_check.is_none_or(|at| {
            now.duration_since(at)
                .map_or(true, |d| d >= GONE_CHECK_INTERVAL)
        });
        if due {
            self.last_check = Some(now);
            self.end_gone(now);
        }
        while let Some(front) = self.ended.front() {
            let at = front.ended.as_ref().map_or(now, |e| e.at);
            if now.duration_since(at).unwrap_or_default() > self.retention {
                self.ended.pop_front();
            } else {
                break;
            }
        }
    }

    /// Ends, as exited with no blocks, every live image whose process was
    /// gone ([`ProcessImage::is_gone`]) at this check and the one before:
    /// its end event was lost (the ring buffer was full). Two checks in a
    /// row, so that an end event in flight is never raced. Its totals are
    /// unknown: `drops` is 1, so it reads as incomplete. Until then its
    /// blocks count as those of a live image, and the orphan sweep keeps
    /// them; after, it removes them.
    pub fn end_gone(&mut self, now: SystemTime) {
        let gone: HashSet<(u32, u32)> = self
            .live
            .values()
            .filter(|image| image.is_gone())
            .map(|image| (image.pid, image.gen_))
            .collect();
        for &(pid, gen_) in gone.intersection(&self.gone) {
            let Some(mut image) = self.live.remove(&pid) else {
                continue;
            };
            image.ended = Some(Ended {
                reason: EndReason::Exit,
                at: now,
                stats: ProcStats {
                    gen_,
                    drops: 1,
                    ..ProcStats::default()
                },
                blocks: Vec::new(),
            });
            self.ended.push_back(image);
        }
        self.gone = gone
            .into_iter()
            .filter(|(pid, gen_)| self.has_live(*pid, *gen_))
            .collect();
    }

    /// The image a query for `pid` means: its live image, else its most
    /// recently ended one.
    pub fn get(&self, pid: u32) -> Option<&ProcessImage> {
        self.live
            .get(&pid)
            .or_else(|| self.ended.iter().rev().find(|image| image.pid == pid))
    }

    /// As [`Registry::get`], mutable.
    pub fn get_mut(&mut self, pid: u32) -> Option<&mut ProcessImage> {
        if self.live.contains_key(&pid) {
            return self.live.get_mut(&pid);
        }
        self.ended.iter_mut().rev().find(|image| image.pid == pid)
    }

    /// Live images, by pid.
    pub fn live(&self) -> impl Iterator<Item = &ProcessImage> {
        self.live.values()
    }

    /// Ended images still retained, oldest first.
    pub fn ended(&self) -> impl Iterator<Item = &ProcessImage> {
        self.ended.iter()
    }
}

fn unknown_image(event: EndEvent) -> ProcessImage {
    ProcessImage {
        pid: event.pid,
        gen_: event.gen_,
        start_time: 0,
        comm: String::new(),
        exe: None,
        first_seen: SystemTime::now(),
        maps: None,
        ended: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(pid: u32, gen_: u32) -> ProcessImage {
        ProcessImage {
            gen_,
            ..unknown_image(EndEvent {
                pid,
                gen_,
                reason: EndReason::Exit,
                stats: ProcStats::default(),
            })
        }
    }

    #[test]
    fn ended_image_stays_queryable_until_retention() {
        let mut registry = Registry::new(Duration::from_secs(60));
        registry.add(image(7, 1));
        let stats = ProcStats {
            gen_: 1,
            current: 100,
            ..ProcStats::default()
        };
        let event = EndEvent::new(ProcEventKind::Exit, 7, 1, stats).expect("an end");
        registry.end(
            event,
            vec![RawBlock {
                size: 100,
                stack: None,
            }],
        );
        let got = registry.get(7).expect("retained");
        assert_eq!(got.ended.as_ref().map(|e| e.stats.current), Some(100));
        registry.expire(SystemTime::now() + Duration::from_secs(61));
        assert!(registry.get(7).is_none());
    }

    #[test]
    fn a_gone_process_whose_end_was_lost_ends_at_the_second_check() {
        let mut registry = Registry::new(Duration::from_secs(600));
        // Above the kernel's largest pid_max: never a process.
        let gone = 5_000_000;
        let mut dead = image(gone, 3);
        dead.start_time = 12345;
        registry.add(dead);
        registry.add(image(gone + 1, 4));
        let me = ProcessImage::capture(std::process::id(), 5);
        assert_ne!(me.start_time, 0);
        registry.add(me);
        let t0 = SystemTime::now();
        registry.expire(t0);
        assert!(registry.has_live(gone, 3), "one check is not enough");
        registry.expire(t0 + Duration::from_secs(5));
        assert!(registry.has_live(gone, 3), "checked every 10 s only");
        registry.expire(t0 + GONE_CHECK_INTERVAL);
        assert!(!registry.has_live(gone, 3));
        assert!(!registry.has_live(gone + 1, 4));
        assert!(registry.has_live(std::process::id(), 5));
        let ended = registry
            .get(gone)
            .and_then(|i| i.ended.as_ref())
            .expect("ended");
        assert_eq!(ended.reason, EndReason::Exit);
        assert_eq!((ended.stats.gen_, ended.stats.drops), (3, 1));
        assert!(ended.blocks.is_empty());
        assert_eq!(registry.ended().count(), 2);
    }

    #[test]
    fn pid_reuse_prefers_the_live_image() {
        let mut registry = Registry::new(Duration::from_secs(60));
        registry.add(image(7, 1));
        let event = EndEvent::new(ProcEventKind::Exit, 7, 1, ProcStats::default()).expect("end");
        registry.end(event, Vec::new());
        registry.add(image(7, 2));
        assert_eq!(registry.get(7).map(|i| i.gen_), Some(2));
        assert!(registry.has_live(7, 2));
        assert!(!registry.has_live(7, 1));
    }
}
