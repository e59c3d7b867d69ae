//! Quotas: automatic snapshots evicted for room, then refusals, in total
//! and per owner.
use super::*;

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
