//! The service: one façade over tracerd's state, the only way to a
//! process's numbers. The HTTP API, `/metrics` and the last-stop record all
//! read them here, so they agree by construction.
//!
//! It owns the kernel side (through [`KernelMaps`]), the registry of
//! process images, tracemalloc's start/stop/clear state, the scope and the
//! snapshot store, behind the locks of [`state`] (taken in one order by one
//! function), and the [`SnapshotBuilder`] that symbolizes. Its methods are
//! tracemalloc's module API over processes, what the HTTP layer, `/metrics`
//! and `app.rs` ask:
//!
//! - [`processes`]: `get_traced_memory()` and the process list;
//! - [`snapshots`]: `take_snapshot()` now or stored, loaded files, labels;
//! - [`compare`]: the two sides of `compare_to()`;
//! - [`control`]: `start`, `stop`, `is_tracing`, `clear_traces`,
//!   `reset_peak`;
//! - [`inspect`]: `get_tracemalloc_memory()`, `get_object_traceback()`, the
//!   kernel maps, health and the last-stop record;
//! - [`scope`]: which processes are traced;
//! - [`access`]: who sees which processes and snapshots ([`Viewer`]).
//!
//! The background work is not the façade's: each has an owner of its own
//! over the service's state, which `tasks.rs` drives (`app.rs` too, for the
//! tables of the processes found at start):
//!
//! - [`Housekeeping`] ([`housekeeping`], [`losses`], `stacks`): kernel
//!   events, expiry, lost images, the stacks' collection, the losses
//!   logged and the orphan sweeps;
//! - [`Discoverer`] (`allocators`): allocator discovery;
//! - [`Unwinder`] (`unwind`): the unwind queue;
//! - [`ExecHolder`] ([`exec_hold`]): execs held until their probes are in
//!   place;
//! - [`Triggers`] ([`triggers`]): snapshots taken and kept by a policy
//!   (every interval).
//!
//! Every method blocks (map syscalls, DWARF, files): call them from
//! blocking threads. Results are typed; errors are [`ServiceError`].
use std::time::{Duration, SystemTime};

use crate::capture::KernelMaps;
use crate::lifecycle::{Registry, TracingControl};
use crate::snapshot::FramePatterns;
use crate::snapshot::SnapshotBuilder;
use crate::store::{SnapshotStore, StoreError};
use crate::symbolize::{Symbolizer, SymbolizerStats};

pub mod access;
mod allocators;
pub mod compare;
pub mod control;
mod error;
mod exact;
pub mod exec_hold;
pub mod housekeeping;
pub mod inspect;
pub mod losses;
pub mod processes;
pub mod scope;
pub mod snapshots;
mod stacks;
mod state;
pub mod triggers;
mod unwind;

pub use access::Viewer;
pub use allocators::Discoverer;
pub use compare::{BaseSpec, Side};
pub use control::{ProcessTracing, TracingState};
pub use error::{NotTracedWhy, ServiceError};
pub use exact::{ExactPolicy, ExactReason, ExactTracing, WatchedProcess};
pub use exec_hold::ExecHolder;
pub use housekeeping::{Housekeeping, ProcRead};
pub use inspect::{Health, KernelMapsView, LastStop, MapUse, TracerMemory};
pub use processes::{ProcessStatus, ProcessView, SystemMemory, state_of};
pub use snapshots::{Now, SnapshotRef, Target};
pub use triggers::{AutoPolicy, Triggers};
pub use unwind::Unwinder;

use state::State;

/// tracerd's state and the operations on it.
pub struct Service {
    state: State,
    /// Makes the images' own spill maps as the events ask, without the
    /// kernel lock ([`Housekeeping::make_own_levels`]); None for the fake
    /// kernel.
    own_levels: Option<crate::capture::own_spill::OwnLevels>,
    /// `STACK_TOTALS` and `STACKS` read without the kernel lock, for
    /// statistics of live images.
    totals_reader: std::sync::Arc<dyn crate::capture::stack_totals::StackTotalsSource>,
    builder: SnapshotBuilder,
    /// The unwinder's work: new images waiting for their tables and mappings, images that mapped code, and what the kernel was given ([`Unwinder::unwind_pending`]).
    unwind: unwind::UnwindWork,
    /// Allocator discovery's state and queues ([`Discoverer`]).
    discovery: allocators::Discovery,
    /// What the exec holds read without the service's locks ([`ExecHolder::exec_held`]).
    exec_holds: exec_hold::ExecHolds,
    /// What the housekeeping passes remember between ticks: the lost events seen, the sweeps, the losses logged, the stacks unnamed.
    upkeep: housekeeping::Upkeep,
    /// When tracing began (wall clock).
    started_at: SystemTime,
    /// The scope in force, a copy published by [`Service::set_scope`] as
    /// it stores the scope: why a pid is not traced is told without the
    /// scope's lock, which a scope change holds while it attaches (seconds
    /// for hundreds of processes).
    scope_published: std::sync::RwLock<std::sync::Arc<crate::lifecycle::Scope>>,
    /// Raised once tracerd is stopping ([`Service::begin_stop`]): the long
    /// background passes end at their next item, and reads of the kernel
    /// maps and snapshot builds at their next block (the kernel side and
    /// the builder share it), so that nothing holds the service's locks
    /// (and its probes) for long.
    stopping: crate::capture::Stopping,
    /// The probes' links, which [`Service::detach_probes`] takes out
    /// without the kernel lock.
    probe_links: crate::capture::ProbeLinks,
    /// The libraries probed, as `/health` shows them: a copy published
    /// under the kernel lock whenever the list changes
    /// ([`Discoverer::probe_library`], [`Discoverer::drop_unused_allocators`]),
    /// so that `/health` never waits on the kernel lock (a wide scope
    /// change holds it for seconds).
    libraries: std::sync::RwLock<Vec<crate::capture::AttachedLibrary>>,
    /// The kernel's per-process totals (`PROC_SLOTS`, `PROCS`), read
    /// without the kernel lock ([`TotalsMaps::totals`]): the process list
    /// and `get_traced_memory()` never wait behind a pass over the live
    /// blocks, and still show the kernel's totals of the moment.
    totals: std::sync::Arc<dyn crate::capture::ProcTotalsSource>,
    /// The kernel's counters, program statistics, map use and unwind
    /// tables' use, read without the kernel lock ([`UsageMaps::stats`]):
    /// `/metrics` never waits behind a pass over the live blocks.
    stats: std::sync::Arc<dyn crate::capture::KernelStatsSource>,
    /// The store's counts as last read by [`Service::store_stats`], which
    /// `/metrics` answers with while a snapshot is being stored.
    store_stats_seen:
        std::sync::Mutex<Option<(crate::store::StoreStats, Option<std::path::PathBuf>)>>,
    /// Batches of kernel events applied to the registry so far, and the
    /// signal of each: a query for a pid whose image the kernel has and the
    /// registry not yet waits for them ([`Service::catch_up`]).
    events_applied: (std::sync::Mutex<u64>, std::sync::Condvar),
    /// Exact tracing on demand and the watch ([`Service::start_exact`],
    /// [`Service::watch_tick`]).
    exact: exact::ExactState,
}

impl Service {
    /// A service over a loaded kernel side; ended images are kept for
    /// `retention`; snapshots drop the leading frames that
    /// `allocator_frames` (the configuration's patterns, compiled) says are
    /// the allocation machinery's, unless asked to keep them. The store is
    /// empty until [`Service::open_store`].
    pub fn new(
        mut kernel: Box<dyn KernelMaps>,
        retention: Duration,
        allocator_frames: FramePatterns,
    ) -> Self {
        let stopping = crate::capture::Stopping::default();
        kernel.stop_with(stopping.clone());
        let probe_links = kernel.probe_links();
        let nframe = kernel.config().nframe;
        let sample_interval = kernel.config().sample_interval;
        let pinned: Vec<_> = kernel.libraries().iter().map(|l| l.key).collect();
        let libraries = std::sync::RwLock::new(kernel.libraries().to_vec());
        let totals = kernel.totals();
        let stats = kernel.stats();
        let own_levels = kernel.own_levels();
        let totals_reader = kernel.totals_reader();
        Self {
            own_levels,
            totals_reader,
            unwind: unwind::UnwindWork::default(),
            discovery: allocators::Discovery::new(pinned),
            exec_holds: exec_hold::ExecHolds::default(),
            upkeep: housekeeping::Upkeep::default(),
            state: State::new(
                kernel,
                Registry::new(retention),
                TracingControl::new(nframe),
                SnapshotStore::default(),
            ),
            scope_published: std::sync::RwLock::default(),
            events_applied: (std::sync::Mutex::new(0), std::sync::Condvar::new()),
            libraries,
            totals,
            stats,
            store_stats_seen: std::sync::Mutex::default(),
            stopping: stopping.clone(),
            probe_links,
            builder: SnapshotBuilder {
                symbolizer: Symbolizer::new(),
                nframe,
                sample_interval,
                allocator_frames,
                stopping,
            },
            started_at: SystemTime::now(),
            exact: exact::ExactState::new(ExactPolicy {
                mode: crate::config::ExactMode::All,
                ..ExactPolicy::default()
            }),
        }
    }

    /// This service with `policy` for exact tracing and the watch (the
    /// service is made with `exact = "all"` and the default watch).
    #[must_use]
    pub fn with_exact(mut self, policy: ExactPolicy) -> Self {
        self.exact = exact::ExactState::new(policy);
        self
    }

    /// Marks tracerd as stopping: the background passes (unwind tables,
    /// allocator discovery, housekeeping) end at their next item, reads of
    /// the kernel maps and snapshot builds at their next block, and the
    /// requests still running answer [`ServiceError::Stopping`]; nothing
    /// is attached any more.
    pub fn begin_stop(&self) {
        self.stopping.raise();
    }

    /// Whether every process is in scope (no pids, executables or cgroups
    /// chosen).
    pub fn scope_is_all(&self) -> bool {
        self.exec_holds
            .scope_is_all
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether [`Service::begin_stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping.is_raised()
    }

    /// [`ServiceError::Stopping`] once [`Service::begin_stop`] was called,
    /// [`ServiceError::Interrupted`] once the thread's interrupt check said
    /// to stop: what was read or built since may be partial, and is not
    /// shown.
    ///
    /// # Errors
    /// [`ServiceError::Stopping`], [`ServiceError::Interrupted`].
    pub(crate) fn unless_stopping(&self) -> Result<(), ServiceError> {
        if self.stopping() {
            Err(ServiceError::Stopping)
        } else {
            // A build stops early when the request's interrupt check says
            // so (as it does when tracerd stops): its partial snapshot is
            // never shown.
            tracer_model::interrupt::check()?;
            Ok(())
        }
    }

    /// Detaches every probe (allocator probes and tracepoints) and returns
    /// how many there were: the first step of a stop, taken at the signal.
    /// No lock of the service is taken (the links have one of their own,
    /// [`crate::capture::ProbeLinks`]): detaching costs the kernel grace
    /// periods (a wait per uprobe_multi link, links on several threads at
    /// once; about 0.09 s a probe, one after another, for perf events),
    /// and the requests of the grace period go on reading the maps
    /// meanwhile (what they show is then the state at the signal). Nothing is attached afterwards; a second call
    /// finds nothing to detach.
    pub fn detach_probes(&self) -> usize {
        let detached = crate::capture::attach::lock_links(&self.probe_links).take_all();
        let probes = detached.len();
        detached.finish();
        probes
    }

    /// Opens the snapshot store in `state_dir` (its files read back; those
    /// that do not decode are logged and left where they are), with
    /// `quotas`. Snapshots read back beyond the quotas stay (and are
    /// logged): new ones are refused until there is room.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the state directory cannot be used.
    pub fn open_store(
        &self,
        state_dir: &std::path::Path,
        quotas: crate::store::Quotas,
    ) -> Result<(), StoreError> {
        let mut store = SnapshotStore::open(state_dir)?;
        store.set_quotas(quotas);
        let stats = store.stats();
        let (count, bytes) = stats
            .by_kind
            .iter()
            .fold((0u64, 0u64), |(c, b), (_, n, s)| (c + n, b + s));
        if count > quotas.snapshots || bytes > quotas.bytes {
            ::tracing::warn!(
                count,
                bytes,
                max_snapshots = quotas.snapshots,
                max_snapshot_bytes = quotas.bytes,
                "the stored snapshots read back exceed the quotas: new snapshots are refused until some are deleted (DELETE /snapshots/{{id}})"
            );
        }
        for bad in store.unreadable() {
            ::tracing::error!(target = %bad.path.display(), err = %bad.error, "stored snapshot not loaded");
        }
        ::tracing::info!(
            snapshots = store.len(),
            refused = store.unreadable().len(),
            "snapshot store opened"
        );
        *self.state.locks().store().store = store;
        Ok(())
    }

    /// The traceback limit in frames (tracerd's `nframe`).
    pub fn nframe(&self) -> u32 {
        self.builder.nframe
    }

    /// When tracing began (wall clock).
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// Holds the kernel lock on a thread of its own for `hold`, as a
    /// request stuck in a long read would (tests of the stop).
    #[cfg(test)]
    pub(crate) fn hold_kernel_lock(
        self: &std::sync::Arc<Self>,
        hold: Duration,
    ) -> std::thread::JoinHandle<()> {
        self.hold_locks(hold, false)
    }

    /// Holds every lock of the service's state on a thread of its own for
    /// `hold` (tests of the stop: a service stuck everywhere).
    #[cfg(test)]
    pub(crate) fn hold_all_locks(
        self: &std::sync::Arc<Self>,
        hold: Duration,
    ) -> std::thread::JoinHandle<()> {
        self.hold_locks(hold, true)
    }

    /// The kernel lock, or every lock when `all`, held on a thread of its
    /// own for `hold`; returns once they are taken.
    #[cfg(test)]
    fn hold_locks(
        self: &std::sync::Arc<Self>,
        hold: Duration,
        all: bool,
    ) -> std::thread::JoinHandle<()> {
        let service = self.clone();
        let (held, taken) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let wait = || {
                let _ = held.send(());
                std::thread::sleep(hold);
            };
            if all {
                let _all = service
                    .state
                    .locks()
                    .kernel()
                    .scope()
                    .registry()
                    .control()
                    .store();
                wait();
            } else {
                let _kernel = service.state.locks().kernel();
                wait();
            }
        });
        let _ = taken.recv();
        handle
    }

    /// The symbolizer's counters.
    pub fn symbolizer_stats(&self) -> SymbolizerStats {
        self.builder.symbolizer.stats()
    }
}

#[cfg(test)]
pub(crate) mod tests;
