//! Loading: the eBPF object into the kernel, sized from the configuration,
//! the lifecycle tracepoints attached, every uprobe program loaded, and
//! handles to every map taken out of the object.
use std::{collections::HashMap, os::fd::AsFd as _, path::Path, process::Command};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Map, MapData, RingBuf},
    programs::{TracePoint, UProbe, trace_point::TracePointLinkId},
};
use tracer_common::{
    FLOOR_PROGRAMS, GLOBAL_INFLIGHT_SLOT_MASK, GLOBAL_LIVE_BUCKET_MASK, GLOBAL_NFRAME,
    GLOBAL_PAGE_SIZE, GLOBAL_PROCESS_MAX_BLOCKS, GLOBAL_PROCESS_MAX_STACKS, GLOBAL_SAMPLE_MEAN,
    GLOBAL_TRACERD_TGID, GLOBAL_VMA_OFFSETS, LIVE_WAYS, MAP_COUNTERS, MAP_EVENTS, MAP_EXP_TABLE,
    MAP_INFLIGHT, MAP_INFLIGHT_SLOTS, MAP_LIVE_ALLOCS, MAP_LIVE_KEYS, MAP_LIVE_VALUES,
    MAP_PROC_SLOTS, MAP_PROCS, MAP_SCOPE_TGIDS, MAP_STACK_TOTALS, MAP_STACKS, MAP_SWITCHES,
    MAPPING_TRACEPOINT, MAX_NFRAME, MAX_WALK_FRAMES, MMAP_TRACEPOINTS, STACK_WORDS, TRACEPOINTS,
    VmaOffsets,
    unwind::{MAP_PROC_MAPS, MAP_UNWIND_PAGES, MAP_UNWIND_ROWS},
};

use super::attach::Target;
use super::events::{RingPositions, ring_size};
use super::inflight::MAX_INFLIGHT_SLOTS;
use super::live_table::{self, LiveTable};
use super::multi::MultiPrograms;
use super::object::{exponential_table, patch_map_value_size};
use super::probes::{AttachedLibrary, find_libc, probe_points};
use super::proc_slots::ProcSlots;
use super::unwind::{maps::UnwindMaps, tables::TableStore};
use super::{Capture, CaptureConfig, CaptureError};
use crate::sys::procfs::FileKey;

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// Which programs [`Capture`] attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Programs {
    /// tracer's own.
    Tracer,
    /// Empty ones, at the same points (the physical floor).
    Floor,
}

impl Programs {
    /// The program attached where tracer's `name` goes (`exit`: a
    /// uretprobe).
    pub(super) fn program_for(self, name: &'static str, exit: bool) -> &'static str {
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
        let walk_frames = config.walk_frames.clamp(nframe, MAX_WALK_FRAMES);
        let object = patch_map_value_size(
            EBPF_OBJECT,
            MAP_STACKS,
            STACK_WORDS as u32 * 8,
            (1 + walk_frames) * 8,
        )?;
        // The unwinder off: the smallest maps (the walk finds no process's
        // mappings and follows frame pointers).
        let unwind_rows = config.unwind_table_rows;
        let (rows_entries, pages_entries, procs_entries) = match unwind_rows {
            0 => (1, 1, 1),
            rows => (
                rows,
                config.unwind_table_pages.max(1),
                config.unwind_processes.max(1),
            ),
        };
        let tgid = std::process::id();
        let page_size = crate::sys::procfs::page_size();
        let inflight_slots = config
            .inflight_slots
            .clamp(1, MAX_INFLIGHT_SLOTS)
            .next_power_of_two();
        let slot_mask = inflight_slots - 1;
        let events_ring_bytes = ring_size(config.events_ring_bytes, page_size);
        let live_buckets = live_table::buckets_for(config.live_table_blocks);
        let live_bucket_mask = live_buckets.saturating_sub(1);
        let process_max_blocks = CaptureConfig {
            live_table_blocks: live_buckets * LIVE_WAYS,
            ..config.clone()
        }
        .process_max_blocks();
        // The walk asks the kernel for a mapping PROC_MAPS lacks only with
        // the unwinder on (off, every stack is a frame-pointer walk).
        let vma_offsets = match unwind_rows {
            0 => VmaOffsets::default(),
            _ => crate::sys::btf::vma_offsets().unwrap_or_else(|err| {
                tracing::warn!(%err, "the unwinder cannot read the kernel's mappings: a process is walked with frame pointers until tracerd has written its mappings (counted in unwind_no_proc_maps)");
                VmaOffsets::default()
            }),
        };
        let mut ebpf = EbpfLoader::new()
            .override_global(GLOBAL_TRACERD_TGID, &tgid, true)
            .override_global(GLOBAL_VMA_OFFSETS, &vma_offsets, true)
            .override_global(GLOBAL_PAGE_SIZE, &page_size, true)
            .override_global(GLOBAL_NFRAME, &walk_frames, true)
            .override_global(GLOBAL_SAMPLE_MEAN, &config.sample_interval, true)
            .override_global(GLOBAL_INFLIGHT_SLOT_MASK, &slot_mask, true)
            .override_global(GLOBAL_LIVE_BUCKET_MASK, &live_bucket_mask, true)
            .override_global(GLOBAL_PROCESS_MAX_BLOCKS, &process_max_blocks, true)
            .override_global(
                GLOBAL_PROCESS_MAX_STACKS,
                &config.process_max_stacks(),
                true,
            )
            .map_max_entries(MAP_LIVE_ALLOCS, config.max_live_blocks)
            .map_max_entries(MAP_LIVE_KEYS, live_buckets.max(1))
            .map_max_entries(MAP_LIVE_VALUES, live_buckets.max(1) * LIVE_WAYS)
            .map_max_entries(MAP_STACKS, config.max_stacks)
            .map_max_entries(MAP_STACK_TOTALS, config.stack_totals_entries())
            .map_max_entries(MAP_PROCS, config.max_procs)
            .map_max_entries(MAP_INFLIGHT, config.max_inflight)
            .map_max_entries(MAP_INFLIGHT_SLOTS, inflight_slots)
            .map_max_entries(MAP_EVENTS, events_ring_bytes)
            .map_max_entries(MAP_UNWIND_ROWS, rows_entries)
            .map_max_entries(MAP_UNWIND_PAGES, pages_entries)
            .map_max_entries(MAP_PROC_MAPS, procs_entries)
            .load(object.as_bytes())
            .map_err(|e| CaptureError::Load(e.to_string()))?;

        // Every uprobe program is loaded now, while the object still holds
        // every map its instructions refer to (a map taken out of it below
        // and dropped, as EXP_TABLE is, would leave a later load with a
        // closed fd); objects found later, and a scoped tracerd, attach
        // them only later. For uprobe_multi links where the kernel has
        // them, else by aya for a perf event per probe.
        let names: Vec<&'static str> = tracer_common::PROBES
            .iter()
            .flat_map(|spec| {
                let exit = spec.exit.map(|name| programs.program_for(name, true));
                std::iter::once(programs.program_for(spec.entry, false)).chain(exit)
            })
            .collect();
        // The verifier takes seconds over this object (the stack walk is
        // in every allocator exit and anonymous-mapping program), one
        // program at a time on one CPU: the uprobe programs are verified
        // on a thread of their own while the tracepoints load here.
        let prepared = MultiPrograms::prepare(object.as_bytes(), &ebpf);
        let (tracepoint_links, multi) = std::thread::scope(|scope| {
            let uprobes = scope.spawn(|| prepared.and_then(|p| p.load(names.iter().copied())));
            let links = attach_tracepoints(&mut ebpf, &config, programs);
            let multi = uprobes
                .join()
                .unwrap_or_else(|_| Err("the thread that loaded them panicked".into()));
            (links, multi)
        });
        let tracepoint_links = tracepoint_links?;
        let libcs = find_libc(&config.libc)?;
        let mut libraries = Vec::new();
        let mut targets = Vec::new();
        for path in &libcs {
            let probes = probe_points(path)?;
            let key = FileKey::of_path(path).ok_or_else(|| CaptureError::Libc {
                path: path.clone(),
                reason: "cannot stat it".into(),
            })?;
            let library = AttachedLibrary::new(path.clone(), key, None, &probes);
            targets.push(Target {
                key,
                path: path.clone(),
                file: None,
                points: probes.points,
                family: library.family,
            });
            libraries.push(library);
        }
        let multi = match multi {
            Ok(multi) => Some(multi),
            Err(reason) => {
                tracing::warn!(
                    %reason,
                    "no uprobe_multi links: each probe is a perf event of its own, and a stop detaches them one after another (about 0.09 s each)"
                );
                for name in &names {
                    load_uprobe(&mut ebpf, name)?;
                }
                None
            }
        };
        let switches = take_map(&mut ebpf, MAP_SWITCHES)?;
        let scope_tgids = take_map(&mut ebpf, MAP_SCOPE_TGIDS)?;
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
        let own = std::sync::Arc::new(super::own_spill::OwnSpill::take(
            &mut ebpf,
            u64::from(config.max_live_blocks),
        )?);
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
        let procs: aya::maps::HashMap<MapData, u32, tracer_common::ProcTotals> =
            take_map(&mut ebpf, MAP_PROCS)?;
        let procs_fd = second_map_fd(aya::maps::IterableMap::map(&procs), MAP_PROCS)?;
        let stack_totals = take_map(&mut ebpf, MAP_STACK_TOTALS)?;
        let proc_slots_map = take_array(&mut ebpf, MAP_PROC_SLOTS)?;
        let proc_slots =
            ProcSlots::map(proc_slots_map.fd().as_fd()).map_err(|e| CaptureError::Map {
                map: MAP_PROC_SLOTS,
                reason: format!("cannot map the process slots: {e}"),
            })?;
        let counters = take_map(&mut ebpf, MAP_COUNTERS)?;
        let inflight: aya::maps::HashMap<MapData, u64, tracer_common::Inflight> =
            take_map(&mut ebpf, MAP_INFLIGHT)?;
        let inflight_slots_map = take_array(&mut ebpf, MAP_INFLIGHT_SLOTS)?;
        let events: RingBuf<MapData> = take_map(&mut ebpf, MAP_EVENTS)?;
        let events_positions = RingPositions::map(events.as_fd(), page_size);
        if events_positions.is_none() {
            tracing::warn!(
                map = MAP_EVENTS,
                "cannot map the ring buffer's positions: its use reads 0"
            );
        }
        let unwind_maps = match unwind_rows {
            0 => UnwindMaps::none(),
            _ => UnwindMaps::take(&mut ebpf, rows_entries)?,
        };
        let config = CaptureConfig {
            nframe,
            walk_frames,
            unwind_table_rows: if unwind_maps.is_some() {
                rows_entries
            } else {
                0
            },
            inflight_slots,
            events_ring_bytes,
            live_table_blocks: live_buckets * LIVE_WAYS,
            ..config
        };
        let live_table = live_table.map(std::sync::Arc::new);
        let totals = std::sync::Arc::new(super::ProcTotalsMaps::new(proc_slots, procs_fd));
        let stopping = super::Stopping::default();
        // The statistics reader's own descriptors of the programs and maps.
        let second_fd = |e: std::io::Error| {
            CaptureError::Load(format!(
                "opening a map or program a second time for the statistics reader: {e}"
            ))
        };
        let mut program_fds = Vec::new();
        for (name, program) in ebpf.programs() {
            if let Ok(fd) = program.fd() {
                let fd = fd.as_fd().try_clone_to_owned().map_err(second_fd)?;
                program_fds.push((name.to_string(), fd));
            }
        }
        for (name, fd) in multi.iter().flat_map(MultiPrograms::fds) {
            program_fds.push((name, fd.map_err(second_fd)?));
        }
        let totals_reader = std::sync::Arc::new(
            super::stack_totals::TotalsReader::new(
                aya::maps::IterableMap::map(&stack_totals).fd().as_fd(),
                stacks.fd().as_fd(),
                config.walk_frames,
                stopping.clone(),
            )
            .map_err(second_fd)?,
        );
        let stats = super::usage::KernelStats::new(super::usage::StatsParts {
            counters,
            programs: program_fds,
            live: aya::maps::IterableMap::map(&live),
            stacks: &stacks,
            stack_totals: aya::maps::IterableMap::map(&stack_totals),
            procs: aya::maps::IterableMap::map(&procs),
            inflight: aya::maps::IterableMap::map(&inflight),
            inflight_slots: &inflight_slots_map,
            live_table: live_table.clone(),
            totals: totals.clone(),
            events_positions,
            config: config.clone(),
            stopping: stopping.clone(),
        })
        .map_err(second_fd)?;
        let mut capture = Self {
            ebpf,
            live,
            own,
            live_table,
            _live_table_maps: (live_keys, live_values),
            stacks,
            procs,
            stack_totals,
            totals_reader,
            totals,
            _proc_slots_map: proc_slots_map,
            stats: std::sync::Arc::new(stats),
            switches,
            scope_tgids,
            events: Some(events),
            libraries,
            targets,
            programs,
            multi,
            links: HashMap::new(),
            owned_links: super::ProbeLinks::default(),
            stopping,
            config,
            unwind: TableStore::new(
                if unwind_maps.is_some() {
                    rows_entries
                } else {
                    0
                },
                pages_entries,
            ),
            unwind_maps,
        };
        capture.publish_unwind_usage();
        capture.own_tracepoints(tracepoint_links);
        if capture.config.system_wide {
            capture.attach(None)?;
        }
        Ok(capture)
    }
}

pub(super) fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, CaptureError>
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

pub(super) fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, CaptureError>
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

/// A descriptor of its own of `map` (named `name`), for a reader that
/// works without the lock of the one that owns the map.
///
/// # Errors
/// [`CaptureError::Map`] when it cannot be duplicated (no descriptor left).
pub(super) fn second_map_fd(
    map: &MapData,
    name: &'static str,
) -> Result<std::os::fd::OwnedFd, CaptureError> {
    map.fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| CaptureError::Map {
            map: name,
            reason: format!("cannot open it a second time: {e}"),
        })
}

/// Takes the array map `name` out of `ebpf`, untyped (its values are read
/// raw or through a mapping).
pub(super) fn take_array(ebpf: &mut Ebpf, name: &'static str) -> Result<MapData, CaptureError> {
    match ebpf.take_map(name) {
        Some(Map::Array(data)) => Ok(data),
        _ => Err(CaptureError::Map {
            map: name,
            reason: "missing or not an array".into(),
        }),
    }
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

/// Loads and attaches the lifecycle tracepoints ([`TRACEPOINTS`]), then
/// the optional ones: the mapping tracepoint, and the anonymous-mapping
/// ones when `config.trace_mmap` (tracer's own programs only). Returns
/// their links.
///
/// # Errors
/// [`CaptureError::Program`] or [`CaptureError::Attach`] naming the
/// lifecycle tracepoint that failed.
fn attach_tracepoints(
    ebpf: &mut Ebpf,
    config: &CaptureConfig,
    programs: Programs,
) -> Result<Vec<(&'static str, TracePointLinkId)>, CaptureError> {
    let mut tracepoint_links = Vec::new();
    for (name, category, event) in TRACEPOINTS {
        let program: &mut TracePoint = program_mut(ebpf, name)?;
        let started = std::time::Instant::now();
        program.load().map_err(|source| CaptureError::Program {
            program: name.into(),
            source: Box::new(source),
        })?;
        tracing::debug!(
            program = name,
            ms = started.elapsed().as_millis() as u64,
            "program verified"
        );
        let link = program
            .attach(category, event)
            .map_err(|source| CaptureError::Attach {
                program: name.into(),
                target: format!("{category}:{event}"),
                source: Box::new(source),
            })?;
        tracepoint_links.push((name, link));
    }
    tracepoint_links.extend(attach_mapping_tracepoint(ebpf));
    if config.trace_mmap && programs == Programs::Tracer {
        tracepoint_links.extend(attach_mmap_tracepoints(ebpf));
    }
    Ok(tracepoint_links)
}

/// Attaches [`MMAP_TRACEPOINTS`] (anonymous mappings as blocks); a kernel
/// without syscall tracepoints gets a warning, and no `mmap` source.
fn attach_mmap_tracepoints(ebpf: &mut Ebpf) -> Vec<(&'static str, TracePointLinkId)> {
    MMAP_TRACEPOINTS
        .into_iter()
        .filter_map(|tracepoint| {
            attach_optional_tracepoint(ebpf, tracepoint, "anonymous mappings are not traced")
        })
        .collect()
}

/// Attaches [`MAPPING_TRACEPOINT`] (prompt news of a library mapped, for
/// allocator discovery and the unwinder); a kernel without syscall
/// tracepoints gets a warning, and both their periodic refresh only.
fn attach_mapping_tracepoint(ebpf: &mut Ebpf) -> Option<(&'static str, TracePointLinkId)> {
    attach_optional_tracepoint(
        ebpf,
        MAPPING_TRACEPOINT,
        "libraries loaded later are unwound from the next refresh (within 1 s)",
    )
}

/// Loads and attaches the tracepoint program (program, category, name)
/// that tracerd can do without, and returns its link; when it cannot,
/// logs a warning that says `without` (what is lost).
fn attach_optional_tracepoint(
    ebpf: &mut Ebpf,
    (name, category, event): (&'static str, &str, &str),
    without: &str,
) -> Option<(&'static str, TracePointLinkId)> {
    let attached = program_mut::<TracePoint>(ebpf, name).and_then(|program| {
        let started = std::time::Instant::now();
        program
            .load()
            .map_err(|e| CaptureError::Load(e.to_string()))?;
        tracing::debug!(
            program = name,
            ms = started.elapsed().as_millis() as u64,
            "program verified"
        );
        program
            .attach(category, event)
            .map_err(|e| CaptureError::Load(e.to_string()))
    });
    match attached {
        Ok(link) => Some((name, link)),
        Err(err) => {
            tracing::warn!(
                err = %err,
                tracepoint = %format!("{category}:{event}"),
                "{without}"
            );
            None
        }
    }
}
