//! Tests of `collector`.
use super::*;
use crate::metrics::Metrics;
use crate::service::Viewer;
use crate::service::tests::{PID, service, start};
use crate::service::{ServiceError, Target};

fn view(pid: u32, comm: &str, current: u64) -> ProcessView {
    ProcessView {
        pid,
        generation: 1,
        ppid: None,
        comm: comm.into(),
        exe: None,
        nspid: None,
        cgroup: None,
        owner_uid: None,
        container_id: None,
        state: tracer_api::ProcessState::Alive,
        first_seen_ms: 0,
        ended_ms: None,
        current,
        peak: current * 2,
        blocks: current / 10,
        allocs: 7,
        frees: 3,
        unknown_frees: 1,
        drops: 0,
        cut_tracebacks: 0,
        complete: true,
    }
}

#[test]
fn top_processes_by_current_bytes_rest_summed() {
    let views = vec![
        view(5, "a", 100),
        view(3, "b", 500),
        view(9, "c", 100),
        view(1, "d", 40),
    ];
    let (top, other) = top_processes(views, 2);
    assert_eq!(top.iter().map(|v| v.pid).collect::<Vec<_>>(), vec![3, 5]);
    assert_eq!(
        other,
        OtherTotals {
            processes: 2,
            current: 140,
            peak: 280,
            blocks: 14,
            allocs: 14,
            frees: 6,
            unknown_frees: 2,
            drops: 0,
            cut_tracebacks: 0,
        }
    );
}

#[test]
fn top_processes_with_room_for_all_has_no_other() {
    let (top, other) = top_processes(vec![view(1, "a", 1)], 20);
    assert_eq!(top.len(), 1);
    assert_eq!(other, OtherTotals::default());
}

#[test]
fn every_ebpf_counter_has_a_metric() {
    let mut drops = Vec::new();
    for (_, name) in tracer_common::Counter::ALL {
        match counter_metric(name) {
            CounterMetric::Drop(reason) => drops.push(reason),
            CounterMetric::DropNamed(reason) => {
                panic!("drop counter {reason} has no reason label")
            }
            CounterMetric::UnknownFrees
            | CounterMetric::CutTracebacks
            | CounterMetric::Event(_) => {}
        }
    }
    assert_eq!(
        drops,
        [
            "live_map_full",
            "inflight_map_full",
            "procs_map_full",
            "stack_store_full",
            "event_ring_full",
            "stack_scratch_preempted",
            "process_share",
            "process_stack_share",
            "mmap_regions_full"
        ]
    );
    assert_eq!(
        counter_metric("allocs"),
        CounterMetric::Event("allocs".into())
    );
    assert_eq!(
        counter_metric("cut_tracebacks"),
        CounterMetric::CutTracebacks
    );
}

/// The value of a `/metrics` sample of `name` labelled with `pid`.
fn metric(service: &Arc<Service>, name: &str, pid: u32) -> Option<u64> {
    let mut metrics = Metrics::new();
    metrics.collect_service(
        Arc::clone(service),
        MetricsOptions {
            top_processes: 10,
            call_sites: 0,
            bpf_stats_enabled: false,
            public: false,
        },
    );
    let text = metrics.encode(true).expect("encodes");
    let prefix = format!("{name}{{pid=\"{pid}\",");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn the_api_and_metrics_show_the_same_numbers_after_clear_traces_and_stop() {
    let (kernel, service) = service();
    start(&kernel, &service, PID);
    for i in 0..3 {
        kernel.alloc(PID, 0x1000 + i * 0x100, 100, &[0x40_1000, 0x40_2000]);
    }
    let status = service.process(PID).expect("traced");
    assert_eq!((status.view.current, status.view.blocks), (300, 3));
    assert_eq!(
        metric(&service, "tracer_process_current_bytes", PID),
        Some(300)
    );

    let (cleared, after) = service.clear_traces(PID).expect("cleared");
    assert_eq!(cleared, 3);
    assert_eq!(
        (after.view.current, after.view.peak, after.view.blocks),
        (0, 0, 0)
    );
    kernel.alloc(PID, 0x9000, 50, &[0x40_1000]);
    let listed = service.processes(Viewer::Operator);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].view.current,
            listed[0].view.peak,
            listed[0].view.blocks
        ),
        (50, 50, 1)
    );
    assert_eq!(
        metric(&service, "tracer_process_current_bytes", PID),
        Some(50)
    );
    assert_eq!(metric(&service, "tracer_process_peak_bytes", PID), Some(50));
    assert_eq!(metric(&service, "tracer_process_live_blocks", PID), Some(1));
    assert_eq!(service.system_memory(Viewer::Operator).current, 50);

    let state = service.stop_tracing(Some(PID)).expect("stopped");
    assert!(!state.is_tracing);
    let stopped = service.process(PID).expect("traced");
    assert!(!stopped.is_tracing);
    assert_eq!((stopped.view.current, stopped.view.peak), (0, 0));
    assert_eq!(
        metric(&service, "tracer_process_current_bytes", PID),
        Some(0)
    );
    assert!(matches!(
        service.snapshot_now(Target::Process(PID)),
        Err(ServiceError::TracingStopped { pid: Some(PID) })
    ));
}
