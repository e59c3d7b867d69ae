//! The per-CPU counters (`COUNTERS`): one slot per [`Counter`], incremented
//! by the kernel side on every outcome worth counting (every failure branch
//! included), summed over CPUs and named ([`Counter::ALL`]) by tracerd.

#[cfg(doc)]
use crate::{MAP_COUNTERS, MAP_INFLIGHT, MAP_INFLIGHT_SLOTS, MAP_LIVE_ALLOCS, MAP_PROCS};

/// Slots of the per-CPU [`MAP_COUNTERS`] array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Allocations recorded.
    Allocs = 0,
    /// Frees of known blocks.
    Frees = 1,
    /// Frees of pointers not in the live map.
    UnknownFrees = 2,
    /// `free(NULL)` calls.
    NullFrees = 3,
    /// Allocator calls that returned failure.
    FailedAllocs = 4,
    /// Probed calls nested in another probed call (not counted twice).
    Nested = 5,
    /// A return seen without its entry (attached mid-call).
    ExitWithoutEntry = 6,
    /// Drop: [`MAP_LIVE_ALLOCS`] full, the block is not traced.
    DropLiveFull = 7,
    /// Drop: the call's slot in [`MAP_INFLIGHT_SLOTS`] was taken and
    /// [`MAP_INFLIGHT`] was full: the call is not traced (a `realloc`'s old
    /// block leaves the live set at once, so no phantom leak remains).
    DropInflightFull = 8,
    /// Drop: [`MAP_PROCS`] full, the process is not traced.
    DropProcsFull = 9,
    /// The stack could not be walked or stored (stack map full, or another
    /// stack with the same id): the block is traced with no traceback.
    DropStack = 10,
    /// Drop: the ring buffer was full, an event was lost.
    DropEvents = 11,
    /// A block overwrote a live block of the same address (its free was missed).
    Overwrites = 12,
    /// Process events sent.
    ProcEvents = 13,
    /// Allocations passed over by sampling.
    Unsampled = 14,
    /// Frames stepped with an unwind table.
    UnwindTableFrames = 15,
    /// Frames stepped with frame pointers (no table covers the address).
    UnwindFpFrames = 16,
    /// Walks stopped at an address in no executable mapping of the process
    /// (the address is not reported).
    UnwindNoMapping = 17,
    /// Walks cut for another reason: memory that cannot be read, a stack
    /// pointer that does not move up, a zero return address.
    UnwindStopped = 18,
    /// Walks of a process whose mappings neither `PROC_MAPS` nor the
    /// kernel's VMAs could give (the unwinder off, or the kernel's BTF
    /// lacks a field the VMA lookup reads): walked with frame pointers only.
    UnwindNoProcMaps = 19,
    /// Drop: the per-CPU scratch of a walk was overwritten by another task
    /// on the same CPU (preemption): the block keeps frame 0 only.
    DropStackPreempted = 20,
    /// Drop: the process holds its share of the live-block maps already
    /// (`GLOBAL_PROCESS_MAX_BLOCKS`): the block is not traced, so that the
    /// other processes stay complete.
    DropShare = 21,
    /// The process has its share of `STACKS` already
    /// (`GLOBAL_PROCESS_MAX_STACKS`), or the map is into its reserve
    /// (`GLOBAL_STACKS_RESERVE_FROM`) and the process holds a quarter of
    /// the room left: its new stack is not stored, and the block keeps its
    /// frame 0 only.
    DropStackShare = 22,
    /// Anonymous mappings recorded as blocks (source `mmap`).
    MmapRegions = 23,
    /// Drop: the process holds `MMAP_REGION_SLOTS` anonymous mappings
    /// already, or `MMAP_REGIONS` is full: the mapping (or the part of one
    /// that a partial `munmap` split off) is not traced.
    DropMmapRegions = 24,
    /// A call in flight found over without its return (its return probe
    /// was removed while it ran: a scope change), or one that jumped to
    /// another probed function at the same stack pointer (a tail call:
    /// `reallocarray` to `realloc`, whose return then records the block
    /// and the outer return finds nothing: `exit_without_entry`): the
    /// record is replaced, so that the thread's next calls are not taken
    /// for calls nested in it.
    StaleInflight = 25,
    /// Allocator calls of tracerd itself (their uprobe's trap paid, nothing
    /// recorded): near 0, for tracerd allocates through mimalloc.
    TracerdCalls = 26,
    /// A block's key could not be put in `STACK_TOTALS` (the map was
    /// full): its image's totals per stack are not exact from then on
    /// (`ProcTotals::stack_totals_lost`), and tracerd reads its blocks.
    StackTotalsRefused = 27,
    /// Walks of an image whose mappings `PROC_MAPS` does not hold (the
    /// first moments after an exec, before tracerd wrote them), walked
    /// with the kernel's own VMAs (`crate::vma`) instead.
    UnwindVmaWalks = 28,
    /// Mappings a walk looked up in the kernel's VMAs (`bpf_find_vma`): an
    /// address `PROC_MAPS` did not hold (or no entry there at all).
    UnwindVmaLookups = 29,
    /// A lookup in the kernel's VMAs failed (the process's mmap lock was
    /// held for writing, or no VMA holds the address): the walk is cut there.
    UnwindVmaFailed = 30,
    /// Blocks recorded with a cut traceback: the stack could not be stored
    /// (the stack map full, the process's share of it, another stack's id,
    /// a preemption), or the walk stopped before the outermost frame for
    /// want of mappings or readable memory (not for reaching nframe).
    /// Also counted in the process's `ProcStats::cut`.
    CutTracebacks = 31,
}

/// Number of slots in [`MAP_COUNTERS`].
pub const COUNTER_SLOTS: u32 = 32;

impl Counter {
    /// Every counter with its name, in slot order.
    pub const ALL: [(Counter, &'static str); COUNTER_SLOTS as usize] = [
        (Counter::Allocs, "allocs"),
        (Counter::Frees, "frees"),
        (Counter::UnknownFrees, "unknown_frees"),
        (Counter::NullFrees, "null_frees"),
        (Counter::FailedAllocs, "failed_allocs"),
        (Counter::Nested, "nested"),
        (Counter::ExitWithoutEntry, "exit_without_entry"),
        (Counter::DropLiveFull, "drop_live_full"),
        (Counter::DropInflightFull, "drop_inflight_full"),
        (Counter::DropProcsFull, "drop_procs_full"),
        (Counter::DropStack, "drop_stack"),
        (Counter::DropEvents, "drop_events"),
        (Counter::Overwrites, "overwrites"),
        (Counter::ProcEvents, "proc_events"),
        (Counter::Unsampled, "unsampled"),
        (Counter::UnwindTableFrames, "unwind_table_frames"),
        (Counter::UnwindFpFrames, "unwind_fp_frames"),
        (Counter::UnwindNoMapping, "unwind_no_mapping"),
        (Counter::UnwindStopped, "unwind_stopped"),
        (Counter::UnwindNoProcMaps, "unwind_no_proc_maps"),
        (Counter::DropStackPreempted, "drop_stack_preempted"),
        (Counter::DropShare, "drop_share"),
        (Counter::DropStackShare, "drop_stack_share"),
        (Counter::MmapRegions, "mmap_regions"),
        (Counter::DropMmapRegions, "drop_mmap_regions"),
        (Counter::StaleInflight, "stale_inflight"),
        (Counter::TracerdCalls, "tracerd_calls"),
        (Counter::StackTotalsRefused, "stack_totals_refused"),
        (Counter::UnwindVmaWalks, "unwind_vma_walks"),
        (Counter::UnwindVmaLookups, "unwind_vma_lookups"),
        (Counter::UnwindVmaFailed, "unwind_vma_failed"),
        (Counter::CutTracebacks, "cut_tracebacks"),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_listed_in_slot_order_with_distinct_names() {
        for (slot, (counter, name)) in Counter::ALL.iter().enumerate() {
            assert_eq!(*counter as usize, slot, "{name}");
        }
        let mut names: Vec<&str> = Counter::ALL.iter().map(|(_, name)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COUNTER_SLOTS as usize);
    }
}
