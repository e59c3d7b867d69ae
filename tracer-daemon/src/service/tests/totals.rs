//! Statistics from the kernel's totals per stack, and those totals leaving
//! the kernel with their images.
use super::*;
use crate::capture::StackMaps;

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
    assert_eq!(
        Housekeeping::new(&service).sweep_stack_totals(),
        0,
        "both are tracked"
    );
    let exit = kernel.exit(PID).expect("traced");
    Housekeeping::new(&service).handle_events(&[exit]);
    assert_eq!(Housekeeping::new(&service).sweep_stack_totals(), 1);
    let left: Vec<u32> = StackMaps::stack_totals(&kernel, None)
        .iter()
        .map(|(key, _)| key.generation)
        .collect();
    assert_eq!(left, vec![live.generation]);
    assert_ne!(ended.generation, live.generation);
}
