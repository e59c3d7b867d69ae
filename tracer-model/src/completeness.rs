//! [`Completeness`]: whether a snapshot's data is every live block, and
//! the loss per process when it is not. Every statistics, compare and
//! traces answer and every snapshot file carries one.
use std::collections::BTreeMap;

use serde::{Serialize, ser::SerializeStruct as _};
use serde_json::Value;

/// Whether a snapshot's data is complete, and the loss when it is not:
/// events (allocations) of its processes lost since their tracing began
/// because a kernel map was full. With no drop the traces are every live
/// block; with drops they undercount.
///
/// The one shape every response and snapshot file uses: serialized as
/// `{"complete": bool, "drops": N, "drops_by_pid": {"PID": N, ...}}`, where
/// `drops_by_pid` lists only processes with drops (so `{}` when complete).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Completeness {
    /// Drops in all, summed over the processes.
    drops: u64,
    /// Drops of each process that had any.
    by_pid: BTreeMap<u32, u64>,
}

impl Completeness {
    /// Complete: no drop (a loaded tracemalloc file, the empty state at
    /// tracing start).
    #[must_use]
    pub fn complete() -> Self {
        Self::default()
    }

    /// The loss of one process: `drops` events of `pid`.
    #[must_use]
    pub fn of_process(pid: u32, drops: u64) -> Self {
        let mut out = Self::default();
        out.add(pid, drops);
        out
    }

    /// Adds `drops` events lost by `pid` (several domains in one snapshot).
    pub fn add(&mut self, pid: u32, drops: u64) {
        if drops == 0 {
            return;
        }
        self.drops = self.drops.saturating_add(drops);
        let slot = self.by_pid.entry(pid).or_default();
        *slot = slot.saturating_add(drops);
    }

    /// Adds the loss of another part of the same snapshot.
    pub fn merge(&mut self, other: &Completeness) {
        self.drops = self.drops.saturating_add(other.drops);
        for (&pid, &drops) in &other.by_pid {
            let slot = self.by_pid.entry(pid).or_default();
            *slot = slot.saturating_add(drops);
        }
    }

    /// True when no event was lost.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        self.drops == 0
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
    /// Files without it (tracer files written before drops were recorded)
    /// read as complete. `drops` is the total; `drops_by_pid` entries that
    /// do not parse are ignored, and a total below their sum is raised to it.
    #[must_use]
    pub fn from_meta(meta: &Value) -> Self {
        let mut by_pid = BTreeMap::new();
        if let Some(map) = meta.get("drops_by_pid").and_then(Value::as_object) {
            for (pid, drops) in map {
                if let (Ok(pid), Some(drops)) = (pid.parse::<u32>(), drops.as_u64())
                    && drops > 0
                {
                    by_pid.insert(pid, drops);
                }
            }
        }
        let sum = by_pid.values().fold(0u64, |a, &d| a.saturating_add(d));
        let total = meta.get("drops").and_then(Value::as_u64).unwrap_or(0);
        Self {
            drops: total.max(sum),
            by_pid,
        }
    }
}

impl Serialize for Completeness {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_struct("Completeness", 3)?;
        out.serialize_field("complete", &self.is_complete())?;
        out.serialize_field("drops", &self.drops)?;
        out.serialize_field("drops_by_pid", &self.by_pid)?;
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
        all.add(3, 0);
        assert_eq!(all, Completeness::complete(), "no drop adds no pid");
        all.merge(&Completeness::of_process(3, 2));
        all.merge(&Completeness::of_process(3, 5));
        all.add(4, u64::MAX);
        assert_eq!(all.drops(), u64::MAX);
        assert_eq!(all.by_pid().get(&3), Some(&7));
        assert!(!all.is_complete());
        let read = Completeness::from_meta(&json!({
            "drops": 1, "drops_by_pid": {"x": 4, "2": "many", "9": 3, "10": 0}
        }));
        assert_eq!(
            read,
            Completeness::of_process(9, 3),
            "total raised to the sum"
        );
        assert_eq!(
            Completeness::from_meta(&json!({"drops": "lots"})),
            Completeness::complete()
        );
        let mut map = serde_json::Map::new();
        Completeness::of_process(9, 3).insert_into(&mut map);
        assert_eq!(
            Value::Object(map),
            json!({"complete": false, "drops": 3, "drops_by_pid": {"9": 3}})
        );
    }
}
