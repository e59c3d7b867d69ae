//! The dense index of a snapshot, built once when the snapshot is made (by
//! every constructor: capture, our dump format, tracemalloc's pickle,
//! `filter_traces`), so that `statistics()` and `compare_to()` index
//! arrays instead of hashing and following pointers, and sort integers.
//!
//! Three levels, each numbered densely:
//! - **arcs**: the traces' distinct `Arc<Traceback>`s, by address, in order
//!   of first appearance ([`Interned`]), with each trace's arc;
//! - **tracebacks**: the arcs' distinct frame sequences (equal frames in
//!   separate arcs are one traceback), numbered in tracemalloc's traceback
//!   order (frames compared oldest first), each stored as its frame ids,
//!   oldest first;
//! - **frames**: the distinct `(filename, lineno)` pairs, numbered in
//!   tracemalloc's frame order (file name, then line), each with its file:
//!   the distinct file names, numbered in text order.
//!
//! Because ids follow tracemalloc's orders, the last sort key of a
//! statistic (its traceback) is its id; and because every array is
//! dense, grouping is a pass of additions.
//!
//! Representatives: a group's statistic shows the frame (with its
//! [`FrameExtra`](super::FrameExtra)) of the first arc, in order of first
//! appearance, that has it; those arcs are recorded here per frame and per
//! traceback, so that results do not depend on hash-table or thread order.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::hash::{FxHashMap, FxHasher};
use super::table::{AHEAD, Table, prefetch};
use crate::trace::{Frame, Trace, Traceback};

/// "None" in the `u32` id arrays.
pub(crate) const NONE: u32 = u32::MAX;

/// The distinct `Arc<Traceback>`s of a snapshot's traces, in order of
/// first appearance, and each trace's index into them: tracebacks interned
/// as `_tracemalloc` interns them. Loaders and the capture know the
/// sharing already and hand it over ([`Interned::checked`]); otherwise it is
/// computed from the addresses ([`Interned::of`]).
#[derive(Debug, Default)]
pub(crate) struct Interned {
    /// Distinct by address, first appearance first.
    pub(super) tracebacks: Vec<Arc<Traceback>>,
    /// One per trace: its traceback's index in `tracebacks`.
    pub(super) ids: Vec<u32>,
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
                    let next = u32::try_from(tracebacks.len()).unwrap_or(NONE);
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

    /// The interning of the traces `keep` accepts, numbered anew, and for
    /// each of its tracebacks the index it had here.
    pub(crate) fn subset(&self, keep: &[bool]) -> (Self, Vec<u32>) {
        let mut renumber: Vec<u32> = vec![NONE; self.tracebacks.len()];
        let mut tracebacks = Vec::new();
        let mut parents = Vec::new();
        let mut ids = Vec::new();
        for (&id, &kept) in self.ids.iter().zip(keep) {
            if !kept {
                continue;
            }
            let Some(slot) = renumber.get_mut(id as usize) else {
                continue;
            };
            if *slot == NONE {
                let Some(traceback) = self.tracebacks.get(id as usize) else {
                    continue;
                };
                *slot = u32::try_from(tracebacks.len()).unwrap_or(NONE);
                tracebacks.push(Arc::clone(traceback));
                parents.push(id);
            }
            ids.push(*slot);
        }
        (Interned { tracebacks, ids }, parents)
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

/// The index of one snapshot (see the module docs). Built by
/// [`Index::build`] (for a subset of a snapshot, with hints from
/// [`Index::hints_for`]); never changed afterwards.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// The arcs and each trace's arc.
    pub(super) interned: Interned,
    /// Per arc: its traceback id.
    pub(super) arc_tb: Vec<u32>,
    /// Per traceback: its statistic's traceback, the frames of the first
    /// arc (in order of first appearance) that has them, without
    /// `total_nframe`.
    pub(super) tb_views: Vec<Traceback>,
    /// Per traceback: where its frames start in `tb_frames`; one more entry
    /// than tracebacks, the last one `tb_frames.len()`.
    pub(super) tb_start: Vec<usize>,
    /// The frame ids of every traceback, oldest first, traceback after
    /// traceback.
    pub(super) tb_frames: Vec<u32>,
    /// Per traceback: its most recent frame.
    pub(super) tb_top: Vec<u32>,
    /// Per frame: its file id.
    pub(super) frame_file: Vec<u32>,
    /// Per frame: its line number.
    pub(super) frame_lineno: Vec<u32>,
    /// Per frame: the representative without `cumulative`, the frame of the
    /// first arc whose most recent frame it is (for a frame never the most
    /// recent: as in `first_frames`). Statistics share this table.
    pub(super) top_frames: Arc<[Frame]>,
    /// Per frame: the representative under `cumulative`, the frame of the
    /// first arc that has it, at its first index there. The same table as
    /// `top_frames` when they are equal.
    pub(super) first_frames: Arc<[Frame]>,
    /// Per frame: the hash of the one-frame traceback of it.
    pub(super) frame_hash: Vec<u64>,
    /// Per file: `filename:0` with no extra, the frame of a `filename`
    /// statistic.
    pub(super) file_frames: Arc<[Frame]>,
    /// Per file: the hash of the one-frame traceback of its frame.
    pub(super) file_hash: Vec<u64>,
}

/// Converts an index to `u32`, saturating (ids never reach `u32::MAX`:
/// a snapshot holds fewer than 2^32 traces).
fn id(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(NONE)
}

/// The element of an id array, or `default` out of range (never, for
/// arrays built here).
#[inline]
fn at<T: Copy>(items: &[T], i: u32, default: T) -> T {
    items.get(i as usize).copied().unwrap_or(default)
}

/// Where a file name's text is: the key of a frame looked up by address.
fn address(frame: &Frame) -> (usize, u32) {
    (frame.filename.as_ptr() as usize, frame.lineno)
}

/// The permutation that sorts `0..n` by `key`, and its inverse (the rank
/// of each item).
fn ranks_by<K: Ord>(n: usize, key: impl Fn(u32) -> K) -> (Vec<u32>, Vec<u32>) {
    let mut order: Vec<u32> = (0..id(n)).collect();
    order.sort_unstable_by_key(|&i| key(i));
    let mut rank = vec![0u32; n];
    for (r, &i) in order.iter().enumerate() {
        if let Some(slot) = rank.get_mut(i as usize) {
            *slot = id(r);
        }
    }
    (order, rank)
}

impl Index {
    /// How many distinct tracebacks (by frames).
    pub(super) fn tracebacks(&self) -> usize {
        self.tb_top.len()
    }

    /// Hints for an index of the arcs `parents` (indices of this index's
    /// arcs): this index's frame ids.
    pub(crate) fn hints_for(&self, parents: &[u32]) -> FrameHints {
        let mut spans = Vec::with_capacity(parents.len());
        let mut ids = Vec::new();
        for &arc in parents {
            let tb = at(&self.arc_tb, arc, NONE);
            let start = ids.len();
            // Stored oldest first; hints are most recent first.
            ids.extend(self.tb_frames(tb as usize).iter().rev());
            spans.push((start, ids.len()));
        }
        FrameHints {
            spans,
            ids,
            count: self.frames(),
        }
    }

    /// How many distinct file names.
    pub(super) fn files(&self) -> usize {
        self.file_frames.len()
    }

    /// The name of file `file`.
    pub(super) fn file(&self, file: u32) -> Option<&Arc<str>> {
        self.file_frames
            .get(file as usize)
            .map(|frame| &frame.filename)
    }

    /// How many distinct frames.
    pub(super) fn frames(&self) -> usize {
        self.frame_file.len()
    }

    /// The frame ids of traceback `tb`, oldest first.
    #[inline]
    pub(super) fn tb_frames(&self, tb: usize) -> &[u32] {
        match (self.tb_start.get(tb), self.tb_start.get(tb + 1)) {
            (Some(&start), Some(&end)) => self.tb_frames.get(start..end).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// The index of `interned`'s traces, with the frame numbers a loader
    /// knows (`hints`), if any.
    ///
    /// 1. One pass over the arcs numbers frames and tracebacks by first
    ///    appearance: a frame is looked up by its hint (a dense array), or
    ///    without hints by the address of its file name and its line (a
    ///    table), and by text only the first time either is seen; each
    ///    arc's frame ids are hashed.
    /// 2. Arcs with equal frame ids are one traceback (a table keyed by
    ///    the hashes, prefetched ahead).
    /// 3. Files are sorted by name, frames by (file, line), tracebacks by
    ///    their frames oldest first (packed prefixes of the sequences,
    ///    then whole sequences where prefixes tie), and renumbered.
    pub(crate) fn build(interned: Interned, hints: Option<FrameHints>) -> Self {
        let hints = hints.filter(|h| h.spans.len() == interned.tracebacks.len());
        let mut first = FirstPass::new(&interned.tracebacks);
        let complete = match &hints {
            Some(hints) => first.run_with_hints(hints),
            None => {
                first.run();
                true
            }
        };
        drop(hints);
        if !complete {
            // Hints that do not describe the arcs: number them anew.
            drop(first);
            return Index::build(interned, None);
        }
        let FirstPass {
            arc_start,
            arc_frames,
            arc_hash,
            frames,
            files,
            ..
        } = first;
        let tracebacks = dedup_tracebacks(&arc_start, &arc_frames, &arc_hash);
        let Tracebacks { arc_tb, tb_arc } = tracebacks;

        // Files in text order, frames by (file, line).
        let (file_order, file_rank) = ranks_by(files.len(), |f| {
            files.get(f as usize).map_or("", |name| &***name)
        });
        let frame_keys: Vec<u64> = frames
            .iter()
            .map(|frame| {
                (u64::from(at(&file_rank, frame.file, NONE)) << 32) | u64::from(frame.lineno)
            })
            .collect();
        let (frame_order, frame_rank) = ranks_by(frames.len(), |f| at(&frame_keys, f, 0));
        drop(frame_keys);
        // The arcs' frames renumbered and turned oldest first, in place.
        let mut arc_frames = arc_frames;
        for a in 0..arc_tb.len() {
            let (Some(&start), Some(&end)) = (arc_start.get(a), arc_start.get(a + 1)) else {
                continue;
            };
            if let Some(ids) = arc_frames.get_mut(start..end) {
                ids.reverse();
                for id in ids {
                    *id = at(&frame_rank, *id, NONE);
                }
            }
        }
        let sequence = |tb: u32| -> &[u32] {
            let a = at(&tb_arc, tb, NONE);
            let start = at(&arc_start, a, 0);
            let end = at(&arc_start, a + 1, 0);
            arc_frames.get(start..end).unwrap_or(&[])
        };
        let tb_order = sort_sequences(tb_arc.len(), frames.len(), sequence);
        let mut tb_rank = vec![0u32; tb_order.len()];
        for (r, &tb) in tb_order.iter().enumerate() {
            if let Some(slot) = tb_rank.get_mut(tb as usize) {
                *slot = id(r);
            }
        }
        let mut tb_start = Vec::with_capacity(tb_order.len() + 1);
        tb_start.push(0);
        let mut tb_frames = Vec::with_capacity(arc_frames.len());
        let mut tb_top = Vec::with_capacity(tb_order.len());
        for (r, &tb) in tb_order.iter().enumerate() {
            if let Some(&ahead) = tb_order.get(r + AHEAD) {
                prefetch(sequence(ahead).as_ptr().cast());
            }
            let frames = sequence(tb);
            tb_frames.extend_from_slice(frames);
            tb_start.push(tb_frames.len());
            tb_top.push(frames.last().copied().unwrap_or(NONE));
        }
        drop(arc_frames);
        // The views in order of first appearance (the arcs' own order,
        // usually that of their allocation), then in traceback order.
        let mut views: Vec<Option<Traceback>> = vec![None; tb_order.len()];
        for (tb, &a) in tb_arc.iter().enumerate() {
            if let Some(&ahead) = tb_arc.get(tb + AHEAD)
                && let Some(arc) = interned.tracebacks.get(ahead as usize)
            {
                prefetch(Arc::as_ptr(arc).cast());
            }
            let view = interned
                .tracebacks
                .get(a as usize)
                .map(|arc| arc.without_total_nframe());
            if let Some(slot) = views.get_mut(at(&tb_rank, id(tb), NONE) as usize) {
                *slot = view;
            }
        }
        let tb_views: Vec<Traceback> = views
            .into_iter()
            .map(|view| view.unwrap_or_else(|| Traceback::new(Vec::new(), None)))
            .collect();
        let arc_tb: Vec<u32> = arc_tb.iter().map(|&tb| at(&tb_rank, tb, NONE)).collect();

        let mut frame_file = Vec::with_capacity(frames.len());
        let mut frame_lineno = Vec::with_capacity(frames.len());
        let mut first_frames = Vec::with_capacity(frames.len());
        let mut top_frames = Vec::with_capacity(frames.len());
        let mut frame_hash = Vec::with_capacity(frames.len());
        let mut frames: Vec<Option<SeenFrame>> = frames.into_iter().map(Some).collect();
        for &f in &frame_order {
            let Some(seen) = frames.get_mut(f as usize).and_then(Option::take) else {
                continue;
            };
            frame_file.push(at(&file_rank, seen.file, NONE));
            frame_lineno.push(seen.lineno);
            frame_hash.push(Traceback::one_frame_hash(&seen.first));
            top_frames.push(seen.top.unwrap_or_else(|| seen.first.clone()));
            first_frames.push(seen.first);
        }
        let same_extra = |a: &Frame, b: &Frame| match (&a.extra, &b.extra) {
            (Some(x), Some(y)) => Arc::ptr_eq(x, y),
            (None, None) => true,
            _ => false,
        };
        let first_frames: Arc<[Frame]> = Arc::from(first_frames);
        let top_frames: Arc<[Frame]> = if top_frames
            .iter()
            .zip(first_frames.iter())
            .all(|(a, b)| same_extra(a, b))
        {
            Arc::clone(&first_frames)
        } else {
            Arc::from(top_frames)
        };
        let file_frames: Vec<Frame> = file_order
            .iter()
            .filter_map(|&f| files.get(f as usize))
            .map(|name| Frame {
                filename: Arc::clone(name),
                lineno: 0,
                extra: None,
            })
            .collect();
        let file_hash: Vec<u64> = file_frames.iter().map(Traceback::one_frame_hash).collect();
        Index {
            interned,
            arc_tb,
            tb_views,
            tb_start,
            tb_frames,
            tb_top,
            frame_file,
            frame_lineno,
            top_frames,
            first_frames,
            frame_hash,
            file_frames: Arc::from(file_frames),
            file_hash,
        }
    }
}

/// The frame numbers a loader knows: for each arc (in the order of the
/// [`Interned`] it comes with), a number per frame, most recent first, in
/// `ids[spans[arc].0..spans[arc].1]` (arcs may share numbers); equal
/// numbers are equal frames (file name and line). Numbers are below
/// `count`. Hints that do not fit the arcs are ignored.
#[derive(Debug, Default)]
pub(crate) struct FrameHints {
    /// Where each arc's numbers are in `ids`.
    pub(crate) spans: Vec<(usize, usize)>,
    /// The numbers.
    pub(crate) ids: Vec<u32>,
    /// One more than the highest number.
    pub(crate) count: usize,
}

/// A frame seen in the first pass.
struct SeenFrame {
    file: u32,
    lineno: u32,
    /// The frame at its first occurrence.
    first: Frame,
    /// The frame at its first occurrence as the most recent frame.
    top: Option<Frame>,
}

/// The first pass of [`Index::build`]: frames numbered by first
/// appearance, each arc's frame ids (most recent first) and their hash.
struct FirstPass<'a> {
    arcs: &'a [Arc<Traceback>],
    by_text: FxHashMap<(&'a str, u32), u32>,
    file_ids: FxHashMap<&'a str, u32>,
    files: Vec<&'a Arc<str>>,
    frames: Vec<SeenFrame>,
    /// Per frame: whether it was seen as the most recent frame (dense, for
    /// a check per arc).
    on_top: Vec<bool>,
    arc_start: Vec<usize>,
    arc_frames: Vec<u32>,
    arc_hash: Vec<u64>,
}

impl<'a> FirstPass<'a> {
    fn new(arcs: &'a [Arc<Traceback>]) -> Self {
        let mut arc_start = Vec::with_capacity(arcs.len() + 1);
        arc_start.push(0);
        FirstPass {
            arcs,
            by_text: FxHashMap::default(),
            file_ids: FxHashMap::default(),
            files: Vec::new(),
            frames: Vec::new(),
            on_top: Vec::new(),
            arc_start,
            arc_frames: Vec::new(),
            arc_hash: Vec::with_capacity(arcs.len()),
        }
    }

    /// The id of the frame at `position` of arc `a`, seen for the first
    /// time under its address or hint: found by text, or numbered.
    fn by_text(&mut self, a: usize, position: usize) -> u32 {
        let Some(frame) = self.arcs.get(a).and_then(|arc| arc.frames().get(position)) else {
            return NONE;
        };
        let next = id(self.frames.len());
        let found = *self
            .by_text
            .entry((&*frame.filename, frame.lineno))
            .or_insert(next);
        if found == next {
            let next_file = id(self.files.len());
            let file = *self.file_ids.entry(&*frame.filename).or_insert(next_file);
            if file == next_file {
                self.files.push(&frame.filename);
            }
            self.frames.push(SeenFrame {
                file,
                lineno: frame.lineno,
                first: frame.clone(),
                top: None,
            });
            self.on_top.push(false);
        }
        found
    }

    /// Records that frame `id` is the most recent frame of arc `a`.
    fn top(&mut self, frame_id: u32, a: usize) {
        let Some(on_top) = self.on_top.get_mut(frame_id as usize) else {
            return;
        };
        if *on_top {
            return;
        }
        *on_top = true;
        if let Some(seen) = self.frames.get_mut(frame_id as usize)
            && let Some(frame) = self.arcs.get(a).and_then(|arc| arc.frames().first())
        {
            seen.top = Some(frame.clone());
        }
    }

    /// Ends arc `a`: its frame ids are the last pushed since its start.
    /// Appends frame `frame_id`, at `position` of arc `a`, to that arc's
    /// frames (the top frame also marks the frame as seen on top).
    fn push_frame(&mut self, a: usize, position: usize, frame_id: u32) {
        if position == 0 {
            self.top(frame_id, a);
        }
        self.arc_frames.push(frame_id);
    }

    fn end_arc(&mut self) {
        let start = self.arc_start.last().copied().unwrap_or(0);
        let ids = self.arc_frames.get(start..).unwrap_or(&[]);
        let mut hasher = FxHasher::default();
        ids.hash(&mut hasher);
        self.arc_hash.push(hasher.finish());
        self.arc_start.push(self.arc_frames.len());
    }

    /// Without hints: frames looked up by address.
    fn run(&mut self) {
        let arcs = self.arcs;
        let mut by_address: Table<(usize, u32), u32> = Table::with_capacity(1024);
        for (a, arc) in arcs.iter().enumerate() {
            // Two dependent misses per arc (the traceback, then its
            // frames): fetch the traceback 2 * AHEAD ahead and its frames
            // AHEAD ahead.
            if let Some(far) = arcs.get(a + 2 * AHEAD) {
                prefetch(Arc::as_ptr(far).cast());
            }
            if let Some(ahead) = arcs.get(a + AHEAD) {
                prefetch(ahead.frames().as_ptr().cast());
            }
            // The lookups miss the cache: fetch the next arc's buckets.
            if let Some(next) = arcs.get(a + 1) {
                for frame in next.frames() {
                    by_address.prefetch(&address(frame));
                }
            }
            for (position, frame) in arc.frames().iter().enumerate() {
                let (slot, new) = by_address.get_or_insert(address(frame), || NONE);
                let frame_id = if new {
                    let found = self.by_text(a, position);
                    *slot = found;
                    found
                } else {
                    *slot
                };
                self.push_frame(a, position, frame_id);
            }
            self.end_arc();
        }
    }

    /// With hints: frames looked up by hint. False if the hints do not fit
    /// the arcs (a number out of range, a count of frames that differs).
    fn run_with_hints(&mut self, hints: &FrameHints) -> bool {
        let mut by_hint: Vec<u32> = vec![NONE; hints.count];
        self.arc_frames.reserve(hints.ids.len());
        let arcs = self.arcs;
        for (a, arc) in arcs.iter().enumerate() {
            if let Some(ahead) = arcs.get(a + AHEAD) {
                prefetch(Arc::as_ptr(ahead).cast());
            }
            let Some(&(start, end)) = hints.spans.get(a) else {
                return false;
            };
            let Some(ids) = hints.ids.get(start..end) else {
                return false;
            };
            if ids.len() != arc.frames().len() {
                return false;
            }
            for (position, &hint) in ids.iter().enumerate() {
                let Some(slot) = by_hint.get_mut(hint as usize) else {
                    return false;
                };
                let frame_id = if *slot == NONE {
                    let found = self.by_text(a, position);
                    if found == NONE {
                        return false;
                    }
                    *slot = found;
                    found
                } else {
                    *slot
                };
                self.push_frame(a, position, frame_id);
            }
            self.end_arc();
        }
        true
    }
}

/// Step 2 of [`Index::build`]: each arc's traceback and each traceback's
/// first arc, tracebacks numbered by first appearance.
struct Tracebacks {
    arc_tb: Vec<u32>,
    tb_arc: Vec<u32>,
}

fn dedup_tracebacks(arc_start: &[usize], arc_frames: &[u32], arc_hash: &[u64]) -> Tracebacks {
    let arcs = arc_hash.len();
    // Keyed by hash (0 is the table's empty key: hashes 0 and 1 share a
    // key, which the comparison of the frames tells apart).
    let key = |hash: u64| (hash as usize).max(1);
    let ids_of = |a: u32| {
        let start = at(arc_start, a, 0);
        let end = at(arc_start, a + 1, 0);
        arc_frames.get(start..end).unwrap_or(&[])
    };
    let mut by_hash: Table<usize, u32> = Table::with_capacity(arcs);
    // Per traceback: the previous traceback with the same key.
    let mut chain: Vec<u32> = Vec::with_capacity(arcs);
    let mut arc_tb = Vec::with_capacity(arcs);
    let mut tb_arc: Vec<u32> = Vec::with_capacity(arcs);
    for (a, &hash) in arc_hash.iter().enumerate() {
        if let Some(&ahead) = arc_hash.get(a + AHEAD) {
            by_hash.prefetch(&key(ahead));
        }
        let next = id(tb_arc.len());
        let (slot, new) = by_hash.get_or_insert(key(hash), || next);
        let mut tb = if new { NONE } else { *slot };
        let head = tb;
        while tb != NONE {
            if ids_of(at(&tb_arc, tb, NONE)) == ids_of(id(a)) {
                break;
            }
            tb = at(&chain, tb, NONE);
        }
        if tb == NONE {
            tb = next;
            *slot = next;
            chain.push(head);
            tb_arc.push(id(a));
        }
        arc_tb.push(tb);
    }
    Tracebacks { arc_tb, tb_arc }
}

/// The order of `n` distinct sequences of frame ids (each below `frames`),
/// lexicographic, a sequence before any longer one it starts: as many of
/// each sequence's first ids as fit in 96 bits are packed (id + 1, 0 past
/// the end) above its number, the packed keys sorted, and the runs of
/// equal prefixes sorted by whole sequences.
fn sort_sequences<'s>(n: usize, frames: usize, sequence: impl Fn(u32) -> &'s [u32]) -> Vec<u32> {
    let width = u64::BITS - (frames as u64 + 1).leading_zeros();
    let per_key = (96 / width.max(1)) as usize;
    let mut keys: Vec<u128> = (0..id(n))
        .map(|tb| {
            let ids = sequence(tb);
            let mut prefix = 0u128;
            for k in 0..per_key {
                let symbol = ids.get(k).map_or(0, |&f| u128::from(f) + 1);
                prefix = (prefix << width) | symbol;
            }
            (prefix << (128 - 32 - width as usize * per_key)) << 32 | u128::from(tb)
        })
        .collect();
    keys.sort_unstable();
    let mut order: Vec<u32> = keys.iter().map(|&k| k as u32).collect();
    // Runs of equal prefixes: their sequences are longer than the prefix.
    let mut start = 0;
    while start < keys.len() {
        let prefix = keys.get(start).map_or(0, |k| k >> 32);
        let mut end = start + 1;
        while keys.get(end).is_some_and(|k| k >> 32 == prefix) {
            end += 1;
        }
        if end - start > 1
            && let Some(run) = order.get_mut(start..end)
        {
            run.sort_unstable_by(|&a, &b| sequence(a).cmp(sequence(b)));
        }
        start = end;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FrameExtra;
    use crate::testing::trace;

    fn tb(frames: &[(&str, u32)], total: Option<u32>) -> Arc<Traceback> {
        Arc::new(Traceback::new(
            frames.iter().map(|&(f, l)| Frame::new(f, l)).collect(),
            total,
        ))
    }

    /// The frames of traceback `t` of `index`, oldest first, as text.
    fn frames_of(index: &Index, t: usize) -> Vec<String> {
        index
            .tb_frames(t)
            .iter()
            .map(|&f| {
                let file = index.file(index.frame_file[f as usize]).unwrap();
                format!("{file}:{}", index.frame_lineno[f as usize])
            })
            .collect()
    }

    #[test]
    fn interning_from_a_loader_is_checked_and_subsets_renumber() {
        let a = tb(&[("a.c", 1)], None);
        let b = tb(&[("b.c", 2)], None);
        let traces = [trace(1, &a), trace(2, &b), trace(4, &a)];
        let good = Interned::checked(&traces, vec![Arc::clone(&a), Arc::clone(&b)], vec![0, 1, 0]);
        assert_eq!(good.as_ref().map(Interned::ids), Some(&[0, 1, 0][..]));
        // Not in order of first appearance, another Arc, unused, short.
        assert!(
            Interned::checked(&traces, vec![Arc::clone(&b), Arc::clone(&a)], vec![1, 0, 1])
                .is_none()
        );
        let copy = tb(&[("a.c", 1)], None);
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
        let (subset, parents) = Interned::of(&traces).subset(&[false, true, true]);
        assert_eq!(subset.ids(), [0, 1]);
        assert_eq!(subset.len(), 2);
        assert_eq!(parents, [1, 0]);
    }

    #[test]
    fn ids_follow_tracemalloc_orders_and_equal_frames_are_one_traceback() {
        // Most recent first; tracemalloc orders tracebacks oldest first.
        let x = tb(&[("b.c", 2), ("main.c", 9)], Some(7));
        let y = tb(&[("a.c", 5), ("main.c", 9)], None);
        let z = tb(&[("main.c", 9)], None);
        let x_copy = tb(&[("b.c", 2), ("main.c", 9)], None);
        let w = tb(&[("a.c", 10), ("a.c", 5)], None);
        let traces = [
            trace(1, &x),
            trace(1, &y),
            trace(1, &x_copy),
            trace(1, &z),
            trace(1, &w),
        ];
        let index = Index::build(Interned::of(&traces), None);
        assert_eq!(index.files(), 3);
        assert_eq!(
            (0..index.files() as u32)
                .map(|f| index.file(f).unwrap().to_string())
                .collect::<Vec<_>>(),
            ["a.c", "b.c", "main.c"]
        );
        assert_eq!(index.frame_lineno, [5, 10, 2, 9]);
        assert_eq!(index.tracebacks(), 4);
        let all: Vec<Vec<String>> = (0..4).map(|t| frames_of(&index, t)).collect();
        assert_eq!(
            all,
            [
                vec!["a.c:5", "a.c:10"],
                vec!["main.c:9"],
                vec!["main.c:9", "a.c:5"],
                vec!["main.c:9", "b.c:2"],
            ]
        );
        // x and its copy are one traceback, shown by x without its
        // total_nframe.
        assert_eq!(index.arc_tb, [3, 2, 3, 1, 0]);
        assert!(index.tb_views[3].total_nframe().is_none());
        assert_eq!(index.tb_top, [1, 3, 0, 2]);
    }

    #[test]
    fn representatives_are_the_first_occurrences() {
        let at = |address| FrameExtra {
            function: None,
            module: None,
            address: Some(address),
        };
        let frame = |file: &str, line, address| Frame::new(file, line).with_extra(at(address));
        // a.c:1 first appears below the top (address 1), then on top (2).
        let one = Arc::new(Traceback::new(
            vec![frame("b.c", 1, 0), frame("a.c", 1, 1)],
            None,
        ));
        let two = Arc::new(Traceback::new(vec![frame("a.c", 1, 2)], None));
        let three = Arc::new(Traceback::new(vec![frame("a.c", 1, 3)], None));
        let traces = [trace(1, &one), trace(1, &two), trace(1, &three)];
        let index = Index::build(Interned::of(&traces), None);
        let address =
            |frames: &Arc<[Frame]>, f: usize| frames[f].extra.as_ref().and_then(|e| e.address);
        // Frame 0 is a.c:1, frame 1 b.c:1.
        assert_eq!(address(&index.first_frames, 0), Some(1));
        assert_eq!(address(&index.top_frames, 0), Some(2));
        assert_eq!(address(&index.first_frames, 1), Some(0));
        assert_eq!(address(&index.top_frames, 1), Some(0));
        assert_eq!(
            index.frame_hash[0],
            Traceback::one_frame_hash(&Frame::new("a.c", 1))
        );
    }

    #[test]
    fn hints_give_the_index_built_without_them() {
        let names: Vec<Arc<str>> = (0..7).map(|i| Arc::from(format!("f{i}.c"))).collect();
        let mut random = crate::testing::lcg(99);
        let mut next = move |n: u64| (random() >> 33) % n;
        let pool: Vec<Arc<Traceback>> = (0..300)
            .map(|_| {
                let depth = 1 + next(5) as usize;
                let frames = (0..depth)
                    .map(|_| Frame {
                        filename: Arc::clone(&names[next(7) as usize]),
                        lineno: next(4) as u32,
                        extra: None,
                    })
                    .collect();
                Arc::new(Traceback::new(frames, None))
            })
            .collect();
        let traces: Vec<Trace> = (0..2000)
            .map(|_| trace(next(100), &pool[next(300) as usize]))
            .collect();
        let plain = Index::build(Interned::of(&traces), None);
        let arcs = plain.interned.len() as u32;
        let keep: Vec<u32> = (0..arcs).collect();
        let hinted = Index::build(Interned::of(&traces), Some(plain.hints_for(&keep)));
        let same = |a: &Index, b: &Index| {
            assert_eq!(a.arc_tb, b.arc_tb);
            assert_eq!(a.tb_start, b.tb_start);
            assert_eq!(a.tb_frames, b.tb_frames);
            assert_eq!(a.tb_top, b.tb_top);
            assert_eq!(a.frame_file, b.frame_file);
            assert_eq!(a.frame_lineno, b.frame_lineno);
            assert_eq!(a.frame_hash, b.frame_hash);
            assert_eq!(a.file_hash, b.file_hash);
        };
        same(&plain, &hinted);
        // A subset, as filter_traces makes it: its own index from hints.
        let kept: Vec<bool> = (0..traces.len()).map(|i| i % 3 != 1).collect();
        let subset: Vec<Trace> = traces
            .iter()
            .zip(&kept)
            .filter(|(_, k)| **k)
            .map(|(t, _)| t.clone())
            .collect();
        let (interned, parents) = plain.interned.subset(&kept);
        same(
            &Index::build(Interned::of(&subset), None),
            &Index::build(interned, Some(plain.hints_for(&parents))),
        );
        // Hints that do not fit are ignored.
        let mut short = plain.hints_for(&keep);
        short.spans.pop();
        same(&plain, &Index::build(Interned::of(&traces), Some(short)));
        let mut wrong = plain.hints_for(&keep);
        wrong.count = 1;
        same(&plain, &Index::build(Interned::of(&traces), Some(wrong)));
        let mut long = plain.hints_for(&keep);
        if let Some(span) = long.spans.first_mut() {
            span.1 += 1;
        }
        same(&plain, &Index::build(Interned::of(&traces), Some(long)));
    }

    #[test]
    fn sequences_sort_past_their_packed_prefixes() {
        // Three frames: 3 bits a symbol, 32 symbols a packed prefix.
        let mut sequences: Vec<Vec<u32>> = vec![
            vec![1; 60],
            [vec![1; 50], vec![0]].concat(),
            vec![1; 48],
            [vec![1; 48], vec![2, 0]].concat(),
            vec![0, 2],
            vec![2],
            [vec![1; 50], vec![0, 0]].concat(),
        ];
        let order = sort_sequences(sequences.len(), 3, |t| &sequences[t as usize]);
        let sorted: Vec<Vec<u32>> = order
            .iter()
            .map(|&t| sequences[t as usize].clone())
            .collect();
        sequences.sort();
        assert_eq!(sorted, sequences);
    }
}
