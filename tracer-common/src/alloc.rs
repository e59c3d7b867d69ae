//! A live block as the kernel records it: its key ([`AllocKey`]: process and
//! address) and value ([`AllocInfo`]: size, stack, frame 0, generation), the
//! entry of `LIVE_ALLOCS` and the value of the fast table's `LIVE_VALUES`.

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
    /// The process generation ([`ProcStats::gen_`]) the block belongs to: an
    /// exec or a reused pid starts a new generation, so stale blocks of an
    /// earlier image are never mixed with the new one.
    pub gen_: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<AllocInfo>() == 32);

// SAFETY: #[repr(C)], Copy, made only of integers with explicit padding, so
// every bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for AllocKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for AllocInfo {}
