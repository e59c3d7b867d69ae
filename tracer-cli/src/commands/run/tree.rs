//! The process tree a command started, built from tracerd's records of
//! process images (`GET /processes`: each with its `pid`, `generation`,
//! `ppid` and `first_seen_ms`), without asking the kernel again: the
//! command's processes may all be gone by then.
//!
//! A member is an image whose pid is the command's, or whose parent
//! (`ppid`, read by tracerd when it first saw the image) is a member's pid,
//! first seen since the command started (so an earlier process that had
//! one of these pids is never taken for one of them). A process whose
//! parent had already ended when tracerd first saw it was adopted by
//! `tracer run` (a child subreaper): its `ppid` is tracer's own pid, and it
//! counts as a child of the command's first process. One pid may have
//! several images (an exec starts a new one); they are listed together, in
//! the order they ran; one that allocated nothing before its exec (a
//! fork's child between fork and exec) is left out.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use tracer_api::{ProcessState, ProcessStatus, ProcessView};

use crate::format::{Complete, Loss, int};

/// A record of an image: tracerd's, or one tracer made. Serialized as
/// the record itself (`--json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Record {
    /// tracerd's record of the image (`GET /processes`).
    Traced(Box<ProcessStatus>),
    /// A process tracer waited for that tracerd has no record of
    /// ([`untraced`]).
    Untraced(Untraced),
}

/// What tracer knows of a process tracerd has no record of: read from
/// `/proc` while it is a zombie; no figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Untraced {
    /// Process id.
    pub pid: u32,
    /// Its parent's pid, if it could be read.
    pub ppid: Option<u32>,
    /// Its command (`/proc/PID/comm`).
    pub comm: String,
    /// Always [`ProcessState::Exited`].
    pub state: ProcessState,
    /// Unix ms after which it ran (the command's start, or the end of its
    /// pid's last image tracerd knows).
    pub first_seen_ms: i64,
    /// Always true: tells it from tracerd's records.
    pub untraced: bool,
}

impl Record {
    /// tracerd's figures of the image; None for an untraced one.
    pub fn view(&self) -> Option<&ProcessView> {
        match self {
            Record::Traced(status) => Some(&status.view),
            Record::Untraced(_) => None,
        }
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        match self {
            Record::Traced(status) => status.view.pid,
            Record::Untraced(record) => record.pid,
        }
    }

    /// The parent's pid, when known.
    pub fn ppid(&self) -> Option<u32> {
        match self {
            Record::Traced(status) => status.view.ppid,
            Record::Untraced(record) => record.ppid,
        }
    }

    /// The command.
    pub fn comm(&self) -> &str {
        match self {
            Record::Traced(status) => &status.view.comm,
            Record::Untraced(record) => &record.comm,
        }
    }

    /// Where the image is in its life (an untraced one has exited).
    pub fn state(&self) -> ProcessState {
        match self {
            Record::Traced(status) => status.view.state,
            Record::Untraced(record) => record.state,
        }
    }

    /// Unix ms tracerd learned of the image (see [`Untraced`]).
    pub fn first_seen_ms(&self) -> i64 {
        match self {
            Record::Traced(status) => int(status.view.first_seen_ms),
            Record::Untraced(record) => record.first_seen_ms,
        }
    }

    /// A figure of tracerd's record (`allocs`, `current` ...); 0 for an
    /// untraced one.
    pub fn figure(&self, of: impl Fn(&ProcessView) -> u64) -> i64 {
        self.view().map_or(0, |view| int(of(view)))
    }
}

/// An untraced record is complete: it has no figures to undercount.
impl Complete for Record {
    fn loss(&self) -> Loss {
        self.view().map_or(Loss::NONE, Complete::loss)
    }
}

/// One image of the tree, in the order the report lists them.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// tracerd's record of the image (`GET /processes`), or one tracer made
    /// for a process it waited for that tracerd has no record of
    /// ([`untraced`]).
    pub record: Record,
    /// 0 for the command's own pid, 1 for its children, and so on.
    pub depth: usize,
    /// True for the last image of its pid (what `GET /pid/{pid}/...`
    /// answers about once the process is gone).
    pub latest: bool,
    /// True when its parent had ended before tracerd first saw it (tracer
    /// adopted it): its `ppid` is tracer's.
    pub adopted: bool,
}

/// The images of the tree of `root`, the pid of the command tracer started
/// at `since_ms` (Unix ms): the images among `records` of `root` and of its
/// descendants, depth first, children in the order tracerd first saw them.
/// `tracer_pid` is tracer's own pid (adopted processes name it as parent).
pub fn build(records: &[Record], root: u32, tracer_pid: u32, since_ms: i64) -> Vec<Member> {
    // Images by pid, in the order they ran.
    let mut by_pid: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for record in records {
        let pid = record.pid();
        if pid == tracer_pid || record.first_seen_ms() < since_ms {
            continue;
        }
        by_pid.entry(pid).or_default().push(record);
    }
    for images in by_pid.values_mut() {
        images.sort_by_key(|r| (r.first_seen_ms(), r.figure(|v| u64::from(v.generation))));
        // An image that allocated nothing before its exec (a fork's child
        // between fork and exec) tells nothing the next one does not.
        let last = images.len().saturating_sub(1);
        let mut index = 0;
        images.retain(|r| {
            let keep = index == last
                || r.state() != ProcessState::Exec
                || r.figure(|v| v.allocs) != 0
                || r.figure(|v| v.current) != 0;
            index += 1;
            keep
        });
    }
    // The children of each pid: the pids one of whose images names it as
    // parent (adopted ones under the root).
    let mut children: BTreeMap<u32, Vec<(i64, u32, bool)>> = BTreeMap::new();
    for (&pid, images) in &by_pid {
        if pid == root {
            continue;
        }
        let first_seen = images.first().map_or(0, |r| r.first_seen_ms());
        let parent = images.iter().find_map(|r| r.ppid());
        let (parent, adopted) = match parent {
            Some(ppid) if ppid == tracer_pid => (root, true),
            Some(ppid) => (ppid, false),
            None => continue,
        };
        children
            .entry(parent)
            .or_default()
            .push((first_seen, pid, adopted));
    }
    for list in children.values_mut() {
        list.sort_unstable();
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    // Depth first, without recursion: (pid, depth, adopted).
    let mut stack = vec![(root, 0, false)];
    while let Some((pid, depth, adopted)) = stack.pop() {
        if !seen.insert(pid) {
            continue; // a pid reused within the tree: listed once
        }
        if let Some(images) = by_pid.get(&pid) {
            let last = images.len().saturating_sub(1);
            out.extend(images.iter().enumerate().map(|(i, record)| Member {
                record: (*record).clone(),
                depth,
                latest: i == last,
                adopted,
            }));
        }
        if let Some(list) = children.get(&pid) {
            stack.extend(
                list.iter()
                    .rev()
                    .map(|&(_, child, adopted)| (child, depth + 1, adopted)),
            );
        }
    }
    out
}

/// A record for a process tracer waited for that tracerd has no record of:
/// its pid, parent and command (read from `/proc` while it is a zombie),
/// `state` `exited` and `untraced: true`; no figures.
pub fn untraced(pid: u32, ppid: Option<u32>, comm: &str, since_ms: i64) -> Record {
    Record::Untraced(Untraced {
        pid,
        ppid,
        comm: comm.to_string(),
        state: ProcessState::Exited,
        first_seen_ms: since_ms,
        untraced: true,
    })
}

/// True for a record of [`untraced`].
pub fn is_untraced(record: &Record) -> bool {
    matches!(record, Record::Untraced(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::tests::process;

    const TRACER: u32 = 50;
    const SINCE: i64 = 1_000;

    fn image(pid: u32, generation: u32, ppid: Option<u32>, seen: u64, state: &str) -> Record {
        let state = serde_json::from_value(serde_json::json!(state)).unwrap();
        let mut status = process(pid, &format!("p{pid}"), 8, state);
        status.view.generation = generation;
        status.view.ppid = ppid;
        status.view.first_seen_ms = seen;
        status.view.allocs = 1;
        Record::Traced(Box::new(status))
    }

    fn view(record: &mut Record) -> &mut ProcessView {
        match record {
            Record::Traced(status) => &mut status.view,
            Record::Untraced(_) => unreachable!("a traced record"),
        }
    }

    fn shown(members: &[Member]) -> Vec<(u32, i64, usize, bool, bool)> {
        members
            .iter()
            .map(|m| {
                (
                    m.record.pid(),
                    m.record.figure(|v| u64::from(v.generation)),
                    m.depth,
                    m.latest,
                    m.adopted,
                )
            })
            .collect()
    }

    #[test]
    fn a_shell_and_the_two_commands_it_ran_make_one_tree() {
        // sh (100) forks 101 for a, then execs b itself (dash's last
        // command): pid 100 has two images.
        let records = [
            image(7, 1, Some(1), 10, "alive"), // unrelated, older
            image(100, 11, Some(TRACER), 1_001, "exec"),
            image(101, 12, Some(100), 1_002, "exited"),
            image(100, 13, Some(TRACER), 1_003, "exited"),
            image(TRACER, 9, Some(2), 999, "alive"), // tracer itself
        ];
        assert_eq!(
            shown(&build(&records, 100, TRACER, SINCE)),
            [
                (100, 11, 0, false, false),
                (100, 13, 0, true, false),
                (101, 12, 1, true, false),
            ]
        );
    }

    #[test]
    fn grandchildren_forks_and_adopted_orphans_are_members() {
        let records = [
            image(200, 1, Some(TRACER), 1_000, "exited"),
            image(203, 4, Some(201), 1_010, "exited"), // grandchild
            image(201, 2, Some(200), 1_005, "exited"),
            image(202, 3, Some(200), 1_006, "exited"), // a fork without exec
            image(204, 5, Some(TRACER), 1_020, "alive"), // its parent had ended
            image(205, 6, None, 1_021, "exited"),      // parent unknown: not placed
            image(201, 7, Some(200), 1_030, "alive"),  // 201 after an exec
        ];
        assert_eq!(
            shown(&build(&records, 200, TRACER, SINCE)),
            [
                (200, 1, 0, true, false),
                (201, 2, 1, false, false),
                (201, 7, 1, true, false),
                (203, 4, 2, true, false),
                (202, 3, 1, true, false),
                (204, 5, 1, true, true),
            ]
        );
    }

    #[test]
    fn images_seen_before_the_command_started_are_not_members() {
        // pid 300 was another process's before (pid reuse), and had a child.
        let records = [
            image(300, 1, Some(1), 500, "exited"),
            image(301, 2, Some(300), 600, "exited"),
            image(300, 3, Some(TRACER), 1_000, "exited"),
        ];
        assert_eq!(
            shown(&build(&records, 300, TRACER, SINCE)),
            [(300, 3, 0, true, false)]
        );
        // A command without a record of its own: what tracer adopted is
        // still its.
        assert_eq!(
            shown(&build(&records, 999, TRACER, SINCE)),
            [(300, 3, 1, true, true)]
        );
        assert!(build(&records[..2], 999, TRACER, SINCE).is_empty());
    }

    #[test]
    fn an_image_that_allocated_nothing_before_its_exec_is_left_out() {
        let mut before = image(500, 1, Some(TRACER), 1_000, "exec");
        (view(&mut before).allocs, view(&mut before).current) = (0, 0);
        let mut after = image(500, 2, Some(TRACER), 1_001, "exited");
        view(&mut after).allocs = 0;
        let mut alone = image(501, 3, Some(500), 1_002, "exec");
        (view(&mut alone).allocs, view(&mut alone).current) = (0, 0);
        let records = [before, after, alone];
        assert_eq!(
            shown(&build(&records, 500, TRACER, SINCE)),
            [(500, 2, 0, true, false), (501, 3, 1, true, false)]
        );
    }

    #[test]
    fn a_parent_loop_ends() {
        // Never from the kernel, but a pid listed twice must not loop.
        let records = [
            image(400, 1, Some(TRACER), 1_000, "exited"),
            image(401, 2, Some(402), 1_001, "exited"),
            image(402, 3, Some(401), 1_002, "exited"),
            image(403, 4, Some(400), 1_003, "exited"),
        ];
        assert_eq!(
            shown(&build(&records, 400, TRACER, SINCE)),
            [(400, 1, 0, true, false), (403, 4, 1, true, false)]
        );
    }

    #[test]
    fn an_untraced_process_is_a_record_without_figures() {
        let record = untraced(9, Some(TRACER), "gzip", SINCE);
        assert!(is_untraced(&record));
        assert_eq!(
            serde_json::to_value(&record).unwrap().to_string(),
            r#"{"comm":"gzip","first_seen_ms":1000,"pid":9,"ppid":50,"state":"exited","untraced":true}"#
        );
        assert!(!is_untraced(&image(9, 1, None, 0, "exited")));
        assert_eq!(
            shown(&build(&[record], 9, TRACER, SINCE)),
            [(9, 0, 0, true, false)]
        );
    }
}
