//! Automatic snapshots: kept compactly, tracebacks shared, expired unless
//! labelled, and what they cost in memory.
use super::*;

#[test]
fn automatic_snapshots_expire_unless_labelled() {
    let dir = temp_dir("auto");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let old = store
        .add(
            stored(5, 1),
            SnapshotInfo::new(SnapshotKind::Auto, Some(ImageId::new(5, 1))),
        )
        .unwrap();
    let kept = store
        .add(
            stored(5, 1),
            SnapshotInfo::new(SnapshotKind::Auto, Some(ImageId::new(5, 1))),
        )
        .unwrap();
    assert!(
        !dir.join(format!("snapshots/{old}.tsnap")).exists(),
        "auto snapshots stay in memory"
    );
    store.set_label(kept, Some("keep".into())).unwrap();
    assert!(
        dir.join(format!("snapshots/{kept}.tsnap")).exists(),
        "labelling keeps it on disk"
    );
    let later = SystemTime::UNIX_EPOCH
        + Duration::from_millis(1_700_000_000_123)
        + Duration::from_secs(601);
    assert_eq!(store.expire_auto(later, Duration::from_secs(600)), 1);
    assert!(store.get(old).is_err());
    assert!(store.get(kept).is_ok());
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn automatic_snapshots_are_compact_and_share_their_tracebacks() {
    let mut store = SnapshotStore::default();
    let a = add_auto(&mut store, 1000).unwrap();
    let b = add_auto(&mut store, 1000).unwrap();
    let (one, two) = (store.get(a).unwrap(), store.get(b).unwrap());
    assert_eq!(sorted(&one.snapshot), sorted(&auto_snapshot(1000).snapshot));
    assert_eq!(one.snapshot.traceback_limit(), 16);
    // 1000 traces are 6 groups (3 tracebacks x 2 sizes, as i % 6 runs):
    // 5 one-byte varints each (count 166 or 167 takes two), and 3
    // pointers.
    let summary = store.summary(a).unwrap();
    assert_eq!((summary.traces, summary.size), (1000, 500 * 16 + 500 * 32));
    assert_eq!(summary.bytes, 6 * 6 + 3 * 8);
    assert!(!summary.persisted);
    // The second snapshot's tracebacks are the first one's.
    let first = |s: &StoredSnapshot, i: usize| Arc::clone(&s.snapshot.traces()[i].traceback);
    assert!(Arc::ptr_eq(&first(&one, 0), &first(&two, 0)));
    assert_eq!(store.interners.get(&ImageId::new(5, 1)).unwrap().len(), 3);
    // Frames that differ only in what symbolization knows beyond
    // file:line are not merged.
    let with_address = |address| {
        Arc::new(Traceback::new(
            vec![Frame::new("a.c", 10).with_extra(tracer_model::FrameExtra {
                address: Some(address),
                ..Default::default()
            })],
            Some(1),
        ))
    };
    let traces = [0x10, 0x20]
        .map(|address| Trace {
            source: tracer_model::AllocatorFamily::UNKNOWN,
            domain: 5,
            size: 8,
            traceback: with_address(address),
        })
        .to_vec();
    let id = store
        .add(
            StoredSnapshot {
                snapshot: Arc::new(Snapshot::new(traces, 16)),
                ..stored(5, 1)
            },
            SnapshotInfo::new(SnapshotKind::Auto, Some(ImageId::new(5, 1))),
        )
        .unwrap();
    let addresses: Vec<Option<u64>> = store
        .get(id)
        .unwrap()
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
    // Once the image's automatic snapshots are gone, so are its tracebacks.
    for id in [a, b, id] {
        store.remove(id).unwrap();
    }
    assert!(store.interners.is_empty());
}

/// tracerd's resident memory now, in bytes.
fn rss() -> u64 {
    crate::sys::procfs::self_rss().unwrap()
}

/// A process's snapshot of `blocks` live blocks over `sites` tracebacks of
/// 8 frames and `sizes` size classes, built anew (fresh `Arc`s) as each
/// automatic snapshot is.
fn big_snapshot(blocks: usize, sites: usize, sizes: u64) -> StoredSnapshot {
    let tbs: Vec<Arc<Traceback>> = (0..sites)
        .map(|i| {
            let frames = (0..8)
                .map(|d| Frame::new(format!("src/file{}.c", (i + d) % 97), (i * 8 + d) as u32))
                .collect();
            Arc::new(Traceback::new(frames, Some(8)))
        })
        .collect();
    let traces = (0..blocks)
        .map(|i| Trace {
            source: tracer_model::AllocatorFamily(1),
            domain: 5,
            size: 16 * (1 + (i as u64 * 7919) % sizes),
            traceback: Arc::clone(&tbs[(i * 31) % sites]),
        })
        .collect();
    StoredSnapshot {
        snapshot: Arc::new(Snapshot::new(traces, 16)),
        ..stored(5, 1)
    }
}

/// RSS of 60 automatic snapshots of one process of 1 M live blocks, kept
/// whole (as before) and compact, one case per run (`RSS_CASE` =
/// `SITES,SIZES,whole|compact`: RSS does not shrink after a case). Run
/// with `RSS_CASE=2000,256,compact cargo test -p tracer-daemon --lib --
/// --ignored --nocapture rss_of_60`.
#[test]
#[ignore = "a measurement: takes minutes and prints RSS"]
fn rss_of_60_automatic_snapshots_of_a_million_blocks() {
    let case = std::env::var("RSS_CASE").unwrap_or_else(|_| "2000,256,compact".into());
    let parts: Vec<&str> = case.split(',').collect();
    let (sites, sizes): (usize, u64) = (parts[0].parse().unwrap(), parts[1].parse().unwrap());
    let compact = parts[2] == "compact";
    {
        {
            let mut store = SnapshotStore::default();
            let before = rss();
            for _ in 0..60 {
                let snapshot = big_snapshot(1_000_000, sites, sizes);
                let (kind, image) = if compact {
                    (SnapshotKind::Auto, Some(ImageId::new(5, 1)))
                } else {
                    (SnapshotKind::Taken, None)
                };
                if compact {
                    store.add(snapshot, SnapshotInfo::new(kind, image)).unwrap();
                } else {
                    // As the store kept automatic snapshots before: whole.
                    let (mut head, snapshot) = snapshot.split();
                    store.next_id += 1;
                    head.id = store.next_id;
                    store.entries.insert(
                        head.id,
                        Entry {
                            head,
                            shape: Shape::of(&snapshot),
                            body: Body::Whole(snapshot),
                            info: SnapshotInfo::new(SnapshotKind::Auto, image),
                            persisted: false,
                            this_run: true,
                            bytes: 0,
                        },
                    );
                }
            }
            let held = rss().saturating_sub(before);
            let bytes: u64 = store.summaries().iter().map(|s| s.bytes).sum();
            let decoded = store.get(60).unwrap();
            assert_eq!(decoded.snapshot.traces().len(), 1_000_000);
            println!(
                "sites={sites} sizes={sizes} {}: RSS +{} MiB for 60 snapshots ({} MiB counted)",
                if compact { "compact" } else { "whole" },
                held >> 20,
                bytes >> 20
            );
            drop(store);
        }
    }
}

#[test]
fn an_earlier_runs_automatic_snapshot_unlabelled_goes_back_to_memory_compact() {
    let dir = temp_dir("unlabel");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let id = add_auto(&mut store, 30).unwrap();
    store.set_label(id, Some("keep".into())).unwrap();
    drop(store);
    let mut store = SnapshotStore::open(&dir).unwrap();
    assert!(on_disk(&store, id));
    let summary = store.set_label(id, None).unwrap();
    assert!(matches!(store.entries[&id].body, Body::Compact(_)));
    assert!(!summary.persisted);
    assert!(!dir.join(format!("snapshots/{id}.tsnap")).exists());
    assert_eq!(
        sorted(&store.get(id).unwrap().snapshot),
        sorted(&auto_snapshot(30).snapshot)
    );
    drop(store);
    let store = SnapshotStore::open(&dir).unwrap();
    assert!(store.is_empty(), "it no longer comes back");
    let _ = fs::remove_dir_all(&dir);
}
