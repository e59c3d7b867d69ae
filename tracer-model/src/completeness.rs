//! [`Completeness`]: whether a snapshot's data is every live block with
//! its whole traceback, and the loss per process when it is not. Every
//! statistics, compare and traces answer and every snapshot file carries
//! one.
use std::collections::BTreeMap;

use serde::{Serialize, ser::SerializeStruct as _};
use serde_json::Value;

/// Whether a snapshot's data is complete, and the loss when it is not:
/// events (allocations) of its processes lost since their tracing began
/// because a kernel map was full (`drops`: the traces undercount), and
/// blocks recorded with a cut traceback (`cut_tracebacks`: their stack was
/// not stored, or its walk stopped for want of mappings or readable memory,
/// so their tracebacks are shorter than the stack was, one frame at worst).
/// With neither, the traces are every live block, each with its whole
/// traceback (to nframe).
///
/// The one shape every response and snapshot file uses: serialized as
/// `{"complete": bool, "drops": N, "drops_by_pid": {"PID": N, ...},
/// "cut_tracebacks": N, "cut_tracebacks_by_pid": {"PID": N, ...}}`, where
/// the `_by_pid` maps list only processes with such a loss (so `{}` when
/// complete).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Completeness {
    /// Drops in all, summed over the processes.
    drops: u64,
    /// Drops of each process that had any.
    by_pid: BTreeMap<u32, u64>,
    /// Blocks with a cut traceback in all, summed over the processes.
    cut: u64,
    /// Cut tracebacks of each process that had any.
    cut_by_pid: BTreeMap<u32, u64>,
}

impl Completeness {
    /// Complete: no drop (a loaded tracemalloc file, the empty state at
    /// tracing start).
    #[must_use]
    pub fn complete() -> Self {
        Self::default()
    }

    /// The loss of one process: `drops` events of `pid` lost, `cut` of its
    /// blocks recorded with a cut traceback.
    #[must_use]
    pub fn of_process(pid: u32, drops: u64, cut: u64) -> Self {
        let mut out = Self::default();
        out.add(pid, drops, cut);
        out
    }

    /// Adds the loss of `pid` (several domains in one snapshot): `drops`
    /// events lost, `cut` blocks with a cut traceback.
    pub fn add(&mut self, pid: u32, drops: u64, cut: u64) {
        add_to(&mut self.drops, &mut self.by_pid, pid, drops);
        add_to(&mut self.cut, &mut self.cut_by_pid, pid, cut);
    }

    /// Adds the loss of another part of the same snapshot.
    pub fn merge(&mut self, other: &Completeness) {
        for (&pid, &drops) in &other.by_pid {
            add_to(&mut self.drops, &mut self.by_pid, pid, drops);
        }
        for (&pid, &cut) in &other.cut_by_pid {
            add_to(&mut self.cut, &mut self.cut_by_pid, pid, cut);
        }
    }

    /// True when no event was lost and no traceback cut.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        self.drops == 0 && self.cut == 0
    }

    /// Blocks with a cut traceback in all.
    #[must_use]
    pub fn cut_tracebacks(&self) -> u64 {
        self.cut
    }

    /// Cut tracebacks of each process that had any.
    #[must_use]
    pub fn cut_by_pid(&self) -> &BTreeMap<u32, u64> {
        &self.cut_by_pid
    }

    /// Events lost in all.
    #[must_use]
    pub fn drops(&self) -> u64 {
        self.drops
    }

    /// Drops of each process that had any.
    #[must_use]
    pub fn by_pid(&self) -> &BTreeMap<u32, u64> {
        &self.by_pid
    }

    /// Adds `complete`, `drops` and `drops_by_pid` to a JSON object (a
    /// response head, a compare side, a file's metadata).
    pub fn insert_into(&self, map: &mut serde_json::Map<String, Value>) {
        if let Ok(Value::Object(fields)) = serde_json::to_value(self) {
            map.extend(fields);
        }
    }

    /// Reads what [`Completeness::insert_into`] wrote in a file's metadata.
    /// Files without it (tracer files written before drops were recorded,
    /// or before cut tracebacks were) read as complete in that respect.
    /// `drops` and `cut_tracebacks` are totals; `_by_pid` entries that do
    /// not parse are ignored, and a total below their sum is raised to it.
    #[must_use]
    pub fn from_meta(meta: &Value) -> Self {
        let (drops, by_pid) = read_loss(meta, "drops", "drops_by_pid");
        let (cut, cut_by_pid) = read_loss(meta, "cut_tracebacks", "cut_tracebacks_by_pid");
        Self {
            drops,
            by_pid,
            cut,
            cut_by_pid,
        }
    }
}

/// Adds `count` of `pid` to `total` and its entry of `by_pid` (none for 0).
fn add_to(total: &mut u64, by_pid: &mut BTreeMap<u32, u64>, pid: u32, count: u64) {
    if count == 0 {
        return;
    }
    *total = total.saturating_add(count);
    let slot = by_pid.entry(pid).or_default();
    *slot = slot.saturating_add(count);
}

/// One loss of a file's metadata: its total (field `total`) and per pid
/// (field `by_pid`), the total raised to the per-pid sum.
fn read_loss(meta: &Value, total: &str, by_pid: &str) -> (u64, BTreeMap<u32, u64>) {
    let mut map = BTreeMap::new();
    if let Some(entries) = meta.get(by_pid).and_then(Value::as_object) {
        for (pid, count) in entries {
            if let (Ok(pid), Some(count)) = (pid.parse::<u32>(), count.as_u64())
                && count > 0
            {
                map.insert(pid, count);
            }
        }
    }
    let sum = map.values().fold(0u64, |a, &d| a.saturating_add(d));
    let total = meta.get(total).and_then(Value::as_u64).unwrap_or(0);
    (total.max(sum), map)
}

impl Serialize for Completeness {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_struct("Completeness", 5)?;
        out.serialize_field("complete", &self.is_complete())?;
        out.serialize_field("drops", &self.drops)?;
        out.serialize_field("drops_by_pid", &self.by_pid)?;
        out.serialize_field("cut_tracebacks", &self.cut)?;
        out.serialize_field("cut_tracebacks_by_pid", &self.cut_by_pid)?;
        out.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn completeness_merges_per_pid_and_reads_bad_meta_safely() {
        let mut all = Completeness::complete();
        assert!(all.is_complete());
        all.add(3, 0, 0);
        assert_eq!(all, Completeness::complete(), "no drop adds no pid");
        all.merge(&Completeness::of_process(3, 2, 0));
        all.merge(&Completeness::of_process(3, 5, 0));
        all.add(4, u64::MAX, 0);
        assert_eq!(all.drops(), u64::MAX);
        assert_eq!(all.by_pid().get(&3), Some(&7));
        assert!(!all.is_complete());
        let read = Completeness::from_meta(&json!({
            "drops": 1, "drops_by_pid": {"x": 4, "2": "many", "9": 3, "10": 0}
        }));
        assert_eq!(
            read,
            Completeness::of_process(9, 3, 0),
            "total raised to the sum"
        );
        assert_eq!(
            Completeness::from_meta(&json!({"drops": "lots"})),
            Completeness::complete()
        );
        let mut map = serde_json::Map::new();
        Completeness::of_process(9, 3, 0).insert_into(&mut map);
        assert_eq!(
            Value::Object(map),
            json!({"complete": false, "drops": 3, "drops_by_pid": {"9": 3},
                   "cut_tracebacks": 0, "cut_tracebacks_by_pid": {}})
        );
    }

    #[test]
    fn a_cut_traceback_makes_the_data_incomplete_without_a_drop() {
        let mut all = Completeness::of_process(7, 0, 44);
        assert!(!all.is_complete());
        assert_eq!((all.drops(), all.cut_tracebacks()), (0, 44));
        assert!(all.by_pid().is_empty());
        all.merge(&Completeness::of_process(7, 1, 2));
        all.merge(&Completeness::of_process(8, 0, 3));
        assert_eq!(all.cut_by_pid(), &BTreeMap::from([(7, 46), (8, 3)]));
        assert_eq!(all.cut_tracebacks(), 49);
        let mut map = serde_json::Map::new();
        all.insert_into(&mut map);
        let meta = Value::Object(map);
        assert_eq!(meta["cut_tracebacks_by_pid"], json!({"7": 46, "8": 3}));
        assert_eq!(Completeness::from_meta(&meta), all, "a file keeps it");
        // A file of an older tracer has no cut tracebacks: complete there.
        assert!(Completeness::from_meta(&json!({"drops": 0})).is_complete());
    }
}
