//! The store's tests: ids, labels, files across a reopen, corrupt files,
//! expiry of automatic snapshots.
use super::*;
use serde_json::json;
use std::sync::Arc;
use tracer_model::{Completeness, Frame, Snapshot, Trace, Traceback};

use crate::snapshot::AllocatorFrames;

fn stored(pid: u32, gen_: u32) -> StoredSnapshot {
    let tb = Arc::new(Traceback::new(vec![Frame::new("a.c", 3)], Some(1)));
    StoredSnapshot {
        id: 0,
        pid,
        start_time: 77,
        gen_,
        taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        traced_memory: (300, 400),
        completeness: Completeness::complete(),
        snapshot: Arc::new(Snapshot::new(
            vec![Trace {
                source: tracer_model::Source::UNKNOWN,
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

#[test]
fn ids_increase_and_a_reused_pid_sees_only_its_own() {
    let mut store = SnapshotStore::default();
    assert_eq!(store.insert(stored(5, 1)), 1);
    assert_eq!(store.insert(stored(5, 2)), 2);
    let ids: Vec<u64> = store.of_image(ImageId::new(5, 2)).map(|s| s.id).collect();
    assert_eq!(ids, vec![2]);
}

#[test]
fn labels_are_checked_unique_and_findable() {
    let mut store = SnapshotStore::default();
    let mut info = SnapshotInfo::new(SnapshotKind::Taken, Some(ImageId::new(5, 1)));
    info.label = Some("before".into());
    let id = store.add(stored(5, 1), info.clone()).unwrap();
    assert_eq!(store.id_of_label("before"), Some(id));
    let err = store.add(stored(5, 1), info).unwrap_err();
    assert_eq!(
        err.to_string(),
        "label \"before\" is already used by snapshot 1"
    );
    for bad in ["", "123", "now", "a b", &"x".repeat(65)] {
        assert!(
            matches!(check_label(bad), Err(StoreError::InvalidLabel { .. })),
            "{bad:?}"
        );
    }
    check_label("v1.2:pre-fix_x").unwrap();
    let other = store.insert(stored(5, 1));
    assert!(matches!(
        store.set_label(other, Some("before".into())),
        Err(StoreError::LabelTaken { id: Some(1), .. })
    ));
    store.set_label(id, None).unwrap();
    assert_eq!(
        store
            .set_label(other, Some("before".into()))
            .unwrap()
            .label
            .as_deref(),
        Some("before")
    );
}

#[test]
fn files_survive_a_reopen_and_ids_are_never_reused() {
    let dir = temp_dir("reopen");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let mut info = SnapshotInfo::new(SnapshotKind::Taken, Some(ImageId::new(5, 1)));
    info.label = Some("before".into());
    info.comm = Some("app".into());
    let a = store.add(stored(5, 1), info).unwrap();
    let b = store
        .add(
            stored(6, 1),
            SnapshotInfo::new(SnapshotKind::Taken, Some(ImageId::new(6, 1))),
        )
        .unwrap();
    let auto = store
        .add(
            stored(6, 1),
            SnapshotInfo::new(SnapshotKind::Auto, Some(ImageId::new(6, 1))),
        )
        .unwrap();
    store.remove(b).unwrap();
    assert_eq!((a, b, auto), (1, 2, 3));
    drop(store);

    let store = SnapshotStore::open(&dir).unwrap();
    assert!(store.unreadable().is_empty());
    let summaries = store.summaries();
    assert_eq!(
        summaries.len(),
        1,
        "the removed and the automatic one are gone"
    );
    let s = &summaries[0];
    assert_eq!(
        (s.id, s.pid, s.label.as_deref(), s.comm.as_deref()),
        (1, Some(5), Some("before"), Some("app"))
    );
    assert_eq!(
        (s.taken_at_ms, s.current, s.peak, s.traces, s.size),
        (1_700_000_000_123, 300, 400, 1, 300)
    );
    assert!(!s.this_run && s.persisted);
    assert_eq!(store.get(1).unwrap().snapshot, stored(5, 1).snapshot);
    assert_eq!(
        store.of_image(ImageId::new(5, 1)).count(),
        0,
        "an earlier run's image is not this run's"
    );
    let mut store = store;
    let next = store
        .add(stored(7, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap();
    assert!(next > auto, "id {next} reused");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn drops_survive_a_reopen_and_files_without_them_read_as_complete() {
    let dir = temp_dir("drops");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let mut lossy = stored(5, 1);
    lossy.completeness = Completeness::of_process(5, 476, 0);
    lossy.completeness.add(6, 24, 9);
    let id = store
        .add(lossy, SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap();
    let complete = store
        .add(stored(7, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap();
    drop(store);
    // A file written before drops were recorded: its meta has no such key.
    let old = json!({"id": 9, "pid": 8, "kind": "taken", "traced_memory": [300, 400]});
    fs::write(
        dir.join("snapshots/9.tsnap"),
        encode(&stored(8, 1).snapshot, &old),
    )
    .unwrap();

    let store = SnapshotStore::open(&dir).unwrap();
    assert!(store.unreadable().is_empty(), "{:?}", store.unreadable());
    let summary = serde_json::to_value(store.summary(id).unwrap()).unwrap();
    assert_eq!(summary["complete"], false);
    assert_eq!(summary["drops"], 500);
    assert_eq!(summary["drops_by_pid"], json!({"5": 476, "6": 24}));
    assert_eq!(summary["cut_tracebacks"], 9);
    assert_eq!(summary["cut_tracebacks_by_pid"], json!({"6": 9}));
    for other in [complete, 9] {
        let summary = serde_json::to_value(store.summary(other).unwrap()).unwrap();
        assert_eq!(
            (
                &summary["complete"],
                &summary["drops"],
                &summary["drops_by_pid"]
            ),
            (&json!(true), &json!(0), &json!({})),
            "{summary}"
        );
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupt_file_is_refused_and_the_others_load() {
    let dir = temp_dir("corrupt");
    let mut store = SnapshotStore::open(&dir).unwrap();
    for _ in 0..3 {
        store
            .add(stored(5, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
            .unwrap();
    }
    drop(store);
    let two = dir.join("snapshots/2.tsnap");
    let bytes = fs::read(&two).unwrap();
    fs::write(&two, &bytes[..bytes.len() / 2]).unwrap();
    fs::write(dir.join("snapshots/.3.tsnap.99.tmp"), b"partial").unwrap();
    fs::write(
        dir.join("snapshots/9.tsnap"),
        fs::read(dir.join("snapshots/1.tsnap")).unwrap(),
    )
    .unwrap();
    let store = SnapshotStore::open(&dir).unwrap();
    let ids: Vec<u64> = store.summaries().iter().map(|s| s.id).collect();
    assert_eq!(ids, [1, 3]);
    let refused: Vec<(String, String)> = store
        .unreadable()
        .iter()
        .map(|u| {
            (
                u.path.file_name().unwrap().to_string_lossy().into_owned(),
                u.error.clone(),
            )
        })
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[0].0, "2.tsnap");
    assert!(
        refused[0]
            .1
            .starts_with("corrupt or truncated tracer snapshot: CRC-32 is"),
        "{}",
        refused[0].1
    );
    assert_eq!(
        refused[1],
        (
            "9.tsnap".into(),
            "its header says snapshot 1, its name says 9".into()
        )
    );
    assert!(two.exists(), "a refused file is left for inspection");
    assert!(
        !dir.join("snapshots/.3.tsnap.99.tmp").exists(),
        "leftover temp files are removed"
    );
    let _ = fs::remove_dir_all(&dir);
}

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
fn how_allocator_frames_were_treated_survives_a_reopen() {
    let dir = temp_dir("allocator-frames");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let mut info = SnapshotInfo::new(SnapshotKind::Taken, Some(ImageId::new(5, 1)));
    info.allocator_frames = Some(AllocatorFrames::Keep);
    let kept = store.add(stored(5, 1), info).unwrap();
    let unknown = store
        .add(stored(5, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap();
    assert_eq!(
        store.summary(kept).unwrap().allocator_frames,
        Some(AllocatorFrames::Keep)
    );
    drop(store);
    let store = SnapshotStore::open(&dir).unwrap();
    let summary = store.summary(kept).unwrap();
    assert_eq!(summary.allocator_frames, Some(AllocatorFrames::Keep));
    assert_eq!(
        serde_json::to_value(&summary).unwrap()["allocator_frames"],
        "keep"
    );
    assert_eq!(store.summary(unknown).unwrap().allocator_frames, None);
    let _ = fs::remove_dir_all(&dir);
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

#[test]
fn a_fifo_named_as_a_snapshot_is_refused_without_blocking_and_its_id_stays_reserved() {
    let dir = temp_dir("fifo");
    let mut store = SnapshotStore::open(&dir).unwrap();
    take(&mut store);
    drop(store);
    let fifo = dir.join("snapshots/7.tsnap");
    let name = std::ffi::CString::new(fifo.clone().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that lives for the call.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    // A FIFO in place of the id reservation must not block either.
    fs::remove_file(dir.join("snapshots/next-id")).unwrap();
    let next = std::ffi::CString::new(
        dir.join("snapshots/next-id")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mkfifo(next.as_ptr(), 0o600) }, 0);

    let mut store = open_within_10s(&dir);
    let ids: Vec<u64> = store.summaries().iter().map(|s| s.id).collect();
    assert_eq!(ids, [1]);
    assert_eq!(
        store.unreadable(),
        [Unreadable {
            path: fifo.clone(),
            error: "cannot read it: not a regular file (a FIFO)".into(),
        }]
    );
    let _ = fs::remove_file(dir.join("snapshots/next-id"));
    let id = take(&mut store);
    assert_eq!(id, 8, "the FIFO's id 7 is not handed out again");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_refused_files_id_is_never_handed_out_so_the_file_is_never_overwritten() {
    let dir = temp_dir("refused-id");
    let mut store = SnapshotStore::open(&dir).unwrap();
    take(&mut store);
    drop(store);
    // A file tracerd cannot read (from a newer version, or damaged), and
    // no reservation that covers its id (lost with a disk, or restored
    // from a backup taken before it).
    let refused = dir.join("snapshots/2.tsnap");
    fs::write(&refused, b"not a snapshot").unwrap();
    fs::remove_file(dir.join("snapshots/next-id")).unwrap();
    let mut store = SnapshotStore::open(&dir).unwrap();
    assert_eq!(store.unreadable().len(), 1);
    let id = take(&mut store);
    assert_eq!(id, 3);
    assert_eq!(fs::read(&refused).unwrap(), b"not a snapshot");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_snapshot_directory_is_0700_and_its_files_0600() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = temp_dir("modes");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let id = take(&mut store);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.join("snapshots")), 0o700);
    assert_eq!(mode(&dir.join(format!("snapshots/{id}.tsnap"))), 0o600);
    assert_eq!(mode(&dir.join("snapshots/next-id")), 0o600);
    let _ = fs::remove_dir_all(&dir);
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
            source: tracer_model::Source(1),
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
            source: tracer_model::Source::UNKNOWN,
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

fn quotas(snapshots: u64, bytes: u64) -> Quotas {
    Quotas {
        snapshots,
        bytes,
        ..Quotas::UNLIMITED
    }
}

#[test]
fn a_full_count_evicts_the_oldest_automatic_snapshots_then_refuses() {
    let mut store = SnapshotStore::default();
    store.set_quotas(quotas(4, u64::MAX));
    let a1 = add_auto(&mut store, 10).unwrap();
    let a2 = add_auto(&mut store, 10).unwrap();
    let t1 = take(&mut store);
    let a3 = add_auto(&mut store, 10).unwrap();
    let ids = |store: &SnapshotStore| store.iter().map(|(h, _)| h.id).collect::<Vec<_>>();
    assert_eq!(ids(&store), [a1, a2, t1, a3]);
    let t2 = take(&mut store);
    assert_eq!(ids(&store), [a2, t1, a3, t2], "a1, the oldest, went");
    // A new automatic snapshot evicts the oldest automatic one too.
    let a4 = add_auto(&mut store, 10).unwrap();
    assert_eq!(ids(&store), [t1, a3, t2, a4]);
    let t3 = take(&mut store);
    let t4 = take(&mut store);
    assert_eq!(ids(&store), [t1, t2, t3, t4]);
    assert_eq!(store.stats().evicted, 4);
    // Only users' snapshots left: nothing to evict, and none is.
    let err = store
        .add(stored(5, 1), SnapshotInfo::new(SnapshotKind::Taken, None))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "snapshot quota reached: max_snapshots is 4, and the snapshots that are never evicted automatically (taken, loaded, labelled) number 4"
    );
    assert!(matches!(
        err,
        StoreError::QuotaFull {
            quota: Quota::Snapshots,
            limit: 4,
            held: 4,
            need: 1,
            owner: None
        }
    ));
    assert!(matches!(
        add_auto(&mut store, 10),
        Err(StoreError::QuotaFull {
            quota: Quota::Snapshots,
            ..
        })
    ));
    assert_eq!(ids(&store), [t1, t2, t3, t4]);
    let stats = store.stats();
    assert_eq!(
        stats.refused,
        [
            (SnapshotKind::Taken, 1),
            (SnapshotKind::Auto, 1),
            (SnapshotKind::Loaded, 0)
        ]
    );
    assert_eq!(stats.evicted, 4);
    assert!(store.interners.is_empty(), "no automatic snapshot is left");
    // The refused snapshots took no id.
    store.set_quotas(quotas(5, u64::MAX));
    assert_eq!(take(&mut store), t4 + 1);
}

#[test]
fn a_full_byte_quota_evicts_as_few_automatic_snapshots_as_it_needs() {
    let dir = temp_dir("quota-bytes");
    let mut store = SnapshotStore::open(&dir).unwrap();
    let t1 = take(&mut store);
    let file = store.summary(t1).unwrap().bytes;
    assert_eq!(
        file,
        fs::metadata(dir.join(format!("snapshots/{t1}.tsnap")))
            .unwrap()
            .len()
    );
    let a1 = add_auto(&mut store, 1000).unwrap();
    let a2 = add_auto(&mut store, 1000).unwrap();
    let a3 = add_auto(&mut store, 1000).unwrap();
    let auto = store.summary(a1).unwrap().bytes;
    assert_eq!(auto, 60);
    // Room for the taken one, the three automatic ones and 10 bytes: a
    // second taken one (same size as the first) needs two evicted.
    store.set_quotas(quotas(u64::MAX, 2 * file + auto + 10));
    let t2 = take(&mut store);
    let ids: Vec<u64> = store.iter().map(|(h, _)| h.id).collect();
    assert_eq!(ids, [t1, a3, t2]);
    assert!(store.get(a1).is_err() && store.get(a2).is_err());
    let stats = store.stats();
    assert_eq!(stats.evicted, 2);
    assert_eq!(
        stats.by_kind,
        [
            (SnapshotKind::Taken, 2, 2 * file),
            (SnapshotKind::Auto, 1, auto),
            (SnapshotKind::Loaded, 0, 0)
        ]
    );
    // Labelling a3 writes its file: that does not fit, and a3 is not
    // evicted for itself.
    let err = store.set_label(a3, Some("keep".into())).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::QuotaFull {
                quota: Quota::Bytes,
                held,
                owner: None,
                ..
            } if held == 2 * file
        ),
        "{err}"
    );
    assert_eq!(store.info(a3).unwrap().label, None);
    assert!(!dir.join(format!("snapshots/{a3}.tsnap")).exists());
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn per_owner_quotas_refuse_without_evicting_anything() {
    let mut store = SnapshotStore::default();
    store.set_quotas(Quotas {
        snapshots_per_owner: 2,
        ..Quotas::UNLIMITED
    });
    let user = |uid| {
        let mut info = SnapshotInfo::new(SnapshotKind::Taken, None);
        info.owner = Some(uid);
        info
    };
    let a1 = add_auto(&mut store, 10).unwrap();
    store.add(stored(5, 1), user(1000)).unwrap();
    store.add(stored(5, 1), user(1000)).unwrap();
    let err = store.add(stored(5, 1), user(1000)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "snapshot quota reached: max_snapshots_per_owner is 2, and the snapshots of uid 1000 number 2"
    );
    // Another user, and the operators, are not held back.
    store.add(stored(5, 1), user(1001)).unwrap();
    take(&mut store);
    assert!(store.get(a1).is_ok(), "nothing was evicted");
    assert_eq!(store.len(), 5);

    store.set_quotas(Quotas {
        bytes_per_owner: 1024,
        ..Quotas::UNLIMITED
    });
    let bytes = store
        .summaries()
        .iter()
        .filter(|s| s.owner_uid == Some(1001))
        .map(|s| s.bytes)
        .sum::<u64>();
    let mut big = user(1001);
    big.label = Some("big".into());
    let err = store.add(auto_snapshot(1000), big).unwrap_err();
    let need = match err {
        StoreError::QuotaFull {
            quota: Quota::BytesPerOwner,
            limit: 1024,
            held,
            need,
            owner: Some(1001),
        } if held == bytes => need,
        other => panic!("{other}"),
    };
    assert_eq!(
        err_text(need, bytes),
        store
            .add(auto_snapshot(1000), {
                let mut again = user(1001);
                again.label = Some("big".into());
                again
            })
            .unwrap_err()
            .to_string()
    );
}

fn err_text(need: u64, held: u64) -> String {
    format!(
        "snapshot quota reached: max_snapshot_bytes_per_owner is 1024 bytes, the snapshots of uid 1001 hold {held} bytes, and this snapshot takes {need} bytes"
    )
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
            source: tracer_model::Source(1),
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

/// A taken snapshot of pid 5 whose traces are in no sorted order: sizes
/// 500, 100, 300, 200, each over its own traceback.
fn unordered() -> StoredSnapshot {
    let traces = [500, 100, 300, 200]
        .iter()
        .enumerate()
        .map(|(i, &size)| Trace {
            source: tracer_model::Source(1),
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

fn sizes(stored: &StoredSnapshot) -> Vec<u64> {
    stored.snapshot.traces().iter().map(|t| t.size).collect()
}

fn on_disk(store: &SnapshotStore, id: u64) -> bool {
    matches!(store.entries[&id].body, Body::OnDisk(_))
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
