//! Snapshots kept in their files: loaded back equal, the cache of decoded
//! ones, files changed behind the store's back.
use super::*;

/// A taken snapshot of pid 5 whose traces are in no sorted order: sizes
/// 500, 100, 300, 200, each over its own traceback.
fn unordered() -> StoredSnapshot {
    let traces = [500, 100, 300, 200]
        .iter()
        .enumerate()
        .map(|(i, &size)| Trace {
            source: tracer_model::AllocatorFamily(1),
            domain: 5,
            size,
            traceback: Arc::new(Traceback::new(
                vec![Frame::new(format!("f{i}.c"), 7), Frame::new("main.c", 1)],
                Some(2),
            )),
        })
        .collect();
    StoredSnapshot {
        snapshot: Arc::new(Snapshot::new(traces, 16)),
        ..stored(5, 1)
    }
}

#[test]
fn a_snapshot_with_a_file_is_kept_in_it_and_loads_back_equal_in_its_order() {
    let dir = temp_dir("ondisk");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let id = store
        .add(unordered(), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap();
    assert!(on_disk(&store, id), "kept in its file, not whole");
    assert_eq!(store.cache().contents().0, vec![id], "cached as just used");
    let loaded = store.get(id).unwrap();
    assert_eq!(loaded.snapshot, unordered().snapshot);
    assert_eq!(sizes(&loaded), vec![500, 100, 300, 200]);
    drop(store);

    // At start: read once to check it and count its summary, not cached.
    let store = SnapshotStore::open(&dir).unwrap();
    assert!(store.unreadable().is_empty());
    assert!(on_disk(&store, id));
    assert_eq!(store.cache().contents(), (vec![], 0));
    let summary = store.summary(id).unwrap();
    assert_eq!(
        (summary.traces, summary.size, summary.traceback_limit),
        (4, 1100, 16)
    );
    assert_eq!(
        summary.bytes,
        fs::metadata(dir.join(format!("snapshots/{id}.tsnap")))
            .unwrap()
            .len()
    );
    let loaded = store.loader(id).unwrap().load().unwrap();
    assert_eq!(loaded.snapshot, unordered().snapshot);
    assert_eq!(sizes(&loaded), vec![500, 100, 300, 200]);
    assert_eq!(
        (loaded.id, loaded.pid, loaded.traced_memory),
        (id, 5, (300, 400))
    );
    assert_eq!(store.cache().contents().0, vec![id]);
    let _ = fs::remove_dir_all(&dir);

    // Without a state directory: whole in memory.
    let mut store = SnapshotStore::default();
    let id = store
        .add(unordered(), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap();
    assert!(matches!(store.entries[&id].body, Body::Whole(_)));
    assert_eq!(sizes(&store.get(id).unwrap()), vec![500, 100, 300, 200]);
}

#[test]
fn the_cache_holds_at_most_its_bound_least_recently_used_out_first() {
    let dir = temp_dir("cache");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let ids: Vec<u64> = (0..6).map(|_| take(&mut store)).collect();
    assert_eq!(ids, vec![1, 2, 3, 4, 5, 6]);
    let one = heap_estimate(&stored(5, 1).snapshot);
    assert_eq!(
        store.cache().contents(),
        (vec![3, 4, 5, 6], 4 * one),
        "CACHE_SNAPSHOTS = 4"
    );
    store.get(1).unwrap();
    store.get(4).unwrap();
    assert_eq!(store.cache().contents().0, vec![5, 6, 1, 4]);
    store.remove(6).unwrap();
    assert_eq!(store.cache().contents().0, vec![5, 1, 4]);

    // The byte bound: two snapshots' worth holds two.
    store.cache = Arc::new(Cache::new(10, 2 * one));
    for id in 1..=5 {
        store.get(id).unwrap();
    }
    assert_eq!(store.cache().contents(), (vec![4, 5], 2 * one));
    // One larger than the bound is never cached, and still loads.
    store.cache = Arc::new(Cache::new(10, one - 1));
    assert_eq!(store.get(2).unwrap().snapshot, stored(5, 1).snapshot);
    assert_eq!(store.cache().contents(), (vec![], 0));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_file_removed_or_changed_behind_the_stores_back_is_an_error_not_its_traces() {
    let dir = temp_dir("behind");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let a = take(&mut store);
    let b = store
        .add(unordered(), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap();
    let c = take(&mut store);
    let path = |id: u64| dir.join(format!("snapshots/{id}.tsnap"));

    // Removed, though it is cached.
    assert!(store.cache().contents().0.contains(&a));
    fs::remove_file(path(a)).unwrap();
    let err = store.get(a).unwrap_err();
    assert!(matches!(err, StoreError::FileGone { id, .. } if id == a));
    assert_eq!(
        err.to_string(),
        format!(
            "the file of snapshot {a}, {}, was removed behind tracerd's back: its traces are gone",
            path(a).display()
        )
    );
    assert!(matches!(
        store.set_label(a, Some("x".into())),
        Err(StoreError::FileGone { .. })
    ));
    assert_eq!(store.summary(a).unwrap().label, None, "label unchanged");
    assert_eq!(store.remove(a).unwrap().id, a, "it can still be deleted");
    assert!(matches!(store.get(a), Err(StoreError::NotFound { id }) if id == a));

    // Replaced by another file (another snapshot's: another length).
    fs::copy(path(c), path(b)).unwrap();
    let err = store.get(b).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the file of snapshot {b}, {}, changed behind tracerd's back: it was replaced or modified (its inode, length or modification time differ)",
            path(b).display()
        )
    );

    // Modified in place, its length and modification time kept: the hash
    // of its bytes tells (it is read: not cached).
    let mut bytes = fs::read(path(c)).unwrap();
    let mtime = fs::metadata(path(c)).unwrap().modified().unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(path(c), &bytes).unwrap();
    fs::File::options()
        .write(true)
        .open(path(c))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    store.cache().forget(c);
    let err = store.get(c).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the file of snapshot {c}, {}, changed behind tracerd's back: its bytes were modified",
            path(c).display()
        )
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_new_label_rewrites_the_file_and_an_earlier_loader_still_loads() {
    let dir = temp_dir("relabel");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let id = store
        .add(unordered(), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap();
    let loader = store.loader(id).unwrap();
    store.set_label(id, Some("after".into())).unwrap();
    store.cache().forget(id);
    assert_eq!(sizes(&loader.load().unwrap()), vec![500, 100, 300, 200]);
    drop(store);
    let store = SnapshotStore::open(&dir).unwrap();
    assert_eq!(store.id_of_label("after"), Some(id));
    let _ = fs::remove_dir_all(&dir);
}
