//! `Frame`: one call site of a stack, tracemalloc's `Frame`, and
//! [`FrameExtra`], what symbolization knows of it beyond that.
//!
//! A frame's identity is its code location: two different places in the
//! code are never one frame. With line info a frame is `(filename,
//! lineno)`, exactly as in tracemalloc. A frame with no line info (a
//! stripped binary) is named, at line 0, by where its code is; that name
//! is its `filename`, so equality, hashing, ordering, `str()`, the JSON and
//! the pickle all tell such frames apart and name them the same way:
//!
//! - `FILE!FUNCTION+0xOFFSET` when the function is known (from the ELF
//!   symbol tables or DWARF): `OFFSET` is the return address's offset from
//!   the function's start, e.g. `/usr/bin/node!NodeArrayBufferAllocator::Allocate(unsigned long)+0x1f`;
//! - `FILE+0xOFFSET` when it is not: `OFFSET` is the return address's
//!   offset in the module's file, e.g. `/usr/bin/node+0x1a2b30`.
//!
//! `OFFSET` is lowercase hexadecimal without leading zeros. Both offsets
//! are the same in every process and run of one binary (never an absolute
//! address: ASLR). `FILE` is the module's path (or, when the debug info
//! names a source file but no line, that file): the frame's
//! [`file`](Frame::file), what `group_by=filename` groups by and what
//! filter patterns match. The rest is its [`site`](Frame::site).
//!
//! `str(frame)` stays `filename:lineno` (`/usr/bin/node+0x1a2b30:0`): what
//! CPython's tracemalloc prints for the same frame read from tracer's
//! pickle, which holds the name as the file name.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

/// File name of the frame used when nothing is known about a call site,
/// as tracemalloc names it.
pub const UNKNOWN_FILENAME: &str = "<unknown>";

/// Between the file and the function in the name of a frame with no line
/// info (`FILE!FUNCTION+0xOFFSET`).
pub const SITE_FUNCTION_MARK: char = '!';

/// Before the hexadecimal offset in the name of a frame with no line info
/// (`FILE!FUNCTION+0xOFFSET`, `FILE+0xOFFSET`).
pub const SITE_OFFSET_MARK: &str = "+0x";

/// One call site of a stack: tracemalloc's `Frame`.
///
/// `filename` and `lineno` come from the DWARF line info of the return
/// address minus one (inlined calls are frames of their own); with no line
/// info the frame is named by its site (see the module docs:
/// `FILE!FUNCTION+0xOFFSET` or `FILE+0xOFFSET`, lineno 0); with nothing at
/// all it is [`Frame::unknown`] (`<unknown>:0`).
///
/// Equality, hashing and ordering use `(filename, lineno)` only, ordered as
/// tracemalloc orders frames: by file name (Unicode code points, which is
/// the byte order of UTF-8), then line number. A site is part of the
/// filename, so frames at two sites are two frames, ordered as CPython
/// orders them in a pickle. Where the site starts and `extra` are carried
/// along and never compared.
///
/// JSON: `{"filename": "src/a.c", "lineno": 12}` plus `"file"` (the part
/// of the filename before the site) for a frame with a site, and
/// `"function"`, `"module"`, `"address"` and `"build_id"` when
/// [`FrameExtra`] has them.
#[derive(Clone, Debug)]
pub struct Frame {
    /// Source file path as found in the debug info; for a frame with no
    /// line info, its name `FILE!FUNCTION+0xOFFSET` or `FILE+0xOFFSET`;
    /// `<unknown>` when nothing is known.
    pub filename: Arc<str>,
    /// Line number in `filename`, 0 when unknown.
    pub lineno: u32,
    /// Byte index in `filename` where the site starts; 0: no site.
    site_start: u32,
    /// Symbolization details that tracemalloc does not have.
    pub extra: Option<Arc<FrameExtra>>,
}

/// What symbolization knows about a frame beyond `file:line`.
///
/// Serialized flattened into the [`Frame`]'s JSON object; absent fields are
/// omitted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FrameExtra {
    /// Name of the function containing the call site (demangled), if known.
    pub function: Option<Arc<str>>,
    /// Path of the mapped object file (executable or shared library).
    pub module: Option<Arc<str>>,
    /// Return address in the traced process's address space.
    pub address: Option<u64>,
    /// The module's GNU build id (its `.note.gnu.build-id`, lowercase
    /// hexadecimal), when it has one: with it a debug file can be found
    /// (debuginfod, `/usr/lib/debug/.build-id/`) to turn a site into a line.
    pub build_id: Option<Arc<str>>,
}

/// The name of a frame with no line info: `FILE!FUNCTION+0xOFFSET`, or
/// `FILE+0xOFFSET` without a function (an empty function is none).
#[must_use]
pub fn site_name(file: &str, function: Option<&str>, offset: u64) -> String {
    match function.filter(|f| !f.is_empty()) {
        Some(function) => {
            format!("{file}{SITE_FUNCTION_MARK}{function}{SITE_OFFSET_MARK}{offset:x}")
        }
        None => format!("{file}{SITE_OFFSET_MARK}{offset:x}"),
    }
}

/// Where the site starts in `name`, if `name` has the form of a site name
/// (see the module docs): it ends in `+0x` and lowercase hex digits without
/// leading zeros (at most 16), and what comes before is `FILE!FUNCTION`
/// (split at the first `!`; neither part empty) or a non-empty `FILE`.
#[must_use]
pub fn parse_site(name: &str) -> Option<usize> {
    let (head, hex) = name.rsplit_once(SITE_OFFSET_MARK)?;
    let digits_ok = !hex.is_empty()
        && hex.len() <= 16
        && !(hex.len() > 1 && hex.starts_with('0'))
        && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !digits_ok || head.is_empty() {
        return None;
    }
    match head.find(SITE_FUNCTION_MARK) {
        // A function after the file: neither is empty.
        Some(mark) => (mark > 0 && mark + 1 < head.len()).then_some(mark),
        None => Some(head.len()),
    }
}

impl Frame {
    /// A frame `filename:lineno` with no site and no extra details.
    #[must_use]
    pub fn new(filename: impl Into<Arc<str>>, lineno: u32) -> Self {
        Frame {
            filename: filename.into(),
            lineno,
            site_start: 0,
            extra: None,
        }
    }

    /// tracemalloc's unknown frame, `<unknown>:0`.
    #[must_use]
    pub fn unknown() -> Self {
        Frame::new(UNKNOWN_FILENAME, 0)
    }

    /// The frame with no line info at `offset` in `function` of `file`
    /// (`FILE!FUNCTION+0xOFFSET`), or with no function at `offset` in the
    /// module's file (`FILE+0xOFFSET`); line 0.
    #[must_use]
    pub fn without_line(file: &str, function: Option<&str>, offset: u64) -> Self {
        Frame::with_site(Arc::from(site_name(file, function, offset)), file.len())
    }

    /// The frame named `name` (a [`site_name`]) at line 0, its site starting
    /// at byte `site_start` of it (the length of its file). A `site_start`
    /// that is not inside `name` (0, or at or past its end) or not at a
    /// character boundary gives a frame with no site, named `name` all the
    /// same.
    #[must_use]
    pub fn with_site(name: Arc<str>, site_start: usize) -> Self {
        let valid = site_start > 0 && site_start < name.len() && name.is_char_boundary(site_start);
        Frame {
            site_start: if valid {
                u32::try_from(site_start).unwrap_or(0)
            } else {
                0
            },
            ..Frame::new(name, 0)
        }
    }

    /// A frame read from tracemalloc's `(filename, lineno)` (a pickle): at
    /// line 0, a filename of the form of a site name ([`parse_site`]) is
    /// read as one, so that the file of a frame tracer wrote is its file
    /// again. Equality does not depend on it.
    #[must_use]
    pub fn from_tracemalloc(filename: Arc<str>, lineno: u32) -> Self {
        match parse_site(&filename) {
            Some(start) if lineno == 0 => Frame::with_site(filename, start),
            _ => Frame::new(filename, lineno),
        }
    }

    /// The same frame with `extra` attached.
    #[must_use]
    pub fn with_extra(mut self, extra: FrameExtra) -> Self {
        self.extra = Some(Arc::new(extra));
        self
    }

    /// Where the site starts in `filename`, for a frame with no line info
    /// named by its site; None for any other frame.
    #[must_use]
    pub fn site_start(&self) -> Option<usize> {
        let start = self.site_start as usize;
        (start > 0
            && self.lineno == 0
            && start < self.filename.len()
            && self.filename.is_char_boundary(start))
        .then_some(start)
    }

    /// The file of the frame: `filename` without its site (the module's
    /// path of `/usr/bin/node!f+0x1f`), else all of `filename`. What
    /// `group_by=filename` groups by.
    #[must_use]
    pub fn file(&self) -> &str {
        match self.site_start() {
            Some(start) => self.filename.get(..start).unwrap_or(&self.filename),
            None => &self.filename,
        }
    }

    /// The site of a frame with no line info: `!FUNCTION+0xOFFSET` or
    /// `+0xOFFSET`, the end of its `filename`; None for other frames.
    #[must_use]
    pub fn site(&self) -> Option<&str> {
        self.site_start()
            .and_then(|start| self.filename.get(start..))
    }

    /// The function its site names (`FUNCTION` of `!FUNCTION+0xOFFSET`),
    /// if any.
    #[must_use]
    pub fn site_function(&self) -> Option<&str> {
        let site = self.site()?.strip_prefix(SITE_FUNCTION_MARK)?;
        site.rsplit_once(SITE_OFFSET_MARK)
            .map(|(function, _)| function)
    }

    /// The offset its site names: from the function's start, or with no
    /// function in the module's file.
    #[must_use]
    pub fn site_offset(&self) -> Option<u64> {
        let (_, hex) = self.site()?.rsplit_once(SITE_OFFSET_MARK)?;
        u64::from_str_radix(hex, 16).ok()
    }
}

impl PartialEq for Frame {
    fn eq(&self, other: &Self) -> bool {
        self.lineno == other.lineno
            && (Arc::ptr_eq(&self.filename, &other.filename) || self.filename == other.filename)
    }
}

impl Eq for Frame {}

impl Hash for Frame {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.filename.hash(state);
        self.lineno.hash(state);
    }
}

impl PartialOrd for Frame {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Frame {
    fn cmp(&self, other: &Self) -> Ordering {
        let filename = if Arc::ptr_eq(&self.filename, &other.filename) {
            Ordering::Equal
        } else {
            self.filename.cmp(&other.filename)
        };
        filename.then(self.lineno.cmp(&other.lineno))
    }
}

/// `filename:lineno`, as `str(Frame)`.
impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.filename, self.lineno)
    }
}

impl Serialize for Frame {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let extra = self.extra.as_deref();
        let file = self.site_start().map(|_| self.file());
        let function = extra.and_then(|e| e.function.as_deref());
        let module = extra.and_then(|e| e.module.as_deref());
        let address = extra.and_then(|e| e.address);
        let build_id = extra.and_then(|e| e.build_id.as_deref());
        let len = 2
            + usize::from(file.is_some())
            + usize::from(function.is_some())
            + usize::from(module.is_some())
            + usize::from(address.is_some())
            + usize::from(build_id.is_some());
        let mut map = serializer.serialize_map(Some(len))?;
        map.serialize_entry("filename", &*self.filename)?;
        map.serialize_entry("lineno", &self.lineno)?;
        if let Some(file) = file {
            map.serialize_entry("file", file)?;
        }
        if let Some(function) = function {
            map.serialize_entry("function", function)?;
        }
        if let Some(module) = module {
            map.serialize_entry("module", module)?;
        }
        if let Some(address) = address {
            map.serialize_entry("address", &address)?;
        }
        if let Some(build_id) = build_id {
            map.serialize_entry("build_id", build_id)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_displays_and_orders_by_filename_then_lineno() {
        assert_eq!(Frame::new("src/a.c", 12).to_string(), "src/a.c:12");
        assert_eq!(Frame::unknown().to_string(), "<unknown>:0");
        let mut frames = [
            Frame::new("b.c", 1),
            Frame::new("a.c", 10),
            Frame::new("a.c", 2),
            Frame::new("B.c", 99),
            Frame::new("<unknown>", 0),
            Frame::new("é.c", 0),
        ];
        frames.sort();
        let shown: Vec<String> = frames.iter().map(Frame::to_string).collect();
        assert_eq!(
            shown,
            ["<unknown>:0", "B.c:99", "a.c:2", "a.c:10", "b.c:1", "é.c:0"]
        );
    }

    #[test]
    fn frame_equality_ignores_extra() {
        let plain = Frame::new("a.c", 1);
        let rich = Frame::new("a.c", 1).with_extra(FrameExtra {
            function: Some("f".into()),
            address: Some(0x1234),
            ..FrameExtra::default()
        });
        assert_eq!(plain, rich);
        assert_eq!(plain.cmp(&rich), Ordering::Equal);
    }

    #[test]
    fn frames_without_line_are_named_by_function_and_offset_or_module_offset() {
        let a = Frame::without_line("/usr/bin/node", Some("Alloc::New(unsigned long)"), 0x1f);
        assert_eq!(
            a.filename.as_ref(),
            "/usr/bin/node!Alloc::New(unsigned long)+0x1f"
        );
        assert_eq!(
            a.to_string(),
            "/usr/bin/node!Alloc::New(unsigned long)+0x1f:0"
        );
        assert_eq!(a.lineno, 0);
        assert_eq!(a.file(), "/usr/bin/node");
        assert_eq!(a.site(), Some("!Alloc::New(unsigned long)+0x1f"));
        assert_eq!(a.site_function(), Some("Alloc::New(unsigned long)"));
        assert_eq!(a.site_offset(), Some(0x1f));
        let m = Frame::without_line("/usr/bin/node", None, 0x1a_2b30);
        assert_eq!(m.to_string(), "/usr/bin/node+0x1a2b30:0");
        assert_eq!(m.file(), "/usr/bin/node");
        assert_eq!(m.site(), Some("+0x1a2b30"));
        assert_eq!(m.site_function(), None);
        assert_eq!(m.site_offset(), Some(0x1a_2b30));
        assert_eq!(
            Frame::without_line("/a", Some(""), 0).to_string(),
            "/a+0x0:0"
        );
        // A frame with a line has no site; its file is its filename.
        let lined = Frame::new("/src/a.c", 3);
        assert_eq!((lined.file(), lined.site()), ("/src/a.c", None));
    }

    #[test]
    fn two_sites_of_one_module_are_two_frames_ordered_by_their_names() {
        let f = |function: Option<&str>, offset| Frame::without_line("/bin/app", function, offset);
        let one = f(Some("alloc_a"), 0x10);
        assert_ne!(one, f(Some("alloc_a"), 0x20), "other offset");
        assert_ne!(one, f(Some("alloc_b"), 0x10), "other function");
        assert_ne!(f(None, 0x10), f(None, 0x20), "other module offset");
        assert_ne!(one, Frame::new("/bin/app", 0), "not the module's line 0");
        assert_eq!(one, f(Some("alloc_a"), 0x10));
        let hash = |frame: &Frame| {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            frame.hash(&mut hasher);
            hasher.finish()
        };
        assert_eq!(hash(&one), hash(&f(Some("alloc_a"), 0x10)));
        // Ordered as their names are, as CPython orders them in a pickle:
        // '!' (0x21) < '+' (0x2b) < '.' (0x2e).
        let mut frames = [
            Frame::new("/bin/app.c", 1),
            f(None, 0x10),
            f(Some("alloc_b"), 0x10),
            f(Some("alloc_a"), 0x20),
            Frame::new("/bin/app", 0),
        ];
        frames.sort();
        let shown: Vec<String> = frames.iter().map(Frame::to_string).collect();
        assert_eq!(
            shown,
            [
                "/bin/app:0",
                "/bin/app!alloc_a+0x20:0",
                "/bin/app!alloc_b+0x10:0",
                "/bin/app+0x10:0",
                "/bin/app.c:1"
            ]
        );
    }

    #[test]
    fn tracemalloc_names_of_sites_are_read_back_as_sites() {
        let read = |name: &str, lineno| Frame::from_tracemalloc(Arc::from(name), lineno);
        let f = read("/usr/bin/node!operator!=(A const&)+0x1f", 0);
        assert_eq!(f.file(), "/usr/bin/node");
        assert_eq!(f.site_function(), Some("operator!=(A const&)"));
        assert_eq!(f.site_offset(), Some(0x1f));
        assert_eq!(
            f,
            Frame::without_line("/usr/bin/node", Some("operator!=(A const&)"), 0x1f)
        );
        let m = read("/lib/x.so+0x10", 0);
        assert_eq!((m.file(), m.site_offset()), ("/lib/x.so", Some(0x10)));
        // Not site names: a line, no offset, bad digits, empty parts.
        for (name, lineno) in [
            ("/lib/x.so+0x10", 3),
            ("/lib/x.so", 0),
            ("/lib/x.so+0x", 0),
            ("/lib/x.so+0x1F", 0),
            ("/lib/x.so+0x010", 0),
            ("/lib/x.so+0x12345678901234567", 0),
            ("+0x10", 0),
            ("!f+0x10", 0),
            ("/lib/x.so!+0x10", 0),
            ("a.py", 0),
        ] {
            let frame = read(name, lineno);
            assert_eq!((frame.file(), frame.site()), (name, None), "{name}");
        }
    }

    #[test]
    fn a_site_start_outside_the_name_is_no_site() {
        // "/é" is 3 bytes (é is 2, from byte 1), the name 9.
        for start in [0, 2, 3, 9, 100] {
            let frame = Frame::with_site(Arc::from("/é!f+0x1"), start);
            let valid = start == 3;
            assert_eq!(frame.site().is_some(), valid, "start {start}");
            assert_eq!(frame.filename.as_ref(), "/é!f+0x1");
        }
        let mut frame = Frame::with_site(Arc::from("/a!f+0x1"), 2);
        frame.lineno = 7;
        assert_eq!(frame.site(), None, "a frame with a line has no site");
        assert_eq!(frame.file(), "/a!f+0x1");
    }

    #[test]
    fn frames_serialize_their_file_and_build_id() {
        let frame = Frame::without_line("/bin/app", Some("f"), 0x10).with_extra(FrameExtra {
            function: Some("f".into()),
            module: Some("/bin/app".into()),
            address: Some(4096),
            build_id: Some("8a2f".into()),
        });
        assert_eq!(
            serde_json::to_value(&frame).expect("serializes"),
            serde_json::json!({"filename": "/bin/app!f+0x10", "lineno": 0, "file": "/bin/app",
                "function": "f", "module": "/bin/app", "address": 4096, "build_id": "8a2f"})
        );
        assert_eq!(
            serde_json::to_value(Frame::new("a.c", 1)).expect("serializes"),
            serde_json::json!({"filename": "a.c", "lineno": 1})
        );
    }
}
