//! A live block as the kernel records it: its key ([`AllocKey`]: process and
//! address) and value ([`AllocInfo`]: size, stack, frame 0, generation,
//! source), the entry of `LIVE_ALLOCS` and the value of the fast table's
//! `LIVE_VALUES`; and how many allocator families a block can come from
//! ([`FAMILY_COUNT`]).

use core::mem::size_of;

#[cfg(doc)]
use crate::{MAP_LIVE_ALLOCS, MAP_STACKS, ProcStats};

/// `stack_id` of an [`AllocInfo`] whose stack could not be stored.
pub const STACK_ID_NONE: u64 = u64::MAX;

/// Key of [`MAP_LIVE_ALLOCS`]: one block of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocKey {
    /// The process (thread group id).
    pub tgid: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// The block's address in the process.
    pub addr: u64,
}
const _: () = assert!(size_of::<AllocKey>() == 16);

/// Value of [`MAP_LIVE_ALLOCS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocInfo {
    /// Requested size in bytes (for `pvalloc`, rounded up to the page size).
    pub size: u64,
    /// Id in [`MAP_STACKS`], or [`STACK_ID_NONE`] when the stack was not stored.
    pub stack_id: u64,
    /// The return address into the allocator's caller (frame 0), kept with
    /// every block: when the stack could not be stored, statistics by
    /// `lineno` and `filename` are still exact.
    pub frame0: u64,
    /// The process generation ([`ProcStats::generation`]) the block belongs to: an
    /// exec or a reused pid starts a new generation, so stale blocks of an
    /// earlier image are never mixed with the new one.
    pub generation: u32,
    /// Where the block comes from: a family code below [`FAMILY_COUNT`]
    /// (the model's `AllocatorFamily`, which names them), the allocator family of
    /// the probe that recorded it (its attach cookie); 0 for a probe
    /// attached without one.
    pub source: u32,
}
const _: () = assert!(size_of::<AllocInfo>() == 32);

/// Allocator family codes ([`AllocInfo::source`]), the entries of
/// [`crate::ProcTotals::sources`]: the model's `AllocatorFamily::all()` names each.
pub const FAMILY_COUNT: usize = 8;

/// Family code of an anonymous mapping (`mmap`, `mremap`) a traced process
/// made itself, outside any probed allocator call: the model's `mmap`.
pub const FAMILY_MMAP: u32 = 7;

/// Slots of an [`MmapRegions`] page (a power of two): the anonymous
/// mappings a process image holds as blocks whose starts fall in one
/// [`MMAP_PAGE_SPAN`] of address space (modulo [`MMAP_PAGES`] of them); a
/// new mapping whose start finds no free slot in its window (32 slots from
/// the one its address hashes to) is dropped (counted).
pub const MMAP_REGION_SLOTS: usize = 256;

/// A page of a process's anonymous mappings holds those that start in one
/// `1 << MMAP_PAGE_SHIFT` bytes (64 MiB) of address space: an `munmap` of
/// a range that does not begin at a mapping looks only at the pages of the
/// starts that could reach into it (from the range's start less the
/// image's longest mapping, `ProcTotals::mmap_max_len`, to its end).
pub const MMAP_PAGE_SHIFT: u32 = 26;
/// Bytes of address space of one page: `1 << MMAP_PAGE_SHIFT`.
pub const MMAP_PAGE_SPAN: u64 = 1 << MMAP_PAGE_SHIFT;
/// Pages a process image can have (a power of two): the page of a start is
/// `(start >> MMAP_PAGE_SHIFT) & (MMAP_PAGES - 1)`, so a process can hold
/// `MMAP_PAGES * MMAP_REGION_SLOTS` (65,536) mappings spread over its
/// address space, 256 in one 64 MiB of it.
pub const MMAP_PAGES: u32 = 256;

/// The page of [`crate::MAP_MMAP_REGIONS`] of a mapping that starts at `start`.
#[inline(always)]
#[must_use]
pub const fn mmap_page(start: u64) -> u32 {
    ((start >> MMAP_PAGE_SHIFT) as u32) & (MMAP_PAGES - 1)
}

/// Key of [`crate::MAP_MMAP_REGIONS`]: one page of one process's mappings.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MmapPageKey {
    /// The process.
    pub tgid: u32,
    /// The page ([`mmap_page`] of its mappings' starts).
    pub page: u32,
}
const _: () = assert!(size_of::<MmapPageKey>() == 8);

/// Value of [`crate::MAP_MMAP_REGIONS`]: (tgid, page) → the start address of
/// each anonymous mapping of that page its image holds as a block of
/// [`FAMILY_MMAP`] (the block itself, size and stack, is in the live maps
/// under that address), so that an `munmap` of any part of it finds it. A
/// start goes in a free slot of its window (from the slot its address
/// hashes to), claimed by compare-and-swap from 0, and is cleared by the
/// thread that took the block out.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmapRegions {
    /// The image ([`ProcStats::generation`]) the slots belong to: slots of an
    /// earlier image of the pid are cleared at its first mapping there.
    pub generation: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// Start addresses; 0 is a free slot.
    pub starts: [u64; MMAP_REGION_SLOTS],
}
const _: () = assert!(size_of::<MmapRegions>() == 8 + 8 * MMAP_REGION_SLOTS);

// SAFETY: #[repr(C)], Copy, made only of integers with explicit padding, so
// every bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for AllocKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for AllocInfo {}
