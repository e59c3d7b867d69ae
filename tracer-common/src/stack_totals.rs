//! Totals per (process image, stack): the key ([`StackTotalsKey`]) and value
//! ([`StackTotals`]) of `STACK_TOTALS`, which the programs keep in step with
//! the live maps, so that statistics of a live image cost its distinct
//! stacks, not its blocks (memleak's `--combined-only`).
//!
//! Invariant: for every image, the entries of its generation sum, per key,
//! the blocks of that image in the live maps (`LIVE_KEYS`/`LIVE_VALUES` and
//! `LIVE_ALLOCS`): a block adds to its key when it is put in the live maps
//! and subtracts when it is taken out, by the program that puts or takes
//! it. Blocks tracerd removes itself (`clear_traces()`) stay counted here;
//! tracerd subtracts them on its side. An image whose key could not be
//! inserted (the map was full) counts it in
//! [`ProcTotals::stack_totals_lost`](crate::ProcTotals::stack_totals_lost):
//! its totals here are then not exact, and tracerd reads its blocks instead.
//! The programs never delete an entry (a concurrent add could land in a
//! freed element): tracerd deletes the entries of ended images.

use core::mem::size_of;

use crate::AllocInfo;
#[cfg(doc)]
use crate::STACK_ID_NONE;

/// Entries of `STACK_TOTALS` as compiled; tracerd sets the real number at
/// load time (twice the stacks the kernel may store).
pub const STACK_TOTALS_ENTRIES: u32 = 1 << 17;

/// Key of `STACK_TOTALS`: one stack of one process image and source. Its
/// layout is that of the last 24 bytes of [`AllocInfo`] (from `stack_id`
/// on), so that the programs use a block's own value as its key and need
/// no stack space for one ([`STACK_TOTALS_KEY_OFFSET`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackTotalsKey {
    /// The stack id in `STACKS`, or [`STACK_ID_NONE`] for blocks whose stack
    /// was not stored.
    pub stack_id: u64,
    /// The blocks' frame 0 (their exact call site; for a stored stack, its
    /// first frame, so it splits no stack's blocks).
    pub frame0: u64,
    /// The image's generation ([`AllocInfo::generation`], unique per image).
    pub generation: u32,
    /// The blocks' source ([`AllocInfo::source`]).
    pub source: u32,
}
const _: () = assert!(size_of::<StackTotalsKey>() == 24);

/// Offset in bytes of a block's [`StackTotalsKey`] within its
/// [`AllocInfo`].
pub const STACK_TOTALS_KEY_OFFSET: usize = core::mem::offset_of!(AllocInfo, stack_id);
const _: () =
    assert!(STACK_TOTALS_KEY_OFFSET + size_of::<StackTotalsKey>() == size_of::<AllocInfo>());
const _: () = assert!(core::mem::offset_of!(AllocInfo, frame0) - STACK_TOTALS_KEY_OFFSET == 8);
const _: () = assert!(core::mem::offset_of!(AllocInfo, generation) - STACK_TOTALS_KEY_OFFSET == 16);
const _: () = assert!(core::mem::offset_of!(AllocInfo, source) - STACK_TOTALS_KEY_OFFSET == 20);

impl StackTotalsKey {
    /// The key block `info` counts under (the bytes of `info` from
    /// `stack_id` on).
    #[inline(always)]
    pub fn of(info: &AllocInfo) -> Self {
        StackTotalsKey {
            stack_id: info.stack_id,
            frame0: info.frame0,
            generation: info.generation,
            source: info.source,
        }
    }
}

/// Value of `STACK_TOTALS`: the live blocks of one key. Changed only
/// atomically by the programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackTotals {
    /// Live blocks.
    pub count: u64,
    /// Bytes in them (requested sizes).
    pub size: u64,
}
const _: () = assert!(size_of::<StackTotals>() == 16);

// SAFETY: #[repr(C)], Copy, made only of integers with explicit padding, so
// every bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for StackTotalsKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for StackTotals {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_s_key_is_the_tail_of_its_value() {
        let info = AllocInfo {
            size: 8,
            stack_id: 42,
            frame0: 0x1234,
            generation: 7,
            source: 1,
        };
        // SAFETY: the layouts are pinned above; both are plain integers.
        let tail = unsafe {
            *(&raw const info)
                .cast::<u8>()
                .add(STACK_TOTALS_KEY_OFFSET)
                .cast::<StackTotalsKey>()
        };
        assert_eq!(tail, StackTotalsKey::of(&info));
        assert_eq!(
            tail,
            StackTotalsKey {
                stack_id: 42,
                frame0: 0x1234,
                generation: 7,
                source: 1
            }
        );
    }
}
