//! `Frame`, `Traceback` and `Trace`: one live block and where it was allocated.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};

use crate::hash::FxHasher;
use crate::text::format::format_size_f64;

mod frame;

pub use frame::{
    Frame, FrameExtra, SITE_FUNCTION_MARK, SITE_OFFSET_MARK, UNKNOWN_FILENAME, parse_site,
    site_name,
};

/// The stack of one allocation: tracemalloc's `Traceback`.
///
/// Frames are stored **most recent call first** (frame 0 is the call site
/// in the caller of the allocator), like the raw frames tracemalloc keeps;
/// Python's `Traceback` sequence shows them reversed, oldest first. There
/// is at most `traceback_limit` of them and always at least one: an empty
/// stack becomes `[<unknown>:0]`, as in `_tracemalloc`.
///
/// `total_nframe` is the depth of the stack before truncation to the
/// limit, when the capture knows it.
///
/// Equality and hashing use the frames only (not `total_nframe`), and the
/// ordering is tracemalloc's: frames compared oldest first, a traceback
/// that is a prefix of the other (from the oldest end) sorting first. That
/// ordering breaks the ties of `statistics()` and `compare_to()`.
///
/// JSON: an array of [`Frame`] objects, most recent call first.
#[derive(Clone, Debug)]
pub struct Traceback {
    /// Most recent first; never empty. Shared so that a statistic can reuse
    /// the frames of the traces it groups: the traceback is the frames
    /// `start..start + len` of this array.
    frames: Arc<[Frame]>,
    start: u32,
    len: u32,
    total_nframe: Option<u32>,
    /// Hash of the frames' `(filename, lineno)`, computed once.
    hash: u64,
}

impl Traceback {
    /// A traceback from `frames`, most recent call first. An empty `frames`
    /// becomes `[<unknown>:0]`. `total_nframe` is the stack's depth before
    /// truncation, if known.
    #[must_use]
    pub fn new(frames: Vec<Frame>, total_nframe: Option<u32>) -> Self {
        let frames: Arc<[Frame]> = if frames.is_empty() {
            Arc::from(vec![Frame::unknown()])
        } else {
            Arc::from(frames)
        };
        Traceback::from_shared(frames, total_nframe)
    }

    fn from_shared(frames: Arc<[Frame]>, total_nframe: Option<u32>) -> Self {
        let mut hasher = FxHasher::default();
        frames.hash(&mut hasher);
        let len = u32::try_from(frames.len()).unwrap_or(u32::MAX);
        Traceback {
            frames,
            start: 0,
            len,
            total_nframe,
            hash: hasher.finish(),
        }
    }

    /// A traceback over shared frames (most recent first); empty frames
    /// become `[<unknown>:0]` as in [`Traceback::new`].
    #[must_use]
    pub(crate) fn from_frames(frames: Arc<[Frame]>, total_nframe: Option<u32>) -> Self {
        if frames.is_empty() {
            return Traceback::new(Vec::new(), total_nframe);
        }
        Traceback::from_shared(frames, total_nframe)
    }

    /// The same frames (shared, with their hash: no pass over them) with
    /// `total_nframe`.
    #[must_use]
    pub(crate) fn with_total_nframe(&self, total_nframe: Option<u32>) -> Self {
        Traceback {
            total_nframe,
            ..self.clone()
        }
    }

    /// The traceback of one frame, as `statistics()` makes for the
    /// `lineno` and `filename` groups (no `total_nframe`).
    #[must_use]
    pub fn from_frame(frame: Frame) -> Self {
        Traceback::from_shared(Arc::from(vec![frame]), None)
    }

    /// The same frames without `total_nframe`: the traceback of a statistic
    /// grouped by traceback, as tracemalloc builds it. Shares the frames.
    #[must_use]
    pub(crate) fn without_total_nframe(&self) -> Self {
        Traceback {
            frames: Arc::clone(&self.frames),
            start: self.start,
            len: self.len,
            total_nframe: None,
            hash: self.hash,
        }
    }

    /// The one-frame traceback of `frames[index]`, with no `total_nframe`,
    /// sharing `frames` (no allocation): the traceback of a `lineno` or
    /// `filename` statistic, from the snapshot index's table of frames.
    /// `hash` must be the hash of `[frame]` (the index computes it once per
    /// frame). None if `index` is out of range.
    #[must_use]
    pub(crate) fn one_frame_of(frames: &Arc<[Frame]>, index: usize, hash: u64) -> Option<Self> {
        frames.get(index)?;
        Some(Traceback {
            frames: Arc::clone(frames),
            start: u32::try_from(index).ok()?,
            len: 1,
            total_nframe: None,
            hash,
        })
    }

    /// The hash of the one-frame traceback `[frame]`, for
    /// [`Traceback::one_frame_of`].
    #[must_use]
    pub(crate) fn one_frame_hash(frame: &Frame) -> u64 {
        let mut hasher = FxHasher::default();
        std::slice::from_ref(frame).hash(&mut hasher);
        hasher.finish()
    }

    /// Where cloning this traceback writes (the reference count of its
    /// frames), for a prefetch hint only: never dereferenced.
    pub(crate) fn clone_target(&self) -> *const i8 {
        // The counts of an `Arc` lie just before its data (two words).
        Arc::as_ptr(&self.frames)
            .cast::<i8>()
            .wrapping_sub(2 * size_of::<usize>())
    }

    /// The frames, most recent call first (at least one).
    #[must_use]
    pub fn frames(&self) -> &[Frame] {
        let start = self.start as usize;
        self.frames
            .get(start..start + self.len as usize)
            .unwrap_or(&[])
    }

    /// Whether both share the same frames (same array, same range).
    fn same_frames(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.frames, &other.frames)
            && self.start == other.start
            && self.len == other.len
    }

    /// Depth of the stack before truncation to `traceback_limit`, when known.
    #[must_use]
    pub fn total_nframe(&self) -> Option<u32> {
        self.total_nframe
    }

    /// Lines of `Traceback.format(limit, most_recent_first)` without source
    /// lines: `  File "src/a.c", line 12` per frame.
    ///
    /// Oldest frame first unless `most_recent_first`. A positive `limit`
    /// keeps the `limit` most recent frames; zero keeps none; a negative
    /// `limit` drops the `-limit` most recent frames; `None` keeps all.
    #[must_use]
    pub fn format(&self, limit: Option<i64>, most_recent_first: bool) -> Vec<String> {
        self.format_with(limit, most_recent_first, |_, _| String::new())
    }

    /// `Traceback.format(limit, most_recent_first)` with source lines:
    /// after each frame's line, `    <source line, stripped>` when
    /// `getline(filename, lineno)` (tracemalloc calls `linecache.getline`)
    /// gives a line that is not blank after Python's `str.strip()`.
    #[must_use]
    pub fn format_with(
        &self,
        limit: Option<i64>,
        most_recent_first: bool,
        mut getline: impl FnMut(&str, u32) -> String,
    ) -> Vec<String> {
        let frames = self.frames();
        let len = frames.len();
        let clamp = |n: u64| usize::try_from(n).map_or(len, |n| n.min(len));
        let selected = match limit {
            None => frames,
            // Python's `self[-limit:]`: the most recent `limit` frames.
            Some(limit) if limit > 0 => frames.get(..clamp(limit.unsigned_abs())).unwrap_or(&[]),
            // `self[:0]`: nothing.
            Some(0) => &[],
            // `self[:limit]`: all but the `-limit` most recent frames.
            Some(limit) => frames.get(clamp(limit.unsigned_abs())..).unwrap_or(&[]),
        };
        let mut lines = Vec::with_capacity(selected.len());
        let mut emit = |frame: &Frame| {
            lines.push(format!(
                "  File \"{}\", line {}",
                frame.filename, frame.lineno
            ));
            let source = getline(&frame.filename, frame.lineno);
            let source = source.trim_matches(is_python_space);
            if !source.is_empty() {
                lines.push(format!("    {source}"));
            }
        };
        if most_recent_first {
            selected.iter().for_each(&mut emit);
        } else {
            selected.iter().rev().for_each(&mut emit);
        }
        lines
    }
}

/// Python's `str.isspace()` for one character, which `str.strip()` uses:
/// Unicode White_Space plus the separators U+001C to U+001F.
#[must_use]
pub fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

impl PartialEq for Traceback {
    fn eq(&self, other: &Self) -> bool {
        self.same_frames(other) || (self.hash == other.hash && self.frames() == other.frames())
    }
}

impl Eq for Traceback {}

impl Hash for Traceback {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for Traceback {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// tracemalloc compares its `_frames` tuples, which are oldest first.
impl Ord for Traceback {
    fn cmp(&self, other: &Self) -> Ordering {
        if self.same_frames(other) {
            return Ordering::Equal;
        }
        self.frames().iter().rev().cmp(other.frames().iter().rev())
    }
}

/// `str(Traceback)`: the frame at index 0 of Python's sequence, which is
/// the **oldest** frame (tracemalloc has shown that one since 3.7).
impl fmt::Display for Traceback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.frames().last() {
            Some(frame) => frame.fmt(f),
            None => Frame::unknown().fmt(f),
        }
    }
}

impl Serialize for Traceback {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let frames = self.frames();
        let mut seq = serializer.serialize_seq(Some(frames.len()))?;
        for frame in frames {
            seq.serialize_element(frame)?;
        }
        seq.end()
    }
}

/// Serializes the traceback behind an `Arc` (serde's `rc` feature is off).
pub(crate) fn serialize_traceback<S: Serializer>(
    traceback: &Arc<Traceback>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    traceback.as_ref().serialize(serializer)
}

/// Where a block came from, tracer's addition to tracemalloc's `Trace`: the
/// allocator family whose probe recorded it (`glibc`, `musl`, `jemalloc`,
/// `tcmalloc`, `mimalloc`, `malloc`) or `mmap`; [`AllocatorFamily::UNKNOWN`] for a
/// trace read from a tracemalloc file or written before sources were kept.
/// Its code is what the kernel records (`AllocInfo::source`, the index of
/// its name in [`FAMILY_NAMES`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocatorFamily(pub u8);

/// The name of each [`AllocatorFamily`] code.
pub const FAMILY_NAMES: [&str; 8] = [
    "unknown", "glibc", "musl", "jemalloc", "tcmalloc", "mimalloc", "malloc", "mmap",
];

impl AllocatorFamily {
    /// Not known.
    pub const UNKNOWN: AllocatorFamily = AllocatorFamily(0);
    /// An anonymous mapping the program made itself (`mmap`): recorded
    /// whole, never sampled.
    pub const MMAP: AllocatorFamily = AllocatorFamily(7);

    /// The source recorded as `code` by the kernel (`AllocInfo::source`);
    /// unknown for a code out of range.
    #[must_use]
    pub fn from_code(code: u32) -> Self {
        u8::try_from(code)
            .ok()
            .filter(|c| usize::from(*c) < FAMILY_NAMES.len())
            .map_or(AllocatorFamily::UNKNOWN, AllocatorFamily)
    }

    /// The source named `name` (see [`AllocatorFamily::all`]), or None.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        FAMILY_NAMES
            .iter()
            .position(|n| *n == name)
            .and_then(|i| u8::try_from(i).ok())
            .map(AllocatorFamily)
    }

    /// Its name: `unknown`, `glibc`, `musl`, `jemalloc`, `tcmalloc`,
    /// `mimalloc`, `malloc` or `mmap`.
    #[must_use]
    pub fn name(self) -> &'static str {
        FAMILY_NAMES
            .get(usize::from(self.0))
            .copied()
            .unwrap_or("unknown")
    }

    /// Every name, in code order.
    #[must_use]
    pub fn all() -> &'static [&'static str] {
        &FAMILY_NAMES
    }

    /// Whether it is [`AllocatorFamily::UNKNOWN`].
    #[must_use]
    pub fn is_unknown(&self) -> bool {
        *self == AllocatorFamily::UNKNOWN
    }
}

impl fmt::Display for AllocatorFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for AllocatorFamily {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// One live memory block: tracemalloc's `Trace`, with where it came from.
///
/// JSON: `{"domain": 1234, "size": 256, "traceback": [frames...], "source":
/// "glibc"}` (`source` only when known).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Trace {
    /// Address space of the block: the pid of the traced process.
    pub domain: u32,
    /// Requested size of the block in bytes.
    pub size: u64,
    /// Stack of the allocation. Traces with the same stack should share one
    /// `Arc`: grouping is fastest when equal tracebacks are one allocation.
    #[serde(serialize_with = "serialize_traceback")]
    pub traceback: Arc<Traceback>,
    /// Where the block came from (not part of tracemalloc's `Trace`: its
    /// `str()`, statistics and pickles ignore it).
    #[serde(skip_serializing_if = "AllocatorFamily::is_unknown")]
    pub source: AllocatorFamily,
}

/// `str(Trace)`: `"<oldest frame>: <size>"`, e.g. `"a.c:3: 256 B"`.
impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // u64 -> f64 rounds as Python's int -> float does in `_format_size`.
        write!(
            f,
            "{}: {}",
            self.traceback,
            format_size_f64(self.size as f64, false)
        )
    }
}

/// The live blocks of one traceback in one domain from one source, as
/// totals: `count` blocks together `size` bytes (requested sizes). A
/// snapshot made of these ([`Snapshot::from_totals`](crate::Snapshot::from_totals))
/// answers `statistics()`, `compare_to()` and `filter_traces()` exactly as
/// one holding `count` traces of `traceback`, `domain` and `source` whose
/// sizes sum to `size`. Where they come from: the kernel's totals per
/// (image, stack) of a live process, or [`Snapshot::traceback_totals`](crate::Snapshot::traceback_totals).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TracebackTotals {
    /// Stack of the blocks. Groups with equal stacks should share one
    /// `Arc`, as traces should.
    pub traceback: Arc<Traceback>,
    /// Address space of the blocks: the pid of the traced process.
    pub domain: u32,
    /// Where the blocks came from.
    pub source: AllocatorFamily,
    /// Number of live blocks.
    pub count: u64,
    /// Their requested sizes summed, in bytes.
    pub size: u64,
}

/// What the engine reads of a snapshot's items, whether traces (one block
/// each) or [`TracebackTotals`] (`count` blocks).
pub(crate) trait Block {
    /// The stack of the item's blocks.
    fn traceback(&self) -> &Arc<Traceback>;
    /// The domain (pid) of the item's blocks.
    fn domain(&self) -> u32;
    /// The source of the item's blocks.
    fn source(&self) -> AllocatorFamily;
    /// Bytes and blocks of the item: `(size, count)`.
    fn size_count(&self) -> (u64, u64);
}

impl Block for Trace {
    #[inline]
    fn traceback(&self) -> &Arc<Traceback> {
        &self.traceback
    }
    #[inline]
    fn domain(&self) -> u32 {
        self.domain
    }
    #[inline]
    fn source(&self) -> AllocatorFamily {
        self.source
    }
    #[inline]
    fn size_count(&self) -> (u64, u64) {
        (self.size, 1)
    }
}

impl Block for TracebackTotals {
    #[inline]
    fn traceback(&self) -> &Arc<Traceback> {
        &self.traceback
    }
    #[inline]
    fn domain(&self) -> u32 {
        self.domain
    }
    #[inline]
    fn source(&self) -> AllocatorFamily {
        self.source
    }
    #[inline]
    fn size_count(&self) -> (u64, u64) {
        (self.size, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tb(frames: &[(&str, u32)]) -> Traceback {
        Traceback::new(
            frames.iter().map(|&(f, l)| Frame::new(f, l)).collect(),
            None,
        )
    }

    #[test]
    fn empty_traceback_becomes_unknown_frame() {
        let empty = Traceback::new(Vec::new(), Some(0));
        assert_eq!(empty.frames(), [Frame::unknown()]);
        assert_eq!(empty.to_string(), "<unknown>:0");
        assert_eq!(empty.total_nframe(), Some(0));
    }

    #[test]
    fn traceback_orders_oldest_frame_first_and_prefix_first() {
        // Most recent first in the constructor; compared oldest first.
        let a = tb(&[("z.c", 1), ("a.c", 1)]);
        let b = tb(&[("a.c", 9), ("b.c", 1)]);
        assert!(a < b, "oldest frames a.c:1 < b.c:1 decide");
        // [a.c:1] is a prefix (from the oldest end) of [a.c:1, z.c:1].
        let short = tb(&[("a.c", 1)]);
        assert!(short < a);
        assert_eq!(tb(&[("x.c", 1), ("a.c", 1)]).cmp(&a), Ordering::Less);
        let same = Traceback::new(a.frames().to_vec(), Some(7));
        assert_eq!(a, same, "total_nframe is not compared");
        assert_eq!(a.cmp(&same), Ordering::Equal);
    }

    #[test]
    fn traceback_displays_its_oldest_frame() {
        let t = tb(&[("a.c", 3), ("a.c", 1), ("b.c", 2), ("main.c", 7)]);
        assert_eq!(t.to_string(), "main.c:7");
    }

    #[test]
    fn traceback_format_applies_limits_like_python() {
        // Python order (oldest first): main.c:7, b.c:2, a.c:1, a.c:3
        let t = tb(&[("a.c", 3), ("a.c", 1), ("b.c", 2), ("main.c", 7)]);
        let line = |f: &str, l: u32| format!("  File \"{f}\", line {l}");
        assert_eq!(
            t.format(None, false),
            [
                line("main.c", 7),
                line("b.c", 2),
                line("a.c", 1),
                line("a.c", 3)
            ]
        );
        assert_eq!(t.format(Some(1), false), [line("a.c", 3)]);
        assert_eq!(t.format(Some(2), false), [line("a.c", 1), line("a.c", 3)]);
        assert_eq!(t.format(Some(2), true), [line("a.c", 3), line("a.c", 1)]);
        assert_eq!(t.format(Some(100), false).len(), 4);
        assert_eq!(t.format(Some(i64::MAX), true).len(), 4);
        assert!(t.format(Some(0), false).is_empty());
        assert_eq!(
            t.format(Some(-1), false),
            [line("main.c", 7), line("b.c", 2), line("a.c", 1)]
        );
        assert_eq!(
            t.format(Some(-3), true),
            [line("main.c", 7)],
            "negative limit drops the most recent frames"
        );
        assert!(t.format(Some(-4), false).is_empty());
        assert!(t.format(Some(i64::MIN), false).is_empty());
    }

    #[test]
    fn frame_and_traceback_serialize_as_documented() {
        let frame = Frame::new("a.c", 3).with_extra(FrameExtra {
            function: Some("alloc_node".into()),
            module: Some("/usr/bin/app".into()),
            address: Some(4096),
            build_id: None,
        });
        let t = Traceback::new(vec![frame, Frame::new("main.c", 7)], Some(9));
        let json = serde_json::to_value(&t).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!([
                {"filename": "a.c", "lineno": 3, "function": "alloc_node",
                 "module": "/usr/bin/app", "address": 4096},
                {"filename": "main.c", "lineno": 7}
            ])
        );
        let trace = Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 42,
            size: 10240,
            traceback: Arc::new(t),
        };
        assert_eq!(trace.to_string(), "main.c:7: 10.0 KiB");
        let json = serde_json::to_value(&trace).expect("serializes");
        assert_eq!(json["domain"], 42);
        assert_eq!(json["size"], 10240);
        assert_eq!(json["traceback"][1]["lineno"], 7);
    }
}
