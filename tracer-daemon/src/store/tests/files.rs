//! The store's files: what survives a reopen, files refused at open, the
//! directory's modes.
use super::*;

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
