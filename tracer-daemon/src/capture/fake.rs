//! A kernel side in memory, for unit tests of lifecycle and the service:
//! it keeps blocks, stacks and per-process totals as the eBPF programs do
//! (the same keys, values and generations), and lets a test allocate, free,
//! exec and exit processes. Clones share one state, so a test keeps a
//! handle while the service owns another.
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tracer_common::{
    AllocInfo, AllocKey, FamilyTotals, ProcEvent, ProcEventKind, ProcStats, ProcTotals,
    STACK_ID_NONE, StackTotals, StackTotalsKey,
};

use super::kernel::MapUsage;
use super::unwind::tables::{TableError, TableSink, TableStore, UnwindUsage};
use super::{
    AttachedLibrary, BlockMaps, CaptureConfig, CaptureError, ImageId, ProbeMaps, ScopeMaps,
    StackMaps, TotalsMaps, UnwindMaps, UsageMaps,
};
use crate::elf::unwind::FileTable;
use crate::sys::procfs::FileKey;
use tracer_common::{ProcMapping, ProcMappings, UnwindPage, UnwindPageKey, UnwindRow};

#[derive(Debug, Default)]
struct FakeState {
    blocks: HashMap<(u32, u64), AllocInfo>,
    stacks: HashMap<u64, Vec<u64>>,
    procs: HashMap<u32, ProcStats>,
    /// `STACK_TOTALS`, kept as the programs keep it: in step with
    /// `blocks` through alloc and free, not through `remove_blocks`.
    stack_totals: HashMap<StackTotalsKey, StackTotals>,
    attached: BTreeSet<Option<u32>>,
    /// tracerd's stop, as handed by `stop_with`.
    stopping: super::Stopping,
    /// The probes' links (none: nothing is really attached); once taken
    /// out, nothing is attached.
    links: super::ProbeLinks,
    switches: u64,
    in_scope: std::collections::BTreeSet<u32>,
    next_generation: u32,
    unwind: Option<TableStore>,
    tables: FakeTables,
}

impl FakeState {
    /// Takes block `info` out of its stack's totals.
    fn uncount_in_stack(&mut self, info: &AllocInfo) {
        if let Some(totals) = self.stack_totals.get_mut(&StackTotalsKey::of(info)) {
            totals.count = totals.count.saturating_sub(1);
            totals.size = totals.size.saturating_sub(info.size);
        }
    }
}

/// The unwind maps in memory.
#[derive(Debug, Default)]
struct FakeTables {
    rows: HashMap<u32, UnwindRow>,
    pages: HashMap<UnwindPageKey, UnwindPage>,
    procs: HashMap<u32, (u32, Vec<ProcMapping>)>,
    files: HashMap<FileKey, u32>,
}

impl TableSink for FakeTables {
    fn write_rows(&mut self, first: u32, rows: &[UnwindRow]) -> Result<(), String> {
        for (i, row) in (first..).zip(rows) {
            self.rows.insert(i, *row);
        }
        Ok(())
    }
    fn insert_page(&mut self, key: UnwindPageKey, page: UnwindPage) -> Result<(), String> {
        self.pages.insert(key, page);
        Ok(())
    }
    fn remove_page(&mut self, key: UnwindPageKey) {
        self.pages.remove(&key);
    }
    fn set_mappings(&mut self, tgid: u32, value: &ProcMappings) -> Result<(), String> {
        let count = value.count as usize;
        let used = value.mappings.get(..count).unwrap_or_default().to_vec();
        self.procs.insert(tgid, (value.generation, used));
        Ok(())
    }
    fn remove_mappings(&mut self, tgid: u32) {
        self.procs.remove(&tgid);
    }
    fn set_file_table(&mut self, key: FileKey, id: u32) -> Result<(), String> {
        self.files.insert(key, id);
        Ok(())
    }
    fn remove_file_table(&mut self, key: FileKey) {
        self.files.remove(&key);
    }
}

/// The fake kernel; see the module doc.
#[derive(Clone, Debug)]
pub struct FakeKernel {
    state: Arc<Mutex<FakeState>>,
    config: CaptureConfig,
}

impl FakeKernel {
    /// An empty kernel side tracing every process with `nframe` frames.
    pub fn new(nframe: u32) -> Self {
        let state = FakeState {
            attached: BTreeSet::from([None]),
            next_generation: 1,
            unwind: Some(TableStore::new(1 << 16, 1 << 10)),
            ..FakeState::default()
        };
        Self {
            state: Arc::new(Mutex::new(state)),
            config: CaptureConfig {
                nframe,
                walk_frames: nframe,
                unwind_table_rows: 1 << 16,
                unwind_table_pages: 1 << 10,
                unwind_processes: 1 << 10,
                max_live_blocks: 1 << 20,
                live_table_blocks: 0,
                process_share: 100,
                trace_mmap: false,
                max_stacks: 1 << 16,
                max_procs: 1 << 16,
                max_inflight: 1 << 16,
                inflight_slots: 1 << 16,
                events_ring_bytes: 1 << 18,
                libc: Vec::new(),
                sample_interval: 0,
                system_wide: true,
            },
        }
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The kernel's `New` event of a process's first allocation: a new
    /// generation for `pid`, as the programs give one.
    pub fn start(&self, pid: u32) -> (ImageId, ProcEvent) {
        let mut state = self.lock();
        let generation = state.next_generation;
        state.next_generation += 1;
        state.procs.insert(
            pid,
            ProcStats {
                generation,
                ..ProcStats::default()
            },
        );
        let image = ImageId::new(pid, generation);
        (
            image,
            event(ProcEventKind::New, image, ProcStats::default()),
        )
    }

    /// An allocation of `size` bytes at `addr` by `pid` with `stack`
    /// (frame 0 first; empty: no stack stored).
    pub fn alloc(&self, pid: u32, addr: u64, size: u64, stack: &[u64]) {
        let mut state = self.lock();
        let stack_id = if stack.is_empty() {
            STACK_ID_NONE
        } else {
            let id = stack
                .iter()
                .fold(17u64, |h, a| h.wrapping_mul(31).wrapping_add(*a));
            state.stacks.insert(id, stack.to_vec());
            id
        };
        let Some(stats) = state.procs.get_mut(&pid) else {
            return;
        };
        stats.current += size;
        stats.peak = stats.peak.max(stats.current);
        stats.blocks += 1;
        stats.allocs += 1;
        let info = AllocInfo {
            size,
            stack_id,
            frame0: stack.first().copied().unwrap_or(0),
            generation: stats.generation,
            source: FAKE_SOURCE,
        };
        if let Some(old) = state.blocks.insert((pid, addr), info) {
            state.uncount_in_stack(&old);
        }
        let totals = state
            .stack_totals
            .entry(StackTotalsKey::of(&info))
            .or_default();
        totals.count += 1;
        totals.size += size;
    }

    /// A free of `addr` by `pid`.
    pub fn free(&self, pid: u32, addr: u64) {
        let mut state = self.lock();
        let removed = state.blocks.remove(&(pid, addr));
        if let Some(stats) = state.procs.get_mut(&pid) {
            match removed {
                Some(info) => {
                    stats.current -= info.size;
                    stats.blocks -= 1;
                    stats.frees += 1;
                }
                None => stats.unknown_frees += 1,
            }
        }
        if let Some(info) = removed {
            state.uncount_in_stack(&info);
        }
    }

    /// The kernel's `Exit` event of `pid`: its totals leave `PROCS` (its
    /// blocks stay until tracerd removes them).
    pub fn exit(&self, pid: u32) -> Option<ProcEvent> {
        let mut state = self.lock();
        let stats = state.procs.remove(&pid)?;
        Some(event(
            ProcEventKind::Exit,
            ImageId::new(pid, stats.generation),
            stats,
        ))
    }

    /// Forgets `pid`'s totals without an event, as a lost end event leaves
    /// them.
    pub fn lose_exit(&self, pid: u32) {
        self.lock().procs.remove(&pid);
    }

    /// Blocks in the maps now, of every process.
    pub fn block_count(&self) -> usize {
        self.lock().blocks.len()
    }

    /// The generation and executable mappings of `tgid` in `PROC_MAPS`.
    pub fn process_mappings(&self, tgid: u32) -> Option<(u32, Vec<ProcMapping>)> {
        self.lock().tables.procs.get(&tgid).cloned()
    }

    /// The runtime switches last set.
    pub fn switches(&self) -> u64 {
        self.lock().switches
    }
}

/// A kernel event as the programs send it.
pub fn event(kind: ProcEventKind, image: ImageId, stats: ProcStats) -> ProcEvent {
    ProcEvent {
        kind: kind as u32,
        tgid: image.pid,
        generation: image.generation,
        stats,
        ..ProcEvent::default()
    }
}

/// The source of every fake block: glibc's.
const FAKE_SOURCE: u32 = 1;

fn key(pid: u32, addr: u64) -> AllocKey {
    AllocKey {
        tgid: pid,
        _pad: 0,
        addr,
    }
}

/// The fake's totals per stack and stacks, read under its own lock (as
/// the real ones are read without the service's).
impl super::stack_totals::StackTotalsSource for FakeKernel {
    fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        StackMaps::stack_totals(self, generations)
    }
    fn stack(&self, id: u64) -> Option<Vec<u64>> {
        StackMaps::stack(self, id)
    }
}

/// The fake's totals, read under its own lock (as the real ones are
/// read without the service's).
impl super::ProcTotalsSource for FakeKernel {
    fn proc_totals(&self, tgid: u32) -> Option<ProcTotals> {
        let state = self.lock();
        let stats = *state.procs.get(&tgid)?;
        // Every fake block comes from FAKE_SOURCE: its bytes are the
        // process's (peak included).
        let mut sources = [FamilyTotals::default(); tracer_common::FAMILY_COUNT];
        sources[FAKE_SOURCE as usize] = FamilyTotals {
            current: stats.current,
            peak: stats.peak,
        };
        Some(ProcTotals {
            stats,
            sources,
            ..ProcTotals::default()
        })
    }
    fn all_proc_stats(&self) -> Vec<(u32, ProcStats)> {
        self.lock().procs.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

impl ProbeMaps for FakeKernel {
    fn config(&self) -> &CaptureConfig {
        &self.config
    }
    fn libraries(&self) -> &[AttachedLibrary] {
        &[]
    }
    fn attach(&mut self, pid: Option<u32>) -> Result<(), CaptureError> {
        let mut state = self.lock();
        if state.stopping.is_raised() || super::attach::lock_links(&state.links).is_closed() {
            return Err(CaptureError::Stopping);
        }
        state.attached.insert(pid);
        Ok(())
    }
    fn detach(&mut self, pid: Option<u32>) {
        self.lock().attached.remove(&pid);
    }
    fn probe_links(&self) -> super::ProbeLinks {
        self.lock().links.clone()
    }
    fn stop_with(&mut self, stopping: super::Stopping) {
        self.lock().stopping = stopping;
    }
    fn add_library(&mut self, _found: super::probes::Found) -> Result<(), CaptureError> {
        Ok(())
    }
    fn remove_library(&mut self, _key: FileKey) -> bool {
        false
    }
    fn attached(&self) -> Vec<Option<u32>> {
        self.lock().attached.iter().copied().collect()
    }
    fn set_switches(&mut self, bits: u64) {
        self.lock().switches = bits;
    }
}

impl ScopeMaps for FakeKernel {
    fn set_in_scope(&mut self, pid: u32, in_scope: bool) {
        let mut state = self.lock();
        if in_scope {
            state.in_scope.insert(pid);
        } else {
            state.in_scope.remove(&pid);
        }
    }
    fn in_scope(&self) -> Vec<u32> {
        self.lock().in_scope.iter().copied().collect()
    }
    fn is_in_scope(&self, pid: u32) -> bool {
        self.lock().in_scope.contains(&pid)
    }
}

impl BlockMaps for FakeKernel {
    fn for_each_live_block(
        &self,
        want: Option<&HashSet<ImageId>>,
        f: &mut dyn FnMut(&AllocKey, &AllocInfo) -> ControlFlow<()>,
    ) {
        let mut out: Vec<_> = {
            let state = self.lock();
            // Stopping: the pass ends before its first block.
            if state.stopping.is_raised() {
                return;
            }
            state
                .blocks
                .iter()
                .map(|(&(pid, addr), info)| (key(pid, addr), *info))
                .filter(|(k, i)| want.is_none_or(|w| w.contains(&ImageId::of_block(k, i))))
                .collect()
        };
        out.sort_by_key(|(k, _)| (k.tgid, k.addr));
        for (key, info) in &out {
            if f(key, info).is_break() {
                return;
            }
        }
    }
    fn remove_blocks(&mut self, keys: &[AllocKey]) -> usize {
        let mut state = self.lock();
        keys.iter()
            .filter(|k| state.blocks.remove(&(k.tgid, k.addr)).is_some())
            .count()
    }
}

impl StackMaps for FakeKernel {
    fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        let state = self.lock();
        if state.stopping.is_raised() {
            return Vec::new();
        }
        let mut out: Vec<_> = state
            .stack_totals
            .iter()
            .filter(|(key, _)| generations.is_none_or(|want| want.contains(&key.generation)))
            .map(|(key, totals)| (*key, *totals))
            .collect();
        out.sort_by_key(|(key, _)| *key);
        out
    }
    fn totals_reader(&self) -> Arc<dyn super::stack_totals::StackTotalsSource> {
        Arc::new(self.clone())
    }
    fn remove_stack_totals(&mut self, keys: &[StackTotalsKey]) -> usize {
        let mut state = self.lock();
        keys.iter()
            .filter(|key| state.stack_totals.remove(key).is_some())
            .count()
    }
    fn stack(&self, id: u64) -> Option<Vec<u64>> {
        self.lock().stacks.get(&id).cloned()
    }
    fn stack_ids(&self) -> Vec<u64> {
        self.lock().stacks.keys().copied().collect()
    }
    fn remove_stacks(&mut self, ids: &[u64]) -> usize {
        let mut state = self.lock();
        ids.iter()
            .filter(|id| state.stacks.remove(id).is_some())
            .count()
    }
    fn stacks_stored(&self) -> u64 {
        self.lock().stacks.len() as u64
    }
    fn set_stack_counts(&mut self, _counts: &[(u32, u32, u64)]) {
        // The fake stores every stack: no share to keep.
    }
}

impl TotalsMaps for FakeKernel {
    fn totals(&self) -> Arc<dyn super::ProcTotalsSource> {
        Arc::new(self.clone())
    }
    fn proc_stats(&self, tgid: u32) -> Option<ProcStats> {
        super::ProcTotalsSource::proc_stats(self, tgid)
    }
    fn proc_totals(&self, tgid: u32) -> Option<ProcTotals> {
        super::ProcTotalsSource::proc_totals(self, tgid)
    }
    fn all_proc_stats(&self) -> Vec<(u32, ProcStats)> {
        super::ProcTotalsSource::all_proc_stats(self)
    }
    fn reset_peak(&mut self, tgid: u32) -> bool {
        match self.lock().procs.get_mut(&tgid) {
            Some(stats) => {
                stats.peak = stats.current;
                true
            }
            None => false,
        }
    }
}

impl UsageMaps for FakeKernel {
    fn stats(&self) -> Arc<dyn super::KernelStatsSource> {
        Arc::new(self.clone())
    }
}

impl UnwindMaps for FakeKernel {
    fn unwind_file(&self, key: FileKey) -> Option<u32> {
        self.lock().unwind.as_ref()?.file(key)
    }
    fn load_unwind_file(&mut self, key: FileKey, table: Result<&FileTable, &str>) -> u32 {
        let mut state = self.lock();
        let FakeState { unwind, tables, .. } = &mut *state;
        unwind
            .as_mut()
            .map_or(tracer_common::UNWIND_FILE_NONE, |store| {
                store.load(tables, key, table)
            })
    }
    fn set_process_mappings(
        &mut self,
        tgid: u32,
        generation: u32,
        mappings: &[ProcMapping],
        files: &[FileKey],
    ) -> Result<(), TableError> {
        let mut state = self.lock();
        let FakeState { unwind, tables, .. } = &mut *state;
        match unwind.as_mut() {
            Some(store) => store.set_process(tables, tgid, generation, mappings, files),
            None => Ok(()),
        }
    }
    fn remove_process_mappings(&mut self, tgid: u32, generation: u32) {
        let mut state = self.lock();
        let FakeState { unwind, tables, .. } = &mut *state;
        if let Some(store) = unwind.as_mut() {
            store.remove_process(tables, tgid, generation);
        }
    }
    fn unwind_usage(&self) -> UnwindUsage {
        self.lock()
            .unwind
            .as_ref()
            .map(TableStore::usage)
            .unwrap_or_default()
    }
    fn unwind_processes(&self) -> Vec<ImageId> {
        self.lock().unwind.as_ref().map_or_else(Vec::new, |store| {
            store
                .processes()
                .into_iter()
                .map(|(tgid, generation)| ImageId::new(tgid, generation))
                .collect()
        })
    }
}

impl super::KernelStatsSource for FakeKernel {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        tracer_common::Counter::ALL
            .iter()
            .map(|(_, name)| (*name, 0))
            .collect()
    }
    fn program_stats(&self) -> Vec<(String, Duration, u64)> {
        Vec::new()
    }
    fn map_usage(&self) -> MapUsage {
        vec![(
            tracer_common::MAP_LIVE_ALLOCS,
            self.lock().blocks.len() as u64,
            u64::from(self.config.max_live_blocks),
        )]
    }
    fn unwind_usage(&self) -> UnwindUsage {
        super::UnwindMaps::unwind_usage(self)
    }
}
