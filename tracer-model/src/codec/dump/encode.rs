//! The writer of tracer's snapshot format (see the parent module for the
//! layout): equal strings, frames and tracebacks are written once, in
//! order of first use, so the output is deterministic.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{DUMP_MAGIC, DUMP_VERSION, LAYOUT, crc32};
use crate::hash::FxHashMap;
use crate::snapshot::Snapshot;
use crate::trace::{AllocatorFamily, Frame, Trace, Traceback};

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A frame as written: file name, line, function, module, address, site
/// start, build id.
type FrameKey<'a> = (
    &'a str,
    u32,
    Option<&'a str>,
    Option<&'a str>,
    Option<u64>,
    Option<usize>,
    Option<&'a str>,
);

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

/// The frame table being written, in order of first use: each distinct
/// frame once.
#[derive(Default)]
struct Frames<'a> {
    body: Vec<u8>,
    count: u64,
    index: HashMap<FrameKey<'a>, u64>,
}

impl<'a> Frames<'a> {
    /// The number of `frame` in the table, written now (its strings
    /// interned in `strings`) if it is new.
    fn id(&mut self, frame: &'a Frame, strings: &mut Strings<'a>) -> u64 {
        let extra = frame.extra.as_deref();
        let function = extra.and_then(|e| e.function.as_deref());
        let module = extra.and_then(|e| e.module.as_deref());
        let address = extra.and_then(|e| e.address);
        let site_start = frame.site_start();
        let build_id = extra.and_then(|e| e.build_id.as_deref());
        let key = (
            &*frame.filename,
            frame.lineno,
            function,
            module,
            address,
            site_start,
            build_id,
        );
        match self.index.get(&key) {
            Some(&id) => id,
            None => {
                put_varint(&mut self.body, strings.intern(&frame.filename));
                put_varint(&mut self.body, u64::from(frame.lineno));
                let flags = u8::from(function.is_some())
                    | (u8::from(module.is_some()) << 1)
                    | (u8::from(address.is_some()) << 2)
                    | (u8::from(site_start.is_some()) << 3)
                    | (u8::from(build_id.is_some()) << 4);
                self.body.push(flags);
                if let Some(function) = function {
                    put_varint(&mut self.body, strings.intern(function));
                }
                if let Some(module) = module {
                    put_varint(&mut self.body, strings.intern(module));
                }
                if let Some(address) = address {
                    put_varint(&mut self.body, address);
                }
                if let Some(start) = site_start {
                    put_varint(&mut self.body, start as u64);
                }
                if let Some(build_id) = build_id {
                    put_varint(&mut self.body, strings.intern(build_id));
                }
                self.index.insert(key, self.count);
                self.count += 1;
                self.count - 1
            }
        }
    }
}

/// Writes one trace to the traces section: its domain, size, traceback
/// number `index` and source.
fn put_trace(out: &mut Vec<u8>, trace: &Trace, index: u64) {
    put_varint(out, u64::from(trace.domain));
    put_varint(out, trace.size);
    put_varint(out, index);
    put_varint(out, u64::from(trace.source.0));
}

/// Encodes `snapshot` with `meta` (a JSON object) into the format of
/// [`DUMP_VERSION`].
#[must_use]
pub fn encode(snapshot: &Snapshot, meta: &Value) -> Vec<u8> {
    // A snapshot of totals as equivalent traces (`Snapshot::from_totals`).
    let traces = snapshot.dump_traces();
    let mut strings = Strings::default();
    let mut frames = Frames::default();
    let mut tracebacks_body = Vec::new();
    let mut traceback_count = 0u64;
    let mut by_pointer: FxHashMap<*const Traceback, u64> = FxHashMap::default();
    // Keyed by frame ids, so frames equal in file:line but not in their
    // extras (function, module, address) stay apart.
    let mut by_content: HashMap<(Vec<u64>, Option<u32>), u64> = HashMap::new();
    let mut traces_body = Vec::with_capacity(traces.len() * 4);
    for trace in traces.iter() {
        let traceback: &Traceback = &trace.traceback;
        let pointer = Arc::as_ptr(&trace.traceback);
        let index = if let Some(&i) = by_pointer.get(&pointer) {
            i
        } else {
            let mut ids = Vec::with_capacity(traceback.frames().len());
            for frame in traceback.frames() {
                ids.push(frames.id(frame, &mut strings));
            }
            let content = (ids, traceback.total_nframe());
            if let Some(&i) = by_content.get(&content) {
                by_pointer.insert(pointer, i);
                put_trace(&mut traces_body, trace, i);
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
        put_trace(&mut traces_body, trace, index);
    }
    let header = json!({
        "format": "tracer-snapshot",
        "version": DUMP_VERSION,
        "traceback_limit": snapshot.traceback_limit,
        "counts": {
            "strings": strings.list.len(),
            "frames": frames.count,
            "tracebacks": traceback_count,
            "traces": traces.len(),
        },
        "sources": AllocatorFamily::all(),
        "layout": LAYOUT,
        "meta": meta,
    });
    let header = header.to_string().into_bytes();
    let mut out = Vec::with_capacity(
        18 + header.len() + frames.body.len() + tracebacks_body.len() + traces_body.len(),
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
    out.extend_from_slice(&frames.body);
    out.extend_from_slice(&tracebacks_body);
    out.extend_from_slice(&traces_body);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}
