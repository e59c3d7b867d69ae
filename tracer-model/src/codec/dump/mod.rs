//! tracer's own snapshot file format: versioned, compact, self-describing,
//! checksummed. Pure encode/decode of bytes; the store does the file I/O.
//!
//! Layout, version 3 (all integers little-endian; "varint" is unsigned
//! LEB128):
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic `\x89TRSNAP\n` |
//! | 2 | format version (3; 1 and 2 are read too) |
//! | 4 | header length H |
//! | H | header: a JSON object, see below |
//! | … | strings: count × (varint byte length, UTF-8 bytes) |
//! | … | frames: count × (varint filename string, varint lineno, flags byte, then if flag 1 varint function string, if flag 2 varint module string, if flag 4 varint address, if flag 8 varint site start, if flag 16 varint build id string) |
//! | … | tracebacks: count × (varint total_nframe + 1 or 0 for unknown, varint depth ≥ 1, depth × varint frame, most recent first) |
//! | … | traces: count × (varint domain, varint size in bytes, varint traceback, varint source) |
//! | 4 | CRC-32 (IEEE) of every byte before it |
//!
//! The header says what the body holds, so a reader needs nothing else:
//! `{"format": "tracer-snapshot", "version": 3, "traceback_limit": N,
//! "counts": {"strings": S, "frames": F, "tracebacks": T, "traces": N},
//! "sources": ["unknown", "glibc", ...], "layout": "...", "meta": {...}}`;
//! a trace's source is an index of `sources` (a name this reader does not
//! know reads as unknown). Version 1 had no source per trace: its traces
//! read with an unknown source. Version 3 added the frame flags 8 (where
//! the site starts in the filename of a frame with no line info, see
//! [`Frame::site`](crate::Frame::site)) and 16 (the module's build id);
//! versions 1 and 2 have neither (a frame's filename there is its file). `meta` is free-form (the store keeps
//! the snapshot's id, pid, label and times there, and its loss as
//! `complete`, `drops` and `drops_by_pid`: see
//! [`Completeness`](crate::Completeness)). A reader ignores keys it does not know
//! and treats a missing one as absent, so adding a key to `meta` needs no
//! new version: files written before drops were recorded read as complete.
//!
//! Equal strings, frames and tracebacks are written once; a decoded
//! snapshot shares them again (one `Arc` per distinct traceback).

mod decode;
mod encode;
#[cfg(test)]
mod tests;

use serde_json::Value;

use crate::codec::budget::OverBudget;
use crate::interrupt::Interrupted;
use crate::snapshot::Snapshot;

pub use decode::decode;
#[cfg(test)]
use decode::decode_with;
pub use encode::encode;

/// The first 8 bytes of every file.
pub const DUMP_MAGIC: [u8; 8] = *b"\x89TRSNAP\n";

/// The format version this code writes; it reads this one and every one
/// since [`DUMP_OLDEST_VERSION`].
pub const DUMP_VERSION: u16 = 3;

/// The oldest format version this code reads (1: no source per trace).
pub const DUMP_OLDEST_VERSION: u16 = 1;

const LAYOUT: &str = "strings: count x (varint len, utf8); frames: count x (varint filename, \
    varint lineno, u8 flags [1 function, 2 module, 4 address, 8 site start, 16 build id], varint \
    per flag); tracebacks: \
    count x (varint total_nframe+1 or 0, varint depth, depth x varint frame, most recent first); \
    traces: count x (varint domain, varint size, varint traceback, varint source index of the \
    header's sources); then crc32 (IEEE, LE) of all bytes before it";

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
        "tracer snapshot format version {found} is not supported (this tracerd reads versions {DUMP_OLDEST_VERSION} to {DUMP_VERSION})"
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
    /// Loading the file would take more memory than
    /// [`LOAD_BYTES_PER_INPUT_BYTE`](crate::LOAD_BYTES_PER_INPUT_BYTE)
    /// bytes per byte of it plus
    /// [`LOAD_BASE_BYTES`](crate::LOAD_BASE_BYTES): a count or repetition
    /// that expands in memory (say a traceback of millions of references
    /// to one frame). Nothing of it is kept.
    #[error("tracer snapshot refused: {0}")]
    OverBudget(#[from] OverBudget),
    /// The thread's interrupt check ([`crate::interrupt`]) stopped the
    /// decoding.
    #[error(transparent)]
    Interrupted(#[from] Interrupted),
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
