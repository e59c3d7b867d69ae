//! Loading: the eBPF object into the kernel, sized from the configuration,
//! the lifecycle tracepoints attached, every uprobe program loaded, and
//! handles to every map taken out of the object.
use std::{
    collections::HashMap,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::Command,
};

use aya::{
    Ebpf,
    maps::{Map, MapData},
    programs::UProbe,
};
use tracer_common::{
    FLOOR_PROGRAMS, MAP_STACKS, MMAP_ADD_PROGRAM, MMAP_UNMAP_PROGRAM, STACK_WORDS,
};

use super::multi::MultiPrograms;
use super::object::patch_map_value_size;
use super::probes::Target;
use super::probes::{AttachedLibrary, find_libc, probe_points};
use super::unwind::tables::TableStore;
use super::{Capture, CaptureConfig, CaptureError};
use crate::sys::procfs::FileKey;

mod maps;
mod sizes;
mod tracepoints;

use maps::Taken;
use sizes::{Sizes, load_object};
use tracepoints::{attach_tracepoints, verify_tracepoints};

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
        let sizes = Sizes::of(&config);
        let object = patch_map_value_size(
            EBPF_OBJECT,
            MAP_STACKS,
            STACK_WORDS as u32 * 8,
            (1 + sizes.walk_frames) * 8,
        )?;
        let mut ebpf = load_object(object.as_bytes(), &config, &sizes)?;

        // Every uprobe program is loaded now, while the object still holds
        // every map its instructions refer to (a map taken out of it below
        // and dropped, as EXP_TABLE is, would leave a later load with a
        // closed fd); objects found later, and a scoped tracerd, attach
        // them only later. For uprobe_multi links where the kernel has
        // them, else by aya for a perf event per probe.
        let names = uprobe_names(programs);
        let multi = verify_on_both_cpus(object.as_bytes(), &mut ebpf, &names, &config, programs);
        let tracepoint_links = attach_tracepoints(&mut ebpf, &config, programs)?;
        let (libraries, targets) = libc_targets(&config.libc)?;
        let multi = multi_or_each(multi, &mut ebpf, &names)?;
        let maps = Taken::take(&mut ebpf, &config, &sizes)?;
        let config = sizes.applied(config, maps.unwind_maps.is_some());
        let live_table = maps.live_table.map(std::sync::Arc::new);
        let totals =
            std::sync::Arc::new(super::ProcTotalsMaps::new(maps.proc_slots, maps.procs_fd));
        let stopping = super::Stopping::default();
        // The statistics reader's own descriptors of the programs and maps.
        let program_fds = program_fds(&ebpf, multi.as_ref())?;
        let totals_reader = std::sync::Arc::new(
            super::stack_totals::TotalsReader::new(
                aya::maps::IterableMap::map(&maps.stack_totals).fd().as_fd(),
                maps.stacks.fd().as_fd(),
                config.walk_frames,
                stopping.clone(),
            )
            .map_err(second_fd)?,
        );
        let stats = super::usage::KernelStats::new(super::usage::StatsParts {
            counters: maps.counters,
            programs: program_fds,
            live: aya::maps::IterableMap::map(&maps.live),
            stacks: &maps.stacks,
            stack_totals: aya::maps::IterableMap::map(&maps.stack_totals),
            procs: aya::maps::IterableMap::map(&maps.procs),
            inflight: aya::maps::IterableMap::map(&maps.inflight),
            inflight_slots: &maps.inflight_slots_map,
            live_table: live_table.clone(),
            totals: totals.clone(),
            events_positions: maps.events_positions,
            config: config.clone(),
            stopping: stopping.clone(),
        })
        .map_err(second_fd)?;
        let _exp_table = maps.exp_table;
        let mut capture = Self {
            ebpf,
            live: maps.live,
            own: maps.own,
            live_table,
            _live_table_maps: (maps.live_keys, maps.live_values),
            stacks: maps.stacks,
            stacks_held: maps.stacks_held,
            procs: maps.procs,
            stack_totals: maps.stack_totals,
            totals_reader,
            totals,
            _proc_slots_map: maps.proc_slots_map,
            stats: std::sync::Arc::new(stats),
            switches: maps.switches,
            scope_tgids: maps.scope_tgids,
            events: Some(maps.events),
            libraries,
            targets,
            programs,
            multi,
            links: HashMap::new(),
            owned_links: super::ProbeLinks::default(),
            stopping,
            config,
            unwind: TableStore::new(
                if maps.unwind_maps.is_some() {
                    sizes.rows_entries
                } else {
                    0
                },
                sizes.pages_entries,
            ),
            unwind_maps: maps.unwind_maps,
        };
        capture.publish_unwind_usage();
        capture.own_tracepoints(tracepoint_links);
        if capture.config.system_wide {
            capture.attach(None)?;
        }
        Ok(capture)
    }
}

/// The uprobe programs `programs` attaches, entry and exit of each probed
/// function, in [`tracer_common::PROBES`] order.
fn uprobe_names(programs: Programs) -> Vec<&'static str> {
    tracer_common::PROBES
        .iter()
        .flat_map(|spec| {
            let exit = spec.exit.map(|name| programs.program_for(name, true));
            std::iter::once(programs.program_for(spec.entry, false)).chain(exit)
        })
        .collect()
}

/// The glibc files `configured` names (or the dynamic loader finds), each
/// with its probe points: as attached libraries, and as attach targets.
///
/// # Errors
/// [`CaptureError::Libc`] when one cannot be found, read or stat'ed.
fn libc_targets(
    configured: &[PathBuf],
) -> Result<(Vec<AttachedLibrary>, Vec<Target>), CaptureError> {
    let libcs = find_libc(configured)?;
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
    Ok((libraries, targets))
}

/// The uprobe_multi programs `multi`, or where the kernel refused them
/// (logged), every program of `names` loaded by aya to attach as a perf
/// event per probe (None).
///
/// # Errors
/// [`CaptureError::Program`] naming a program that did not load.
fn multi_or_each(
    multi: Result<MultiPrograms, String>,
    ebpf: &mut Ebpf,
    names: &[&'static str],
) -> Result<Option<MultiPrograms>, CaptureError> {
    Ok(match multi {
        Ok(multi) => Some(multi),
        Err(reason) => {
            tracing::warn!(
                %reason,
                "no uprobe_multi links: each probe is a perf event of its own, and a stop detaches them one after another (about 0.09 s each)"
            );
            for name in names {
                load_uprobe(ebpf, name)?;
            }
            None
        }
    })
}

/// A descriptor opened a second time, for the statistics reader, failed.
fn second_fd(e: std::io::Error) -> CaptureError {
    CaptureError::Load(format!(
        "opening a map or program a second time for the statistics reader: {e}"
    ))
}

/// The statistics reader's own descriptors of the loaded programs of
/// `ebpf` and of `multi`'s, by name.
///
/// # Errors
/// [`CaptureError::Load`] when one cannot be opened a second time.
fn program_fds(
    ebpf: &Ebpf,
    multi: Option<&MultiPrograms>,
) -> Result<Vec<(String, std::os::fd::OwnedFd)>, CaptureError> {
    let mut program_fds = Vec::new();
    for (name, program) in ebpf.programs() {
        if let Ok(fd) = program.fd() {
            let fd = fd.as_fd().try_clone_to_owned().map_err(second_fd)?;
            program_fds.push((name.to_string(), fd));
        }
    }
    for (name, fd) in multi.into_iter().flat_map(MultiPrograms::fds) {
        program_fds.push((name, fd.map_err(second_fd)?));
    }
    Ok(program_fds)
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

/// Verifies the programs before anything is attached. The verifier takes
/// seconds over this object (the stack walk is in the allocator exit and
/// in the anonymous-mapping program that records new mappings, the
/// unmap's loops in the other), one program at a time on one CPU: the
/// uprobe programs (for uprobe_multi links, from `object`), then
/// [`MMAP_ADD_PROGRAM`], are verified on a thread of their own while
/// [`MMAP_UNMAP_PROGRAM`] is verified here (docs/design/0011 has the
/// figures). Returns the uprobe programs, or why they could not be loaded
/// so.
fn verify_on_both_cpus(
    object: &[u8],
    ebpf: &mut Ebpf,
    names: &[&'static str],
    config: &CaptureConfig,
    programs: Programs,
) -> Result<MultiPrograms, String> {
    let prepared = MultiPrograms::prepare(object, ebpf);
    let mmap = config.trace_mmap && programs == Programs::Tracer;
    // Sampled: one session program for the allocating calls, whose
    // entries skip the return of the calls sampling passes over.
    let session = config.sample_interval != 0 && programs == Programs::Tracer;
    let (mut here, mut there) = (Vec::new(), Vec::new());
    for (name, program) in ebpf.programs_mut() {
        if mmap && name == MMAP_UNMAP_PROGRAM {
            here.push(program);
        } else if mmap && name == MMAP_ADD_PROGRAM {
            there.push(program);
        }
    }
    std::thread::scope(|scope| {
        let uprobes = scope.spawn(|| {
            let multi = prepared.and_then(|p| p.load(names.iter().copied(), session));
            verify_tracepoints(there);
            multi
        });
        verify_tracepoints(here);
        uprobes
            .join()
            .unwrap_or_else(|_| Err("the thread that loaded them panicked".into()))
    })
}
