//! The store's tests, one module per concept (ids and labels, files,
//! automatic snapshots, quotas, snapshots kept in their files), and the
//! snapshots and stores they share.
use super::*;
use serde_json::json;
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};
use tracer_model::{Completeness, Frame, Snapshot, Trace, Traceback};

use crate::snapshot::AllocatorFrames;

mod compact;
mod disk;
mod files;
mod ids;
mod quota;

fn stored(pid: u32, generation: u32) -> StoredSnapshot {
    let tb = Arc::new(Traceback::new(vec![Frame::new("a.c", 3)], Some(1)));
    StoredSnapshot {
        id: 0,
        pid,
        start_time: 77,
        generation,
        taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        traced_memory: (300, 400),
        completeness: Completeness::complete(),
        snapshot: Arc::new(Snapshot::new(
            vec![Trace {
                source: tracer_model::AllocatorFamily::UNKNOWN,
                domain: pid,
                size: 300,
                traceback: tb,
            }],
            16,
        )),
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-store-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

/// Stores a taken snapshot of pid 5; returns its id.
fn take(store: &mut SnapshotStore) -> u64 {
    store
        .add(stored(5, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap()
}

/// `SnapshotStore::open` on `dir` in a thread: fails the test, rather than
/// hanging it, if the open does not return within 10 s.
fn open_within_10s(dir: &Path) -> SnapshotStore {
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(SnapshotStore::open(&dir));
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the store opened within 10 s")
        .unwrap()
}

/// An automatic snapshot of image (5, 1) with `traces` traces over three
/// tracebacks built anew (equal to those of any other call, in distinct
/// `Arc`s, as each build of the daemon makes them), sizes 16 and 32.
fn auto_snapshot(traces: usize) -> StoredSnapshot {
    let tbs: Vec<Arc<Traceback>> = (0..3)
        .map(|i| {
            Arc::new(Traceback::new(
                vec![Frame::new("a.c", 10 + i), Frame::new("main.c", 1)],
                Some(2),
            ))
        })
        .collect();
    let traces = (0..traces)
        .map(|i| Trace {
            source: tracer_model::AllocatorFamily(1),
            domain: 5,
            size: if i % 2 == 0 { 16 } else { 32 },
            traceback: Arc::clone(&tbs[i % 3]),
        })
        .collect();
    StoredSnapshot {
        snapshot: Arc::new(Snapshot::new(traces, 16)),
        ..stored(5, 1)
    }
}

fn add_auto(store: &mut SnapshotStore, traces: usize) -> Result<u64, StoreError> {
    store.add(
        auto_snapshot(traces),
        SnapshotInfo::new(SnapshotKind::Auto, Some(ImageId::new(5, 1))),
    )
}

/// A trace as a sortable tuple: domain, size, source, frames, total_nframe.
type TraceKey = (u32, u64, u8, Vec<String>, Option<u32>);

/// The traces as sortable tuples (a snapshot's traces are in no order).
fn sorted(snapshot: &Snapshot) -> Vec<TraceKey> {
    let mut out: Vec<_> = snapshot
        .traces()
        .iter()
        .map(|t| {
            (
                t.domain,
                t.size,
                t.source.0,
                t.traceback.frames().iter().map(|f| f.to_string()).collect(),
                t.traceback.total_nframe(),
            )
        })
        .collect();
    out.sort();
    out
}

fn sizes(stored: &StoredSnapshot) -> Vec<u64> {
    stored.snapshot.traces().iter().map(|t| t.size).collect()
}

fn on_disk(store: &SnapshotStore, id: u64) -> bool {
    matches!(store.entries[&id].body, Body::OnDisk(_))
}
