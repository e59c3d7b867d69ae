//! What tracing costs and holds: `get_tracemalloc_memory()`,
//! `get_object_traceback()`, the kernel maps' use, readiness, and the
//! record written when tracerd stops.
use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use tracer_model::Trace;

use super::{Service, ServiceError, Viewer};
use crate::capture::ImageId;
use crate::capture::unwind::tables::UnwindUsage;
use crate::lifecycle::blocks::raw_blocks;
use crate::snapshot::{AllocatorFrames, truncate};
use crate::sys::procfs::{self, BpfMapInfo};
use crate::sys::unix_ms;

/// `get_tracemalloc_memory()`: what tracing costs, in bytes.
#[derive(Clone, Debug, Serialize)]
pub struct TracerMemory {
    /// Memory the kernel charges for tracerd's BPF maps (`memlock` of each).
    pub kernel_maps: u64,
    /// tracerd's resident memory (stored snapshots, symbol caches, ...).
    pub daemon_rss: u64,
    /// The sum: tracemalloc's `get_tracemalloc_memory()`.
    pub total: u64,
    /// Each map: id, type, max_entries, memlock bytes (`/proc/self/fdinfo`).
    pub maps: Vec<BpfMapInfo>,
    /// Snapshots held by the store.
    pub stored_snapshots: usize,
    /// Traces in stored snapshots.
    pub stored_traces: usize,
    /// The unwind tables in the kernel (their bytes are in `kernel_maps`,
    /// as the memlock of `UNWIND_ROWS`, `UNWIND_PAGES` and `PROC_MAPS`).
    pub unwind: UnwindUsage,
}

/// Entries and capacity of one kernel map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MapUse {
    /// Entries now (bytes pending for the event ring).
    pub entries: u64,
    /// Capacity as configured.
    pub capacity: u64,
}

/// A process's blocks past the fast table, as the programs count them:
/// at or above the truth (raised before an insert, lowered after a delete).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SpilledBlocks {
    /// In the process's own spill maps (`OWN_LIVE`).
    pub own: u64,
    /// In the shared `LIVE_ALLOCS`: a read of the process's blocks walks
    /// it only when this is above 0.
    pub shared: u64,
}

/// The kernel maps' use (`GET /maps`).
#[derive(Clone, Debug, Serialize)]
pub struct KernelMapsView {
    /// By map name.
    pub maps: BTreeMap<String, MapUse>,
    /// Live blocks of each process in the kernel maps, by pid.
    pub live_allocs_by_pid: BTreeMap<u32, u64>,
    /// The kernel's counts of each process's blocks past the fast table
    /// (`ProcTotals::own_spill` and `shared_spill`), by pid; only processes
    /// with a count above 0.
    pub spilled_by_pid: BTreeMap<u32, SpilledBlocks>,
    /// How statistics of live images read their totals per stack since
    /// load: by the image's keys, or by a pass over every image's.
    pub stack_totals_reads: crate::capture::stack_totals::StackTotalsReads,
    /// The live blocks one process may hold (`process_share` of the
    /// live-block maps); 0: no limit.
    pub process_max_blocks: u64,
    /// The programs' counters summed over CPUs, by name.
    pub counters: BTreeMap<String, u64>,
    /// The unwind tables: files loaded, refused (over the budget among
    /// them) and evicted, rows, pages, processes, and their bytes.
    pub unwind: UnwindUsage,
    /// Pids whose executable mappings the kernel has for the unwinder
    /// (until then a process is walked with frame pointers), sorted.
    pub unwind_pids: Vec<u32>,
}

/// Readiness (`GET /health`): the probes are attached.
pub use tracer_api::Health;

/// What `last-stop.json` in the state directory records of a stop.
#[derive(Clone, Debug, Serialize)]
pub struct LastStop {
    /// Unix ms of the stop.
    pub stopped_at_ms: u64,
    /// Unix ms when tracing began.
    pub started_at_ms: u64,
    /// Whether every request finished within the grace period.
    pub drained: bool,
    /// The programs' counters (drops included), by name.
    pub counters: BTreeMap<String, u64>,
    /// Processes alive at the end.
    pub processes_alive: usize,
    /// Processes whose data was incomplete (events lost).
    pub processes_incomplete: usize,
    /// False when the stop was recorded without the service (its locks
    /// were held past the record's budget): `counters` is empty and the
    /// process counts are 0.
    pub complete: bool,
}

impl LastStop {
    /// The record of a stop at `now` without what needs the service: when
    /// tracing began (`started_at`) and whether the API drained.
    #[must_use]
    pub fn without_service(started_at: std::time::SystemTime, drained: bool) -> Self {
        Self {
            stopped_at_ms: unix_ms(std::time::SystemTime::now()),
            started_at_ms: unix_ms(started_at),
            drained,
            counters: BTreeMap::new(),
            processes_alive: 0,
            processes_incomplete: 0,
            complete: false,
        }
    }
}

impl Service {
    /// Readiness and what is probed.
    pub fn health(&self) -> Health {
        let libraries = self
            .libraries
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|library| tracer_api::Library {
                path: library.path.to_string_lossy().into_owned(),
                family: library.family.name().to_string(),
                found_in: library.found_in,
                probes: library.probes.clone(),
            })
            .collect();
        Health {
            status: "ready".to_string(),
            nframe: self.nframe(),
            libraries,
            started_at_ms: unix_ms(self.started_at),
        }
    }

    /// The programs' counters summed over CPUs, by name, in slot order
    /// (`COUNTERS`; no lock of tracerd's).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.stats.counters()
    }

    /// (program, run time, run count) of each eBPF program while
    /// `BPF_ENABLE_STATS` is on (each program's fdinfo; no lock of
    /// tracerd's).
    pub fn program_stats(&self) -> Vec<(String, std::time::Duration, u64)> {
        self.stats.program_stats()
    }

    /// Entries and capacity of each kernel map (walks the hash maps' keys,
    /// through descriptors of its own: no lock of tracerd's).
    pub fn map_usage(&self) -> crate::capture::kernel::MapUsage {
        self.stats.map_usage()
    }

    /// What the unwind tables hold and cost (tracerd's bookkeeping of
    /// `UNWIND_ROWS`, `UNWIND_PAGES` and `PROC_MAPS`, as last published;
    /// no lock of tracerd's).
    pub fn unwind_usage(&self) -> UnwindUsage {
        self.stats.unwind_usage()
    }

    /// The kernel maps' use: entries and capacity of each, live blocks per
    /// process and the processes the unwinder has (those `viewer` may
    /// see), and the eBPF programs' counters.
    pub fn kernel_maps(&self, viewer: Viewer) -> KernelMapsView {
        let visible = self.visible_pids(viewer);
        let seen = |pid: &u32| visible.as_ref().is_none_or(|v| v.contains(pid));
        let maps = self
            .map_usage()
            .into_iter()
            .map(|(name, entries, capacity)| (name.to_string(), MapUse { entries, capacity }))
            .collect();
        let counters = self
            .counters()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        let held = self.state.locks().kernel_shared();
        let mut live_allocs_by_pid: BTreeMap<u32, u64> = BTreeMap::new();
        for (key, _) in held.kernel.live_blocks(None) {
            if !seen(&key.tgid) {
                continue;
            }
            *live_allocs_by_pid.entry(key.tgid).or_default() += 1;
        }
        let spilled_by_pid = held
            .kernel
            .all_proc_stats()
            .into_iter()
            .filter(|(pid, _)| seen(pid))
            .filter_map(|(pid, _)| {
                let totals = held.kernel.proc_totals(pid)?;
                let spilled = SpilledBlocks {
                    own: totals.own_spill,
                    shared: totals.shared_spill,
                };
                (spilled.own + spilled.shared > 0).then_some((pid, spilled))
            })
            .collect();
        KernelMapsView {
            maps,
            live_allocs_by_pid,
            spilled_by_pid,
            stack_totals_reads: self.totals_reader.reads(),
            process_max_blocks: held.kernel.config().process_max_blocks(),
            counters,
            unwind: self.unwind_usage(),
            unwind_pids: {
                let mut pids: Vec<u32> = held
                    .kernel
                    .unwind_processes()
                    .into_iter()
                    .map(|image| image.pid)
                    .filter(seen)
                    .collect();
                pids.sort_unstable();
                pids
            },
        }
    }

    /// `tracemalloc.get_tracemalloc_memory()`: the kernel memory of
    /// tracerd's BPF maps plus tracerd's resident memory.
    pub fn tracer_memory(&self) -> TracerMemory {
        let maps = procfs::bpf_maps_of_self();
        let kernel_maps = maps.iter().map(|m| m.memlock).sum();
        let daemon_rss = procfs::self_rss().unwrap_or(0);
        let unwind = self.unwind_usage();
        let held = self.state.locks().store();
        let stored_traces = held.store.summaries().iter().map(|s| s.traces).sum();
        TracerMemory {
            kernel_maps,
            daemon_rss,
            total: kernel_maps + daemon_rss,
            maps,
            stored_snapshots: held.store.len(),
            stored_traces,
            unwind,
        }
    }

    /// `tracemalloc.get_object_traceback()`: the trace of the block of
    /// `pid` that starts at `address`, the allocation machinery's leading
    /// frames dropped or kept as `frames` says.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`], [`ServiceError::Ended`],
    /// [`ServiceError::TracingStopped`], [`ServiceError::NoBlock`].
    pub fn object_traceback(
        &self,
        pid: u32,
        address: u64,
        frames: AllocatorFrames,
    ) -> Result<Trace, ServiceError> {
        let image: ImageId = self.live_image_of(pid)?;
        let tracing = self.state.locks().control().control.of(image);
        if !tracing.is_tracing {
            return Err(ServiceError::TracingStopped { pid: Some(pid) });
        }
        // The scan holds the kernel lock shared and no other; the
        // registry's (which the cheap routes need) only for the look at the
        // image's mappings.
        let blocks = {
            let held = self.state.locks().kernel_shared();
            let kernel = &**held.kernel;
            let entries: Vec<_> = kernel
                .live_blocks(Some(&HashSet::from([image])))
                .into_iter()
                .filter(|(k, _)| k.addr == address)
                .collect();
            if entries.is_empty() {
                return Err(ServiceError::NoBlock { pid, address });
            }
            raw_blocks(kernel, &entries, &self.stopping)
        };
        let Some(maps) = self.refreshed_images(&[image]).pop().map(|i| i.maps) else {
            return Err(self.not_traced(pid));
        };
        let snapshot = truncate(
            self.builder.build(pid, &blocks, maps.as_deref(), frames),
            tracing.traceback_limit,
        );
        self.unless_stopping()?;
        snapshot
            .into_traces()
            .into_iter()
            .next()
            .ok_or(ServiceError::NoBlock { pid, address })
    }

    /// What `last-stop.json` records of a stop now.
    pub fn last_stop(&self, drained: bool) -> LastStop {
        let counters = self
            .counters()
            .into_iter()
            .map(|(name, v)| (name.to_string(), v))
            .collect();
        let processes = self.processes(Viewer::Operator);
        LastStop {
            stopped_at_ms: unix_ms(std::time::SystemTime::now()),
            started_at_ms: unix_ms(self.started_at),
            drained,
            counters,
            processes_alive: processes.iter().filter(|p| p.view.state.is_alive()).count(),
            processes_incomplete: processes.iter().filter(|p| !p.view.complete).count(),
            complete: true,
        }
    }
}
