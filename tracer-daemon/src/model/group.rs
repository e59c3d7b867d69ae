//! Grouping of traces: the core of `statistics()` and `compare_to()`
//! (tracemalloc's `Snapshot._group_by` and `_compare_grouped_stats`).
//!
//! Two stages, so that the per-trace work is a pointer comparison or one
//! table lookup keyed by an address, with no allocation:
//! 1. [`distinct_tracebacks`]: sum size and count per distinct
//!    `Arc<Traceback>` (consecutive traces sharing one are summed before
//!    any lookup);
//! 2. [`group_tracebacks`] / [`group_frames`]: group those sums by content,
//!    once per distinct traceback (or once per frame of it under
//!    `cumulative`), frames looked up by the address of their file name
//!    first and compared by text only the first time an address is seen.
//!
//! Groups come out in order of first appearance in the snapshot, so the
//! representative chosen for a group (whose `FrameExtra` is reported) does
//! not depend on hash-table order.

use std::collections::hash_map::Entry;
use std::hash::Hash;
use std::sync::Arc;

use super::hash::FxHashMap;
use super::snapshot::{GroupBy, Statistic, StatisticDiff};
use super::table::{AHEAD, Table, prefetch};
use super::traceback::{Frame, FrameExtra, Trace, Traceback, UNKNOWN_FILENAME};

/// Bytes and blocks of one group. Sums saturate instead of wrapping (no
/// real process holds 2^64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Totals {
    /// Sum of block sizes, in bytes.
    pub size: u64,
    /// Number of blocks (frame occurrences under `cumulative`).
    pub count: u64,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.size = self.size.saturating_add(other.size);
        self.count = self.count.saturating_add(other.count);
    }
}

/// Stage 1 result: the traces sharing one `Arc<Traceback>`.
#[derive(Clone, Copy)]
pub(super) struct Distinct<'a> {
    traceback: &'a Arc<Traceback>,
    totals: Totals,
}

/// Inputs smaller than this are grouped on the calling thread only.
const PARALLEL_MIN: usize = 50_000;
/// Most threads one grouping uses.
const MAX_THREADS: usize = 8;

/// How many threads to spread `work` items over.
pub(super) fn threads_for(work: usize) -> usize {
    if work < PARALLEL_MIN {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
}

/// Runs `job(part)` for every part in `0..parts`, part 0 on the calling
/// thread and the others on scoped threads; results in part order. A part
/// whose thread failed is run again on the calling thread.
pub(super) fn in_parallel<T: Send>(parts: usize, job: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if parts <= 1 {
        return vec![job(0)];
    }
    std::thread::scope(|scope| {
        let job = &job;
        let handles: Vec<_> = (1..parts)
            .map(|part| scope.spawn(move || job(part)))
            .collect();
        let mut results = Vec::with_capacity(parts);
        results.push(job(0));
        for (offset, handle) in handles.into_iter().enumerate() {
            results.push(handle.join().unwrap_or_else(|_| job(offset + 1)));
        }
        results
    })
}

/// Sorts `items` by `cmp`, the two halves on two threads when there are
/// many, then merges them.
pub(super) fn sort_parallel<T: Send>(
    mut items: Vec<T>,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering + Sync,
) -> Vec<T> {
    if threads_for(items.len()) < 2 {
        items.sort_unstable_by(&cmp);
        return items;
    }
    let mid = items.len() / 2;
    let failed = std::thread::scope(|scope| {
        let cmp = &cmp;
        let (left, right) = items.split_at_mut(mid);
        let handle = scope.spawn(move || right.sort_unstable_by(cmp));
        left.sort_unstable_by(cmp);
        handle.join().is_err()
    });
    if failed && let Some(right) = items.get_mut(mid..) {
        right.sort_unstable_by(&cmp);
    }
    let right = items.split_off(mid);
    let left = items;
    let mut merged = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some(a), Some(b)) => cmp(a, b) != std::cmp::Ordering::Greater,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_left { left.next() } else { right.next() };
        merged.extend(next);
    }
    merged
}

/// The distinct `Arc<Traceback>`s of a snapshot's traces, in order of
/// first appearance, and each trace's index into them: tracebacks interned
/// as `_tracemalloc` interns them. Loaders and the capture know the
/// sharing already and hand it over ([`Interned::checked`]); otherwise it is
/// computed once per snapshot ([`Interned::of`]).
#[derive(Debug)]
pub(crate) struct Interned {
    /// Distinct by address, first appearance first.
    tracebacks: Vec<Arc<Traceback>>,
    /// One per trace: its traceback's index in `tracebacks`.
    ids: Vec<u32>,
}

impl Interned {
    /// Interns `traces` by the address of their tracebacks: one table access
    /// per trace (none within a run of traces sharing one `Arc`), prefetched
    /// [`AHEAD`] traces in advance.
    pub(crate) fn of(traces: &[Trace]) -> Self {
        let mut table: Table<usize, u32> = Table::with_capacity((traces.len() / 4).min(1 << 20));
        let mut tracebacks: Vec<Arc<Traceback>> = Vec::new();
        let mut ids = Vec::with_capacity(traces.len());
        let address = |trace: &Trace| Arc::as_ptr(&trace.traceback) as usize;
        let mut last: Option<(usize, u32)> = None;
        for (position, trace) in traces.iter().enumerate() {
            if let Some(ahead) = traces.get(position + AHEAD) {
                table.prefetch(&address(ahead));
            }
            let key = address(trace);
            let id = match last {
                Some((previous, id)) if previous == key => id,
                _ => {
                    let next = u32::try_from(tracebacks.len()).unwrap_or(u32::MAX);
                    let (id, new) = table.get_or_insert(key, || next);
                    if new {
                        tracebacks.push(Arc::clone(&trace.traceback));
                    }
                    *id
                }
            };
            last = Some((key, id));
            ids.push(id);
        }
        Interned { tracebacks, ids }
    }

    /// The interning a loader computed, if it is one: an index per trace,
    /// each naming the very `Arc` of that trace, indices numbered in order
    /// of first appearance, every traceback used.
    pub(crate) fn checked(
        traces: &[Trace],
        tracebacks: Vec<Arc<Traceback>>,
        ids: Vec<u32>,
    ) -> Option<Self> {
        if ids.len() != traces.len() {
            return None;
        }
        let mut next = 0usize;
        for (trace, &id) in traces.iter().zip(&ids) {
            let id = id as usize;
            if !Arc::ptr_eq(tracebacks.get(id)?, &trace.traceback) || id > next {
                return None;
            }
            if id == next {
                next += 1;
            }
        }
        (next == tracebacks.len()).then_some(Interned { tracebacks, ids })
    }

    /// The interning of the traces `keep` accepts, numbered anew.
    pub(crate) fn subset(&self, keep: &[bool]) -> Self {
        let mut renumber: Vec<u32> = vec![u32::MAX; self.tracebacks.len()];
        let mut tracebacks = Vec::new();
        let mut ids = Vec::new();
        for (&id, &kept) in self.ids.iter().zip(keep) {
            if !kept {
                continue;
            }
            let Some(slot) = renumber.get_mut(id as usize) else {
                continue;
            };
            if *slot == u32::MAX {
                *slot = u32::try_from(tracebacks.len()).unwrap_or(u32::MAX);
                if let Some(traceback) = self.tracebacks.get(id as usize) {
                    tracebacks.push(Arc::clone(traceback));
                }
            }
            ids.push(*slot);
        }
        Interned { tracebacks, ids }
    }

    /// Each trace's traceback index.
    pub(crate) fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// How many distinct tracebacks.
    pub(crate) fn len(&self) -> usize {
        self.tracebacks.len()
    }
}

/// Stage 1: the size and count of the traces of each interned traceback,
/// in order of first appearance: a dense sum, no table. Equal tracebacks
/// in different `Arc`s stay apart here and are merged by stage 2. Large
/// snapshots are summed in two halves on two threads.
pub(super) fn distinct_tracebacks<'a>(
    interned: &'a Interned,
    traces: &[Trace],
) -> Vec<Distinct<'a>> {
    let n = interned.tracebacks.len();
    let sum = |traces: &[Trace], ids: &[u32]| {
        let mut totals = vec![Totals::default(); n];
        for (trace, &id) in traces.iter().zip(ids) {
            if let Some(slot) = totals.get_mut(id as usize) {
                slot.add(Totals {
                    size: trace.size,
                    count: 1,
                });
            }
        }
        totals
    };
    let parts = threads_for(traces.len()).min(2);
    let mid = traces.len() / 2;
    let halves = in_parallel(parts, |part| {
        let range = match (parts, part) {
            (1, _) => 0..traces.len(),
            (_, 0) => 0..mid,
            _ => mid..traces.len(),
        };
        sum(
            traces.get(range.clone()).unwrap_or(&[]),
            interned.ids.get(range).unwrap_or(&[]),
        )
    });
    let mut halves = halves.into_iter();
    let mut totals = halves.next().unwrap_or_default();
    for other in halves {
        for (a, b) in totals.iter_mut().zip(other) {
            a.add(b);
        }
    }
    interned
        .tracebacks
        .iter()
        .zip(totals)
        .map(|(traceback, totals)| Distinct { traceback, totals })
        .collect()
}

/// A representative whose statistic reads memory worth fetching ahead.
pub(super) trait Touch {
    /// Prefetches what building this group's statistic reads.
    fn touch(&self) {}
}

impl Touch for &Arc<Traceback> {
    fn touch(&self) {
        prefetch(self.frames().as_ptr().cast());
    }
}

impl Touch for FrameRep<'_> {
    fn touch(&self) {
        prefetch(self.traceback.frames().as_ptr().cast());
    }
}

impl Touch for LabelRep<'_> {}

/// One group: the first key value seen for it (the representative) and
/// its totals.
pub(super) struct Group<R> {
    rep: R,
    totals: Totals,
}

/// The groups of one snapshot in order of first appearance, with an index
/// from key to position.
pub(super) struct Groups<K, R> {
    index: FxHashMap<K, usize>,
    entries: Vec<Group<R>>,
}

impl<K: Hash + Eq, R> Groups<K, R> {
    fn new() -> Self {
        Groups {
            index: FxHashMap::default(),
            entries: Vec::new(),
        }
    }

    /// Position of the group of `key`, created with `rep` if new.
    fn slot(&mut self, key: K, rep: impl FnOnce() -> R) -> usize {
        match self.index.entry(key) {
            Entry::Occupied(entry) => *entry.get(),
            Entry::Vacant(entry) => {
                self.entries.push(Group {
                    rep: rep(),
                    totals: Totals::default(),
                });
                *entry.insert(self.entries.len() - 1)
            }
        }
    }

    fn add(&mut self, slot: usize, totals: Totals) {
        if let Some(group) = self.entries.get_mut(slot) {
            group.totals.add(totals);
        }
    }

    /// Adds the groups of `later`, computed over traces that come after
    /// this one's (so this one's representatives are the first seen).
    fn absorb(&mut self, later: Groups<K, R>, key_of: impl Fn(&R) -> K)
    where
        R: Copy,
    {
        for group in later.entries {
            let slot = self.slot(key_of(&group.rep), || group.rep);
            self.add(slot, group.totals);
        }
    }

    /// `Snapshot.statistics()` before sorting.
    pub(super) fn statistics(self, traceback_of: impl Fn(&R) -> Traceback) -> Vec<Statistic>
    where
        R: Touch,
    {
        self.labelled_statistics(traceback_of, |_| None)
    }

    /// `Snapshot.statistics()` before sorting, with a label per group.
    fn labelled_statistics(
        self,
        traceback_of: impl Fn(&R) -> Traceback,
        label_of: impl Fn(&R) -> Option<Arc<str>>,
    ) -> Vec<Statistic>
    where
        R: Touch,
    {
        let entries = &self.entries;
        entries
            .iter()
            .enumerate()
            .map(|(i, group)| {
                if let Some(ahead) = entries.get(i + AHEAD) {
                    ahead.rep.touch();
                }
                Statistic {
                    traceback: traceback_of(&group.rep),
                    size: group.totals.size,
                    count: group.totals.count,
                    label: label_of(&group.rep),
                }
            })
            .collect()
    }

    /// tracemalloc's `_compare_grouped_stats` (before sorting): every group
    /// of `self` (new) against the group of the same key in `old` (absent:
    /// the diff is the whole group), then the groups only in `old`, with
    /// size and count 0 and negative diffs.
    pub(super) fn compare_to(
        &self,
        old: &Groups<K, R>,
        key_of: impl Fn(&R) -> K,
        traceback_of: impl Fn(&R) -> Traceback,
    ) -> Vec<StatisticDiff>
    where
        R: Touch,
    {
        self.labelled_compare_to(old, key_of, traceback_of, |_| None)
    }

    /// [`Groups::compare_to`] with a label per group.
    fn labelled_compare_to(
        &self,
        old: &Groups<K, R>,
        key_of: impl Fn(&R) -> K,
        traceback_of: impl Fn(&R) -> Traceback,
        label_of: impl Fn(&R) -> Option<Arc<str>>,
    ) -> Vec<StatisticDiff>
    where
        R: Touch,
    {
        let mut matched = vec![false; old.entries.len()];
        let mut diffs = Vec::with_capacity(self.entries.len() + old.entries.len());
        for (i, group) in self.entries.iter().enumerate() {
            if let Some(ahead) = self.entries.get(i + AHEAD) {
                ahead.rep.touch();
            }
            let now = group.totals;
            let mut before = Totals::default();
            if let Some(&slot) = old.index.get(&key_of(&group.rep))
                && let (Some(previous), Some(seen)) = (old.entries.get(slot), matched.get_mut(slot))
            {
                before = previous.totals;
                *seen = true;
            }
            diffs.push(diff(
                traceback_of(&group.rep),
                label_of(&group.rep),
                now,
                before,
            ));
        }
        for (group, seen) in old.entries.iter().zip(&matched) {
            if !seen {
                diffs.push(diff(
                    traceback_of(&group.rep),
                    label_of(&group.rep),
                    Totals::default(),
                    group.totals,
                ));
            }
        }
        diffs
    }
}

fn diff(
    traceback: Traceback,
    label: Option<Arc<str>>,
    now: Totals,
    before: Totals,
) -> StatisticDiff {
    StatisticDiff {
        traceback,
        size: now.size,
        size_diff: difference(now.size, before.size),
        count: now.count,
        count_diff: difference(now.count, before.count),
        label,
    }
}

/// `now - before`, saturating at the `i64` range.
fn difference(now: u64, before: u64) -> i64 {
    let diff = i128::from(now) - i128::from(before);
    i64::try_from(diff).unwrap_or(if diff < 0 { i64::MIN } else { i64::MAX })
}

/// Groups by whole traceback (compared by content).
pub(super) type TracebackGroups<'a> = Groups<&'a Arc<Traceback>, &'a Arc<Traceback>>;

/// Stage 2 for `traceback`: distinct tracebacks merged by content.
pub(super) fn group_tracebacks<'a>(distinct: &[Distinct<'a>]) -> TracebackGroups<'a> {
    in_chunks(distinct, distinct.len(), group_tracebacks_part, |rep| *rep)
}

/// Runs `part` over contiguous chunks of `distinct` on several threads
/// (as many as `work` items call for) and merges the chunks' groups in
/// order, so that the result equals one pass over all of `distinct`.
fn in_chunks<'a, K: Hash + Eq + Send, R: Copy + Send>(
    distinct: &[Distinct<'a>],
    work: usize,
    part: impl Fn(&[Distinct<'a>]) -> Groups<K, R> + Sync,
    key_of: impl Fn(&R) -> K,
) -> Groups<K, R> {
    let parts = threads_for(work).min(distinct.len().max(1));
    let chunk = distinct.len().div_ceil(parts).max(1);
    let results = in_parallel(parts, |i| {
        let start = (i * chunk).min(distinct.len());
        let end = ((i + 1) * chunk).min(distinct.len());
        part(distinct.get(start..end).unwrap_or(&[]))
    });
    let mut results = results.into_iter();
    let Some(mut merged) = results.next() else {
        return Groups::new();
    };
    for later in results {
        merged.absorb(later, &key_of);
    }
    merged
}

fn group_tracebacks_part<'a>(distinct: &[Distinct<'a>]) -> TracebackGroups<'a> {
    let mut groups = Groups::new();
    groups.index.reserve(distinct.len());
    for (i, d) in distinct.iter().enumerate() {
        // The table hashes the traceback (its hash is stored in it): fetch
        // the traceback ahead.
        if let Some(ahead) = distinct.get(i + AHEAD) {
            prefetch(Arc::as_ptr(ahead.traceback).cast());
        }
        let slot = groups.slot(d.traceback, || d.traceback);
        groups.add(slot, d.totals);
    }
    groups
}

/// The statistic's traceback for a `traceback` group: the same frames
/// without `total_nframe`, as tracemalloc's `Traceback(frames)`.
pub(super) fn traceback_group_traceback(traceback: &&Arc<Traceback>) -> Traceback {
    traceback.without_total_nframe()
}

/// Representative of a `lineno` or `filename` group: the first frame seen
/// and the group's line number (0 for `filename`).
#[derive(Clone, Copy)]
pub(super) struct FrameRep<'a> {
    /// The traceback it was seen in, and its index there.
    traceback: &'a Traceback,
    index: usize,
    frame: &'a Frame,
    lineno: u32,
}

/// Key of a frame group: `(filename, lineno)`, lineno 0 for `filename`.
pub(super) type FrameKey<'a> = (&'a str, u32);

/// Groups by frame or file name.
pub(super) type FrameGroups<'a> = Groups<FrameKey<'a>, FrameRep<'a>>;

/// Work items of a pass over the frames of `distinct`: one frame each, or
/// about 8 (a deep traceback's) under `cumulative`; it sets the threads.
fn frame_work(distinct: &[Distinct<'_>], cumulative: bool) -> usize {
    if cumulative {
        distinct.len().saturating_mul(8)
    } else {
        distinct.len()
    }
}

/// Stage 2 for `lineno` and `filename`: the most recent frame of each
/// distinct traceback, or every frame of it (each occurrence) under
/// `cumulative`.
pub(super) fn group_frames<'a>(
    distinct: &[Distinct<'a>],
    group_by: GroupBy,
    cumulative: bool,
) -> FrameGroups<'a> {
    let work = frame_work(distinct, cumulative);
    in_chunks(
        distinct,
        work,
        |chunk| group_frames_part(chunk, group_by, cumulative),
        frame_key,
    )
}

fn group_frames_part<'a>(
    distinct: &[Distinct<'a>],
    group_by: GroupBy,
    cumulative: bool,
) -> FrameGroups<'a> {
    let keep_lineno = group_by == GroupBy::Lineno;
    let mut groups = Groups::new();
    // File names are usually shared `Arc<str>`s: find a group by the
    // name's address and line, and compare text only for a new address.
    let mut by_address: Table<(usize, u32), u32> = Table::with_capacity(
        if cumulative {
            distinct.len()
        } else {
            distinct.len() / 2
        }
        .min(1 << 18),
    );
    groups.index.reserve(distinct.len().min(1 << 16));
    for (i, d) in distinct.iter().enumerate() {
        // Two dependent misses per traceback (the traceback, then its
        // frames): fetch the traceback 2 * AHEAD ahead and its frames AHEAD
        // ahead.
        if let Some(far) = distinct.get(i + 2 * AHEAD) {
            prefetch(Arc::as_ptr(far.traceback).cast());
        }
        if let Some(ahead) = distinct.get(i + AHEAD) {
            prefetch(ahead.traceback.frames().as_ptr().cast());
        }
        let traceback: &'a Traceback = d.traceback;
        let frames = traceback.frames();
        let selected = if cumulative {
            frames
        } else {
            frames.get(..1).unwrap_or(&[])
        };
        for (index, frame) in selected.iter().enumerate() {
            let lineno = if keep_lineno { frame.lineno } else { 0 };
            let address = (frame.filename.as_ptr() as usize, lineno);
            let (slot, new) = by_address.get_or_insert(address, || 0);
            if new {
                let key = (&*frame.filename, lineno);
                let group = groups.slot(key, || FrameRep {
                    traceback,
                    index,
                    frame,
                    lineno,
                });
                *slot = u32::try_from(group).unwrap_or(u32::MAX);
            }
            groups.add(*slot as usize, d.totals);
        }
    }
    groups
}

/// Key of a frame group, from its representative.
pub(super) fn frame_key<'a>(rep: &FrameRep<'a>) -> FrameKey<'a> {
    (&*rep.frame.filename, rep.lineno)
}

/// The statistic's one-frame traceback for a `lineno` or `filename` group.
/// A `filename` group's frame has lineno 0 and no `extra` (a function and
/// address would describe one arbitrary line of the file).
pub(super) fn frame_group_traceback(rep: &FrameRep<'_>, group_by: GroupBy) -> Traceback {
    if group_by == GroupBy::Lineno
        && let Some(view) = rep.traceback.frame_view(rep.index)
    {
        // The frame itself, extra included, shared with the trace's
        // traceback.
        return view;
    }
    Traceback::from_frame(Frame {
        filename: Arc::clone(&rep.frame.filename),
        lineno: rep.lineno,
        extra: None,
    })
}

/// Representative of a `function` or `module` group: its label and the
/// first frame seen with it.
#[derive(Clone, Copy)]
pub(super) struct LabelRep<'a> {
    label: &'a Arc<str>,
    frame: &'a Frame,
    function: bool,
}

/// Groups by function or module name.
pub(super) type LabelGroups<'a> = Groups<&'a str, LabelRep<'a>>;

/// Stage 2 for `function` and `module`: the label of the most recent frame
/// of each distinct traceback, or of every frame (each occurrence) under
/// `cumulative`. Frames with no such name count under `<unknown>`.
pub(super) fn group_labels<'a>(
    distinct: &[Distinct<'a>],
    group_by: GroupBy,
    cumulative: bool,
) -> LabelGroups<'a> {
    let work = frame_work(distinct, cumulative);
    in_chunks(
        distinct,
        work,
        |chunk| group_labels_part(chunk, group_by, cumulative),
        |rep| &**rep.label,
    )
}

fn group_labels_part<'a>(
    distinct: &[Distinct<'a>],
    group_by: GroupBy,
    cumulative: bool,
) -> LabelGroups<'a> {
    static UNKNOWN: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    let unknown: &'static Arc<str> = UNKNOWN.get_or_init(|| Arc::from(UNKNOWN_FILENAME));
    let function = group_by == GroupBy::Function;
    let mut groups = Groups::new();
    // Names are shared `Arc<str>`s: look up by address first.
    let mut by_address: FxHashMap<(*const u8, usize), usize> = FxHashMap::default();
    for d in distinct {
        let traceback: &'a Traceback = d.traceback;
        let frames = traceback.frames();
        let selected = if cumulative {
            frames
        } else {
            frames.get(..1).unwrap_or(&[])
        };
        for frame in selected {
            let extra = frame.extra.as_deref();
            let name = if function {
                extra.and_then(|e| e.function.as_ref())
            } else {
                extra.and_then(|e| e.module.as_ref())
            };
            let label: &'a Arc<str> = name.unwrap_or(unknown);
            let slot = match by_address.entry((label.as_ptr(), label.len())) {
                Entry::Occupied(entry) => *entry.get(),
                Entry::Vacant(entry) => *entry.insert(groups.slot(&**label, || LabelRep {
                    label,
                    frame,
                    function,
                })),
            };
            groups.add(slot, d.totals);
        }
    }
    groups
}

/// The statistic's one-frame traceback for a label group: the first frame
/// seen, at line 0, with the function and module, for `function`; the
/// module path at line 0 for `module`.
fn label_group_traceback(rep: &LabelRep<'_>) -> Traceback {
    let module = rep.frame.extra.as_deref().and_then(|e| e.module.clone());
    let frame = if rep.function {
        Frame {
            filename: Arc::clone(&rep.frame.filename),
            lineno: 0,
            extra: Some(Arc::new(FrameExtra {
                function: Some(Arc::clone(rep.label)),
                module,
                address: None,
            })),
        }
    } else {
        Frame {
            filename: Arc::clone(rep.label),
            lineno: 0,
            extra: module.map(|module| {
                Arc::new(FrameExtra {
                    function: None,
                    module: Some(module),
                    address: None,
                })
            }),
        }
    };
    Traceback::from_frame(frame)
}

fn label_of(rep: &LabelRep<'_>) -> Option<Arc<str>> {
    Some(Arc::clone(rep.label))
}

impl<'a> LabelGroups<'a> {
    /// `statistics()` of label groups, before sorting.
    pub(super) fn label_statistics(self) -> Vec<Statistic> {
        self.labelled_statistics(label_group_traceback, label_of)
    }

    /// `compare_to()` of label groups, before sorting.
    pub(super) fn label_compare_to(&self, old: &LabelGroups<'a>) -> Vec<StatisticDiff> {
        self.labelled_compare_to(old, |rep| &**rep.label, label_group_traceback, label_of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(size: u64, traceback: &Arc<Traceback>) -> Trace {
        Trace {
            domain: 1,
            size,
            traceback: Arc::clone(traceback),
        }
    }

    #[test]
    fn interning_from_a_loader_is_checked_and_subsets_renumber() {
        let a = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], None));
        let b = Arc::new(Traceback::new(vec![Frame::new("b.c", 2)], None));
        let traces = [trace(1, &a), trace(2, &b), trace(4, &a)];
        let good = Interned::checked(&traces, vec![Arc::clone(&a), Arc::clone(&b)], vec![0, 1, 0]);
        assert_eq!(good.as_ref().map(Interned::ids), Some(&[0, 1, 0][..]));
        // Not in order of first appearance, another Arc, unused, short.
        assert!(
            Interned::checked(&traces, vec![Arc::clone(&b), Arc::clone(&a)], vec![1, 0, 1])
                .is_none()
        );
        let copy = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], None));
        assert!(Interned::checked(&traces, vec![copy, Arc::clone(&b)], vec![0, 1, 0]).is_none());
        assert!(
            Interned::checked(
                &traces,
                vec![Arc::clone(&a), Arc::clone(&b), Arc::clone(&b)],
                vec![0, 1, 0]
            )
            .is_none()
        );
        assert!(
            Interned::checked(&traces, vec![Arc::clone(&a), Arc::clone(&b)], vec![0, 1]).is_none()
        );
        let subset = Interned::of(&traces).subset(&[false, true, true]);
        assert_eq!(subset.ids(), [0, 1]);
        assert_eq!(subset.len(), 2);
    }

    #[test]
    fn distinct_tracebacks_sum_runs_and_keep_first_appearance_order() {
        let a = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], None));
        let b = Arc::new(Traceback::new(vec![Frame::new("b.c", 2)], None));
        let a_copy = Arc::new(Traceback::new(vec![Frame::new("a.c", 1)], None));
        let traces = [
            trace(1, &b),
            trace(2, &a),
            trace(4, &a),
            trace(8, &b),
            trace(16, &a_copy),
            trace(32, &a),
        ];
        let interned = Interned::of(&traces);
        assert_eq!(interned.ids(), [0, 1, 1, 0, 2, 1]);
        let distinct = distinct_tracebacks(&interned, &traces);
        let seen: Vec<(*const Traceback, Totals)> = distinct
            .iter()
            .map(|d| (Arc::as_ptr(d.traceback), d.totals))
            .collect();
        let totals = |size, count| Totals { size, count };
        assert_eq!(
            seen,
            [
                (Arc::as_ptr(&b), totals(9, 2)),
                (Arc::as_ptr(&a), totals(38, 3)),
                (Arc::as_ptr(&a_copy), totals(16, 1)),
            ]
        );
        let groups = group_tracebacks(&distinct);
        let merged: Vec<(*const Traceback, Totals)> = groups
            .entries
            .iter()
            .map(|g| (Arc::as_ptr(g.rep), g.totals))
            .collect();
        assert_eq!(
            merged,
            [
                (Arc::as_ptr(&b), totals(9, 2)),
                (Arc::as_ptr(&a), totals(54, 4)),
            ]
        );
    }

    #[test]
    fn frame_groups_merge_equal_names_in_separate_allocations() {
        let shared: Arc<str> = Arc::from("a.c");
        let separate: Arc<str> = Arc::from("a.c");
        let frame = |name: &Arc<str>, lineno| Frame {
            filename: Arc::clone(name),
            lineno,
            extra: None,
        };
        let one = Arc::new(Traceback::new(
            vec![frame(&shared, 1), frame(&separate, 1), frame(&shared, 2)],
            None,
        ));
        let two = Arc::new(Traceback::new(vec![frame(&separate, 2)], None));
        let traces = [trace(10, &one), trace(5, &two)];
        let interned = Interned::of(&traces);
        let distinct = distinct_tracebacks(&interned, &traces);
        let groups = group_frames(&distinct, GroupBy::Lineno, true);
        let found: Vec<(FrameKey<'_>, Totals)> = groups
            .entries
            .iter()
            .map(|g| (frame_key(&g.rep), g.totals))
            .collect();
        assert_eq!(
            found,
            [
                (("a.c", 1), Totals { size: 20, count: 2 }),
                (("a.c", 2), Totals { size: 15, count: 2 }),
            ]
        );
        let groups = group_frames(&distinct, GroupBy::Filename, false);
        assert_eq!(groups.entries.len(), 1);
        assert_eq!(
            groups.entries.first().map(|g| g.totals),
            Some(Totals { size: 15, count: 2 })
        );
    }
}
