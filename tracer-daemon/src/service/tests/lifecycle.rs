//! Lifecycle of images: exits, execs, expiry of what is gone, the sweep
//! of blocks whose end was never seen, scopes and detached probes.
use super::*;
use crate::capture::{ProbeMaps, TotalsMaps};

#[test]
fn an_exited_image_keeps_its_last_state_and_its_blocks_leave_the_kernel() {
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    kernel.alloc(PID, 0x1000, 100, &[0x40_1000]);
    kernel.alloc(PID, 0x2000, 28, &[0x40_1000]);
    kernel.alloc(PID, 0x3000, 7, &[]);
    let exit = kernel.exit(PID).expect("traced");
    Housekeeping::new(&service).handle_events(&[exit]);
    assert_eq!(
        kernel.block_count(),
        0,
        "the ended image's blocks leave the maps"
    );
    let ended = service.process(PID).expect("retained");
    assert_eq!(ended.view.state, tracer_api::ProcessState::Exited);
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
    Housekeeping::new(&service).handle_events(&[exec, new]);
    assert_ne!(first, second);
    assert_eq!(kernel.block_count(), 0);
    let now = service.process(PID).expect("traced");
    assert_eq!(
        (now.view.state, now.view.current),
        (tracer_api::ProcessState::Alive, 0)
    );
    let ended: Vec<_> = service
        .processes(Viewer::Operator)
        .into_iter()
        .map(|p| (p.view.state, p.view.current))
        .collect();
    assert_eq!(
        ended,
        [
            (tracer_api::ProcessState::Alive, 0),
            (tracer_api::ProcessState::Exec, 100)
        ]
    );
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
    Housekeeping::new(&service).handle_events(&[exit]);
    std::thread::sleep(Duration::from_millis(5));
    Housekeeping::new(&service).expire();
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
    assert_eq!(
        Housekeeping::new(&service).sweep_orphans(),
        0,
        "its totals are still tracked"
    );
    kernel.lose_exit(PID);
    assert_eq!(
        Housekeeping::new(&service).sweep_orphans(),
        0,
        "once is not enough"
    );
    assert_eq!(Housekeeping::new(&service).sweep_orphans(), 2);
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
