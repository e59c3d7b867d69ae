//! Per-process totals: [`ProcStats`] (the value of `PROCS`, and the totals
//! of a [`ProcSlot`] of `PROC_SLOTS`), and the slot word that packs a slot's
//! owner, spill count and generation, with the helpers both sides read it
//! by.
//!
//! Protocol of a slot word: it changes only by compare-and-swap. A process
//! claims its slot ([`proc_slot_index`]) at its image's first allocation
//! when the slot has no owner and no spill; otherwise it goes to `PROCS`,
//! counted first in the slot's spill count, so that a lookup goes to the
//! hash only while some process of the slot is there. The end of an image
//! clears owner and generation and keeps the spill count.

use core::mem::size_of;

#[cfg(doc)]
use crate::{MAP_PROC_SLOTS, MAP_PROCS};

/// Slots of [`MAP_PROC_SLOTS`] (a power of two).
pub const PROC_SLOT_COUNT: u32 = 1 << 12;
/// Bits of a slot word that hold the owner's tgid (0: free). A tgid is below
/// `PID_MAX_LIMIT` (2^22 on 64-bit Linux).
pub const PROC_SLOT_OWNER_MASK: u64 = (1 << 22) - 1;
/// Shift of a slot word's spill count: processes of this slot in `PROCS`.
pub const PROC_SLOT_SPILL_SHIFT: u32 = 22;
/// Largest spill count (10 bits); a process that would exceed it is dropped.
pub const PROC_SLOT_SPILL_MAX: u64 = (1 << 10) - 1;
/// Shift of a slot word's generation (the owner's, 32 bits).
pub const PROC_SLOT_GEN_SHIFT: u32 = 32;

/// One slot of [`MAP_PROC_SLOTS`]: a word that packs owner tgid (bits
/// 0..22), spill count (22..32) and the owner's generation (32..64), changed
/// only atomically, and the owner's totals (zero while the slot is free;
/// `totals.stats.generation` is not kept: the word's generation is the one).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcSlot {
    /// Owner, spill count and generation (see [`ProcSlot`]).
    pub word: u64,
    /// The owner's totals.
    pub totals: ProcTotals,
}
const _: () = assert!(size_of::<ProcSlot>() == 296);

/// Bytes of one allocator family's blocks in a process image.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyTotals {
    /// Bytes in live blocks of this family now.
    pub current: u64,
    /// Highest `current` since tracing began or the last reset.
    pub peak: u64,
}
const _: () = assert!(size_of::<FamilyTotals>() == 16);

/// Value of [`MAP_PROCS`] and the totals of a [`ProcSlot`]: a process
/// image's totals, then the same bytes by allocator family. `stats` is the first
/// field, so a pointer to it is a pointer to its `ProcTotals` (the programs
/// reach `sources` that way).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcTotals {
    /// The image's totals.
    pub stats: ProcStats,
    /// Current and peak bytes by [`crate::AllocInfo::source`].
    pub sources: [FamilyTotals; crate::FAMILY_COUNT],
    /// Stacks of this image in `STACKS`: raised by the programs for each
    /// stack they store for it, set by tracerd at each sweep to the
    /// distinct stacks its live blocks reference (so that collected stacks
    /// leave it). Compared with `GLOBAL_PROCESS_MAX_STACKS`.
    pub stacks: u64,
    /// Blocks of this image whose key could not be put in `STACK_TOTALS`
    /// (the map was full): while 0, its entries there are exact.
    pub stack_totals_lost: u64,
    /// Blocks of this image in `LIVE_ALLOCS` (the shared spill), raised
    /// before one is put there and lowered after one is taken out: never
    /// below the truth, so that while it is 0 a read of the image's blocks
    /// need not walk `LIVE_ALLOCS` (see [`crate::own_spill`]).
    pub shared_spill: u64,
    /// Levels of its own spill this image asked tracerd for (the highest
    /// asked + 1), raised by compare-and-swap so that each is asked once.
    pub own_asked: u64,
    /// Blocks of this image in its own spill maps: once they fill 3/4 of
    /// the levels it has, the next level is asked for, so that it is there
    /// before they are full.
    pub own_spill: u64,
    /// Keys this image put in `STACK_TOTALS`, raised after each is put in
    /// (before its first block is added to it): while it is what it was
    /// when tracerd read the image's keys, the image has no other key
    /// there, and its totals are read by those keys alone, not by a pass
    /// over every image's.
    pub stack_keys: u64,
    /// The longest anonymous mapping this image holds as a block, in bytes
    /// (raised at each, never lowered): how far before an `munmap`'s range a
    /// mapping that reaches into it can start.
    pub mmap_max_len: u64,
    /// The pages of `MMAP_REGIONS` this image has (bit `p` of word `p / 64`,
    /// set by atomic or): removed at its end; all 0: it holds no mapping.
    pub mmap_pages: [u64; 4],
}
const _: () = assert!(size_of::<ProcTotals>() == 288);

/// The slot of [`MAP_PROC_SLOTS`] for `tgid`.
pub const fn proc_slot_index(tgid: u32) -> u32 {
    tgid & (PROC_SLOT_COUNT - 1)
}

/// The owner tgid of a slot word (0: free).
pub const fn proc_slot_owner(word: u64) -> u32 {
    (word & PROC_SLOT_OWNER_MASK) as u32
}

/// The spill count of a slot word.
pub const fn proc_slot_spill(word: u64) -> u64 {
    (word >> PROC_SLOT_SPILL_SHIFT) & PROC_SLOT_SPILL_MAX
}

/// The owner's generation of a slot word.
pub const fn proc_slot_gen(word: u64) -> u32 {
    (word >> PROC_SLOT_GEN_SHIFT) as u32
}

/// Value of [`MAP_PROCS`]: totals of one traced process, in bytes and counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcStats {
    /// Generation: unique per process image, from a global counter.
    pub generation: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// Bytes in live blocks now (`get_traced_memory()[0]`).
    pub current: u64,
    /// Highest `current` since tracing began or the last reset (`[1]`).
    pub peak: u64,
    /// Live blocks now.
    pub blocks: u64,
    /// Allocations recorded since tracing of this image began.
    pub allocs: u64,
    /// Frees of known blocks since tracing of this image began.
    pub frees: u64,
    /// Frees of pointers that were not live blocks (allocated before tracing
    /// began, or lost).
    pub unknown_frees: u64,
    /// Events lost for this process (map full, stack not stored).
    pub drops: u64,
    /// Blocks recorded with a cut traceback since tracing of this image
    /// began (`Counter::CutTracebacks`: the stack not stored, or the walk
    /// stopped for want of mappings or readable memory): while it is not 0
    /// the image's tracebacks are not all whole.
    pub cut: u64,
}
const _: () = assert!(size_of::<ProcStats>() == 72);

// SAFETY: #[repr(C)], Copy, made only of integers with explicit padding, so
// every bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcStats {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcTotals {}
