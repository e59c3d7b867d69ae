//! Ids and labels: ids increase, labels are checked, unique and found.
use super::*;

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
