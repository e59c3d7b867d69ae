//! Automatic snapshots kept compactly in memory ([`Compact`]): a snapshot
//! of one process taken every minute holds nearly the same blocks, with the
//! same tracebacks, as the one before it. Whole, each held its own copy of
//! every traceback and 32 bytes per trace plus 4 of index (about 36 MB per
//! snapshot of 1 M live blocks); compact, it holds
//!
//! - its traces grouped by (traceback, domain, source, size), one group
//!   per distinct tuple with its count, as unsigned LEB128 varints (a few
//!   bytes per group, not per trace), and
//! - one pointer per distinct traceback, to an `Arc<Traceback>` shared with
//!   every other automatic snapshot of the same process image through the
//!   image's [`Interner`].
//!
//! [`Compact::decode`] gives the snapshot back, equal to the one stored as
//! a multiset of traces (traces of one group come out together: a
//! snapshot's traces are in no particular order), its tracebacks (and so
//! their frames) shared with the other snapshots of the image.
use std::{
    collections::{HashMap, hash_map::Entry},
    hash::{Hash, Hasher},
    sync::Arc,
};

use tracer_model::{AllocatorFamily, Snapshot, Trace, Traceback};

/// A traceback as the interner compares it: its frames with everything
/// symbolization knows of them (function, module, address: two frames at
/// one `file:line` may be two call sites), and its depth before
/// truncation. [`Traceback`]'s own equality looks at `file:line` only.
#[derive(Clone, Debug)]
struct Exact(Arc<Traceback>);

impl PartialEq for Exact {
    fn eq(&self, other: &Self) -> bool {
        if Arc::ptr_eq(&self.0, &other.0) {
            return true;
        }
        let (a, b) = (self.0.frames(), other.0.frames());
        self.0.total_nframe() == other.0.total_nframe()
            && a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| x == y && x.extra == y.extra)
    }
}

impl Eq for Exact {}

impl Hash for Exact {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.0.total_nframe().hash(state);
    }
}

/// The tracebacks of one process image's automatic snapshots, one `Arc`
/// per distinct traceback. Those no stored snapshot uses any more are
/// forgotten when the table has doubled since its last purge.
#[derive(Debug, Default)]
pub(super) struct Interner {
    map: HashMap<Exact, ()>,
    purged_at: usize,
}

impl Interner {
    /// The shared `Arc` equal to `traceback` (it becomes the shared one if
    /// none is known yet).
    fn intern(&mut self, traceback: &Arc<Traceback>) -> Arc<Traceback> {
        match self.map.entry(Exact(Arc::clone(traceback))) {
            Entry::Occupied(e) => Arc::clone(&e.key().0),
            Entry::Vacant(e) => {
                e.insert(());
                Arc::clone(traceback)
            }
        }
    }

    /// Drops the tracebacks only the table holds, once it has doubled
    /// since the last purge (and holds at least 1024).
    fn purge_if_grown(&mut self) {
        if self.map.len() >= 1024 && self.map.len() >= 2 * self.purged_at {
            self.map.retain(|k, ()| Arc::strong_count(&k.0) > 1);
            self.purged_at = self.map.len();
        }
    }

    /// Distinct tracebacks held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }
}

/// A snapshot kept compactly; cheap to clone (two `Arc`s).
#[derive(Clone, Debug)]
pub(super) struct Compact {
    /// The distinct tracebacks, in order of first appearance, shared
    /// through the image's [`Interner`].
    tracebacks: Arc<[Arc<Traceback>]>,
    /// Per group: varints traceback index, domain, source code, size in
    /// bytes, count of traces.
    groups: Arc<[u8]>,
    traceback_limit: u32,
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The next varint of `bytes` from `*at`; None at the end or on a varint
/// that does not end (never in what [`put_varint`] wrote).
fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

impl Compact {
    /// `snapshot` grouped and its tracebacks interned in `interner`.
    pub(super) fn new(snapshot: &Snapshot, interner: &mut Interner) -> Self {
        let mut index_of: HashMap<*const Traceback, u64> = HashMap::new();
        let mut tracebacks: Vec<Arc<Traceback>> = Vec::new();
        let mut groups: HashMap<(u64, u32, u8, u64), u64> = HashMap::new();
        let mut order: Vec<(u64, u32, u8, u64)> = Vec::new();
        for trace in snapshot.traces() {
            let tb = *index_of
                .entry(Arc::as_ptr(&trace.traceback))
                .or_insert_with(|| {
                    tracebacks.push(interner.intern(&trace.traceback));
                    tracebacks.len() as u64 - 1
                });
            let key = (tb, trace.domain, trace.source.0, trace.size);
            let count = groups.entry(key).or_insert_with(|| {
                order.push(key);
                0
            });
            *count += 1;
        }
        let mut bytes = Vec::with_capacity(order.len() * 6);
        for key in order {
            let (tb, domain, source, size) = key;
            put_varint(&mut bytes, tb);
            put_varint(&mut bytes, domain.into());
            put_varint(&mut bytes, source.into());
            put_varint(&mut bytes, size);
            put_varint(&mut bytes, groups.get(&key).copied().unwrap_or(0));
        }
        interner.purge_if_grown();
        Self {
            tracebacks: tracebacks.into(),
            groups: bytes.into(),
            traceback_limit: snapshot.traceback_limit(),
        }
    }

    /// The snapshot back, its tracebacks the shared ones.
    pub(super) fn decode(&self) -> Snapshot {
        let mut traces = Vec::new();
        let mut at = 0;
        let bytes = &self.groups[..];
        while at < bytes.len() {
            let mut next = || get_varint(bytes, &mut at);
            let (Some(tb), Some(domain), Some(source), Some(size), Some(count)) =
                (next(), next(), next(), next(), next())
            else {
                break;
            };
            let Some(traceback) = usize::try_from(tb)
                .ok()
                .and_then(|i| self.tracebacks.get(i))
            else {
                continue;
            };
            let trace = Trace {
                domain: u32::try_from(domain).unwrap_or(u32::MAX),
                size,
                traceback: Arc::clone(traceback),
                source: AllocatorFamily::from_code(u32::try_from(source).unwrap_or(0)),
            };
            let count = usize::try_from(count).unwrap_or(0);
            traces.extend(std::iter::repeat_n(trace, count));
        }
        Snapshot::new(traces, self.traceback_limit)
    }

    /// Bytes this snapshot holds of its own: its groups and a pointer per
    /// distinct traceback (the tracebacks are shared, and not counted).
    pub(super) fn bytes(&self) -> u64 {
        (self.groups.len() + self.tracebacks.len() * size_of::<usize>()) as u64
    }
}
