//! tracer's own snapshot file format: versioned, compact, self-describing,
//! checksummed. Pure encode/decode of bytes; the store does the file I/O.
//!
//! Layout, version 1 (all integers little-endian; "varint" is unsigned
//! LEB128):
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic `\x89TRSNAP\n` |
//! | 2 | format version (1) |
//! | 4 | header length H |
//! | H | header: a JSON object, see below |
//! | … | strings: count × (varint byte length, UTF-8 bytes) |
//! | … | frames: count × (varint filename string, varint lineno, flags byte, then if flag 1 varint function string, if flag 2 varint module string, if flag 4 varint address) |
//! | … | tracebacks: count × (varint total_nframe + 1 or 0 for unknown, varint depth ≥ 1, depth × varint frame, most recent first) |
//! | … | traces: count × (varint domain, varint size in bytes, varint traceback) |
//! | 4 | CRC-32 (IEEE) of every byte before it |
//!
//! The header says what the body holds, so a reader needs nothing else:
//! `{"format": "tracer-snapshot", "version": 1, "traceback_limit": N,
//! "counts": {"strings": S, "frames": F, "tracebacks": T, "traces": N},
//! "layout": "...", "meta": {...}}`; `meta` is free-form (the store keeps
//! the snapshot's id, pid, label and times there, and its loss as
//! `complete`, `drops` and `drops_by_pid`: see
//! `crate::Completeness`). A reader ignores keys it does not know
//! and treats a missing one as absent, so adding a key to `meta` needs no
//! new version: files written before drops were recorded read as complete.
//!
//! Equal strings, frames and tracebacks are written once; a decoded
//! snapshot shares them again (one `Arc` per distinct traceback).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::hash::FxHashMap;
use super::snapshot::Snapshot;
use crate::engine::index::FrameHints;
use crate::trace::{Frame, FrameExtra, Trace, Traceback};

/// The first 8 bytes of every file.
pub const DUMP_MAGIC: [u8; 8] = *b"\x89TRSNAP\n";
/// The format version this code writes and reads.
pub const DUMP_VERSION: u16 = 1;

const LAYOUT: &str = "strings: count x (varint len, utf8); frames: count x (varint filename, \
    varint lineno, u8 flags [1 function, 2 module, 4 address], varint per flag); tracebacks: \
    count x (varint total_nframe+1 or 0, varint depth, depth x varint frame, most recent first); \
    traces: count x (varint domain, varint size, varint traceback); then crc32 (IEEE, LE) of all \
    bytes before it";

/// Why a dump file was refused. Every message says what is wrong and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    /// Shorter than the fixed parts.
    #[error("not a tracer snapshot: {len} bytes is too short (at least 18 are needed)")]
    TooShort {
        /// Length of the input.
        len: usize,
    },
    /// Does not start with [`DUMP_MAGIC`].
    #[error("not a tracer snapshot: wrong magic bytes{}", if *.pickle { " (this looks like a Python pickle: load it with format=tracemalloc)" } else { "" })]
    BadMagic {
        /// The input starts like a pickle.
        pickle: bool,
    },
    /// A version this code does not read.
    #[error(
        "tracer snapshot format version {found} is not supported (this tracerd reads version {DUMP_VERSION})"
    )]
    UnsupportedVersion {
        /// The file's version.
        found: u16,
    },
    /// The checksum does not match: the file is corrupt or truncated.
    #[error(
        "corrupt or truncated tracer snapshot: CRC-32 is {found:#010x}, the content gives {computed:#010x}"
    )]
    Checksum {
        /// Stored checksum.
        found: u32,
        /// Checksum of the content.
        computed: u32,
    },
    /// The header is not the JSON object described above.
    #[error("bad tracer snapshot header: {reason}")]
    Header {
        /// What is wrong.
        reason: String,
    },
    /// The body ends before a section does, or a value is out of range.
    #[error("bad tracer snapshot body in {section}: {reason}")]
    Body {
        /// strings, frames, tracebacks or traces.
        section: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// A decoded file: the snapshot and the header's `meta` object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// The traces.
    pub snapshot: Snapshot,
    /// Free-form metadata (`{}` if the file had none).
    pub meta: Value,
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's `crc32`).
#[must_use]
pub fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A frame as written: file name, line, function, module, address.
type FrameKey<'a> = (&'a str, u32, Option<&'a str>, Option<&'a str>, Option<u64>);

/// The string table being written, in order of first use.
#[derive(Default)]
struct Strings<'a> {
    list: Vec<&'a str>,
    index: HashMap<&'a str, u64>,
}

impl<'a> Strings<'a> {
    fn intern(&mut self, text: &'a str) -> u64 {
        if let Some(&i) = self.index.get(text) {
            return i;
        }
        let i = self.list.len() as u64;
        self.list.push(text);
        self.index.insert(text, i);
        i
    }
}

/// Encodes `snapshot` with `meta` (a JSON object) into the version-1 format.
#[must_use]
pub fn encode(snapshot: &Snapshot, meta: &Value) -> Vec<u8> {
    let mut strings = Strings::default();
    let mut frames_body = Vec::new();
    let mut frame_count = 0u64;
    let mut frame_index: HashMap<FrameKey<'_>, u64> = HashMap::new();
    let mut tracebacks_body = Vec::new();
    let mut traceback_count = 0u64;
    let mut by_pointer: FxHashMap<*const Traceback, u64> = FxHashMap::default();
    // Keyed by frame ids, so frames equal in file:line but not in their
    // extras (function, module, address) stay apart.
    let mut by_content: HashMap<(Vec<u64>, Option<u32>), u64> = HashMap::new();
    let mut traces_body = Vec::with_capacity(snapshot.traces.len() * 4);
    for trace in &snapshot.traces {
        let traceback: &Traceback = &trace.traceback;
        let pointer = Arc::as_ptr(&trace.traceback);
        let index = if let Some(&i) = by_pointer.get(&pointer) {
            i
        } else {
            let mut ids = Vec::with_capacity(traceback.frames().len());
            for frame in traceback.frames() {
                let extra = frame.extra.as_deref();
                let function = extra.and_then(|e| e.function.as_deref());
                let module = extra.and_then(|e| e.module.as_deref());
                let address = extra.and_then(|e| e.address);
                let key = (&*frame.filename, frame.lineno, function, module, address);
                let id = match frame_index.get(&key) {
                    Some(&id) => id,
                    None => {
                        put_varint(&mut frames_body, strings.intern(&frame.filename));
                        put_varint(&mut frames_body, u64::from(frame.lineno));
                        let flags = u8::from(function.is_some())
                            | (u8::from(module.is_some()) << 1)
                            | (u8::from(address.is_some()) << 2);
                        frames_body.push(flags);
                        if let Some(function) = function {
                            put_varint(&mut frames_body, strings.intern(function));
                        }
                        if let Some(module) = module {
                            put_varint(&mut frames_body, strings.intern(module));
                        }
                        if let Some(address) = address {
                            put_varint(&mut frames_body, address);
                        }
                        frame_index.insert(key, frame_count);
                        frame_count += 1;
                        frame_count - 1
                    }
                };
                ids.push(id);
            }
            let content = (ids, traceback.total_nframe());
            if let Some(&i) = by_content.get(&content) {
                by_pointer.insert(pointer, i);
                put_varint(&mut traces_body, u64::from(trace.domain));
                put_varint(&mut traces_body, trace.size);
                put_varint(&mut traces_body, i);
                continue;
            }
            let ids = &content.0;
            put_varint(
                &mut tracebacks_body,
                traceback.total_nframe().map_or(0, |n| u64::from(n) + 1),
            );
            put_varint(&mut tracebacks_body, ids.len() as u64);
            for &id in ids {
                put_varint(&mut tracebacks_body, id);
            }
            by_pointer.insert(pointer, traceback_count);
            by_content.insert(content, traceback_count);
            traceback_count += 1;
            traceback_count - 1
        };
        put_varint(&mut traces_body, u64::from(trace.domain));
        put_varint(&mut traces_body, trace.size);
        put_varint(&mut traces_body, index);
    }
    let header = json!({
        "format": "tracer-snapshot",
        "version": DUMP_VERSION,
        "traceback_limit": snapshot.traceback_limit,
        "counts": {
            "strings": strings.list.len(),
            "frames": frame_count,
            "tracebacks": traceback_count,
            "traces": snapshot.traces.len(),
        },
        "layout": LAYOUT,
        "meta": meta,
    });
    let header = header.to_string().into_bytes();
    let mut out = Vec::with_capacity(
        18 + header.len() + frames_body.len() + tracebacks_body.len() + traces_body.len(),
    );
    out.extend_from_slice(&DUMP_MAGIC);
    out.extend_from_slice(&DUMP_VERSION.to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(header.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(&header);
    for text in &strings.list {
        put_varint(&mut out, text.len() as u64);
        out.extend_from_slice(text.as_bytes());
    }
    out.extend_from_slice(&frames_body);
    out.extend_from_slice(&tracebacks_body);
    out.extend_from_slice(&traces_body);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

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

/// Decodes a version-1 file. Refuses (never panics on) anything that is
/// not one: wrong magic, other versions, bad checksum, bad header, indices
/// out of range, invalid UTF-8, values out of range, trailing bytes.
///
/// # Errors
/// [`DumpError`] saying what is wrong and where.
pub fn decode(bytes: &[u8]) -> Result<Decoded, DumpError> {
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
    if version != DUMP_VERSION {
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
    let header: Value = serde_json::from_slice(header_bytes).map_err(|e| DumpError::Header {
        reason: format!("not JSON: {e}"),
    })?;
    if header.get("format").and_then(Value::as_str) != Some("tracer-snapshot") {
        return Err(DumpError::Header {
            reason: "format is not \"tracer-snapshot\"".into(),
        });
    }
    if header_field(&header, &["version"])? != u64::from(DUMP_VERSION) {
        return Err(DumpError::Header {
            reason: "its version differs from the file's".into(),
        });
    }
    let limit = header_field(&header, &["traceback_limit"])?;
    let traceback_limit = u32::try_from(limit).map_err(|_| DumpError::Header {
        reason: format!("traceback_limit {limit} does not fit in 32 bits"),
    })?;
    let meta = header.get("meta").cloned().unwrap_or_else(|| json!({}));
    let mut r = Reader {
        bytes: content,
        at: 14 + header_len,
        section: "strings",
    };

    let n = count(&header, "strings")?;
    r.check_count(n, 1)?;
    let mut strings: Vec<Arc<str>> = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.varint()?;
        let raw = r.slice(len)?;
        let text = std::str::from_utf8(raw)
            .map_err(|e| r.fail(format!("string {} is not UTF-8: {e}", strings.len())))?;
        strings.push(super::intern::intern(text));
    }

    r.section = "frames";
    let n = count(&header, "frames")?;
    r.check_count(n, 3)?;
    let mut frames: Vec<Frame> = Vec::with_capacity(n);
    for _ in 0..n {
        let filename = strings
            .get(r.index("filename string", strings.len())?)
            .cloned()
            .unwrap_or_else(|| Arc::from(""));
        let lineno = r.u32("lineno")?;
        let flags = r.byte()?;
        if flags & !7 != 0 {
            return Err(r.fail(format!("unknown frame flags {flags:#x}")));
        }
        let string = |r: &mut Reader<'_>| -> Result<Arc<str>, DumpError> {
            let i = r.index("string", strings.len())?;
            Ok(strings.get(i).cloned().unwrap_or_else(|| Arc::from("")))
        };
        let function = if flags & 1 != 0 {
            Some(string(&mut r)?)
        } else {
            None
        };
        let module = if flags & 2 != 0 {
            Some(string(&mut r)?)
        } else {
            None
        };
        let address = if flags & 4 != 0 {
            Some(r.varint()?)
        } else {
            None
        };
        let extra = (flags != 0).then(|| {
            Arc::new(FrameExtra {
                function,
                module,
                address,
            })
        });
        frames.push(Frame {
            filename,
            lineno,
            extra,
        });
    }

    r.section = "tracebacks";
    let n = count(&header, "tracebacks")?;
    r.check_count(n, 2)?;
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
        let mut list = Vec::with_capacity(depth);
        for _ in 0..depth {
            let i = r.index("frame", frames.len())?;
            if let Some(frame) = frames.get(i) {
                list.push(frame.clone());
                hints.ids.push(u32::try_from(i).unwrap_or(u32::MAX));
            }
        }
        hints.spans.push((start, hints.ids.len()));
        tracebacks.push(Arc::new(Traceback::new(list, total_nframe)));
    }

    r.section = "traces";
    let n = count(&header, "traces")?;
    r.check_count(n, 3)?;
    let mut traces = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let domain = r.u32("domain")?;
        let size = r.varint()?;
        let i = r.index("traceback", tracebacks.len())?;
        if let Some(traceback) = tracebacks.get(i) {
            traces.push(Trace {
                domain,
                size,
                traceback: Arc::clone(traceback),
            });
            ids.push(u32::try_from(i).unwrap_or(u32::MAX));
        }
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (STYLE.md).
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn sample() -> Snapshot {
        let shared: Arc<str> = Arc::from("src/a.c");
        let rich = Frame {
            filename: Arc::clone(&shared),
            lineno: 12,
            extra: Some(Arc::new(FrameExtra {
                function: Some("alloc_node".into()),
                module: Some("/usr/bin/app".into()),
                address: Some(0x5555_0000_1234),
            })),
        };
        let a = Arc::new(Traceback::new(
            vec![rich.clone(), Frame::new("main.c", 7), rich],
            Some(9),
        ));
        let b = Arc::new(Traceback::new(vec![Frame::unknown()], None));
        Snapshot::new(
            vec![
                Trace {
                    domain: 42,
                    size: 256,
                    traceback: Arc::clone(&a),
                },
                Trace {
                    domain: 42,
                    size: u64::MAX,
                    traceback: b,
                },
                Trace {
                    domain: u32::MAX,
                    size: 0,
                    traceback: a,
                },
            ],
            16,
        )
    }

    #[test]
    fn round_trip_keeps_traces_extras_meta_and_sharing() {
        let snapshot = sample();
        let meta = json!({"id": 7, "label": "before"});
        let bytes = encode(&snapshot, &meta);
        assert_eq!(bytes.get(..8), Some(&DUMP_MAGIC[..]));
        let decoded = decode(&bytes).expect("decodes");
        assert_eq!(decoded.meta, meta);
        assert_eq!(decoded.snapshot, snapshot);
        assert_eq!(decoded.snapshot.traceback_limit(), 16);
        let traces = decoded.snapshot.traces();
        assert!(Arc::ptr_eq(&traces[0].traceback, &traces[2].traceback));
        assert_eq!(traces[0].traceback.total_nframe(), Some(9));
        assert_eq!(traces[1].traceback.total_nframe(), None);
        let extra = traces[0].traceback.frames()[0]
            .extra
            .clone()
            .expect("extra");
        assert_eq!(extra.function.as_deref(), Some("alloc_node"));
        assert_eq!(extra.module.as_deref(), Some("/usr/bin/app"));
        assert_eq!(extra.address, Some(0x5555_0000_1234));
        // Equal re-encoding: the format is deterministic.
        assert_eq!(encode(&decoded.snapshot, &decoded.meta), bytes);
    }

    #[test]
    fn equal_lines_with_other_extras_stay_apart() {
        let at = |address| {
            Frame::new("/usr/bin/grep", 0).with_extra(FrameExtra {
                function: None,
                module: Some("/usr/bin/grep".into()),
                address: Some(address),
            })
        };
        let one = Arc::new(Traceback::new(vec![at(0x10)], None));
        let two = Arc::new(Traceback::new(vec![at(0x20)], None));
        let snapshot = Snapshot::new(
            vec![
                Trace {
                    domain: 1,
                    size: 1,
                    traceback: one,
                },
                Trace {
                    domain: 1,
                    size: 2,
                    traceback: two,
                },
            ],
            1,
        );
        let decoded = decode(&encode(&snapshot, &json!({}))).expect("decodes");
        let addresses: Vec<Option<u64>> = decoded
            .snapshot
            .traces()
            .iter()
            .map(|t| {
                t.traceback.frames()[0]
                    .extra
                    .as_ref()
                    .and_then(|e| e.address)
            })
            .collect();
        assert_eq!(addresses, [Some(0x10), Some(0x20)]);
    }

    #[test]
    fn crc32_matches_zlib() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn corrupt_and_foreign_files_are_refused_with_reasons() {
        let bytes = encode(&sample(), &json!({}));
        let mut flipped = bytes.clone();
        flipped[30] ^= 0x40;
        assert!(matches!(decode(&flipped), Err(DumpError::Checksum { .. })));
        let mut version = bytes.clone();
        version[8] = 9;
        assert_eq!(
            decode(&version).unwrap_err().to_string(),
            "tracer snapshot format version 9 is not supported (this tracerd reads version 1)"
        );
        let pickle = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x0btracemalloc";
        assert_eq!(
            decode(pickle).unwrap_err().to_string(),
            "not a tracer snapshot: wrong magic bytes (this looks like a Python pickle: load it with format=tracemalloc)"
        );
        assert_eq!(decode(b"").unwrap_err(), DumpError::TooShort { len: 0 });
        for cut in 0..bytes.len() {
            assert!(
                decode(&bytes[..cut]).is_err(),
                "truncated at {cut} accepted"
            );
        }
    }

    /// A body that is well formed except for one lie, with a valid CRC, so
    /// the checks behind the checksum are exercised.
    fn with_crc(mut content: Vec<u8>) -> Vec<u8> {
        let crc = crc32(&content);
        content.extend_from_slice(&crc.to_le_bytes());
        content
    }

    fn file(header: &Value, body: &[u8]) -> Vec<u8> {
        let header = header.to_string().into_bytes();
        let mut out = DUMP_MAGIC.to_vec();
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(body);
        with_crc(out)
    }

    #[test]
    fn lying_headers_and_bad_indices_are_refused_behind_a_valid_checksum() {
        let counts = |s: u64, f: u64, t: u64, n: u64| {
            json!({"format": "tracer-snapshot", "version": 1, "traceback_limit": 1,
                   "counts": {"strings": s, "frames": f, "tracebacks": t, "traces": n}})
        };
        let huge = counts(u64::MAX, 0, 0, 0);
        assert!(matches!(
            decode(&file(&huge, &[])),
            Err(DumpError::Header { .. } | DumpError::Body { .. })
        ));
        let err = decode(&file(&counts(1000, 0, 0, 0), &[0])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad tracer snapshot body in strings: the header announces 1000 items but only 1 bytes are left"
        );
        // One string "a", one frame pointing at string 5.
        let body = [1, b'a', 5, 0, 0];
        let err = decode(&file(&counts(1, 1, 0, 0), &body)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad tracer snapshot body in frames: filename string index 5 out of range (there are 1)"
        );
        // Invalid UTF-8.
        let err = decode(&file(&counts(1, 0, 0, 0), &[1, 0xff])).unwrap_err();
        assert!(err.to_string().contains("string 0 is not UTF-8"), "{err}");
        // A traceback with no frame.
        let body = [1, b'a', 0, 0, 0, 0, 0];
        let err = decode(&file(&counts(1, 1, 1, 0), &body)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad tracer snapshot body in tracebacks: traceback 0 has no frame"
        );
        // Trailing bytes.
        let err = decode(&file(&counts(0, 0, 0, 0), &[7])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad tracer snapshot body in traces: 1 bytes after the last trace"
        );
        let err = decode(&file(&json!({"format": "other"}), &[])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad tracer snapshot header: format is not \"tracer-snapshot\""
        );
    }

    #[test]
    fn random_bytes_and_mutations_never_panic() {
        let mut rng = StdRng::seed_from_u64(5);
        let valid = encode(&sample(), &json!({"x": 1}));
        for _ in 0..20_000 {
            let mut bytes = if rng.random_bool(0.5) {
                valid.clone()
            } else {
                (0..rng.random_range(0..64)).map(|_| rng.random()).collect()
            };
            for _ in 0..rng.random_range(1..4) {
                if bytes.is_empty() {
                    break;
                }
                let at = rng.random_range(0..bytes.len());
                match rng.random_range(0..3) {
                    0 => bytes[at] = rng.random(),
                    1 => bytes.truncate(at),
                    _ => bytes.insert(at, rng.random()),
                }
            }
            // Re-seal some with a valid checksum so the body checks run.
            if bytes.len() > 4 && rng.random_bool(0.5) {
                let len = bytes.len() - 4;
                bytes.truncate(len);
                bytes = with_crc(bytes);
            }
            let _ = decode(&bytes);
        }
    }
}
