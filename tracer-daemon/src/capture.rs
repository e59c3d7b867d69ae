//! Capture: load tracer's eBPF programs, attach them to the host's glibc and
//! the scheduler's lifecycle tracepoints, and read what they keep in the
//! kernel maps.
//!
//! Everything here talks to the kernel (needs root, or CAP_BPF +
//! CAP_PERFMON); nothing here interprets what it reads: that is the job of
//! [`crate::registry`] and [`crate::model`].
use std::{
    collections::{HashMap, HashSet},
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
};

use std::os::fd::AsFd as _;

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray, RingBuf},
    programs::{TracePoint, UProbe, uprobe::UProbeScope},
};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use tracer_common::{
    AllocInfo, AllocKey, COUNTER_SLOTS, Counter, EXP_TABLE_LEN, FLOOR_PROGRAMS,
    GLOBAL_INFLIGHT_SLOT_MASK, GLOBAL_LIVE_BUCKET_MASK, GLOBAL_NFRAME, GLOBAL_PAGE_SIZE,
    GLOBAL_SAMPLE_MEAN, GLOBAL_TRACERD_TGID, InflightSlot, LIVE_WAYS, MAP_COUNTERS, MAP_EVENTS,
    MAP_EXP_TABLE, MAP_INFLIGHT, MAP_INFLIGHT_SLOTS, MAP_LIVE_ALLOCS, MAP_LIVE_KEYS,
    MAP_LIVE_VALUES, MAP_PROC_SLOTS, MAP_PROCS, MAP_STACKS, MAP_SWITCHES, MAX_NFRAME, PROBES,
    PROC_SLOT_COUNT, ProcStats, STACK_WORDS, TRACEPOINTS,
};

use crate::live_table::{self, LiveTable, Removed};
use crate::proc_slots::ProcSlots;
use crate::sys::bpf as bpf_sys;

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// Errors of loading, attaching and reading the eBPF side.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// This binary was built with `AYA_BUILD_SKIP=1` and holds no eBPF object.
    #[error(
        "this tracerd was built without its eBPF programs (AYA_BUILD_SKIP); rebuild without it"
    )]
    NotBuilt,
    /// The eBPF object could not be prepared or loaded.
    #[error("loading the eBPF object: {0}")]
    Load(String),
    /// A program could not be loaded into the kernel (verifier, permissions).
    #[error("loading program {program}: {source}")]
    Program {
        /// The program's name.
        program: String,
        /// What aya said (boxed: it is large, and errors are rare).
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A program could not be attached to its target.
    #[error("attaching {program} to {target}: {source}")]
    Attach {
        /// The program's name.
        program: String,
        /// Where: a library path and symbol, or a tracepoint.
        target: String,
        /// What aya said (boxed, as above).
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// No glibc was found to attach to.
    #[error("no glibc found (looked at {looked}); pass --libc PATH")]
    NoLibc {
        /// The places looked at.
        looked: String,
    },
    /// glibc could not be read or lacks a symbol tracer needs.
    #[error("reading {path}: {reason}")]
    Libc {
        /// The library.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A kernel map is missing from the object or of the wrong type.
    #[error("map {map}: {reason}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// What went wrong.
        reason: String,
    },
}

/// Capacities and limits of the kernel side, set at load time.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Frames kept per stack, 1..=64 ([`MAX_NFRAME`]): the kernel's walk
    /// stops there, and the stack map's value size is `nframe * 8` bytes.
    pub nframe: u32,
    /// Capacity of `LIVE_ALLOCS` in live blocks, all processes together.
    pub max_live_blocks: u32,
    /// Block slots of the fast table (`LIVE_KEYS`, `LIVE_VALUES`), rounded
    /// up to [`LIVE_WAYS`](tracer_common::LIVE_WAYS) times a power of two
    /// (at least 2) at load; 0: no table, every block in `LIVE_ALLOCS`.
    pub live_table_blocks: u32,
    /// Capacity of `STACKS` in distinct stacks.
    pub max_stacks: u32,
    /// Capacity of `PROCS` in processes.
    pub max_procs: u32,
    /// Capacity of `INFLIGHT` (the spill of calls in progress whose slot is
    /// taken) in calls.
    pub max_inflight: u32,
    /// Slots of `INFLIGHT_SLOTS` (calls in progress, one per thread id
    /// modulo this), a power of two up to 4194304: a value that is not is
    /// rounded up to one at load.
    pub inflight_slots: u32,
    /// Size of the `EVENTS` ring buffer in bytes, a power of two multiple
    /// of the page size: a value that is not is rounded up to one at load
    /// (as aya and libbpf do).
    pub events_ring_bytes: u32,
    /// The glibc files to probe; empty: found as the dynamic loader finds them.
    pub libc: Vec<PathBuf>,
    /// Mean sampling interval in bytes (byte-weighted Poisson sampling);
    /// 0 records every allocation (exact).
    pub sample_interval: u64,
    /// Attach the probes for every process at load; false attaches none
    /// until [`Capture::attach`] (a scoped tracerd, so no process outside
    /// its scope is traced even while it starts).
    pub system_wide: bool,
}

/// Which programs [`Capture`] attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Programs {
    /// tracer's own.
    Tracer,
    /// Empty ones, at the same points (the physical floor).
    Floor,
}

impl Programs {
    /// The program attached where tracer's `name` goes (`exit`: a
    /// uretprobe).
    fn program_for(self, name: &'static str, exit: bool) -> &'static str {
        match self {
            Programs::Tracer => name,
            Programs::Floor if exit => FLOOR_PROGRAMS.1,
            Programs::Floor => FLOOR_PROGRAMS.0,
        }
    }
}

/// Loads the uprobe program `name` into the kernel if it is not yet (a
/// program shared by several probe points, as the floor's are, loads once).
///
/// # Errors
/// [`CaptureError::Program`] naming it.
fn load_uprobe(ebpf: &mut Ebpf, name: &'static str) -> Result<(), CaptureError> {
    let program = program_mut::<UProbe>(ebpf, name)?;
    if program.fd().is_err() {
        program.load().map_err(|source| CaptureError::Program {
            program: name.into(),
            source: Box::new(source),
        })?;
    }
    Ok(())
}

/// Where the probes of one allocator function go, as file offsets in the
/// library.
#[derive(Clone, Copy, Debug)]
pub struct ProbePoint {
    /// The function and its programs.
    pub spec: tracer_common::ProbeSpec,
    /// The function's first instruction: the uretprobe goes here.
    pub function: u64,
    /// The entry uprobe: the first instruction, or past a leading NULL check
    /// (see [`entry_skip`]).
    pub entry: u64,
}

/// One attached library: its path and the probes on it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AttachedLibrary {
    /// The library as found (canonical path).
    pub path: PathBuf,
    /// `symbol@file_offset` of each attached uprobe (aliases share one).
    pub probes: Vec<String>,
}

/// The loaded eBPF programs, their links, and handles to their maps.
///
/// Dropping it detaches every probe and frees every map.
pub struct Capture {
    /// Holds programs and links: dropping it detaches them.
    ebpf: Ebpf,
    live: BpfHashMap<MapData, AllocKey, AllocInfo>,
    /// The fast table in front of `live`, mapped; None when it is off.
    live_table: Option<LiveTable>,
    /// LIVE_KEYS and LIVE_VALUES, kept open with their mapping.
    _live_table_maps: (MapData, MapData),
    /// STACKS: its value size depends on nframe, so it is read with raw
    /// map syscalls rather than a typed aya map.
    stacks: MapData,
    procs: BpfHashMap<MapData, u32, ProcStats>,
    /// `PROC_SLOTS`, mapped; the map itself is kept open beside it.
    proc_slots: ProcSlots,
    _proc_slots_map: MapData,
    counters: PerCpuArray<MapData, u64>,
    inflight: BpfHashMap<MapData, u64, tracer_common::Inflight>,
    /// INFLIGHT_SLOTS, read with raw batch lookups (only to count the
    /// slots in use).
    inflight_slots: MapData,
    /// The positions of `EVENTS`, which stay readable after the ring buffer
    /// itself was taken by the event loop; None if they could not be mapped.
    events_positions: Option<RingPositions>,
    switches: aya::maps::Array<MapData, u64>,
    events: Option<RingBuf<MapData>>,
    libraries: Vec<AttachedLibrary>,
    /// Each probed library with its probe points.
    targets: Vec<(PathBuf, Vec<ProbePoint>)>,
    programs: Programs,
    /// Attached uprobe links: None for system-wide, Some(pid) per process.
    links: HashMap<Option<u32>, Vec<(&'static str, aya::programs::uprobe::UProbeLinkId)>>,
    config: CaptureConfig,
}

impl Capture {
    /// Loads the programs, sizes the maps from `config`, and attaches the
    /// lifecycle tracepoints, then (when `config.system_wide`) every
    /// allocator uretprobe, then every uprobe (so no entry is recorded whose
    /// return would be missed).
    ///
    /// # Errors
    /// [`CaptureError`] naming the program, map or library that failed.
    pub fn load(config: CaptureConfig) -> Result<Self, CaptureError> {
        Self::load_programs(config, Programs::Tracer)
    }

    /// As [`Capture::load`], but with the empty programs of
    /// [`FLOOR_PROGRAMS`] at every entry and return point tracerd uses: the
    /// physical floor of the probes, for benchmarks. Nothing is recorded.
    ///
    /// # Errors
    /// As [`Capture::load`].
    pub fn load_floor(config: CaptureConfig) -> Result<Self, CaptureError> {
        Self::load_programs(config, Programs::Floor)
    }

    fn load_programs(config: CaptureConfig, programs: Programs) -> Result<Self, CaptureError> {
        if EBPF_OBJECT.is_empty() {
            return Err(CaptureError::NotBuilt);
        }
        ensure_tracefs();
        bump_memlock_rlimit();
        let nframe = config.nframe.clamp(1, MAX_NFRAME);
        let object = patch_map_value_size(
            EBPF_OBJECT,
            MAP_STACKS,
            STACK_WORDS as u32 * 8,
            (1 + nframe) * 8,
        )?;
        let tgid = std::process::id();
        // SAFETY: sysconf has no preconditions.
        let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096);
        let inflight_slots = config
            .inflight_slots
            .clamp(1, MAX_INFLIGHT_SLOTS)
            .next_power_of_two();
        let slot_mask = inflight_slots - 1;
        let events_ring_bytes = ring_size(config.events_ring_bytes, page_size);
        let live_buckets = live_table::buckets_for(config.live_table_blocks);
        let live_bucket_mask = live_buckets.saturating_sub(1);
        let mut ebpf = EbpfLoader::new()
            .override_global(GLOBAL_TRACERD_TGID, &tgid, true)
            .override_global(GLOBAL_PAGE_SIZE, &page_size, true)
            .override_global(GLOBAL_NFRAME, &nframe, true)
            .override_global(GLOBAL_SAMPLE_MEAN, &config.sample_interval, true)
            .override_global(GLOBAL_INFLIGHT_SLOT_MASK, &slot_mask, true)
            .override_global(GLOBAL_LIVE_BUCKET_MASK, &live_bucket_mask, true)
            .map_max_entries(MAP_LIVE_ALLOCS, config.max_live_blocks)
            .map_max_entries(MAP_LIVE_KEYS, live_buckets.max(1))
            .map_max_entries(MAP_LIVE_VALUES, live_buckets.max(1) * LIVE_WAYS)
            .map_max_entries(MAP_STACKS, config.max_stacks)
            .map_max_entries(MAP_PROCS, config.max_procs)
            .map_max_entries(MAP_INFLIGHT, config.max_inflight)
            .map_max_entries(MAP_INFLIGHT_SLOTS, inflight_slots)
            .map_max_entries(MAP_EVENTS, events_ring_bytes)
            .load(object.as_bytes())
            .map_err(|e| CaptureError::Load(e.to_string()))?;

        for (name, category, event) in TRACEPOINTS {
            let program: &mut TracePoint = program_mut(&mut ebpf, name)?;
            program.load().map_err(|source| CaptureError::Program {
                program: name.into(),
                source: Box::new(source),
            })?;
            program
                .attach(category, event)
                .map_err(|source| CaptureError::Attach {
                    program: name.into(),
                    target: format!("{category}:{event}"),
                    source: Box::new(source),
                })?;
        }

        let libcs = find_libc(&config.libc)?;
        let mut libraries = Vec::new();
        let mut targets = Vec::new();
        for path in &libcs {
            let points = probe_points(path)?;
            libraries.push(AttachedLibrary {
                path: path.clone(),
                probes: points
                    .iter()
                    .map(|p| match p.entry - p.function {
                        0 => format!("{}@{:#x}", p.spec.symbol, p.entry),
                        skip => format!("{}+{skip}@{:#x}", p.spec.symbol, p.entry),
                    })
                    .collect(),
            });
            targets.push((path.clone(), points));
        }
        // Every uprobe program is loaded now, while the object still holds
        // every map its instructions refer to (a map taken out of it below
        // and dropped, as EXP_TABLE is, would leave a later load with a
        // closed fd); a scoped tracerd attaches them only later.
        for (_, points) in &targets {
            for point in points {
                let exit = point.spec.exit.map(|name| (name, true));
                for (name, is_exit) in std::iter::once((point.spec.entry, false)).chain(exit) {
                    load_uprobe(&mut ebpf, programs.program_for(name, is_exit))?;
                }
            }
        }
        let switches = take_map(&mut ebpf, MAP_SWITCHES)?;
        let mut exp_table: aya::maps::Array<MapData, u32> = take_map(&mut ebpf, MAP_EXP_TABLE)?;
        for (i, value) in exponential_table().into_iter().enumerate() {
            exp_table
                .set(i as u32, value, 0)
                .map_err(|e| CaptureError::Map {
                    map: MAP_EXP_TABLE,
                    reason: e.to_string(),
                })?;
        }
        let live = take_map(&mut ebpf, MAP_LIVE_ALLOCS)?;
        let live_keys = take_array(&mut ebpf, MAP_LIVE_KEYS)?;
        let live_values = take_array(&mut ebpf, MAP_LIVE_VALUES)?;
        let live_table = match live_buckets {
            0 => None,
            buckets => Some(
                LiveTable::map(live_keys.fd().as_fd(), live_values.fd().as_fd(), buckets).map_err(
                    |e| CaptureError::Map {
                        map: MAP_LIVE_KEYS,
                        reason: format!("cannot map the fast live-block table: {e}"),
                    },
                )?,
            ),
        };
        let stacks = match ebpf.take_map(MAP_STACKS) {
            Some(Map::HashMap(data)) => data,
            _ => {
                return Err(CaptureError::Map {
                    map: MAP_STACKS,
                    reason: "missing or not a hash map".into(),
                });
            }
        };
        let procs = take_map(&mut ebpf, MAP_PROCS)?;
        let proc_slots_map = take_array(&mut ebpf, MAP_PROC_SLOTS)?;
        let proc_slots =
            ProcSlots::map(proc_slots_map.fd().as_fd()).map_err(|e| CaptureError::Map {
                map: MAP_PROC_SLOTS,
                reason: format!("cannot map the process slots: {e}"),
            })?;
        let counters = take_map(&mut ebpf, MAP_COUNTERS)?;
        let inflight = take_map(&mut ebpf, MAP_INFLIGHT)?;
        let inflight_slots_map = take_array(&mut ebpf, MAP_INFLIGHT_SLOTS)?;
        let events: RingBuf<MapData> = take_map(&mut ebpf, MAP_EVENTS)?;
        let events_positions = RingPositions::map(events.as_fd(), page_size);
        if events_positions.is_none() {
            tracing::warn!(
                map = MAP_EVENTS,
                "cannot map the ring buffer's positions: its use reads 0"
            );
        }
        let mut capture = Self {
            ebpf,
            live,
            live_table,
            _live_table_maps: (live_keys, live_values),
            stacks,
            procs,
            proc_slots,
            _proc_slots_map: proc_slots_map,
            counters,
            inflight,
            inflight_slots: inflight_slots_map,
            events_positions,
            switches,
            events: Some(events),
            libraries,
            targets,
            programs,
            links: HashMap::new(),
            config: CaptureConfig {
                nframe,
                inflight_slots,
                events_ring_bytes,
                live_table_blocks: live_buckets * LIVE_WAYS,
                ..config
            },
        };
        if capture.config.system_wide {
            capture.attach(None)?;
        }
        Ok(capture)
    }

    /// Attaches the allocator probes for every process (`pid` None) or for
    /// one process only: its probes are registered with the kernel for that
    /// process (a perf event with a pid), so the breakpoints are placed in
    /// its memory only and other processes pay nothing. Uretprobes first,
    /// then uprobes, so no entry is recorded whose return would be missed.
    /// Attaching what is attached already does nothing.
    ///
    /// # Errors
    /// [`CaptureError::Attach`] (e.g. the process is gone); nothing of this
    /// attach stays attached then.
    pub fn attach(&mut self, pid: Option<u32>) -> Result<(), CaptureError> {
        if self.links.contains_key(&pid) {
            return Ok(());
        }
        let scope = match pid.and_then(std::num::NonZeroU32::new) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        let mut links = Vec::new();
        let mut result = Ok(());
        'targets: for (path, points) in &self.targets {
            for exit_pass in [true, false] {
                for point in points {
                    let spec = &point.spec;
                    let (name, offset) = if exit_pass {
                        match spec.exit {
                            Some(exit) => (exit, point.function),
                            None => continue,
                        }
                    } else {
                        (spec.entry, point.entry)
                    };
                    let name = self.programs.program_for(name, exit_pass);
                    // Loaded by load_programs already.
                    let attached =
                        program_mut::<UProbe>(&mut self.ebpf, name).and_then(|program| {
                            program.attach(offset, path, scope).map_err(|source| {
                                CaptureError::Attach {
                                    program: name.into(),
                                    target: format!("{}:{}", path.display(), spec.symbol),
                                    source: Box::new(source),
                                }
                            })
                        });
                    match attached {
                        Ok(link) => links.push((name, link)),
                        Err(err) => {
                            result = Err(err);
                            break 'targets;
                        }
                    }
                }
            }
        }
        if let Err(err) = result {
            self.detach_links(links);
            return Err(err);
        }
        self.links.insert(pid, links);
        Ok(())
    }

    /// Detaches what [`Capture::attach`] attached for `pid` (None: the
    /// system-wide probes). Detaching what is not attached does nothing.
    pub fn detach(&mut self, pid: Option<u32>) {
        if let Some(links) = self.links.remove(&pid) {
            self.detach_links(links);
        }
    }

    fn detach_links(&mut self, links: Vec<(&'static str, aya::programs::uprobe::UProbeLinkId)>) {
        for (name, link) in links {
            if let Ok(program) = program_mut::<UProbe>(&mut self.ebpf, name) {
                let _ = program.detach(link);
            }
        }
    }

    /// What is attached: None for system-wide, else the pids.
    pub fn attached(&self) -> Vec<Option<u32>> {
        let mut keys: Vec<Option<u32>> = self.links.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    /// Sets the programs' runtime switches (`SWITCH_*` bits of tracer-common).
    pub fn set_switches(&mut self, bits: u64) {
        if let Err(err) = self.switches.set(0, bits, 0) {
            tracing::warn!(map = MAP_SWITCHES, %err, "cannot set the switches");
        }
    }

    /// The libraries probed and the probe points on each.
    pub fn libraries(&self) -> &[AttachedLibrary] {
        &self.libraries
    }

    /// The configuration in force (nframe clamped to 1..=64, the in-flight
    /// slots and the ring buffer's size rounded as the kernel has them).
    pub fn config(&self) -> &CaptureConfig {
        &self.config
    }

    /// The ring buffer of process events; taken once by the event loop.
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    /// Every live block of the process images `want` (tgid, generation),
    /// read from the fast table (through its mapping) and `LIVE_ALLOCS`;
    /// with `want` None, every block of every process. One pass over each.
    pub fn live_blocks(&self, want: Option<&HashSet<(u32, u32)>>) -> Vec<(AllocKey, AllocInfo)> {
        let mut out = Vec::new();
        let mut keep = |key: &AllocKey, info: &AllocInfo| match want {
            Some(want) if !want.contains(&(key.tgid, info.gen_)) => {}
            _ => out.push((*key, *info)),
        };
        if let Some(table) = &self.live_table {
            table.for_each(|key, info| keep(&key, &info));
        }
        // BPF_MAP_LOOKUP_BATCH reads thousands of entries per syscall; fall
        // back to one lookup per key where the kernel lacks it (< 5.6).
        if bpf_sys::lookup_batch(
            aya::maps::IterableMap::map(&self.live).fd().as_fd(),
            &mut keep,
        )
        .is_err()
        {
            for (key, info) in self.live.iter().flatten() {
                keep(&key, &info);
            }
        }
        out
    }

    /// Removes the given blocks from the fast table or `LIVE_ALLOCS`;
    /// returns how many were removed (a block freed meanwhile is already
    /// gone).
    pub fn remove_blocks(&mut self, keys: &[AllocKey]) -> usize {
        let fd = aya::maps::IterableMap::map(&self.live).fd().as_fd();
        let Some(table) = &self.live_table else {
            return bpf_sys::delete_batch(fd, keys, |_| {});
        };
        let spilled: Vec<AllocKey> = keys
            .iter()
            .filter(|key| table.remove(key) == Removed::NotInTable)
            .copied()
            .collect();
        // The bucket of each block removed from LIVE_ALLOCS is told.
        let removed = bpf_sys::delete_batch(fd, &spilled, |key| table.spill_removed(key));
        keys.len() - spilled.len() + removed
    }

    /// The return addresses of stack `id` (frame 0 first: the call site in
    /// the allocator's caller), from `STACKS`; None if it is not there.
    pub fn stack(&self, id: u64) -> Option<Vec<u64>> {
        let mut value = vec![0u64; 1 + self.config.nframe as usize];
        let fd = self.stacks.fd().as_fd();
        bpf_sys::lookup(fd, &id, &mut value).ok()?;
        Some(
            value
                .into_iter()
                .skip(1)
                .take_while(|&ip| ip != 0)
                .collect(),
        )
    }

    /// Every stack id in `STACKS` (one syscall per id).
    pub fn stack_ids(&self) -> Vec<u64> {
        bpf_sys::keys::<u64>(self.stacks.fd().as_fd())
    }

    /// Removes the given stacks from `STACKS` and raises the stack epoch
    /// (`SWITCHES[SWITCH_STACK_EPOCH]`), which empties every CPU's cache of
    /// its last stack; returns how many were removed.
    pub fn remove_stacks(&mut self, ids: &[u64]) -> usize {
        let fd = self.stacks.fd().as_fd();
        let removed = ids.iter().filter(|id| bpf_sys::delete(fd, *id)).count();
        // Every CPU's cache of its last stack may name a removed one.
        let epoch = self
            .switches
            .get(&tracer_common::SWITCH_STACK_EPOCH, 0)
            .unwrap_or(0);
        if let Err(err) =
            self.switches
                .set(tracer_common::SWITCH_STACK_EPOCH, epoch.wrapping_add(1), 0)
        {
            tracing::warn!(map = MAP_SWITCHES, %err, "cannot raise the stack epoch");
        }
        removed
    }

    /// Stacks now in `STACKS` (one syscall per stack).
    pub fn map_usage_of_stacks(&self) -> u64 {
        bpf_sys::count_keys::<u64>(self.stacks.fd().as_fd())
    }

    /// Capacity of `STACKS` in stacks.
    pub fn max_stacks(&self) -> u32 {
        self.config.max_stacks
    }

    /// Totals of one process's current image, from its slot of `PROC_SLOTS`
    /// or from `PROCS`.
    pub fn proc_stats(&self, tgid: u32) -> Option<ProcStats> {
        self.proc_slots.get(tgid).or_else(|| {
            self.proc_slots
                .spilled(tgid)
                .then(|| self.procs.get(&tgid, 0).ok())
                .flatten()
        })
    }

    /// Every traced process (`PROC_SLOTS` and `PROCS`): tgid → totals.
    pub fn all_proc_stats(&self) -> Vec<(u32, ProcStats)> {
        let mut all = self.proc_slots.all();
        all.extend(self.procs.iter().filter_map(Result::ok));
        all
    }

    /// Sets the peak of `tgid` to its current value (`reset_peak()`).
    pub fn reset_peak(&mut self, tgid: u32) -> bool {
        if self.proc_slots.reset_peak(tgid) {
            return true;
        }
        let Ok(mut stats) = self.procs.get(&tgid, 0) else {
            return false;
        };
        stats.peak = stats.current;
        self.procs.insert(tgid, stats, 0).is_ok()
    }

    /// The per-CPU counters summed over CPUs, by name, in slot order.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        Counter::ALL
            .iter()
            .map(|(counter, name)| {
                let total = self
                    .counters
                    .get(&(*counter as u32), 0)
                    .map(|values| values.iter().copied().fold(0u64, u64::wrapping_add))
                    .unwrap_or(0);
                (*name, total)
            })
            .collect()
    }

    /// Run statistics the kernel keeps for each loaded program while
    /// `BPF_ENABLE_STATS` is on (zero otherwise): (program name, total run
    /// time, run count), from `bpf_prog_info`. Read-only.
    pub fn program_stats(&self) -> Vec<(String, std::time::Duration, u64)> {
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some((name.to_string(), info.run_time(), info.run_count()))
            })
            .collect()
    }

    /// Entries now in each kernel map: (map name, entries, capacity), the
    /// capacities as configured. Counting walks the hash maps' keys (one
    /// syscall per key); `INFLIGHT_SLOTS` counts the slots in use (a batch
    /// read of the array, 32 bytes a slot); `EVENTS` is in bytes: those
    /// written and not yet read, of the ring's size.
    pub fn map_usage(&self) -> Vec<(&'static str, u64, u64)> {
        let mut live_entries = 0u64;
        let mut count = |_: &AllocKey, _: &AllocInfo| live_entries += 1;
        if bpf_sys::lookup_batch(
            aya::maps::IterableMap::map(&self.live).fd().as_fd(),
            &mut count,
        )
        .is_err()
        {
            live_entries = self.live.keys().count() as u64;
        }
        vec![
            (
                MAP_LIVE_ALLOCS,
                live_entries,
                u64::from(self.config.max_live_blocks),
            ),
            (
                MAP_LIVE_KEYS,
                self.live_table.as_ref().map_or(0, LiveTable::len),
                u64::from(self.config.live_table_blocks),
            ),
            (
                MAP_STACKS,
                bpf_sys::count_keys::<u64>(self.stacks.fd().as_fd()),
                u64::from(self.config.max_stacks),
            ),
            (
                MAP_PROC_SLOTS,
                self.proc_slots.len(),
                u64::from(PROC_SLOT_COUNT),
            ),
            (
                MAP_PROCS,
                self.procs.keys().count() as u64,
                u64::from(self.config.max_procs),
            ),
            (
                MAP_INFLIGHT,
                self.inflight.keys().count() as u64,
                u64::from(self.config.max_inflight),
            ),
            (
                MAP_INFLIGHT_SLOTS,
                self.inflight_slots_in_use(),
                u64::from(self.config.inflight_slots),
            ),
            (
                MAP_EVENTS,
                self.events_positions
                    .as_ref()
                    .map_or(0, RingPositions::pending),
                u64::from(self.config.events_ring_bytes),
            ),
            (
                MAP_COUNTERS,
                u64::from(COUNTER_SLOTS),
                u64::from(COUNTER_SLOTS),
            ),
        ]
    }
}

impl Capture {
    /// Slots of `INFLIGHT_SLOTS` that a thread holds now (a call in
    /// progress): one batch read of the array, thousands of slots a syscall.
    fn inflight_slots_in_use(&self) -> u64 {
        let mut used = 0u64;
        let mut count = |_: &u32, slot: &InflightSlot| used += u64::from(slot.owner != 0);
        if bpf_sys::lookup_batch(self.inflight_slots.fd().as_fd(), &mut count).is_err() {
            tracing::debug!(
                map = MAP_INFLIGHT_SLOTS,
                "no batch lookup: slots in use not counted"
            );
        }
        used
    }
}

/// Largest `inflight_slots`: the kernel's largest pid_max (PID_MAX_LIMIT),
/// so that every thread id has a slot of its own.
pub const MAX_INFLIGHT_SLOTS: u32 = 1 << 22;

/// The size the kernel gives a ring buffer asked for `bytes`: a power of two
/// multiple of `page_size` bytes, rounded up as aya (and libbpf) do.
pub fn ring_size(bytes: u32, page_size: u64) -> u32 {
    let page = u32::try_from(page_size).unwrap_or(4096).max(1);
    bytes
        .max(1)
        .div_ceil(page)
        .checked_next_power_of_two()
        .and_then(|pages| pages.checked_mul(page))
        .unwrap_or(1 << 31)
}

/// A read-only mapping of a BPF ring buffer's first two pages: the
/// consumer's position (what userspace has read) and the producer's (what
/// the programs have written), so its use can be read while the event loop
/// owns the ring buffer itself.
struct RingPositions {
    /// The mapping: the consumer page, then the producer page.
    base: std::ptr::NonNull<libc::c_void>,
    /// Page size in bytes (the mapping is two pages).
    page: usize,
}

// SAFETY: the mapping is only read, through atomics, and is unmapped once,
// by its owner, on drop: moving it to another thread is sound.
unsafe impl Send for RingPositions {}

impl RingPositions {
    /// Maps the positions of the ring buffer `fd`; None if the kernel
    /// refuses (then its use is not known).
    fn map(fd: std::os::fd::BorrowedFd<'_>, page_size: u64) -> Option<Self> {
        use std::os::fd::AsRawFd as _;
        let page = usize::try_from(page_size).ok()?;
        // SAFETY: a new shared read-only mapping of a BPF ring buffer fd
        // (the kernel allows its first pages read-only); nothing else
        // aliases it as Rust memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        Some(Self {
            base: std::ptr::NonNull::new(base)?,
            page,
        })
    }

    /// Bytes written by the programs and not yet read by tracerd.
    fn pending(&self) -> u64 {
        let at = |offset: usize| {
            // SAFETY: offset is 0 or one page: the start of a mapped page,
            // 8-byte aligned, where the kernel keeps an unsigned long
            // position that it writes with release semantics.
            unsafe {
                (*self
                    .base
                    .as_ptr()
                    .cast::<u8>()
                    .add(offset)
                    .cast::<std::sync::atomic::AtomicU64>())
                .load(std::sync::atomic::Ordering::Acquire)
            }
        };
        let consumer = at(0);
        let producer = at(self.page);
        producer.wrapping_sub(consumer)
    }
}

impl Drop for RingPositions {
    fn drop(&mut self) {
        // SAFETY: the mapping made in map, of this length, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr(), 2 * self.page) };
    }
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| CaptureError::Load(format!("program {name} is not in the object")))?;
    program
        .try_into()
        .map_err(|_| CaptureError::Load(format!("program {name} has an unexpected type")))
}

fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, CaptureError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(CaptureError::Map {
        map: name,
        reason: "not in the object".into(),
    })?;
    T::try_from(map).map_err(|e| CaptureError::Map {
        map: name,
        reason: e.to_string(),
    })
}

/// Takes the array map `name` out of `ebpf`, untyped (its values are read
/// raw or through a mapping).
fn take_array(ebpf: &mut Ebpf, name: &'static str) -> Result<MapData, CaptureError> {
    match ebpf.take_map(name) {
        Some(Map::Array(data)) => Ok(data),
        _ => Err(CaptureError::Map {
            map: name,
            reason: "missing or not an array".into(),
        }),
    }
}

/// An 8-byte aligned copy of an ELF object (object parsing needs alignment).
pub struct AlignedObject(Vec<u64>, usize);

impl AlignedObject {
    /// The object's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: the Vec holds at least self.1 initialised bytes (its length
        // in u64s is rounded up), and u8 has no alignment requirement.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.1) }
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in as_bytes, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), self.1) }
    }
}

/// Returns a copy of the eBPF object with the `value_size` of the legacy map
/// definition `map` (a `struct bpf_map_def` in section `maps`) changed from
/// `expected` to `value_size` bytes. STACKS is compiled for 64 frames; a
/// value of `1 + nframe` words keeps each stored stack as small as nframe
/// allows.
///
/// # Errors
/// [`CaptureError::Load`] if the object has no such map definition, or its
/// value size is not `expected`.
pub fn patch_map_value_size(
    object: &[u8],
    map: &str,
    expected: u32,
    value_size: u32,
) -> Result<AlignedObject, CaptureError> {
    let mut copy = AlignedObject(vec![0u64; object.len().div_ceil(8)], object.len());
    copy.as_bytes_mut().copy_from_slice(object);
    let position = {
        let file = object::File::parse(copy.as_bytes())
            .map_err(|e| CaptureError::Load(format!("parsing the eBPF object: {e}")))?;
        let symbol = file
            .symbols()
            .find(|s| s.name() == Ok(map))
            .ok_or_else(|| CaptureError::Load(format!("no symbol {map} in the eBPF object")))?;
        let section = symbol
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .ok_or_else(|| CaptureError::Load(format!("symbol {map} has no section")))?;
        let (start, _) = section
            .file_range()
            .ok_or_else(|| CaptureError::Load(format!("section of {map} has no data")))?;
        // struct bpf_map_def { u32 type, key_size, value_size, ... }
        usize::try_from(start + symbol.address() + 8)
            .map_err(|_| CaptureError::Load(format!("map {map} lies beyond the object")))?
    };
    let field = copy
        .as_bytes_mut()
        .get_mut(position..position + 4)
        .ok_or_else(|| CaptureError::Load(format!("map {map} lies beyond the object")))?;
    let old = u32::from_le_bytes([field[0], field[1], field[2], field[3]]);
    if old != expected {
        return Err(CaptureError::Load(format!(
            "map {map} has value size {old}, expected {expected}"
        )));
    }
    field.copy_from_slice(&value_size.to_le_bytes());
    Ok(copy)
}

/// `-ln((i + 0.5) / n)` for i in 0..n, in 16.16 fixed point: exponential
/// variates of mean 1 for the kernel's sampling countdown.
pub fn exponential_table() -> Vec<u32> {
    let n = f64::from(EXP_TABLE_LEN);
    (0..EXP_TABLE_LEN)
        .map(|i| (-((f64::from(i) + 0.5) / n).ln() * 65536.0).round() as u32)
        .collect()
}

/// Mounts tracefs at /sys/kernel/tracing if it is not mounted: attaching a
/// tracepoint reads its id there.
fn ensure_tracefs() {
    if Path::new("/sys/kernel/tracing/events").exists()
        || Path::new("/sys/kernel/debug/tracing/events").exists()
    {
        return;
    }
    let ok = Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        tracing::warn!(target = "/sys/kernel/tracing", "could not mount tracefs");
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK.
fn bump_memlock_rlimit() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit struct for the call's duration.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
    if ret != 0 {
        tracing::debug!("setrlimit(RLIMIT_MEMLOCK) failed; fine on kernels >= 5.11");
    }
}

/// The glibc files to probe: `configured` if given, else every distinct
/// `libc.so.6` the dynamic loader resolves: the one mapped into tracerd
/// itself (/proc/self/maps) and those `ldconfig -p` lists (ld.so.cache).
/// Distinct means a distinct (device, inode): symlinks collapse.
///
/// # Errors
/// [`CaptureError::NoLibc`] when none is found.
pub fn find_libc(configured: &[PathBuf]) -> Result<Vec<PathBuf>, CaptureError> {
    let mut candidates: Vec<PathBuf> = configured.to_vec();
    if candidates.is_empty() {
        if let Ok(maps) = fs::read_to_string("/proc/self/maps") {
            for line in maps.lines() {
                if let Some(path) = line.split_whitespace().nth(5)
                    && is_libc_name(path)
                {
                    candidates.push(PathBuf::from(path));
                }
            }
        }
        if let Ok(out) = Command::new("ldconfig").arg("-p").output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                // "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6"
                let line = line.trim();
                if line.starts_with("libc.so.6 ")
                    && host_abi_matches(line)
                    && let Some((_, path)) = line.split_once(" => ")
                {
                    candidates.push(PathBuf::from(path.trim()));
                }
            }
        }
    }
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for candidate in &candidates {
        let Ok(canonical) = fs::canonicalize(candidate) else {
            continue;
        };
        let Ok(meta) = fs::metadata(&canonical) else {
            continue;
        };
        if seen.insert((meta.dev(), meta.ino())) {
            found.push(canonical);
        }
    }
    if found.is_empty() {
        let looked = if configured.is_empty() {
            "/proc/self/maps, ldconfig -p".to_string()
        } else {
            configured
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(CaptureError::NoLibc { looked });
    }
    Ok(found)
}

fn is_libc_name(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "libc.so.6" || (n.starts_with("libc-2.") && n.ends_with(".so")))
}

fn host_abi_matches(ldconfig_line: &str) -> bool {
    if cfg!(target_arch = "x86_64") {
        ldconfig_line.contains("x86-64")
    } else if cfg!(target_arch = "aarch64") {
        ldconfig_line.contains("AArch64")
    } else {
        true
    }
}

/// Resolves each probed function of `PROBES` in the library's dynamic symbol
/// table to its file offset. Functions that are aliases of one another (the
/// same address, e.g. `aligned_alloc` and `memalign` in some glibc versions)
/// get one probe, the first in `PROBES` order: two probes on one address
/// would count one call twice. Functions the library lacks are skipped.
///
/// # Errors
/// [`CaptureError::Libc`] if the file cannot be read, or lacks `malloc` or `free`.
pub fn probe_points(path: &Path) -> Result<Vec<ProbePoint>, CaptureError> {
    let err = |reason: String| CaptureError::Libc {
        path: path.to_path_buf(),
        reason,
    };
    let data = fs::read(path).map_err(|e| err(e.to_string()))?;
    let file = object::File::parse(&*data).map_err(|e| err(e.to_string()))?;
    let mut by_name = std::collections::HashMap::new();
    for symbol in file.dynamic_symbols() {
        if symbol.kind() != object::SymbolKind::Text || !symbol.is_definition() {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        // Versioned names ("malloc@@GLIBC_2.2.5") are reported bare by object.
        let name = name.split('@').next().unwrap_or(name);
        by_name.entry(name.to_string()).or_insert(symbol.address());
    }
    let mut points = Vec::new();
    let mut addresses = HashSet::new();
    for spec in PROBES {
        let Some(&address) = by_name.get(spec.symbol) else {
            if spec.symbol == "malloc" || spec.symbol == "free" {
                return Err(err(format!("no symbol {}", spec.symbol)));
            }
            continue;
        };
        if !addresses.insert(address) {
            continue;
        }
        let section = file
            .sections()
            .find(|s| {
                s.kind() == object::SectionKind::Text
                    && (s.address()..s.address() + s.size()).contains(&address)
            })
            .ok_or_else(|| err(format!("{} is in no text section", spec.symbol)))?;
        let (file_start, _) = section
            .file_range()
            .ok_or_else(|| err("text section without data".into()))?;
        let function = address - section.address() + file_start;
        let code = usize::try_from(function)
            .ok()
            .and_then(|start| data.get(start..start.saturating_add(32).min(data.len())))
            .unwrap_or(&[]);
        let entry = function + entry_skip(spec.symbol, code, address);
        points.push(ProbePoint {
            spec,
            function,
            entry,
        });
    }
    Ok(points)
}

/// Bytes to skip at the start of `symbol` before its entry uprobe, from its
/// first instructions `code` (at virtual address `ip`), decoded with iced-x86.
///
/// A uprobe on an instruction the kernel cannot emulate is single-stepped
/// out of line, which costs about 7x more here. glibc's `free` begins with
/// `test %rdi,%rdi; je` (not emulated); the `push` after it is. Skipping the
/// check loses only `free(NULL)`, which changes nothing. Only that exact
/// pattern in `free` is skipped; anything else, or bytes that do not
/// decode, attach at the entry (0).
pub fn entry_skip(symbol: &str, code: &[u8], ip: u64) -> u64 {
    use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic, OpKind, Register};
    if symbol != "free" || !cfg!(target_arch = "x86_64") {
        return 0;
    }
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut next = || {
        decoder
            .can_decode()
            .then(|| decoder.decode())
            .filter(|i| !i.is_invalid())
    };
    let (Some(test), Some(branch), Some(push)) = (next(), next(), next()) else {
        return 0;
    };
    let tests_first_arg = test.mnemonic() == Mnemonic::Test
        && test.op_count() == 2
        && test.op0_kind() == OpKind::Register
        && test.op1_kind() == OpKind::Register
        && test.op0_register() == Register::RDI
        && test.op1_register() == Register::RDI;
    let jumps_if_null = matches!(branch.code(), Code::Je_rel8_64 | Code::Je_rel32_64);
    let pushes = push.mnemonic() == Mnemonic::Push && push.op0_kind() == OpKind::Register;
    if tests_first_arg && jumps_if_null && pushes {
        push.ip() - ip
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_points_cover_glibc_allocators_once_per_address() {
        let libc = find_libc(&[]).expect("the host has a glibc");
        let points = probe_points(&libc[0]).expect("glibc has malloc and free");
        let names: Vec<_> = points.iter().map(|p| p.spec.symbol).collect();
        for needed in [
            "malloc",
            "calloc",
            "realloc",
            "free",
            "posix_memalign",
            "valloc",
            "pvalloc",
        ] {
            assert!(names.contains(&needed), "{needed} missing from {names:?}");
        }
        let offsets: HashSet<_> = points.iter().map(|p| p.function).collect();
        assert_eq!(offsets.len(), points.len());
    }

    #[test]
    fn ring_sizes_round_up_to_a_power_of_two_of_pages_as_the_kernel_needs() {
        assert_eq!(ring_size(4096, 4096), 4096);
        assert_eq!(ring_size(1, 4096), 4096);
        assert_eq!(ring_size(5000, 4096), 8192);
        assert_eq!(ring_size(3 * 4096, 4096), 4 * 4096);
        assert_eq!(ring_size(1 << 18, 4096), 1 << 18);
        assert_eq!(ring_size(1 << 30, 4096), 1 << 30);
        assert_eq!(ring_size(4096, 65536), 65536);
    }

    #[test]
    fn exponential_table_has_mean_one() {
        let table = exponential_table();
        assert_eq!(table.len(), EXP_TABLE_LEN as usize);
        let mean = table.iter().map(|&v| f64::from(v) / 65536.0).sum::<f64>() / table.len() as f64;
        assert!((mean - 1.0).abs() < 0.002, "mean {mean}");
        assert!(table.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn free_is_entered_past_its_null_check_and_nothing_else_moves() {
        // glibc 2.36's free: test %rdi,%rdi; je +0xbf; push %rbp
        let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
        assert_eq!(entry_skip("free", &free, 0x98ef0), 9);
        // The same bytes in another function, or another register, stay put.
        assert_eq!(entry_skip("malloc", &free, 0x98ef0), 0);
        let rsi = [0x48, 0x85, 0xf6, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
        assert_eq!(entry_skip("free", &rsi, 0), 0);
        // A push first (malloc's shape), or too few bytes: the entry.
        assert_eq!(entry_skip("free", &[0x41, 0x54, 0x55], 0), 0);
        assert_eq!(entry_skip("free", &free[..4], 0), 0);
    }

    #[test]
    fn the_hosts_free_skips_only_its_null_check() {
        let libc = find_libc(&[]).expect("the host has a glibc");
        let points = probe_points(&libc[0]).expect("glibc has malloc and free");
        for point in &points {
            let skip = point.entry - point.function;
            match point.spec.symbol {
                // Debian 12's glibc: 3-byte test + 6-byte je.
                "free" => assert_eq!(skip, 9, "{point:?}"),
                _ => assert_eq!(skip, 0, "{point:?}"),
            }
        }
    }

    #[test]
    fn find_libc_refuses_a_missing_configured_path() {
        let err = find_libc(&[PathBuf::from("/nonexistent/libc.so.6")]).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/libc.so.6"), "{err}");
    }
}
