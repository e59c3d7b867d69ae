//! Stored snapshots (`take_snapshot()` kept under an id), per process image.
use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use serde::Serialize;

use crate::model::Snapshot;

/// A snapshot kept in the store.
#[derive(Clone, Debug)]
pub struct StoredSnapshot {
    /// Its id, unique in this tracerd, increasing from 1.
    pub id: u64,
    /// The process it was taken of.
    pub pid: u32,
    /// That process image's start time (clock ticks since boot), so a reused
    /// pid never picks up another process's snapshots.
    pub start_time: u64,
    /// The image's kernel generation.
    pub gen_: u32,
    /// When it was taken (wall clock).
    pub taken_at: SystemTime,
    /// `get_traced_memory()` at that moment: (current, peak) in bytes.
    pub traced_memory: (u64, u64),
    /// The traces.
    pub snapshot: Arc<Snapshot>,
}

/// What the API shows of a stored snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotSummary {
    /// Snapshot id.
    pub id: u64,
    /// Process id.
    pub pid: u32,
    /// Unix time in ms when it was taken.
    pub taken_at_ms: u64,
    /// Number of traces (live blocks).
    pub traces: usize,
    /// Sum of the traces' sizes in bytes.
    pub size: u64,
    /// Traced memory (current) in bytes at that moment.
    pub current: u64,
    /// Traced memory peak in bytes at that moment.
    pub peak: u64,
    /// The traceback limit (`nframe`) it was taken with.
    pub traceback_limit: u32,
}

impl StoredSnapshot {
    /// The API's view of it.
    pub fn summary(&self) -> SnapshotSummary {
        SnapshotSummary {
            id: self.id,
            pid: self.pid,
            taken_at_ms: unix_ms(self.taken_at),
            traces: self.snapshot.traces().len(),
            size: self.snapshot.traces().iter().map(|t| t.size).sum(),
            current: self.traced_memory.0,
            peak: self.traced_memory.1,
            traceback_limit: self.snapshot.traceback_limit(),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The store: snapshots by id.
#[derive(Debug, Default)]
pub struct SnapshotStore {
    next_id: u64,
    snapshots: BTreeMap<u64, StoredSnapshot>,
}

impl SnapshotStore {
    /// Stores a snapshot under the next id and returns it.
    pub fn insert(&mut self, mut stored: StoredSnapshot) -> u64 {
        self.next_id += 1;
        stored.id = self.next_id;
        self.snapshots.insert(stored.id, stored);
        self.next_id
    }

    /// Number of stored snapshots.
    pub fn len(&self) -> usize {
        self.snapshots.len()
    }

    /// True when no snapshot is stored.
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty()
    }

    /// The snapshot `id`.
    pub fn get(&self, id: u64) -> Option<&StoredSnapshot> {
        self.snapshots.get(&id)
    }

    /// Snapshots of the image (pid, generation), oldest first. The
    /// generation, not the start time, tells images apart: exec keeps the
    /// start time.
    pub fn of_image(&self, pid: u32, gen_: u32) -> impl Iterator<Item = &StoredSnapshot> {
        self.snapshots.values().filter(move |s| s.pid == pid && s.gen_ == gen_)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(pid: u32, gen_: u32) -> StoredSnapshot {
        StoredSnapshot {
            id: 0,
            pid,
            start_time: 0,
            gen_,
            taken_at: SystemTime::UNIX_EPOCH,
            traced_memory: (0, 0),
            snapshot: Arc::new(Snapshot::new(Vec::new(), 16)),
        }
    }

    #[test]
    fn ids_increase_and_a_reused_pid_sees_only_its_own() {
        let mut store = SnapshotStore::default();
        assert_eq!(store.insert(stored(5, 1)), 1);
        assert_eq!(store.insert(stored(5, 2)), 2);
        let ids: Vec<u64> = store.of_image(5, 2).map(|s| s.id).collect();
        assert_eq!(ids, vec![2]);
    }
}
