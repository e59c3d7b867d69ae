//! The service over a fake kernel ([`crate::capture::fake`]): lifecycle,
//! tracemalloc's module API and the numbers every face shows, with no root
//! and no eBPF. One module per concept; here the service and processes
//! they share (also used by the tests of `metrics` and `http`).
use std::sync::Arc;
use std::time::Duration;

use tracer_common::{ProcEventKind, SWITCH_SCOPED};
use tracer_model::GroupBy;

use super::*;
use crate::capture::ImageId;
use crate::capture::fake::{FakeKernel, event};
use crate::lifecycle::{ImageState, Scope};
use crate::snapshot::AllocatorFrames;
use crate::snapshot::FramePatterns;
use crate::store::StoreError;

mod lifecycle;
mod snapshots;
mod totals;
mod waits;

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
    Housekeeping::new(service).handle_events(&[new]);
    image
}
