//! Snapshots: system-wide ones and their compares, what stopping refuses,
//! and whose snapshots a user sees.
use super::*;
use tracer_api::SideKind;

#[test]
fn a_system_snapshot_has_one_domain_per_process_and_compares_with_tracing_start() {
    let (kernel, service) = service();
    for (pid, size) in [(PID, 100), (PID + 7, 30)] {
        start(&kernel, &service, pid);
        kernel.alloc(pid, 0x1000, size, &[0x40_1000]);
    }
    let now = service.snapshot_now(Target::System).expect("tracing");
    assert_eq!(now.pids, [PID, PID + 7]);
    assert_eq!(now.traced_memory, (130, 130));
    let mut domains: Vec<(u32, u64)> = now
        .snapshot
        .traces()
        .iter()
        .map(|t| (t.domain, t.size))
        .collect();
    domains.sort_unstable();
    assert_eq!(domains, [(PID, 100), (PID + 7, 30)]);
    let (base, new) = service
        .compare_sides(
            Viewer::Operator,
            Target::Process(PID),
            &BaseSpec::Default,
            None,
            AllocatorFrames::Drop,
        )
        .expect("sides");
    assert!(matches!(base.info, SideKind::TracingStart { .. }));
    assert!(base.snapshot.traces().is_empty());
    assert_eq!(new.snapshot.blocks(), 1);
    let stored = service
        .store_now(
            Viewer::Operator,
            Target::Process(PID),
            Some("before".into()),
            AllocatorFrames::Drop,
        )
        .expect("stored");
    let (base, _) = service
        .compare_sides(
            Viewer::Operator,
            Target::Process(PID),
            &BaseSpec::Default,
            None,
            AllocatorFrames::Drop,
        )
        .expect("sides");
    assert_eq!(base.info.snapshot_id(), Some(stored.id));
    assert!(matches!(
        service.compare_sides(
            Viewer::Operator,
            Target::Process(PID + 7),
            &BaseSpec::Snapshot(SnapshotRef::Label("before".into())),
            None,
            AllocatorFrames::Drop,
        ),
        Err(ServiceError::WrongScope { .. })
    ));
}

#[test]
fn a_compare_never_mixes_dropped_and_kept_allocator_frames() {
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000]);
    let kept = service
        .store_now(
            Viewer::Operator,
            Target::Process(PID),
            Some("kept".into()),
            AllocatorFrames::Keep,
        )
        .expect("stored");
    assert_eq!(kept.allocator_frames, Some(AllocatorFrames::Keep));
    let dropped = service
        .store_now(
            Viewer::Operator,
            Target::Process(PID),
            None,
            AllocatorFrames::Drop,
        )
        .expect("stored");
    assert_eq!(dropped.allocator_frames, Some(AllocatorFrames::Drop));
    // The default base is the latest snapshot taken as the new side is.
    let sides = |frames| {
        service
            .compare_sides(
                Viewer::Operator,
                Target::Process(PID),
                &BaseSpec::Default,
                None,
                frames,
            )
            .expect("sides")
    };
    let (base, new) = sides(AllocatorFrames::Keep);
    assert_eq!(base.info.snapshot_id(), Some(kept.id));
    assert!(matches!(
        base.info,
        SideKind::Snapshot {
            allocator_frames: Some(Some(tracer_api::AllocatorFrames::Keep)),
            ..
        }
    ));
    assert!(matches!(
        new.info,
        SideKind::Now {
            allocator_frames: tracer_api::AllocatorFrames::Keep,
            ..
        }
    ));
    assert_eq!(new.allocator_frames, Some(AllocatorFrames::Keep));
    let (base, _) = sides(AllocatorFrames::Drop);
    assert_eq!(base.info.snapshot_id(), Some(dropped.id));
    // An explicit base taken otherwise is refused.
    let err = service
        .compare_sides(
            Viewer::Operator,
            Target::Process(PID),
            &BaseSpec::Snapshot(SnapshotRef::Id(kept.id)),
            None,
            AllocatorFrames::Drop,
        )
        .expect_err("kept against dropped");
    assert_eq!(
        err.to_string(),
        "the base was taken with allocator_frames=keep and the new side with allocator_frames=drop: their tracebacks do not compare"
    );
    // since= takes the latest snapshot by then taken as the new side is:
    // the kept one, not the dropped one after it.
    let (base, _) = service
        .compare_sides(
            Viewer::Operator,
            Target::Process(PID),
            &BaseSpec::Since(Duration::ZERO),
            None,
            AllocatorFrames::Keep,
        )
        .expect("sides");
    assert_eq!(base.info.snapshot_id(), Some(kept.id));
}

#[test]
fn once_stopping_snapshots_answer_stopping_and_nothing_partial_is_stored() {
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000]);
    kernel.alloc(PID, 0x2000, 28, &[0x40_1000]);
    let before = service
        .store_now(
            Viewer::Operator,
            Target::Process(PID),
            None,
            AllocatorFrames::Drop,
        )
        .expect("stored");
    assert_eq!((before.traces, before.size), (2, 128));
    service.begin_stop();
    assert!(matches!(
        service.snapshot_now(Target::Process(PID)),
        Err(ServiceError::Stopping)
    ));
    assert!(matches!(
        service.snapshot_now(Target::System),
        Err(ServiceError::Stopping)
    ));
    assert!(matches!(
        service.store_now(
            Viewer::Operator,
            Target::Process(PID),
            None,
            AllocatorFrames::Drop
        ),
        Err(ServiceError::Stopping)
    ));
    assert!(matches!(
        service.object_traceback(PID, 0x1000, AllocatorFrames::Drop),
        Err(ServiceError::NoBlock { .. } | ServiceError::Stopping)
    ));
    assert_eq!(
        Triggers::new(&service).auto_snapshots(Duration::from_secs(60)),
        0
    );
    assert_eq!(service.stored_count(), 1, "only the snapshot of before");
    // The sweep removes nothing from a scan cut short.
    kernel.lose_exit(PID);
    assert_eq!(Housekeeping::new(&service).sweep_orphans(), 0);
    assert_eq!(Housekeeping::new(&service).sweep_orphans(), 0);
    assert_eq!(kernel.block_count(), 2);
}

#[test]
fn a_users_snapshots_are_theirs_and_others_are_as_if_absent() {
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000]);
    let user = Viewer::User(1000);
    let operators = service
        .store_now(
            Viewer::Operator,
            Target::Process(PID),
            Some("ops".into()),
            AllocatorFrames::Drop,
        )
        .expect("stored");
    let mine = service
        .store_now(
            user,
            Target::Process(PID),
            Some("mine".into()),
            AllocatorFrames::Drop,
        )
        .expect("stored");
    assert_eq!((operators.owner_uid, mine.owner_uid), (None, Some(1000)));
    // The user lists and reads only theirs; the operators' is absent to them.
    let ids = |viewer| -> Vec<u64> {
        service
            .list_snapshots(viewer, None)
            .expect("listed")
            .iter()
            .map(|s| s.id)
            .collect()
    };
    assert_eq!(ids(user), vec![mine.id]);
    assert_eq!(ids(Viewer::Operator), vec![operators.id, mine.id]);
    assert_eq!(ids(Viewer::Nobody), Vec::<u64>::new());
    assert!(matches!(
        service.stored(user, &SnapshotRef::Id(operators.id)),
        Err(ServiceError::SnapshotNotFound { id }) if id == operators.id
    ));
    assert!(matches!(
        service.delete_snapshot(user, &SnapshotRef::Label("ops".into())),
        Err(ServiceError::Store(StoreError::LabelNotFound { .. }))
    ));
    // A label in use is refused without naming a snapshot they cannot see.
    let taken = service
        .label_snapshot(user, &SnapshotRef::Id(mine.id), Some("ops".into()))
        .expect_err("taken");
    assert_eq!(
        taken.to_string(),
        "label \"ops\" is already used by another snapshot"
    );
    let taken = service
        .label_snapshot(
            Viewer::Operator,
            &SnapshotRef::Id(mine.id),
            Some("ops".into()),
        )
        .expect_err("taken");
    assert_eq!(
        taken.to_string(),
        format!("label \"ops\" is already used by snapshot {}", operators.id)
    );
    // An operator sees, and may delete, the user's.
    assert!(
        service
            .delete_snapshot(Viewer::Operator, &SnapshotRef::Id(mine.id))
            .is_ok()
    );
}
