//! The background loops of a running tracerd: the kernel's process events
//! as they come (one wake-up per process image start or end, never per
//! allocation), housekeeping every second (expiry; every ten seconds the
//! orphan sweep), and automatic snapshots every interval.
use std::{sync::Arc, time::Duration};

use tokio::io::unix::AsyncFd;
use tracer_common::{MAP_EVENTS, MAP_LIVE_ALLOCS, MAP_STACK_TOTALS, ProcEvent};

use crate::service::{
    AutoPolicy, Discoverer, ExecHolder, Housekeeping, Service, Triggers, Unwinder,
};

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
    // Batches are read from the ring, and their new images from /proc, as
    // they come; the handler applies them in order on a task of its own,
    // so that one waiting for a lock never delays the reading of the next
    // program's /proc (gone once it exits).
    let (batches, received) = tokio::sync::mpsc::unbounded_channel();
    let handler = tokio::spawn(handle_batches(
        service.clone(),
        received,
        discovery_wake,
        unwind_wake,
    ));
    let _abort_handler = AbortOnDrop(handler);
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
        let reader = service.clone();
        let Ok((batch, read)) = tokio::task::spawn_blocking(move || {
            // The levels first: they come from the pool in microseconds
            // (unless it ran dry: then each batch of maps put in OWN_LIVE
            // waits for an RCU grace period, 15 ms here), and meanwhile a
            // process that allocates at full speed spills to LIVE_ALLOCS.
            // Then /proc: a program that lives 50 ms is gone soon after its
            // first allocation.
            Housekeeping::new(&reader).make_own_levels(&batch);
            let read = Housekeeping::read_proc(&batch);
            (batch, read)
        })
        .await
        else {
            continue;
        };
        if batches.send((batch, read)).is_err() {
            return;
        }
    }
}

/// A batch of kernel events with what it needs from `/proc` read already.
type ReadBatch = (Vec<ProcEvent>, Vec<crate::service::ProcRead>);

/// Most events [`handle_batches`] applies in one call (about 100 bytes
/// each): a backlog after a burst of short-lived programs is worked off in
/// a few passes over the kernel maps, not one per batch read.
const MAX_EVENTS_HANDLED_AT_ONCE: usize = 1 << 16;

/// Applies the batches in order ([`Housekeeping::handle_read_events`]), then
/// wakes discovery and the unwinder. Runs until the reader ends.
async fn handle_batches(
    service: Arc<Service>,
    mut received: tokio::sync::mpsc::UnboundedReceiver<ReadBatch>,
    discovery_wake: Arc<tokio::sync::Notify>,
    unwind_wake: Arc<tokio::sync::Notify>,
) {
    while let Some((mut batch, mut read)) = received.recv().await {
        // The batches that queued meanwhile go with it: one pass over the
        // kernel maps for all their ended images.
        while batch.len() < MAX_EVENTS_HANDLED_AT_ONCE
            && let Ok((more, more_read)) = received.try_recv()
        {
            batch.extend(more);
            read.extend(more_read);
        }
        let service = service.clone();
        let _ = tokio::task::spawn_blocking(move || {
            Housekeeping::new(&service).handle_read_events(&batch, read);
        })
        .await;
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
        let _ = tokio::task::spawn_blocking(move || Unwinder::new(&service).unwind_pending()).await;
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
        // The NSS modules first: a process started meanwhile may load one
        // at once (a pre-fork server's workers, switching user).
        Unwinder::new(&all).preload_unwind_tables();
        let discoverer = Discoverer::new(&all);
        discoverer.probe_installed();
        discoverer.discover_all();
    })
    .await;
    loop {
        wake.notified().await;
        let service = service.clone();
        let _ =
            tokio::task::spawn_blocking(move || Discoverer::new(&service).discover_pending()).await;
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
    let upkeep = Housekeeping::new(service);
    let discoverer = Discoverer::new(service);
    upkeep.expire();
    // Images whose start event the full ring lost, from the kernel's totals.
    upkeep.reconcile_lost_images();
    discoverer.discover_again();
    // Libraries dlopen'd since an image was seen get their unwind tables.
    Unwinder::new(service).refresh_unwind();
    // A stack map half full of ended processes' stacks gets room again.
    upkeep.collect_stacks();
    if !tick.is_multiple_of(SWEEP_EVERY_TICKS) || service.stopping() {
        return;
    }
    discoverer.drop_unused_allocators();
    upkeep.log_drops();
    // The sweeps walk every live block: on a thread of their own at a
    // lower priority, which ends with them, so that on a host of few CPUs
    // the cheap routes' threads get a CPU first.
    let swept = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("tracerd-sweep".into())
            .spawn_scoped(scope, || {
                crate::sys::lower_this_threads_priority(crate::sys::EXPENSIVE_NICE);
                (upkeep.sweep_orphans(), upkeep.sweep_stack_totals())
            })
            .map(|thread| thread.join().unwrap_or((0, 0)))
            .unwrap_or_else(|_| (upkeep.sweep_orphans(), upkeep.sweep_stack_totals()))
    });
    if swept.0 > 0 {
        tracing::info!(
            removed = swept.0,
            map = MAP_LIVE_ALLOCS,
            "removed orphaned blocks"
        );
    }
    if swept.1 > 0 {
        tracing::debug!(
            removed = swept.1,
            map = MAP_STACK_TOTALS,
            "removed totals of ended images"
        );
    }
    // Ended images of large processes leave big freed blocks in the
    // allocator's heap: give them back so tracerd's RSS follows what it
    // holds (mimalloc's, tracerd's allocator; glibc's, for what C code in
    // libc allocated).
    // SAFETY: mi_collect has no preconditions; it runs on this thread's heap
    // and frees the abandoned pages of others.
    unsafe { libmimalloc_sys::mi_collect(true) };
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
}

/// The loop of the triggered snapshots (`service::triggers`): takes
/// automatic snapshots every `policy.interval_secs` (none when 0), each
/// kept for `policy.retention_secs`. Runs until aborted.
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
        let _ = crate::work::threads::spawn_expensive(move || {
            Triggers::new(&service).auto_snapshots(retention)
        })
        .await;
    }
}

/// The loop of the watch (`service::exact`): every `watch_interval`, every
/// process's memory read, and under `exact = "demand"` the steadily
/// growing processes traced exactly and those whose time is up let go
/// ([`Service::watch_tick`]). None with the interval 0. Runs until
/// aborted.
pub async fn watch(service: Arc<Service>) {
    let interval = service.exact_policy().watch_interval;
    if interval.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if service.stopping() {
            return;
        }
        let service = Arc::clone(&service);
        let _ = tokio::task::spawn_blocking(move || service.watch_tick()).await;
    }
}

/// The threads that hold execs until their probes are in place
/// (`hold_exec`, `service::exec_hold`). [`ExecHolds::stop`] ends them.
pub struct ExecHolds {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ExecHolds {
    /// Holds every exec on the filesystems of tracerd's mount table
    /// (`sys::fanotify`) until [`ExecHolder::exec_held`] has run for it, or
    /// for `service::exec_hold::HOLD_LIMIT` at most. One thread reads the
    /// holds and lets each go at its limit; another does the work, one
    /// exec after another.
    ///
    /// # Errors
    /// The kernel's refusal of the fanotify group (no CAP_SYS_ADMIN, no
    /// permission events) or of a thread.
    pub fn start(service: Arc<Service>) -> std::io::Result<Self> {
        use crate::sys::fanotify::ExecWatch;
        let watch = Arc::new(ExecWatch::new()?);
        let marked = watch.mark_filesystems();
        tracing::info!(
            filesystems = marked,
            "execs held until their probes are in place"
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (jobs, work) = std::sync::mpsc::channel::<Arc<crate::sys::fanotify::HeldExec>>();
        let worker = std::thread::Builder::new()
            .name("exec-hold".into())
            .spawn({
                let watch = watch.clone();
                let service = service.clone();
                move || {
                    for held in work {
                        if !held.answered() {
                            ExecHolder::new(&service).exec_held(held.pid, &held.file);
                        }
                        watch.allow(&held);
                    }
                }
            })?;
        let reader = std::thread::Builder::new()
            .name("exec-watch".into())
            .spawn({
                let stop = stop.clone();
                move || read_holds(&service, &watch, &jobs, &stop)
            })?;
        Ok(Self {
            stop,
            threads: vec![reader, worker],
        })
    }

    /// Lets every held exec go and ends the threads (the worker finishes
    /// the exec it is on).
    pub fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// Most files whose execs are no longer held at once (ignore marks, each
/// pinning an inode in the kernel's cache): past it, all are held again.
const MAX_IGNORED: usize = 16_384;

/// Reads held execs and lets those that need nothing go at once
/// ([`ExecHolder::exec_needs_nothing`]: a program run before), and holds
/// them no more until [`ExecHolder::holds_epoch`] changes; hands each
/// other to the worker through `jobs`, letting it go at its `HOLD_LIMIT`
/// if the worker has not; marks the filesystems of new mounts. Returns once `stop` is set, every exec let go.
fn read_holds(
    service: &Service,
    watch: &crate::sys::fanotify::ExecWatch,
    jobs: &std::sync::mpsc::Sender<Arc<crate::sys::fanotify::HeldExec>>,
    stop: &std::sync::atomic::AtomicBool,
) {
    use crate::service::exec_hold::HOLD_LIMIT;
    use std::time::Instant;
    let own = std::process::id();
    let holder = ExecHolder::new(service);
    // Files no longer held (they need nothing of tracerd), and the epoch
    // they were found in.
    let (mut ignored, mut epoch) = (0usize, holder.holds_epoch());
    let mut pending: std::collections::VecDeque<(Instant, Arc<crate::sys::fanotify::HeldExec>)> =
        std::collections::VecDeque::new();
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        if holder.holds_epoch() != epoch || ignored >= MAX_IGNORED {
            watch.hold_all_again();
            (ignored, epoch) = (0, holder.holds_epoch());
        }
        let now = Instant::now();
        while let Some((deadline, held)) = pending.front() {
            if held.answered() {
                pending.pop_front();
            } else if *deadline <= now {
                tracing::debug!(pid = held.pid, "an exec held past its limit is let go");
                watch.allow(held);
                pending.pop_front();
            } else {
                break;
            }
        }
        let wait = pending
            .front()
            .map_or(Duration::from_millis(100), |(deadline, _)| {
                deadline.saturating_duration_since(now)
            })
            .min(Duration::from_millis(100));
        let mut fds = [
            libc::pollfd {
                fd: watch.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: watch.mounts_fd(),
                events: libc::POLLPRI,
                revents: 0,
            },
        ];
        let ms = libc::c_int::try_from(wait.as_millis())
            .unwrap_or(100)
            .max(1);
        // SAFETY: fds is an array of two pollfd that lives through the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if ready <= 0 {
            continue;
        }
        if fds[1].revents & (libc::POLLPRI | libc::POLLERR) != 0 {
            let marked = watch.mark_filesystems();
            if marked > 0 {
                tracing::debug!(filesystems = marked, "new filesystems hold their execs");
            }
        }
        if fds[0].revents & libc::POLLIN == 0 {
            continue;
        }
        let held = match watch.read() {
            Ok(held) => held,
            Err(err) => {
                tracing::warn!(%err, "cannot read held execs");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        for exec in held {
            let known = || {
                crate::sys::procfs::FileKey::of_file(&exec.file)
                    .is_some_and(|key| holder.exec_needs_nothing(key))
            };
            if exec.pid == own {
                watch.allow(&exec);
                continue;
            }
            if known() {
                // Not held again until the scope or the objects probed
                // change, or the file is written.
                if watch.stop_holding(&exec) {
                    ignored += 1;
                }
                watch.allow(&exec);
                continue;
            }
            let exec = Arc::new(exec);
            pending.push_back((Instant::now() + HOLD_LIMIT, exec.clone()));
            if jobs.send(exec.clone()).is_err() {
                watch.allow(&exec);
            }
        }
    }
    for (_, held) in pending {
        watch.allow(&held);
    }
}
