//! Waits: the cheap reads never wait for the kernel lock, a query waits for
//! an image's event to be applied.
use super::*;

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
            Housekeeping::new(&service).handle_events(&[exec_end, new]);
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
