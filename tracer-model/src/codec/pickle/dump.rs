//! `dump_tracemalloc`: a protocol-4 pickle that Python's
//! `tracemalloc.Snapshot.load()` reads into an equal snapshot.

use std::collections::HashMap;
use std::sync::Arc;

use crate::hash::FxHashMap;
use crate::snapshot::Snapshot;
use crate::trace::Traceback;

/// Writes pickle opcodes with a memo numbered in order, as Python does.
struct Writer {
    out: Vec<u8>,
    memo_len: u32,
}

impl Writer {
    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo_len += 1;
        self.memo_len - 1
    }

    fn get(&mut self, index: u32) {
        if let Ok(small) = u8::try_from(index) {
            self.out.extend_from_slice(&[b'h', small]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&index.to_le_bytes());
        }
    }

    fn str(&mut self, text: &str) {
        let len = text.len();
        if let Ok(short) = u8::try_from(len) {
            self.out.extend_from_slice(&[0x8c, short]);
        } else if let Ok(long) = u32::try_from(len) {
            self.out.push(b'X');
            self.out.extend_from_slice(&long.to_le_bytes());
        } else {
            self.out.push(0x8d);
            self.out.extend_from_slice(&(len as u64).to_le_bytes());
        }
        self.out.extend_from_slice(text.as_bytes());
    }

    /// Python's `save_long` for protocol 2 and later.
    fn int(&mut self, value: u64) {
        if let Ok(v) = u8::try_from(value) {
            self.out.extend_from_slice(&[b'K', v]);
        } else if let Ok(v) = u16::try_from(value) {
            self.out.push(b'M');
            self.out.extend_from_slice(&v.to_le_bytes());
        } else if value <= 0x7fff_ffff {
            self.out.push(b'J');
            self.out.extend_from_slice(&(value as u32).to_le_bytes());
        } else {
            // LONG1: little-endian two's complement, one more byte than
            // bit_length // 8 so the sign bit is clear.
            let bits = 64 - value.leading_zeros() as usize;
            let n = (bits >> 3) + 1;
            self.out.extend_from_slice(&[0x8a, n as u8]);
            let bytes = u128::from(value).to_le_bytes();
            self.out.extend_from_slice(bytes.get(..n).unwrap_or(&bytes));
        }
    }
}

/// Writes `snapshot` as Python's `Snapshot.dump()` would (protocol 4, which
/// every Python since 3.4 reads): `tracemalloc.Snapshot` with
/// `traces = tracemalloc._Traces([(domain, size, frames, total_nframe),
/// ...])` and `traceback_limit`. Equal strings, frames and tracebacks are
/// written once and referenced through the memo.
#[must_use]
pub fn dump_tracemalloc(snapshot: &Snapshot) -> Vec<u8> {
    // A snapshot of totals as equivalent traces (`Snapshot::from_totals`).
    let traces = snapshot.dump_traces();
    let mut w = Writer {
        out: Vec::with_capacity(64 + traces.len() * 16),
        memo_len: 0,
    };
    w.out.extend_from_slice(&[0x80, 4]);
    w.str("tracemalloc");
    let module = w.memoize();
    w.str("Snapshot");
    w.memoize();
    w.out.push(0x93);
    w.memoize();
    w.out.extend_from_slice(&[b')', 0x81]);
    w.memoize();
    w.out.push(b'}');
    w.memoize();
    w.out.push(b'(');
    w.str("traces");
    w.memoize();
    w.get(module);
    w.str("_Traces");
    w.memoize();
    w.out.push(0x93);
    w.memoize();
    w.out.extend_from_slice(&[b')', 0x81]);
    w.memoize();
    w.out.push(b'}');
    w.memoize();
    w.str("_traces");
    w.memoize();
    w.out.push(b']');
    w.memoize();

    let mut names: HashMap<&str, u32> = HashMap::new();
    let mut frames: HashMap<(&str, u32), u32> = HashMap::new();
    let mut tracebacks: FxHashMap<*const Traceback, u32> = FxHashMap::default();
    let mut by_content: HashMap<&Traceback, u32> = HashMap::new();
    for batch in traces.chunks(1000) {
        w.out.push(b'(');
        for trace in batch {
            w.out.push(b'(');
            w.int(u64::from(trace.domain));
            w.int(trace.size);
            let pointer = Arc::as_ptr(&trace.traceback);
            let traceback: &Traceback = &trace.traceback;
            match tracebacks
                .get(&pointer)
                .or_else(|| by_content.get(traceback))
            {
                Some(&index) => w.get(index),
                None => {
                    let list = traceback.frames();
                    if list.len() > 3 {
                        w.out.push(b'(');
                    }
                    for frame in list {
                        match frames.get(&(&*frame.filename, frame.lineno)) {
                            Some(&index) => w.get(index),
                            None => {
                                match names.get(&*frame.filename) {
                                    Some(&index) => w.get(index),
                                    None => {
                                        w.str(&frame.filename);
                                        let index = w.memoize();
                                        names.insert(&frame.filename, index);
                                    }
                                }
                                w.int(u64::from(frame.lineno));
                                w.out.push(0x86);
                                let index = w.memoize();
                                frames.insert((&frame.filename, frame.lineno), index);
                            }
                        }
                    }
                    match list.len() {
                        1 => w.out.push(0x85),
                        2 => w.out.push(0x86),
                        3 => w.out.push(0x87),
                        _ => w.out.push(b't'),
                    }
                    let index = w.memoize();
                    tracebacks.insert(pointer, index);
                    by_content.insert(traceback, index);
                }
            }
            match trace.traceback.total_nframe() {
                Some(n) => w.int(u64::from(n)),
                None => w.out.push(b'N'),
            }
            w.out.push(b't');
            w.memoize();
        }
        w.out.push(b'e');
    }
    // _Traces.__dict__['_traces'] = list; BUILD
    w.out.extend_from_slice(b"sb");
    w.str("traceback_limit");
    w.memoize();
    w.int(u64::from(snapshot.traceback_limit));
    w.out.extend_from_slice(b"ub.");
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_python_ints_as_save_long_does() {
        let cases: [(u64, &[u8]); 7] = [
            (0, b"K\x00"),
            (255, b"K\xff"),
            (256, b"M\x00\x01"),
            (65_536, b"J\x00\x00\x01\x00"),
            (0x7fff_ffff, b"J\xff\xff\xff\x7f"),
            (0x8000_0000, b"\x8a\x05\x00\x00\x00\x80\x00"),
            (u64::MAX, b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00"),
        ];
        for (value, bytes) in cases {
            let mut w = Writer {
                out: Vec::new(),
                memo_len: 0,
            };
            w.int(value);
            assert_eq!(w.out, bytes, "{value}");
        }
    }
}
