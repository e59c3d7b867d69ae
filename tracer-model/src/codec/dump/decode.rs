//! The reader of tracer's snapshot format (see the parent module for the
//! layout): every read is bounds-checked and names its section, and a
//! count in the header is checked against the bytes left before anything
//! is allocated for it.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{DUMP_MAGIC, DUMP_OLDEST_VERSION, DUMP_VERSION, Decoded, DumpError, crc32};
use crate::codec::budget::{Budget, cost};
use crate::codec::intern::intern;
use crate::engine::index::FrameHints;
use crate::snapshot::Snapshot;
use crate::trace::{AllocatorFamily, Frame, FrameExtra, Trace, Traceback};

/// Reads the body with bounds checks; every read names its section.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    section: &'static str,
}

impl<'a> Reader<'a> {
    fn fail(&self, reason: impl Into<String>) -> DumpError {
        DumpError::Body {
            section: self.section,
            reason: reason.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }

    fn byte(&mut self) -> Result<u8, DumpError> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| self.fail(format!("ends at byte {}", self.at)))?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DumpError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(self.fail(format!("varint over 64 bits at byte {}", self.at)));
            }
            value |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.fail(format!("varint over 64 bits at byte {}", self.at)))
    }

    fn u32(&mut self, what: &str) -> Result<u32, DumpError> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| self.fail(format!("{what} {v} does not fit in 32 bits")))
    }

    fn index(&mut self, what: &str, len: usize) -> Result<usize, DumpError> {
        let v = self.varint()?;
        match usize::try_from(v) {
            Ok(i) if i < len => Ok(i),
            _ => Err(self.fail(format!("{what} index {v} out of range (there are {len})"))),
        }
    }

    fn slice(&mut self, len: u64) -> Result<&'a [u8], DumpError> {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > self.remaining() {
            return Err(self.fail(format!(
                "a {len}-byte item at byte {} goes past the end",
                self.at
            )));
        }
        let out = self.bytes.get(self.at..self.at + len).unwrap_or(&[]);
        self.at += len;
        Ok(out)
    }

    /// A count from the header, checked against what is left (every item
    /// takes at least `min_bytes`), so that no huge allocation is made for
    /// a lying header.
    fn check_count(&self, count: usize, min_bytes: usize) -> Result<(), DumpError> {
        if count.saturating_mul(min_bytes) > self.remaining() {
            return Err(self.fail(format!(
                "the header announces {count} items but only {} bytes are left",
                self.remaining()
            )));
        }
        Ok(())
    }
}

fn header_field(header: &Value, path: &[&str]) -> Result<u64, DumpError> {
    let mut value = header;
    for key in path {
        value = value.get(key).ok_or_else(|| DumpError::Header {
            reason: format!("missing {}", path.join(".")),
        })?;
    }
    value.as_u64().ok_or_else(|| DumpError::Header {
        reason: format!("{} is not a whole number", path.join(".")),
    })
}

fn count(header: &Value, name: &str) -> Result<usize, DumpError> {
    let n = header_field(header, &["counts", name])?;
    usize::try_from(n).map_err(|_| DumpError::Header {
        reason: format!("counts.{name} {n} is too large"),
    })
}

/// The header's `sources` (version 2): the writer's source names, each as
/// this reader knows it (a name it does not know is unknown).
fn header_sources(header: &Value) -> Result<Vec<AllocatorFamily>, DumpError> {
    let bad = || DumpError::Header {
        reason: "sources is not a list of at most 256 names".into(),
    };
    let list = header
        .get("sources")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    if list.len() > 256 {
        return Err(bad());
    }
    list.iter()
        .map(|name| {
            let name = name.as_str().ok_or_else(bad)?;
            Ok(AllocatorFamily::from_name(name).unwrap_or(AllocatorFamily::UNKNOWN))
        })
        .collect()
}

/// Decodes a file of a version from [`DUMP_OLDEST_VERSION`] to
/// [`DUMP_VERSION`]. Refuses (never panics on) anything that is not one:
/// wrong magic, other versions, bad checksum, bad header, indices out of
/// range, invalid UTF-8, values out of range, trailing bytes, and a file
/// whose decoding would take more memory than
/// [`LOAD_BYTES_PER_INPUT_BYTE`](crate::LOAD_BYTES_PER_INPUT_BYTE) bytes
/// per byte of it plus [`LOAD_BASE_BYTES`](crate::LOAD_BASE_BYTES)
/// (see `tracer-model/src/codec/budget.rs`); its time is linear in its size.
///
/// # Errors
/// [`DumpError`] saying what is wrong and where;
/// [`DumpError::OverBudget`] past the memory bound;
/// [`DumpError::Interrupted`] when the thread's interrupt check
/// ([`crate::interrupt`]) says to stop.
pub fn decode(bytes: &[u8]) -> Result<Decoded, DumpError> {
    decode_with(bytes, &mut Budget::for_input(bytes.len()))
}

/// [`decode`], charging what it materialises to `budget`.
pub(crate) fn decode_with(bytes: &[u8], budget: &mut Budget) -> Result<Decoded, DumpError> {
    let Header {
        version,
        json: header,
        content,
        header_len,
        traceback_limit,
        meta,
        sources,
    } = read_header(bytes, budget)?;
    let mut r = Reader {
        bytes: content,
        at: 14 + header_len,
        section: "strings",
    };
    let strings = read_strings(&mut r, &header, budget)?;
    r.section = "frames";
    let frames = read_frames(&mut r, &header, version, &strings, budget)?;
    r.section = "tracebacks";
    let (tracebacks, hints) = read_tracebacks(&mut r, &header, &frames, budget)?;
    r.section = "traces";
    let (traces, ids) = read_traces(&mut r, &header, version, &sources, &tracebacks, budget)?;
    if r.remaining() != 0 {
        return Err(r.fail(format!("{} bytes after the last trace", r.remaining())));
    }
    Ok(Decoded {
        // The file's traceback table is the interning when its writer
        // numbered tracebacks by first appearance (this one does).
        snapshot: Snapshot::with_interned(traces, traceback_limit, tracebacks, ids, hints),
        meta,
    })
}

/// A file's header, checked (magic, version, checksum, JSON), and what it
/// says.
struct Header<'a> {
    version: u16,
    json: Value,
    /// The file but its checksum: the header, then the body from byte
    /// `14 + header_len`.
    content: &'a [u8],
    header_len: usize,
    traceback_limit: u32,
    meta: Value,
    /// The writer's sources, by their numbers in the file (version 2 on).
    sources: Vec<AllocatorFamily>,
}

/// Checks the file `bytes` up to its body and reads its header (charged to
/// `budget`).
fn read_header<'a>(bytes: &'a [u8], budget: &mut Budget) -> Result<Header<'a>, DumpError> {
    if bytes.len() < 18 {
        if !bytes.is_empty() && !bytes.starts_with(&DUMP_MAGIC[..bytes.len().min(8)]) {
            return Err(DumpError::BadMagic {
                pickle: bytes.first() == Some(&0x80),
            });
        }
        return Err(DumpError::TooShort { len: bytes.len() });
    }
    if bytes.get(..8) != Some(&DUMP_MAGIC[..]) {
        return Err(DumpError::BadMagic {
            pickle: bytes.first() == Some(&0x80),
        });
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if !(DUMP_OLDEST_VERSION..=DUMP_VERSION).contains(&version) {
        return Err(DumpError::UnsupportedVersion { found: version });
    }
    let (content, stored) = bytes.split_at(bytes.len() - 4);
    let found = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
    let computed = crc32(content);
    if found != computed {
        return Err(DumpError::Checksum { found, computed });
    }
    let header_len = u32::from_le_bytes([bytes[10], bytes[11], bytes[12], bytes[13]]) as usize;
    let header_bytes = content
        .get(14..14usize.saturating_add(header_len))
        .ok_or_else(|| DumpError::Header {
            reason: format!("its length {header_len} goes past the end of the file"),
        })?;
    budget.charge_n(header_bytes.len(), cost::HEADER_BYTE, || {
        format!("its {}-byte header", header_bytes.len())
    })?;
    let header: Value = serde_json::from_slice(header_bytes).map_err(|e| DumpError::Header {
        reason: format!("not JSON: {e}"),
    })?;
    if header.get("format").and_then(Value::as_str) != Some("tracer-snapshot") {
        return Err(DumpError::Header {
            reason: "format is not \"tracer-snapshot\"".into(),
        });
    }
    if header_field(&header, &["version"])? != u64::from(version) {
        return Err(DumpError::Header {
            reason: "its version differs from the file's".into(),
        });
    }
    let limit = header_field(&header, &["traceback_limit"])?;
    let traceback_limit = u32::try_from(limit).map_err(|_| DumpError::Header {
        reason: format!("traceback_limit {limit} does not fit in 32 bits"),
    })?;
    let meta = header.get("meta").cloned().unwrap_or_else(|| json!({}));
    let sources = if version >= 2 {
        header_sources(&header)?
    } else {
        Vec::new()
    };
    Ok(Header {
        version,
        json: header,
        content,
        header_len,
        traceback_limit,
        meta,
        sources,
    })
}

/// The strings section: the header's count of strings, each interned.
fn read_strings(
    r: &mut Reader<'_>,
    header: &Value,
    budget: &mut Budget,
) -> Result<Vec<Arc<str>>, DumpError> {
    let n = count(header, "strings")?;
    r.check_count(n, 1)?;
    budget.charge_n(n, size_of::<Arc<str>>() as u64, || {
        format!("its {n} strings")
    })?;
    let mut strings: Vec<Arc<str>> = Vec::with_capacity(n);
    for _ in 0..n {
        budget.tick()?;
        let len = r.varint()?;
        let raw = r.slice(len)?;
        budget.charge((raw.len() as u64).saturating_mul(2) + cost::STRING, || {
            format!("string {} of the strings section", strings.len())
        })?;
        let text = std::str::from_utf8(raw)
            .map_err(|e| r.fail(format!("string {} is not UTF-8: {e}", strings.len())))?;
        strings.push(intern(text));
    }
    Ok(strings)
}

/// The frames section, of a file of `version`: each frame names its file
/// and extras by their number in `strings`.
fn read_frames(
    r: &mut Reader<'_>,
    header: &Value,
    version: u16,
    strings: &[Arc<str>],
    budget: &mut Budget,
) -> Result<Vec<Frame>, DumpError> {
    let n = count(header, "frames")?;
    r.check_count(n, 3)?;
    budget.charge_n(n, cost::FRAME, || format!("its {n} frames"))?;
    let mut frames: Vec<Frame> = Vec::with_capacity(n);
    for _ in 0..n {
        budget.tick()?;
        let filename = strings
            .get(r.index("filename string", strings.len())?)
            .cloned()
            .unwrap_or_else(|| Arc::from(""));
        let lineno = r.u32("lineno")?;
        let flags = r.byte()?;
        // Flags 8 and 16 came with version 3.
        let known = if version >= 3 { 31 } else { 7 };
        if flags & !known != 0 {
            return Err(r.fail(format!("unknown frame flags {flags:#x}")));
        }
        let string = |r: &mut Reader<'_>| -> Result<Arc<str>, DumpError> {
            let i = r.index("string", strings.len())?;
            Ok(strings.get(i).cloned().unwrap_or_else(|| Arc::from("")))
        };
        let function = if flags & 1 != 0 {
            Some(string(r)?)
        } else {
            None
        };
        let module = if flags & 2 != 0 {
            Some(string(r)?)
        } else {
            None
        };
        let address = if flags & 4 != 0 {
            Some(r.varint()?)
        } else {
            None
        };
        let site_start = if flags & 8 != 0 {
            Some(r.varint()?)
        } else {
            None
        };
        let build_id = if flags & 16 != 0 {
            Some(string(r)?)
        } else {
            None
        };
        if flags & !8 != 0 {
            budget.charge(cost::FRAME_EXTRA, || {
                format!("frame {} of the frames section", frames.len())
            })?;
        }
        // A site start that is not inside the name leaves a frame without
        // a site (`Frame::with_site`): still the same frame.
        let frame = match site_start {
            Some(start) if lineno == 0 => {
                Frame::with_site(filename, usize::try_from(start).unwrap_or(0))
            }
            Some(_) => return Err(r.fail(format!("frame {} has a line and a site", frames.len()))),
            None => Frame::new(filename, lineno),
        };
        let extra = FrameExtra {
            function,
            module,
            address,
            build_id,
        };
        frames.push(if extra == FrameExtra::default() {
            frame
        } else {
            frame.with_extra(extra)
        });
    }
    Ok(frames)
}

/// The tracebacks section: each traceback by the numbers of its `frames`;
/// with the file's numbers kept for the snapshot's index.
fn read_tracebacks(
    r: &mut Reader<'_>,
    header: &Value,
    frames: &[Frame],
    budget: &mut Budget,
) -> Result<(Vec<Arc<Traceback>>, FrameHints), DumpError> {
    let n = count(header, "tracebacks")?;
    r.check_count(n, 2)?;
    budget.charge_n(n, cost::TRACEBACK, || format!("its {n} tracebacks"))?;
    let mut tracebacks: Vec<Arc<Traceback>> = Vec::with_capacity(n);
    // The file's frame numbers, for the snapshot's index.
    let mut hints = FrameHints {
        spans: Vec::with_capacity(n),
        ids: Vec::new(),
        count: frames.len(),
    };
    for _ in 0..n {
        let total = r.varint()?;
        let total_nframe = match total {
            0 => None,
            t => Some(u32::try_from(t - 1).map_err(|_| r.fail("total_nframe over 32 bits"))?),
        };
        let start = hints.ids.len();
        let depth = r.varint()?;
        if depth == 0 {
            return Err(r.fail(format!("traceback {} has no frame", tracebacks.len())));
        }
        let depth = usize::try_from(depth).unwrap_or(usize::MAX);
        r.check_count(depth, 1)?;
        // Every frame of it is a copy of a table frame: charged before
        // anything is allocated (the numbers' vector by its growth).
        budget.charge_n(depth, cost::FRAME_REF, || {
            format!(
                "traceback {} of the tracebacks section ({depth} frames)",
                tracebacks.len()
            )
        })?;
        budget.grow(&mut hints.ids, depth, || {
            format!("traceback {} of the tracebacks section", tracebacks.len())
        })?;
        for _ in 0..depth {
            budget.tick()?;
            let i = r.index("frame", frames.len())?;
            hints.ids.push(u32::try_from(i).unwrap_or(u32::MAX));
        }
        let numbers = hints.ids.get(start..).unwrap_or(&[]);
        // Collected from an exact-size iterator: one allocation, no copy.
        let list: Arc<[Frame]> = numbers
            .iter()
            .map(|&i| {
                frames
                    .get(i as usize)
                    .cloned()
                    .unwrap_or_else(Frame::unknown)
            })
            .collect();
        hints.spans.push((start, hints.ids.len()));
        tracebacks.push(Arc::new(Traceback::from_frames(list, total_nframe)));
    }
    Ok((tracebacks, hints))
}

/// The traces section, of a file of `version`: each trace names its
/// traceback in `tracebacks` and (version 2 on) its source in `sources`.
/// The traces, and each one's traceback number.
fn read_traces(
    r: &mut Reader<'_>,
    header: &Value,
    version: u16,
    sources: &[AllocatorFamily],
    tracebacks: &[Arc<Traceback>],
    budget: &mut Budget,
) -> Result<(Vec<Trace>, Vec<u32>), DumpError> {
    let n = count(header, "traces")?;
    r.check_count(n, if version >= 2 { 4 } else { 3 })?;
    budget.charge_n(n, cost::TRACE, || format!("its {n} traces"))?;
    let mut traces = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        budget.tick()?;
        let domain = r.u32("domain")?;
        let size = r.varint()?;
        let i = r.index("traceback", tracebacks.len())?;
        let source = if version >= 2 {
            let s = r.index("source", sources.len())?;
            sources.get(s).copied().unwrap_or(AllocatorFamily::UNKNOWN)
        } else {
            AllocatorFamily::UNKNOWN
        };
        if let Some(traceback) = tracebacks.get(i) {
            traces.push(Trace {
                source,
                domain,
                size,
                traceback: Arc::clone(traceback),
            });
            ids.push(u32::try_from(i).unwrap_or(u32::MAX));
        }
    }
    Ok((traces, ids))
}
