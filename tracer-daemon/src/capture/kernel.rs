//! [`KernelMaps`]: what every later stage may ask of the kernel side, as a
//! trait, so that lifecycle and the service are unit-tested with a fake
//! (see `fake.rs`) and only [`Capture`](super::Capture) needs root.
//!
//! [`ImageId`] is the kernel's name for a process image: the programs give
//! each image (a process from its first allocation to its exec or exit) a
//! generation, and tag every block and every per-process total with it.
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;

pub use super::stopping::Stopping;
pub use super::usage::MapUsage;

use serde::Serialize;
use tracer_common::{AllocInfo, AllocKey, ProcStats, ProcTotals, StackTotals, StackTotalsKey};

use super::unwind::tables::{TableError, UnwindUsage};
use super::{AttachedLibrary, CaptureConfig, CaptureError, ProbeLinks};
use crate::elf::unwind::FileTable;
use crate::sys::procfs::FileKey;
use tracer_common::ProcMapping;

/// One process image: (pid, generation). A pid alone never names a process:
/// an exec replaces the image, and a pid is reused after an exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ImageId {
    /// The process id (the kernel's tgid).
    pub pid: u32,
    /// The generation the programs gave the image at its first allocation
    /// (`ProcStats::generation`, `AllocInfo::generation`).
    pub generation: u32,
}

impl ImageId {
    /// The image `(pid, generation)`.
    #[must_use]
    pub const fn new(pid: u32, generation: u32) -> Self {
        Self { pid, generation }
    }

    /// The image a live block belongs to, from its key and value in
    /// `LIVE_ALLOCS` or the fast table.
    #[must_use]
    pub const fn of_block(key: &AllocKey, info: &AllocInfo) -> Self {
        Self::new(key.tgid, info.generation)
    }
}

/// The kernel side as the rest of tracerd uses it. Every method blocks on
/// map syscalls: call them from blocking threads.
pub trait KernelMaps:
    ProbeMaps + ScopeMaps + BlockMaps + StackMaps + TotalsMaps + UsageMaps + UnwindMaps + Send + Sync
{
}

impl<T> KernelMaps for T where
    T: ProbeMaps
        + ScopeMaps
        + BlockMaps
        + StackMaps
        + TotalsMaps
        + UsageMaps
        + UnwindMaps
        + Send
        + Sync
{
}

/// The probes: what is attached, to which objects and processes, and the
/// programs' runtime switches. A part of [`KernelMaps`].
pub trait ProbeMaps {
    /// The configuration in force (nframe clamped, sizes rounded as the
    /// kernel has them).
    fn config(&self) -> &CaptureConfig;

    /// The libraries probed and the probe points on each.
    fn libraries(&self) -> &[AttachedLibrary];

    /// Attaches the allocator probes for every process (None) or one.
    ///
    /// # Errors
    /// [`CaptureError::Attach`]; nothing of this attach stays attached.
    fn attach(&mut self, pid: Option<u32>) -> Result<(), CaptureError>;

    /// Detaches what [`ProbeMaps::attach`] attached for `pid`.
    fn detach(&mut self, pid: Option<u32>);

    /// The probes' links (allocator probes, system-wide and per process,
    /// and tracepoints), behind a lock of their own: a stop takes them all
    /// out ([`super::OwnedLinks::take_all`]) without this kernel side's
    /// lock, and nothing is attached after that.
    fn probe_links(&self) -> ProbeLinks;

    /// Hands the kernel side tracerd's stop: once it is raised,
    /// [`BlockMaps::live_blocks`] ends early with what it read so far.
    fn stop_with(&mut self, stopping: Stopping);

    /// Probes one more object, found in a process (see
    /// `Capture::add_library`).
    ///
    /// # Errors
    /// [`CaptureError::Attach`]; nothing of the object stays probed.
    fn add_library(&mut self, found: super::probes::Found) -> Result<(), CaptureError>;

    /// Stops probing object `key`; true if it was probed.
    fn remove_library(&mut self, key: FileKey) -> bool;

    /// What is attached: None for system-wide, else the pids, sorted.
    fn attached(&self) -> Vec<Option<u32>>;

    /// Sets the programs' runtime switches (`SWITCH_*` of tracer-common).
    fn set_switches(&mut self, bits: u64);
}

/// The processes recorded while the scope filter is on (`SCOPE_TGIDS`). A part
/// of [`KernelMaps`].
pub trait ScopeMaps {
    /// Puts `pid` in or out of the processes recorded while the scope
    /// filter (`SWITCH_SCOPE_FILTER`) is on (`SCOPE_TGIDS`).
    fn set_in_scope(&mut self, pid: u32, in_scope: bool);

    /// The pids recorded while the scope filter is on, sorted.
    fn in_scope(&self) -> Vec<u32>;

    /// Whether the kernel records `pid` while the scope filter is on (one
    /// lookup of `SCOPE_TGIDS`).
    fn is_in_scope(&self, pid: u32) -> bool;
}

/// The live blocks (`LIVE_ALLOCS`, the fast table, the images' own spill maps).
/// A part of [`KernelMaps`].
pub trait BlockMaps {
    /// Every live block of the images `want` (None: of every process);
    /// only some of them once the stop given to [`ProbeMaps::stop_with`]
    /// is raised.
    fn live_blocks(&self, want: Option<&HashSet<ImageId>>) -> Vec<(AllocKey, AllocInfo)> {
        let mut out = Vec::new();
        self.for_each_live_block(want, &mut |key, info| {
            out.push((*key, *info));
            ControlFlow::Continue(())
        });
        out
    }

    /// Calls `f` with every live block of the images `want` (None: of
    /// every process), in [`BlockMaps::live_blocks`]'s order, until it
    /// breaks: a pass that keeps what it needs of each block rather than
    /// every key and value. Ends at the next block once the stop given to
    /// [`ProbeMaps::stop_with`] is raised.
    fn for_each_live_block(
        &self,
        want: Option<&HashSet<ImageId>>,
        f: &mut dyn FnMut(&AllocKey, &AllocInfo) -> ControlFlow<()>,
    );

    /// Removes the given blocks; returns how many were there to remove.
    fn remove_blocks(&mut self, keys: &[AllocKey]) -> usize;

    /// Removes the given blocks of the live image `image`
    /// (`clear-traces`), calling `removed` with each one that was there;
    /// returns how many. The kernel's counts of the image's spilled blocks
    /// are lowered by those removed from its spill.
    fn remove_image_blocks(
        &mut self,
        image: ImageId,
        keys: &[AllocKey],
        removed: &mut dyn FnMut(&AllocKey),
    ) -> usize {
        let _ = image;
        keys.iter()
            .filter(|key| {
                let gone = self.remove_blocks(std::slice::from_ref(key)) == 1;
                if gone {
                    removed(key);
                }
                gone
            })
            .count()
    }

    /// The handle that makes the images' own spill maps as the programs
    /// ask for them (a `Spill` event), without the kernel lock; None for
    /// the fake kernel, which has a single place for blocks.
    fn own_levels(&self) -> Option<super::own_spill::OwnLevels> {
        None
    }

    /// Drops the own spill maps of `images`, which ended and whose blocks
    /// were read and removed.
    fn drop_own_spill(&mut self, images: &[ImageId]) {
        let _ = images;
    }

    /// The images that have own spill maps.
    fn own_spill_images(&self) -> Vec<ImageId> {
        Vec::new()
    }
}

/// The stacks (`STACKS`) and the totals per stack (`STACK_TOTALS`). A part of
/// [`KernelMaps`].
pub trait StackMaps {
    /// The totals per stack (`STACK_TOTALS`) of the images whose
    /// generation is in `generations` (None: of every image); only some of
    /// them once the stop given to [`ProbeMaps::stop_with`] is raised.
    fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)>;

    /// `STACK_TOTALS` and `STACKS` read without the kernel lock (statistics
    /// of a live image), shared with its readers.
    fn totals_reader(&self) -> Arc<dyn super::stack_totals::StackTotalsSource>;

    /// Removes totals per stack (of ended images); returns how many were
    /// there to remove.
    fn remove_stack_totals(&mut self, keys: &[StackTotalsKey]) -> usize;

    /// The return addresses of stack `id`, frame 0 first.
    fn stack(&self, id: u64) -> Option<Vec<u64>>;

    /// Every stack id stored.
    fn stack_ids(&self) -> Vec<u64>;

    /// Removes stacks (and empties every CPU's cache of its last stack);
    /// returns how many were removed.
    fn remove_stacks(&mut self, ids: &[u64]) -> usize;

    /// Stacks stored now.
    fn stacks_stored(&self) -> u64;

    /// Sets the stacks count of each (tgid, generation, stacks) the kernel
    /// still tracks: the distinct stacks its live blocks reference.
    fn set_stack_counts(&mut self, counts: &[(u32, u32, u64)]);
}

/// The per-process totals (`PROC_SLOTS`, `PROCS`). A part of [`KernelMaps`].
pub trait TotalsMaps {
    /// The per-process totals (`PROC_SLOTS`, `PROCS`) as a reader of its
    /// own, shared: reading through it takes no lock of tracerd's, so the
    /// cheap routes never wait behind a holder of the kernel side's lock
    /// (a pass over millions of live blocks, the orphan sweep). Each read
    /// is the kernel's value at that moment.
    fn totals(&self) -> Arc<dyn super::ProcTotalsSource>;

    /// Totals of one process's current image.
    fn proc_stats(&self, tgid: u32) -> Option<ProcStats>;

    /// Totals of one process's current image with its bytes by source
    /// (`PROC_SLOTS` or `PROCS`).
    fn proc_totals(&self, tgid: u32) -> Option<ProcTotals>;

    /// Totals of every process the programs track: tgid → totals.
    fn all_proc_stats(&self) -> Vec<(u32, ProcStats)>;

    /// Sets the peak of `tgid` to its current value; false if unknown.
    fn reset_peak(&mut self, tgid: u32) -> bool;
}

/// The programs' counters and the maps' use (`COUNTERS`, each map's entries and
/// capacity). A part of [`KernelMaps`].
pub trait UsageMaps {
    /// The programs' counters, their run statistics, each map's entries
    /// and capacity, and the unwind tables' use, as a reader of its own,
    /// shared: reading through it takes no lock of tracerd's, so `/metrics`
    /// never waits behind a holder of the kernel side's lock. Each read is
    /// the kernel's value at that moment.
    fn stats(&self) -> Arc<dyn super::KernelStatsSource>;
}

/// The unwind tables (`UNWIND_*`) and the processes' mappings (`PROC_MAPS`). A
/// part of [`KernelMaps`].
pub trait UnwindMaps {
    /// The id of `key`'s unwind table: `Some(id)` once loaded,
    /// `Some(UNWIND_FILE_NONE)` once refused, None if never offered.
    fn unwind_file(&self, key: FileKey) -> Option<u32>;

    /// Loads `key`'s compiled unwind table (or records why there is none)
    /// and returns its id, `UNWIND_FILE_NONE` when refused.
    fn load_unwind_file(&mut self, key: FileKey, table: Result<&FileTable, &str>) -> u32;

    /// Sets the executable mappings of process `tgid`'s image `generation`
    /// in `PROC_MAPS`; `files` are the files they name.
    ///
    /// # Errors
    /// [`TableError`] when the kernel refuses the entry (the process is
    /// then walked with frame pointers only).
    fn set_process_mappings(
        &mut self,
        tgid: u32,
        generation: u32,
        mappings: &[ProcMapping],
        files: &[FileKey],
    ) -> Result<(), TableError>;

    /// Removes the mappings of process `tgid`'s image `generation` from
    /// `PROC_MAPS` (those of another image of the pid stay).
    fn remove_process_mappings(&mut self, tgid: u32, generation: u32);

    /// What the unwind tables hold and cost.
    fn unwind_usage(&self) -> UnwindUsage;

    /// The images whose mappings are in `PROC_MAPS`.
    fn unwind_processes(&self) -> Vec<ImageId>;
}

impl ProbeMaps for super::Capture {
    fn config(&self) -> &CaptureConfig {
        self.config()
    }
    fn libraries(&self) -> &[AttachedLibrary] {
        self.libraries()
    }
    fn attach(&mut self, pid: Option<u32>) -> Result<(), CaptureError> {
        self.attach(pid)
    }
    fn detach(&mut self, pid: Option<u32>) {
        self.detach(pid);
    }
    fn probe_links(&self) -> ProbeLinks {
        self.probe_links()
    }
    fn stop_with(&mut self, stopping: Stopping) {
        self.stats.stop_with(stopping.clone());
        self.totals_reader.stop_with(stopping.clone());
        self.stopping = stopping;
    }
    fn add_library(&mut self, found: super::probes::Found) -> Result<(), CaptureError> {
        self.add_library(found.library, found.path, found.file, found.probes.points)
    }
    fn remove_library(&mut self, key: FileKey) -> bool {
        self.remove_library(key)
    }
    fn attached(&self) -> Vec<Option<u32>> {
        self.attached()
    }
    fn set_switches(&mut self, bits: u64) {
        self.set_switches(bits);
    }
}

impl ScopeMaps for super::Capture {
    fn set_in_scope(&mut self, pid: u32, in_scope: bool) {
        self.set_in_scope(pid, in_scope);
    }
    fn in_scope(&self) -> Vec<u32> {
        self.in_scope()
    }
    fn is_in_scope(&self, pid: u32) -> bool {
        self.is_in_scope(pid)
    }
}

impl BlockMaps for super::Capture {
    fn for_each_live_block(
        &self,
        want: Option<&HashSet<ImageId>>,
        f: &mut dyn FnMut(&AllocKey, &AllocInfo) -> ControlFlow<()>,
    ) {
        self.for_each_live_block(want, f);
    }
    fn remove_blocks(&mut self, keys: &[AllocKey]) -> usize {
        self.remove_blocks(keys)
    }
    fn remove_image_blocks(
        &mut self,
        image: ImageId,
        keys: &[AllocKey],
        removed: &mut dyn FnMut(&AllocKey),
    ) -> usize {
        self.remove_image_blocks(image, keys, removed)
    }
    fn own_levels(&self) -> Option<super::own_spill::OwnLevels> {
        Some(super::own_spill::OwnLevels::new(
            Arc::clone(&self.own),
            self.totals(),
            Arc::clone(&self.stats),
        ))
    }
    fn drop_own_spill(&mut self, images: &[ImageId]) {
        self.own.drop_images(images);
        self.stats.publish_own(self.own.usage());
    }
    fn own_spill_images(&self) -> Vec<ImageId> {
        self.own.images()
    }
}

impl StackMaps for super::Capture {
    fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        self.stack_totals(generations)
    }
    fn remove_stack_totals(&mut self, keys: &[StackTotalsKey]) -> usize {
        self.remove_stack_totals(keys)
    }
    fn totals_reader(&self) -> Arc<dyn super::stack_totals::StackTotalsSource> {
        self.totals_reader.clone()
    }
    fn stack(&self, id: u64) -> Option<Vec<u64>> {
        self.stack(id)
    }
    fn stack_ids(&self) -> Vec<u64> {
        self.stack_ids()
    }
    fn remove_stacks(&mut self, ids: &[u64]) -> usize {
        self.remove_stacks(ids)
    }
    fn stacks_stored(&self) -> u64 {
        self.stacks_stored()
    }
    fn set_stack_counts(&mut self, counts: &[(u32, u32, u64)]) {
        self.set_stack_counts(counts);
    }
}

impl TotalsMaps for super::Capture {
    fn totals(&self) -> Arc<dyn super::ProcTotalsSource> {
        self.totals()
    }
    fn proc_stats(&self, tgid: u32) -> Option<ProcStats> {
        self.proc_stats(tgid)
    }
    fn proc_totals(&self, tgid: u32) -> Option<ProcTotals> {
        self.proc_totals(tgid)
    }
    fn all_proc_stats(&self) -> Vec<(u32, ProcStats)> {
        self.all_proc_stats()
    }
    fn reset_peak(&mut self, tgid: u32) -> bool {
        self.reset_peak(tgid)
    }
}

impl UsageMaps for super::Capture {
    fn stats(&self) -> Arc<dyn super::KernelStatsSource> {
        self.stats()
    }
}

impl UnwindMaps for super::Capture {
    fn unwind_file(&self, key: FileKey) -> Option<u32> {
        self.unwind_file(key)
    }
    fn load_unwind_file(&mut self, key: FileKey, table: Result<&FileTable, &str>) -> u32 {
        self.load_unwind_file(key, table)
    }
    fn set_process_mappings(
        &mut self,
        tgid: u32,
        generation: u32,
        mappings: &[ProcMapping],
        files: &[FileKey],
    ) -> Result<(), TableError> {
        self.set_process_mappings(tgid, generation, mappings, files)
    }
    fn remove_process_mappings(&mut self, tgid: u32, generation: u32) {
        self.remove_process_mappings(tgid, generation);
    }
    fn unwind_usage(&self) -> UnwindUsage {
        self.unwind_usage()
    }
    fn unwind_processes(&self) -> Vec<ImageId> {
        self.unwind_processes()
    }
}
