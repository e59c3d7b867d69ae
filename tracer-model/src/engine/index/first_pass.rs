//! Step 1 of [`Index::build`](super::Index::build): one pass over the
//! arcs numbers their frames by first appearance (by a loader's hints, or
//! by the address of the file name and the line, and by text only the
//! first time either is seen) and their file names (whole, sites
//! included), records each frame's representatives, and hashes each arc's
//! frame ids.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::engine::index::{NONE, address, id};
use crate::engine::table::{AHEAD, Table, prefetch};
use crate::hash::{FxHashMap, FxHasher};
use crate::trace::{Frame, Traceback};

/// The frame numbers a loader knows: for each arc (in the order of the
/// [`Interned`](super::Interned) it comes with), a number per frame, most recent first, in
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
pub(super) struct SeenFrame {
    /// Its file name's id (in `FirstPass::names`).
    pub(super) name: u32,
    pub(super) lineno: u32,
    /// The frame at its first occurrence.
    pub(super) first: Frame,
    /// The frame at its first occurrence as the most recent frame.
    pub(super) top: Option<Frame>,
}

/// The first pass of [`Index::build`](super::Index::build): frames
/// numbered by first appearance, each arc's frame ids (most recent first)
/// and their hash.
pub(super) struct FirstPass<'a> {
    arcs: &'a [Arc<Traceback>],
    by_text: FxHashMap<(&'a str, u32), u32>,
    name_ids: FxHashMap<&'a str, u32>,
    /// The distinct file names (`Frame::filename`, a site included), in
    /// order of first appearance.
    pub(super) names: Vec<&'a Arc<str>>,
    /// Per name: the length of its file ([`Frame::file`]) in the first
    /// frame seen with it; the name's length when it has no site.
    pub(super) name_file_len: Vec<usize>,
    /// Whether some name has a site (a file shorter than the name).
    pub(super) any_site: bool,
    pub(super) frames: Vec<SeenFrame>,
    /// Per frame: whether it was seen as the most recent frame (dense, for
    /// a check per arc).
    on_top: Vec<bool>,
    pub(super) arc_start: Vec<usize>,
    pub(super) arc_frames: Vec<u32>,
    pub(super) arc_hash: Vec<u64>,
}

impl<'a> FirstPass<'a> {
    pub(super) fn new(arcs: &'a [Arc<Traceback>]) -> Self {
        let mut arc_start = Vec::with_capacity(arcs.len() + 1);
        arc_start.push(0);
        FirstPass {
            arcs,
            by_text: FxHashMap::default(),
            name_ids: FxHashMap::default(),
            names: Vec::new(),
            name_file_len: Vec::new(),
            any_site: false,
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
            let next_name = id(self.names.len());
            let name = *self.name_ids.entry(&*frame.filename).or_insert(next_name);
            if name == next_name {
                self.names.push(&frame.filename);
                let file_len = frame.file().len();
                self.any_site |= file_len < frame.filename.len();
                self.name_file_len.push(file_len);
            }
            self.frames.push(SeenFrame {
                name,
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

    /// Appends frame `frame_id`, at `position` of arc `a`, to that arc's
    /// frames (the top frame also marks the frame as seen on top).
    #[inline]
    fn push_frame(&mut self, a: usize, position: usize, frame_id: u32) {
        if position == 0 {
            self.top(frame_id, a);
        }
        self.arc_frames.push(frame_id);
    }

    /// Ends the current arc: its frame ids are those pushed since its
    /// start; records their hash and where the next arc starts.
    fn end_arc(&mut self) {
        let start = self.arc_start.last().copied().unwrap_or(0);
        let ids = self.arc_frames.get(start..).unwrap_or(&[]);
        let mut hasher = FxHasher::default();
        ids.hash(&mut hasher);
        self.arc_hash.push(hasher.finish());
        self.arc_start.push(self.arc_frames.len());
    }

    /// Without hints: frames looked up by address.
    pub(super) fn run(&mut self) {
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
    pub(super) fn run_with_hints(&mut self, hints: &FrameHints) -> bool {
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
