//! The service over a fake kernel ([`crate::capture::fake`]): lifecycle,
//! tracemalloc's module API and the numbers every face shows, with no root
//! and no eBPF.
use std::sync::Arc;
use std::time::Duration;

use tracer_common::{ProcEventKind, SWITCH_SCOPED};
use tracer_model::GroupBy;

use super::*;
use crate::capture::ImageId;
use crate::capture::fake::{FakeKernel, event};
use crate::config::FramePatterns;
use crate::lifecycle::{ImageState, Scope};
use crate::snapshot::AllocatorFrames;
use crate::store::StoreError;

/// Above the kernel's largest pid_max: never a real process, so nothing is
/// read from `/proc` for it.
pub(crate) const PID: u32 = 4_100_001;

/// A service over a fresh fake kernel.
pub(crate) fn service() -> (FakeKernel, Arc<Service>) {
    let kernel = FakeKernel::new(16);
    let service = Service::new(
        Box::new(kernel.clone()),
        Duration::from_secs(60),
        FramePatterns::default(),
    );
    (kernel, Arc::new(service))
}

/// Starts `pid` on the fake kernel and tells the service.
pub(crate) fn start(kernel: &FakeKernel, service: &Service, pid: u32) -> ImageId {
    let (image, new) = kernel.start(pid);
    service.handle_events(&[new]);
    image
}

#[test]
fn an_exited_image_keeps_its_last_state_and_its_blocks_leave_the_kernel() {
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000]);
    kernel.alloc(PID, 0x2000, 28, &[0x40_1000]);
    kernel.alloc(PID, 0x3000, 7, &[]);
    let exit = kernel.exit(PID).expect("traced");
    service.handle_events(&[exit]);
    assert_eq!(
        kernel.block_count(),
        0,
        "the ended image's blocks leave the maps"
    );
    let ended = service.process(PID).expect("retained");
    assert_eq!(ended.view.state, ImageState::Exited);
    assert_eq!((ended.view.current, ended.view.blocks), (135, 3));
    let now = service
        .snapshot_now(Target::Process(PID))
        .expect("last state");
    let sizes: Vec<u64> = now.snapshot.traces().iter().map(|t| t.size).collect();
    assert_eq!(sizes, [100, 28, 7]);
    // No mappings for this pid: every frame is tracemalloc's <unknown>:0.
    let stats = now
        .snapshot
        .statistics(GroupBy::Lineno, false)
        .expect("groups");
    assert_eq!(stats.len(), 1);
    assert_eq!((stats[0].count, stats[0].size), (3, 135));
    assert_eq!(
        stats[0].to_string(),
        "<unknown>:0: size=135 B, count=3, average=45 B"
    );
    assert!(matches!(
        service.clear_traces(PID),
        Err(ServiceError::Ended {
            state: ImageState::Exited,
            ..
        })
    ));
}

#[test]
fn an_exec_ends_the_image_once_and_the_next_generation_starts_empty() {
    // The exec's end and the new image's first allocation in one batch:
    // the old image ends once (as exec, with its blocks), never also as a
    // blockless "exited" phantom.
    let (kernel, service) = service();
    let first = start(&kernel, &service, PID);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000]);
    let stats = kernel.proc_stats(PID).expect("traced");
    kernel.lose_exit(PID);
    let exec = event(ProcEventKind::Exec, first, stats);
    let (second, new) = kernel.start(PID);
    service.handle_events(&[exec, new]);
    assert_ne!(first, second);
    assert_eq!(kernel.block_count(), 0);
    let now = service.process(PID).expect("traced");
    assert_eq!((now.view.state, now.view.current), (ImageState::Alive, 0));
    let ended: Vec<_> = service
        .processes(Viewer::Operator)
        .into_iter()
        .map(|p| (p.view.state, p.view.current))
        .collect();
    assert_eq!(ended, [(ImageState::Alive, 0), (ImageState::Exec, 100)]);
}

#[test]
fn tracing_state_of_images_that_are_gone_is_forgotten_at_expiry() {
    let kernel = FakeKernel::new(16);
    let service = Service::new(
        Box::new(kernel.clone()),
        Duration::ZERO,
        FramePatterns::default(),
    );
    start(&kernel, &service, PID);
    service.stop_tracing(Some(PID)).expect("stopped");
    let overrides = |service: &Service| {
        service
            .tracing_state(Viewer::Operator, None)
            .expect("system")
            .processes
            .map(|p| p.len())
    };
    assert_eq!(overrides(&service), Some(1));
    let exit = kernel.exit(PID).expect("traced");
    service.handle_events(&[exit]);
    std::thread::sleep(Duration::from_millis(5));
    service.expire();
    assert!(service.process(PID).is_err(), "past its retention");
    assert_eq!(overrides(&service), Some(0));
}

#[test]
fn blocks_whose_end_was_never_seen_are_swept_at_the_second_pass() {
    let (kernel, service) = service();
    // Neither its New nor its Exit event reaches the service.
    let _ = kernel.start(PID);
    kernel.alloc(PID, 0x1000, 10, &[0x40_1000]);
    kernel.alloc(PID, 0x2000, 10, &[0x40_1000]);
    let traced = PID + 1;
    start(&kernel, &service, traced);
    kernel.alloc(traced, 0x1000, 10, &[0x40_1000]);
    assert_eq!(service.sweep_orphans(), 0, "its totals are still tracked");
    kernel.lose_exit(PID);
    assert_eq!(service.sweep_orphans(), 0, "once is not enough");
    assert_eq!(service.sweep_orphans(), 2);
    assert_eq!(
        kernel.block_count(),
        1,
        "the traced process keeps its block"
    );
}

#[test]
fn a_scope_attaches_matching_processes_and_an_empty_one_every_process() {
    let (kernel, service) = service();
    let scope = Scope {
        pids: [1].into(),
        ..Scope::default()
    };
    assert_eq!(service.set_scope(scope.clone()).expect("valid"), [1]);
    let view = service.scope(Viewer::Operator);
    assert_eq!(
        (view.scope, view.all_processes, view.attached_pids),
        (scope, false, vec![1])
    );
    assert_eq!(kernel.switches(), SWITCH_SCOPED);
    assert!(
        service
            .set_scope(Scope::default())
            .expect("valid")
            .is_empty()
    );
    assert_eq!(kernel.attached(), [None]);
    assert_eq!(kernel.switches(), 0);
    let bad = Scope {
        pids: [0].into(),
        ..Scope::default()
    };
    assert!(matches!(
        service.set_scope(bad),
        Err(ServiceError::Scope { .. })
    ));
}

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
    assert_eq!(base.info["kind"], "tracing_start");
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
    assert_eq!(base.info["id"], stored.id);
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
    assert_eq!(base.info["id"], kept.id);
    assert_eq!(base.info["allocator_frames"], "keep");
    assert_eq!(new.info["allocator_frames"], "keep");
    assert_eq!(new.allocator_frames, Some(AllocatorFrames::Keep));
    let (base, _) = sides(AllocatorFrames::Drop);
    assert_eq!(base.info["id"], dropped.id);
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
    assert_eq!(base.info["kind"], "snapshot");
    assert_eq!(base.info["id"], kept.id);
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
    assert_eq!(service.auto_snapshots(Duration::from_secs(60)), 0);
    assert_eq!(service.stored_count(), 1, "only the snapshot of before");
    // The sweep removes nothing from a scan cut short.
    kernel.lose_exit(PID);
    assert_eq!(service.sweep_orphans(), 0);
    assert_eq!(service.sweep_orphans(), 0);
    assert_eq!(kernel.block_count(), 2);
}

#[test]
fn detached_probes_stay_detached() {
    let (kernel, service) = service();
    assert_eq!(kernel.attached(), [None]);
    // The fake kernel holds no real probes: none to count.
    assert_eq!(service.detach_probes(), 0);
    let scope = Scope {
        pids: [1].into(),
        ..Scope::default()
    };
    let _ = service.set_scope(scope);
    assert_eq!(
        kernel.attached(),
        Vec::<Option<u32>>::new(),
        "nothing is attached again"
    );
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

#[test]
fn statistics_of_a_live_image_come_from_its_totals_per_stack_minus_what_was_cleared() {
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000, 0x40_2000]);
    kernel.alloc(PID, 0x2000, 28, &[0x40_1000, 0x40_2000]);
    kernel.alloc(PID, 0x3000, 7, &[]);
    kernel.alloc(PID, 0x4000, 9, &[0x40_3000]);
    kernel.free(PID, 0x4000);
    let lines = |now: &Now| -> Vec<String> {
        now.snapshot
            .statistics(GroupBy::Traceback, false)
            .expect("statistics")
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let grouped = service
        .grouped_now(
            Viewer::Operator,
            Target::Process(PID),
            AllocatorFrames::Keep,
        )
        .expect("live");
    let blocks = service
        .snapshot_now_with(
            Viewer::Operator,
            Target::Process(PID),
            AllocatorFrames::Keep,
        )
        .expect("live");
    assert!(grouped.snapshot.is_totals());
    assert!(!blocks.snapshot.is_totals());
    assert_eq!(grouped.snapshot.blocks(), 3);
    assert_eq!(lines(&grouped), lines(&blocks));
    // A clear leaves the kernel's totals as they were: tracerd subtracts.
    service.clear_traces(PID).expect("cleared");
    kernel.alloc(PID, 0x5000, 5, &[0x40_1000, 0x40_2000]);
    let grouped = service
        .grouped_now(
            Viewer::Operator,
            Target::Process(PID),
            AllocatorFrames::Keep,
        )
        .expect("live");
    assert_eq!(grouped.snapshot.blocks(), 1);
    let blocks = service
        .snapshot_now_with(
            Viewer::Operator,
            Target::Process(PID),
            AllocatorFrames::Keep,
        )
        .expect("live");
    assert_eq!(lines(&grouped), lines(&blocks));
}

#[test]
fn the_totals_per_stack_of_ended_images_leave_the_kernel_at_the_sweep() {
    let (kernel, service) = service();
    let ended = start(&kernel, &service, PID);
    let live = start(&kernel, &service, PID + 1);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000]);
    kernel.alloc(PID + 1, 0x1000, 10, &[0x40_1000]);
    assert_eq!(service.sweep_stack_totals(), 0, "both are tracked");
    let exit = kernel.exit(PID).expect("traced");
    service.handle_events(&[exit]);
    assert_eq!(service.sweep_stack_totals(), 1);
    let left: Vec<u32> = KernelMaps::stack_totals(&kernel, None)
        .iter()
        .map(|(key, _)| key.gen_)
        .collect();
    assert_eq!(left, vec![live.generation]);
    assert_ne!(ended.generation, live.generation);
}

#[test]
fn the_cheap_reads_do_not_wait_for_a_holder_of_the_kernel_lock() {
    // A pass over millions of live blocks (a snapshot, the sweep) holds
    // the kernel lock for seconds: a process's traced memory, the process
    // list, the health and /metrics' counters and maps' use are read
    // without it, and are the kernel's values of the moment.
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000]);
    kernel.alloc(PID, 0x2000, 28, &[0x40_1000]);
    let holder = service.hold_kernel_lock(Duration::from_secs(2));
    let started = std::time::Instant::now();
    // Changed meanwhile: the reads show it.
    kernel.alloc(PID, 0x3000, 7, &[]);
    let (process, sources) = service.process_with_sources(PID).expect("traced");
    let listed: Vec<(u32, u64, u64, u64)> = service
        .processes(Viewer::Operator)
        .iter()
        .map(|p| (p.view.pid, p.view.current, p.view.peak, p.view.blocks))
        .collect();
    let one = service.process(PID).expect("traced");
    let health = service.health();
    // And /metrics' readings of the kernel side.
    let counters = service.counters();
    let maps = service.map_usage();
    let unwind = service.unwind_usage();
    let took = started.elapsed();
    let _ = holder.join();
    assert!(took < Duration::from_millis(500), "took {took:?}");
    assert_eq!(
        (process.view.current, process.view.peak, process.view.blocks),
        (135, 135, 3)
    );
    assert_eq!(sources, [("glibc", 135, 135)]);
    assert_eq!(listed, [(PID, 135, 135, 3)]);
    assert_eq!((one.view.current, one.view.blocks), (135, 3));
    assert_eq!(health.status, "ready");
    assert_eq!(counters.len(), tracer_common::Counter::ALL.len());
    assert_eq!(maps, [(tracer_common::MAP_LIVE_ALLOCS, 3, 1 << 20)]);
    assert_eq!(
        (unwind.rows, unwind.rows_capacity, unwind.processes),
        (0, 65536, 0)
    );
}

#[test]
fn a_query_waits_for_the_image_the_kernel_started_until_its_event_is_applied() {
    let (kernel, service) = service();
    let fork = start(&kernel, &service, PID);
    // The exec: the kernel's image is new, its events still on their way
    // (the fork's image read 0 bytes in use while the exec's had 135).
    let exec_end = kernel.exit(PID).expect("traced");
    let (exec, new) = kernel.start(PID);
    kernel.alloc(PID, 0x1000, 135, &[]);
    let applier = {
        let service = service.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            service.handle_events(&[exec_end, new]);
        })
    };
    let status = service.process(PID).expect("traced");
    assert_eq!(
        (status.view.generation, status.view.current),
        (exec.generation, 135),
        "the fork's image was {fork:?}"
    );
    applier.join().expect("applier");
    // Never applied: answered with what the registry has, within the limit.
    let (later, _) = kernel.start(PID);
    let asked = std::time::Instant::now();
    let status = service.process(PID).expect("traced");
    assert_eq!(status.view.generation, exec.generation);
    assert_ne!(later, exec);
    let waited = asked.elapsed();
    assert!(
        waited >= processes::CATCH_UP_LIMIT && waited < processes::CATCH_UP_LIMIT * 3,
        "{waited:?}"
    );
}
