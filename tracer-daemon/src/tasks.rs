//! The background loops of a running tracerd: the kernel's process events
//! as they come (one wake-up per process image start or end, never per
//! allocation), housekeeping every second (expiry; every ten seconds the
//! orphan sweep), and automatic snapshots every interval.
use std::{sync::Arc, time::Duration};

use tokio::io::unix::AsyncFd;
use tracer_common::{MAP_EVENTS, MAP_LIVE_ALLOCS, ProcEvent};

use crate::service::{AutoPolicy, Service};

/// Ticks of the housekeeping loop between two orphan sweeps.
const SWEEP_EVERY_TICKS: u64 = 10;

/// Drains the kernel's process events as they come; housekeeping runs
/// each second on a task of its own, so that a long pass (the orphan sweep
/// over millions of blocks, unwind tables compiled for the processes found
/// at start) never delays the next process's start event. Runs until
/// aborted.
pub async fn events_and_housekeeping(
    service: Arc<Service>,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
) {
    let unwind_wake = Arc::new(tokio::sync::Notify::new());
    let unwinder = tokio::spawn(unwind_new_images(service.clone(), unwind_wake.clone()));
    let _abort_unwinder = AbortOnDrop(unwinder);
    let discovery_wake = Arc::new(tokio::sync::Notify::new());
    let discoverer = tokio::spawn(discover_allocators(service.clone(), discovery_wake.clone()));
    let _abort_discoverer = AbortOnDrop(discoverer);
    let housekeeper = tokio::spawn(housekeeping_loop(service.clone()));
    let _abort_housekeeper = AbortOnDrop(housekeeper);
    // SAFETY: the RingBuf owns its map fd for its whole life inside the
    // AsyncFd, and as_raw_fd always returns that same fd.
    let mut fd =
        match unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) } {
            Ok(fd) => fd,
            Err(err) => {
                tracing::error!(err = %err, map = MAP_EVENTS, "cannot poll the ring buffer");
                return;
            }
        };
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            continue;
        };
        let mut batch = Vec::new();
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<ProcEvent>() {
                // SAFETY: the record holds a ProcEvent written by our
                // eBPF program; read_unaligned copes with alignment.
                batch.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<ProcEvent>()) });
            }
        }
        guard.clear_ready();
        let service = service.clone();
        let _ = tokio::task::spawn_blocking(move || service.handle_events(&batch)).await;
        discovery_wake.notify_one();
        unwind_wake.notify_one();
    }
}

/// Runs [`housekeeping`] each second (a pass that takes longer delays the
/// next). Runs until aborted.
async fn housekeeping_loop(service: Arc<Service>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    loop {
        tick.tick().await;
        ticks += 1;
        let service = service.clone();
        let _ = tokio::task::spawn_blocking(move || housekeeping(&service, ticks)).await;
    }
}

/// Gives the new images of each batch of events their unwind tables and
/// mappings, apart from the event loop so that compiling never delays the
/// next events. Runs until aborted.
async fn unwind_new_images(service: Arc<Service>, wake: Arc<tokio::sync::Notify>) {
    loop {
        wake.notified().await;
        let service = service.clone();
        let _ = tokio::task::spawn_blocking(move || service.unwind_pending()).await;
    }
}

/// Probes the allocators of every process running at start, then of the
/// processes each batch of events queued (exec, code mapped), apart from
/// the event loop and from the unwinder
/// (whose compiling must not delay a process's probes). Runs until
/// aborted.
async fn discover_allocators(service: Arc<Service>, wake: Arc<tokio::sync::Notify>) {
    // The allocator libraries installed on the host, then the processes
    // running at start, without holding up the events of those starting
    // meanwhile.
    let all = service.clone();
    let _ = tokio::task::spawn_blocking(move || {
        all.probe_installed();
        all.discover_all();
    })
    .await;
    loop {
        wake.notified().await;
        let service = service.clone();
        let _ = tokio::task::spawn_blocking(move || service.discover_pending()).await;
    }
}

/// Aborts its task when dropped (with the loop that started it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One housekeeping pass: expiry and the unwinder's mappings each tick,
/// the sweep every
/// [`SWEEP_EVERY_TICKS`].
fn housekeeping(service: &Service, tick: u64) {
    if service.stopping() {
        return;
    }
    service.expire();
    service.discover_again();
    // Libraries dlopen'd since an image was seen get their unwind tables.
    service.refresh_unwind();
    if !tick.is_multiple_of(SWEEP_EVERY_TICKS) || service.stopping() {
        return;
    }
    service.drop_unused_allocators();
    service.log_drops();
    let removed = service.sweep_orphans();
    if removed > 0 {
        tracing::info!(removed, map = MAP_LIVE_ALLOCS, "removed orphaned blocks");
    }
    // Ended images of large processes leave big freed blocks in glibc's
    // heap, which it keeps: give them back so tracerd's RSS follows what it
    // holds.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
}

/// Takes automatic snapshots every `policy.interval_secs` (none when 0),
/// each kept for `policy.retention_secs`. Runs until aborted.
pub async fn automatic_snapshots(service: Arc<Service>, policy: AutoPolicy) {
    if policy.interval_secs == 0 {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(policy.interval_secs));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: skip it (nothing is traced yet).
    tick.tick().await;
    loop {
        tick.tick().await;
        let service = Arc::clone(&service);
        let retention = Duration::from_secs(policy.retention_secs);
        let _ = tokio::task::spawn_blocking(move || service.auto_snapshots(retention)).await;
    }
}
