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
//!   tracemalloc's frame order (file name, then line), each with its name
//!   (its whole file name, numbered in text order) and its file (the file
//!   name without a site, [`Frame::file`]: what `group_by=filename` groups
//!   by, numbered in text order). Names and files are the same table
//!   unless some frame has a site (a frame with no line info named
//!   `FILE!FUNCTION+0xOFFSET`).
//!
//! Because ids follow tracemalloc's orders, the last sort key of a
//! statistic (its traceback) is its id; and because every array is
//! dense, grouping is a pass of additions.
//!
//! Representatives: a group's statistic shows the frame (with its
//! [`FrameExtra`](crate::FrameExtra)) of the first arc, in order of first
//! appearance, that has it; those arcs are recorded here per frame and per
//! traceback, so that results do not depend on hash-table or thread order.

mod first_pass;
mod interned;
#[cfg(test)]
mod tests;
mod tracebacks;

use std::sync::{Arc, OnceLock};

use crate::engine::cells::Cells;
use crate::engine::table::{AHEAD, prefetch};
use crate::engine::totals::Totals;
use crate::trace::{Frame, Traceback};

pub(crate) use first_pass::FrameHints;
use first_pass::{FirstPass, SeenFrame};
pub(crate) use interned::Interned;
use tracebacks::{Tracebacks, dedup_tracebacks, sort_sequences};

/// "None" in the `u32` id arrays.
pub(crate) const NONE: u32 = u32::MAX;

/// The index of one snapshot (see the module docs). Built by
/// [`Index::build`] (for a subset of a snapshot, with hints from
/// [`Index::hints_for`]); never changed afterwards.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// The arcs and each trace's arc.
    pub(crate) interned: Interned,
    /// Per arc: the bytes and blocks of its items (stage 1 of every
    /// grouping, summed once when the snapshot is made; empty until the
    /// snapshot sets it).
    pub(crate) arc_totals: Vec<Totals>,
    /// A snapshot of traces, aggregated per (arc, domain, source): made
    /// the first time a filter needs it, so that filters decide per
    /// distinct traceback and domain rather than per trace.
    pub(crate) cells: OnceLock<Cells>,
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
    /// The frames' names when some frame has a site; None when every
    /// name is its file (names are then the files).
    pub(super) names: Option<Names>,
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
    /// Per file: `file:0` with no extra, the frame of a `filename`
    /// statistic.
    pub(super) file_frames: Arc<[Frame]>,
    /// Per file: the hash of the one-frame traceback of its frame.
    pub(super) file_hash: Vec<u64>,
}

/// The whole file names of the frames (sites included), when they are not
/// the files.
#[derive(Debug, Default)]
pub(crate) struct Names {
    /// Per frame: its name id.
    frame_name: Vec<u32>,
    /// The distinct names, in text order.
    text: Vec<Arc<str>>,
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
    /// The index of `items` with their totals (tests).
    #[cfg(test)]
    pub(crate) fn of<B: crate::trace::Block + Sync>(items: &[B]) -> Self {
        let mut index = Index::build(Interned::of(items), None);
        index.arc_totals = crate::engine::totals::arc_totals(&index.interned, items);
        index
    }

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

    /// How many distinct frame names (file names, sites included).
    pub(super) fn names(&self) -> usize {
        match &self.names {
            Some(names) => names.text.len(),
            None => self.files(),
        }
    }

    /// The text of name `name`.
    pub(super) fn name(&self, name: u32) -> Option<&Arc<str>> {
        match &self.names {
            Some(names) => names.text.get(name as usize),
            None => self.file(name),
        }
    }

    /// The name id of frame `frame`.
    pub(super) fn frame_name(&self, frame: usize) -> u32 {
        let ids = match &self.names {
            Some(names) => &names.frame_name,
            None => &self.frame_file,
        };
        ids.get(frame).copied().unwrap_or(NONE)
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
    /// 3. Names are sorted by text, frames by (name, line), tracebacks by
    ///    their frames oldest first (packed prefixes of the sequences,
    ///    then whole sequences where prefixes tie), and renumbered; files
    ///    are the names, or with sites the names' files sorted by text.
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
            names,
            name_file_len,
            any_site,
            ..
        } = first;
        let tracebacks = dedup_tracebacks(&arc_start, &arc_frames, &arc_hash);
        let Tracebacks { arc_tb, tb_arc } = tracebacks;

        // Names in text order, frames by (name, line).
        let (name_order, name_rank) = ranks_by(names.len(), |n| {
            names.get(n as usize).map_or("", |name| &***name)
        });
        let frame_keys: Vec<u64> = frames
            .iter()
            .map(|frame| {
                (u64::from(at(&name_rank, frame.name, NONE)) << 32) | u64::from(frame.lineno)
            })
            .collect();
        let (frame_order, frame_rank) = ranks_by(frames.len(), |f| at(&frame_keys, f, 0));
        drop(frame_keys);
        // The arcs' frames renumbered and turned oldest first, in place.
        let mut arc_frames = arc_frames;
        renumber_arcs(&mut arc_frames, &arc_start, arc_tb.len(), &frame_rank);
        let TracebackColumns {
            tb_rank,
            tb_start,
            tb_frames,
            tb_top,
        } = traceback_columns(&tb_arc, &arc_start, &arc_frames, frames.len());
        drop(arc_frames);
        // The views in order of first appearance (the arcs' own order,
        // usually that of their allocation), then in traceback order.
        let tb_views = traceback_views(&interned, &tb_arc, &tb_rank);
        let arc_tb: Vec<u32> = arc_tb.iter().map(|&tb| at(&tb_rank, tb, NONE)).collect();

        let files = Files::of(&names, &name_order, &name_rank, &name_file_len, any_site);
        let FrameColumns {
            frame_file,
            frame_name,
            frame_lineno,
            first_frames,
            top_frames,
            frame_hash,
        } = frame_columns(
            frames,
            &frame_order,
            &name_rank,
            files.name_file.as_deref(),
            any_site,
        );
        let names = files.name_file.is_some().then(|| Names {
            frame_name,
            text: name_order
                .iter()
                .filter_map(|&n| names.get(n as usize))
                .map(|name| Arc::clone(name))
                .collect(),
        });
        let file_frames = files.frames;
        let file_hash: Vec<u64> = file_frames.iter().map(Traceback::one_frame_hash).collect();
        Index {
            interned,
            arc_totals: Vec::new(),
            cells: OnceLock::new(),
            arc_tb,
            tb_views,
            tb_start,
            tb_frames,
            tb_top,
            frame_file,
            names,
            frame_lineno,
            top_frames,
            first_frames,
            frame_hash,
            file_frames: Arc::from(file_frames),
            file_hash,
        }
    }
}

/// Renumbers the arcs' frames in place by `frame_rank` and turns each arc's
/// oldest first: `arc_frames` holds each of the `arcs` arcs at
/// `arc_start[a]..arc_start[a + 1]`, most recent first.
fn renumber_arcs(arc_frames: &mut [u32], arc_start: &[usize], arcs: usize, frame_rank: &[u32]) {
    for a in 0..arcs {
        let (Some(&start), Some(&end)) = (arc_start.get(a), arc_start.get(a + 1)) else {
            continue;
        };
        if let Some(ids) = arc_frames.get_mut(start..end) {
            ids.reverse();
            for id in ids {
                *id = at(frame_rank, *id, NONE);
            }
        }
    }
}

/// The tracebacks in tracemalloc's order: each one's rank, and their
/// frames one after another.
struct TracebackColumns {
    /// Per traceback (by first arc): its rank in tracemalloc's order.
    tb_rank: Vec<u32>,
    /// Per traceback (by rank): where its frames start in `tb_frames`,
    /// and one past the last.
    tb_start: Vec<usize>,
    /// Every traceback's frame ids, oldest first.
    tb_frames: Vec<u32>,
    /// Per traceback (by rank): its most recent frame.
    tb_top: Vec<u32>,
}

/// The columns of the tracebacks `tb_arc` (each one's first arc), whose
/// frames (ids below `frames`) are the arcs' `arc_frames` at `arc_start`,
/// renumbered and oldest first.
fn traceback_columns(
    tb_arc: &[u32],
    arc_start: &[usize],
    arc_frames: &[u32],
    frames: usize,
) -> TracebackColumns {
    let sequence = |tb: u32| -> &[u32] {
        let a = at(tb_arc, tb, NONE);
        let start = at(arc_start, a, 0);
        let end = at(arc_start, a + 1, 0);
        arc_frames.get(start..end).unwrap_or(&[])
    };
    let tb_order = sort_sequences(tb_arc.len(), frames, sequence);
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
    TracebackColumns {
        tb_rank,
        tb_start,
        tb_frames,
        tb_top,
    }
}

/// The tracebacks' views, by rank (`tb_rank`, per traceback of `tb_arc`):
/// each the first arc of `interned` with its frames, in order of first
/// appearance (the arcs' own order, usually that of their allocation).
fn traceback_views(interned: &Interned, tb_arc: &[u32], tb_rank: &[u32]) -> Vec<Traceback> {
    let mut views: Vec<Option<Traceback>> = vec![None; tb_rank.len()];
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
        if let Some(slot) = views.get_mut(at(tb_rank, id(tb), NONE) as usize) {
            *slot = view;
        }
    }
    views
        .into_iter()
        .map(|view| view.unwrap_or_else(|| Traceback::new(Vec::new(), None)))
        .collect()
}

/// The columns of the frames, by rank.
struct FrameColumns {
    frame_file: Vec<u32>,
    /// Each frame's name, when the names are not the files.
    frame_name: Vec<u32>,
    frame_lineno: Vec<u32>,
    first_frames: Arc<[Frame]>,
    top_frames: Arc<[Frame]>,
    frame_hash: Vec<u64>,
}

/// The columns of the first pass's `frames`, in `frame_order`: each one's
/// name (by `name_rank`), file (by `name_file`, the names' files when
/// they are not the names: `any_site`), line, hash, and its first and top
/// frames (one table when no frame's differ).
fn frame_columns(
    frames: Vec<SeenFrame>,
    frame_order: &[u32],
    name_rank: &[u32],
    name_file: Option<&[u32]>,
    any_site: bool,
) -> FrameColumns {
    let mut frame_file = Vec::with_capacity(frames.len());
    let mut frame_name = Vec::with_capacity(if any_site { frames.len() } else { 0 });
    let mut frame_lineno = Vec::with_capacity(frames.len());
    let mut first_frames = Vec::with_capacity(frames.len());
    let mut top_frames = Vec::with_capacity(frames.len());
    let mut frame_hash = Vec::with_capacity(frames.len());
    let mut frames: Vec<Option<SeenFrame>> = frames.into_iter().map(Some).collect();
    for &f in frame_order {
        let Some(seen) = frames.get_mut(f as usize).and_then(Option::take) else {
            continue;
        };
        let name = at(name_rank, seen.name, NONE);
        match name_file {
            Some(name_file) => {
                frame_file.push(at(name_file, name, NONE));
                frame_name.push(name);
            }
            None => frame_file.push(name),
        }
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
    FrameColumns {
        frame_file,
        frame_name,
        frame_lineno,
        first_frames,
        top_frames,
        frame_hash,
    }
}

/// The files of an index's frames: the names, or with sites the names'
/// files.
struct Files {
    /// Per file, in text order: `file:0`.
    frames: Vec<Frame>,
    /// Per name (by rank): its file id; None when the files are the names
    /// (same ids).
    name_file: Option<Vec<u32>>,
}

impl Files {
    /// The files of `names` (first-pass ids, `name_order` their text
    /// order and `name_rank` its inverse), whose files are the first
    /// `name_file_len` bytes of each; `any_site` when some is shorter than
    /// its name. A file that is a name too shares its text.
    fn of(
        names: &[&Arc<str>],
        name_order: &[u32],
        name_rank: &[u32],
        name_file_len: &[usize],
        any_site: bool,
    ) -> Self {
        let in_order = name_order.iter().filter_map(|&n| names.get(n as usize));
        if !any_site {
            return Files {
                frames: in_order
                    .map(|name| Frame::new(Arc::clone(name), 0))
                    .collect(),
                name_file: None,
            };
        }
        let file_of = |n: usize| -> &str {
            let name: &str = names.get(n).map_or("", |name| name);
            let len = name_file_len.get(n).copied().unwrap_or(name.len());
            name.get(..len).unwrap_or(name)
        };
        let mut texts: Vec<&str> = (0..names.len()).map(file_of).collect();
        texts.sort_unstable();
        texts.dedup();
        let whole: crate::hash::FxHashMap<&str, &Arc<str>> =
            names.iter().map(|name| (&***name, *name)).collect();
        let frames = texts
            .iter()
            .map(|&text| match whole.get(text) {
                Some(name) => Frame::new(Arc::clone(name), 0),
                None => Frame::new(text, 0),
            })
            .collect();
        let mut name_file = vec![NONE; names.len()];
        for n in 0..names.len() {
            let file = texts.binary_search(&file_of(n)).map_or(NONE, id);
            if let Some(slot) = name_file.get_mut(at(name_rank, id(n), NONE) as usize) {
                *slot = file;
            }
        }
        Files {
            frames,
            name_file: Some(name_file),
        }
    }
}
