//! The registry of traced process images: the live image of each pid, and
//! ended images kept for `retention` so that their last state can still be
//! queried.
use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, SystemTime},
};

use tracer_common::{AllocInfo, AllocKey, ProcStats};

use super::blocks::RawBlock;
use super::image::{EndReason, Ended, ProcessImage};
use crate::capture::ImageId;

/// All images: the live one of each pid, and ended ones for `retention`.
#[derive(Debug)]
pub struct Registry {
    live: HashMap<u32, ProcessImage>,
    ended: VecDeque<ProcessImage>,
    retention: Duration,
    /// Live images whose process was gone at the last check.
    gone: HashSet<ImageId>,
    /// When live images were last checked against `/proc`.
    last_check: Option<SystemTime>,
    /// Images whose blocks looked orphaned at the last sweep.
    orphan_suspects: HashSet<ImageId>,
}

/// How often [`Registry::expire`] checks the live images against `/proc`
/// (one read of `/proc/PID/stat` each): the orphan sweep's period.
pub const GONE_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// An end to apply: the image ended, with its final totals.
#[derive(Clone, Copy, Debug)]
pub struct EndEvent {
    /// The image that ended.
    pub image: ImageId,
    /// Exec or exit.
    pub reason: EndReason,
    /// Final totals from the kernel.
    pub stats: ProcStats,
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
            orphan_suspects: HashSet::new(),
        }
    }

    /// Adds a new image (from a `New` event). An image of the same pid with
    /// another generation that is still listed as live lost its end event;
    /// it is moved to the ended ones with no blocks. A new image whose
    /// parent could not be read takes the parent of the pid's last image
    /// when that one ended by exec (exec keeps the parent).
    pub fn add(&mut self, mut image: ProcessImage) {
        let pid = image.pid();
        if image.ppid.is_none() {
            image.ppid = self.exec_predecessor(pid).and_then(|before| before.ppid);
        }
        let generation = image.id.generation;
        if let Some(mut old) = self.live.insert(pid, image)
            && old.id.generation != generation
        {
            old.ended = Some(Ended {
                reason: EndReason::Exit,
                at: SystemTime::now(),
                stats: ProcStats::default(),
                blocks: std::sync::Arc::from([]),
            });
            self.ended.push_back(old);
        }
    }

    /// Adds `image`, which started at a fork of `parent` (the kernel's
    /// `New` event says so): its parent is that, and what it runs is its
    /// parent's until it execs. `/proc/PID` read a moment after the fork may
    /// already show the program the child exec'd since (whose own image
    /// comes next): so the child takes its parent's executable, mappings
    /// (its address space is the parent's), cgroup and owner, when the
    /// parent's image is live here; its `comm` is the kernel's at the fork.
    /// Returns whether the parent's image was live here (else the child's
    /// executable and mappings are still to be read from `/proc`).
    pub fn add_forked(&mut self, mut image: ProcessImage, parent: u32, comm: String) -> bool {
        image.ppid = Some(parent);
        if !comm.is_empty() {
            image.comm = comm;
        }
        let from = self.live.get(&parent);
        if let Some(from) = from {
            image.exe.clone_from(&from.exe);
            image.maps.clone_from(&from.maps);
            image.cgroup.clone_from(&from.cgroup);
            image.owner = from.owner;
        }
        let known = from.is_some();
        self.add(image);
        known
    }

    /// The image of `pid` that an image starting now replaced by exec: its
    /// most recent one, if it ended by exec and no live image followed it.
    fn exec_predecessor(&self, pid: u32) -> Option<&ProcessImage> {
        if self.live.contains_key(&pid) {
            return None;
        }
        self.ended
            .iter()
            .rev()
            .find(|image| image.pid() == pid)
            .filter(|image| image.ended.as_ref().map(|e| e.reason) == Some(EndReason::Exec))
    }

    /// True if `image` is the live image of its pid.
    pub fn has_live(&self, image: ImageId) -> bool {
        self.live.get(&image.pid).is_some_and(|i| i.id == image)
    }

    /// Ends an image with its final blocks. An image never seen (its `New`
    /// event was lost) is recorded from what the event says.
    pub fn end(&mut self, event: EndEvent, blocks: Vec<RawBlock>) {
        let mut image = if self.has_live(event.image) {
            self.live
                .remove(&event.image.pid)
                .unwrap_or_else(|| ProcessImage::unknown(event.image))
        } else {
            ProcessImage::unknown(event.image)
        };
        image.ended = Some(Ended {
            reason: event.reason,
            at: SystemTime::now(),
            stats: event.stats,
            blocks: blocks.into(),
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
    fn end_gone(&mut self, now: SystemTime) {
        let gone: HashSet<ImageId> = self
            .live
            .values()
            .filter(|image| image.is_gone())
            .map(|image| image.id)
            .collect();
        for &id in gone.intersection(&self.gone) {
            let Some(mut image) = self.live.remove(&id.pid) else {
                continue;
            };
            image.ended = Some(Ended {
                reason: EndReason::Exit,
                at: now,
                stats: ProcStats {
                    generation: id.generation,
                    drops: 1,
                    ..ProcStats::default()
                },
                blocks: std::sync::Arc::from([]),
            });
            self.ended.push_back(image);
        }
        self.gone = gone.into_iter().filter(|id| self.has_live(*id)).collect();
    }

    /// The image a query for `pid` means: its live image, else its most
    /// recently ended one.
    pub fn get(&self, pid: u32) -> Option<&ProcessImage> {
        self.live
            .get(&pid)
            .or_else(|| self.ended.iter().rev().find(|image| image.pid() == pid))
    }

    /// As [`Registry::get`], mutable.
    pub fn get_mut(&mut self, pid: u32) -> Option<&mut ProcessImage> {
        if self.live.contains_key(&pid) {
            return self.live.get_mut(&pid);
        }
        self.ended.iter_mut().rev().find(|image| image.pid() == pid)
    }

    /// Live images, in no order.
    pub fn live(&self) -> impl Iterator<Item = &ProcessImage> {
        self.live.values()
    }

    /// Ended images still retained, oldest first.
    pub fn ended(&self) -> impl Iterator<Item = &ProcessImage> {
        self.ended.iter()
    }

    /// The blocks among `entries` (every live block in the kernel maps) of
    /// images that ended without their end being handled here (an event
    /// lost to a full ring buffer): blocks whose image the kernel no longer
    /// tracks (`tracked`, read *after* `entries`: a block's totals entry is
    /// created before the block, so a block of a live image always matches)
    /// and that is not a live image here, seen so in two sweeps in a row (so
    /// an end event in flight is never raced).
    pub fn orphaned_blocks(
        &mut self,
        entries: &[(AllocKey, AllocInfo)],
        tracked: &HashSet<ImageId>,
    ) -> Vec<AllocKey> {
        let mut seen = HashSet::new();
        let mut doomed = Vec::new();
        for (key, info) in entries {
            let image = ImageId::of_block(key, info);
            if tracked.contains(&image) || self.has_live(image) {
                continue;
            }
            seen.insert(image);
            if self.orphan_suspects.contains(&image) {
                doomed.push(*key);
            }
        }
        self.orphan_suspects = seen;
        doomed
    }

    /// True if `image` is live or still retained after its end.
    pub fn knows(&self, image: ImageId) -> bool {
        self.has_live(image) || self.ended.iter().any(|i| i.id == image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(pid: u32, generation: u32) -> ProcessImage {
        ProcessImage::unknown(ImageId::new(pid, generation))
    }

    fn end(pid: u32, generation: u32, stats: ProcStats) -> EndEvent {
        EndEvent {
            image: ImageId::new(pid, generation),
            reason: EndReason::Exit,
            stats,
        }
    }

    #[test]
    fn ended_image_stays_queryable_until_retention() {
        let mut registry = Registry::new(Duration::from_secs(60));
        registry.add(image(7, 1));
        let stats = ProcStats {
            generation: 1,
            current: 100,
            ..ProcStats::default()
        };
        registry.end(
            end(7, 1, stats),
            vec![RawBlock {
                size: 100,
                stack: None,
                source: tracer_model::AllocatorFamily::UNKNOWN,
            }],
        );
        let got = registry.get(7).expect("retained");
        assert_eq!(got.ended.as_ref().map(|e| e.stats.current), Some(100));
        assert!(registry.knows(ImageId::new(7, 1)));
        registry.expire(SystemTime::now() + Duration::from_secs(61));
        assert!(registry.get(7).is_none());
        assert!(!registry.knows(ImageId::new(7, 1)));
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
        let me = ProcessImage::capture(ImageId::new(std::process::id(), 5));
        assert_ne!(me.start_time, 0);
        registry.add(me);
        let t0 = SystemTime::now();
        registry.expire(t0);
        assert!(
            registry.has_live(ImageId::new(gone, 3)),
            "one check is not enough"
        );
        registry.expire(t0 + Duration::from_secs(5));
        assert!(
            registry.has_live(ImageId::new(gone, 3)),
            "checked every 10 s only"
        );
        registry.expire(t0 + GONE_CHECK_INTERVAL);
        assert!(!registry.has_live(ImageId::new(gone, 3)));
        assert!(!registry.has_live(ImageId::new(gone + 1, 4)));
        assert!(registry.has_live(ImageId::new(std::process::id(), 5)));
        let ended = registry
            .get(gone)
            .and_then(|i| i.ended.as_ref())
            .expect("ended");
        assert_eq!(ended.reason, EndReason::Exit);
        assert_eq!((ended.stats.generation, ended.stats.drops), (3, 1));
        assert!(ended.blocks.is_empty());
        assert_eq!(registry.ended().count(), 2);
    }

    #[test]
    fn pid_reuse_prefers_the_live_image() {
        let mut registry = Registry::new(Duration::from_secs(60));
        registry.add(image(7, 1));
        registry.end(end(7, 1, ProcStats::default()), Vec::new());
        registry.add(image(7, 2));
        assert_eq!(registry.get(7).map(|i| i.id.generation), Some(2));
        assert!(registry.has_live(ImageId::new(7, 2)));
        assert!(!registry.has_live(ImageId::new(7, 1)));
    }

    #[test]
    fn a_fork_child_runs_its_parents_program_until_it_execs() {
        let mut registry = Registry::new(Duration::from_secs(60));
        let mut parent = image(7, 1);
        parent.exe = Some("/usr/sbin/nginx".into());
        parent.owner = Some(33);
        registry.add(parent);
        // /proc read after the child exec'd shows the new program: the
        // fork's image is the parent's program all the same.
        let mut child = image(9, 2);
        child.exe = Some("/usr/bin/dash".into());
        child.comm = "dash".into();
        assert!(registry.add_forked(child, 7, "nginx".into()));
        let child = registry.get(9).expect("child");
        assert_eq!(
            (
                child.ppid,
                child.exe.as_deref(),
                child.comm.as_str(),
                child.owner
            ),
            (Some(7), Some("/usr/sbin/nginx"), "nginx", Some(33))
        );
        // A parent tracerd has no image of: only the parent is known.
        assert!(!registry.add_forked(image(10, 3), 8, String::new()));
        assert_eq!(registry.get(10).map(|i| i.ppid), Some(Some(8)));
    }

    #[test]
    fn an_image_started_by_exec_keeps_the_parent_of_the_one_before() {
        let mut registry = Registry::new(Duration::from_secs(60));
        let mut first = image(7, 1);
        first.ppid = Some(3);
        registry.add(first);
        let exec = EndEvent {
            reason: EndReason::Exec,
            ..end(7, 1, ProcStats::default())
        };
        registry.end(exec, Vec::new());
        // Gone before /proc could be read: the parent of the image before.
        registry.add(image(7, 2));
        assert_eq!(registry.get(7).map(|i| i.ppid), Some(Some(3)));
        // Read from /proc: kept as read.
        registry.end(
            EndEvent {
                reason: EndReason::Exec,
                ..end(7, 2, ProcStats::default())
            },
            Vec::new(),
        );
        let mut third = image(7, 3);
        third.ppid = Some(1);
        registry.add(third);
        assert_eq!(registry.get(7).map(|i| i.ppid), Some(Some(1)));
        // After an exit, the pid is another process's: nothing carried.
        registry.add(image(8, 4));
        registry.end(end(8, 4, ProcStats::default()), Vec::new());
        registry.get_mut(8).expect("ended").ppid = Some(5);
        registry.add(image(8, 5));
        assert_eq!(registry.get(8).map(|i| i.ppid), Some(None));
    }

    #[test]
    fn a_new_generation_of_a_live_pid_ends_the_old_one_with_no_blocks() {
        let mut registry = Registry::new(Duration::from_secs(60));
        registry.add(image(7, 1));
        registry.add(image(7, 2));
        assert!(registry.has_live(ImageId::new(7, 2)));
        let old: Vec<_> = registry.ended().map(|i| (i.id, i.state())).collect();
        assert_eq!(
            old,
            vec![(ImageId::new(7, 1), super::super::image::ImageState::Exited)]
        );
    }
}
