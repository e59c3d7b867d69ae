//! The per-image spill maps: where the blocks of a process image go when
//! their bucket of the fast table is full, once the image has a map of its
//! own (before that, and when its maps are full, they go to the shared
//! `LIVE_ALLOCS`). Reading one process's blocks then reads its own maps,
//! not every spilled block of the host.
//!
//! Layout. [`MAP_OWN_LIVE`] is a hash of maps: a map id (`u32`) → an
//! inner hash `u64` address → [`crate::AllocInfo`], created by tracerd. Level `l` holds at most [`own_level_blocks`]`(l)`
//! blocks (twice the level before), so that an image's maps cost what its
//! blocks need, never its share of the host: a level is made when the
//! image's blocks fill 3/4 of the levels before, so its levels are made
//! for at most 2.7 times the blocks they hold then, and 1.3 times just
//! before the next. An image has at most [`OWN_LEVELS_MAX`] levels.
//! [`MAP_OWN_LEVELS`] says which maps are an image's levels
//! ([`own_image_key`] → [`OwnLevelMaps`]), written by tracerd only.
//!
//! Protocol. A program that spills a block of an image puts it in the
//! newest level (level 0 is asked for at the image's first spilled block,
//! as most images never spill),
//! counted in [`crate::ProcTotals::own_spill`]; once those blocks fill 3/4
//! of the levels ([`own_wants_next`]; or the newest is full, or there is
//! none), it asks tracerd
//! for the next one (a `Spill` event, [`crate::ProcEventKind`], sent once
//! per level: [`crate::ProcTotals::own_asked`] is raised by
//! compare-and-swap). A block that finds no room goes to `LIVE_ALLOCS`,
//! counted in [`crate::ProcTotals::shared_spill`] first. A block is looked
//! for in the newest level first, then the older ones, then
//! `LIVE_ALLOCS`. tracerd creates the level's map, puts it in
//! [`MAP_OWN_LIVE`], then names it in the image's [`MAP_OWN_LEVELS`] value
//! and raises the count there; it drops an image's maps once the image
//! ended and its blocks were read. Every change of a map of maps waits for
//! an RCU grace period (measured in `docs/design/0011-measured-figures.md`), so tracerd keeps maps of the first
//! levels' sizes in [`MAP_OWN_LIVE`] ahead, in a pool: an image is given
//! one by a change of [`MAP_OWN_LEVELS`] alone, a plain hash.

use core::mem::size_of;

/// Name of the hash of maps: a map id → an image's spill map of one level
/// (or one kept in the pool).
pub const MAP_OWN_LIVE: &str = "OWN_LIVE";
/// Name of the images' levels: [`own_image_key`] → [`OwnLevelMaps`].
pub const MAP_OWN_LEVELS: &str = "OWN_LEVELS";
/// Most levels an image's spill has (67 M blocks together); a power of
/// two (the programs mask a level with it).
pub const OWN_LEVELS_MAX: u32 = 16;
const _: () = assert!(OWN_LEVELS_MAX.is_power_of_two());
/// Blocks of level 0; each level holds twice the one before.
pub const OWN_FIRST_BLOCKS: u32 = 1024;
/// Entries of [`MAP_OWN_LIVE`]: the levels of every image together (4 an
/// image on average when [`OWN_LEVELS_ENTRIES`] images have maps; most
/// have one). A level that finds it full is not made: its blocks go to
/// `LIVE_ALLOCS`.
pub const OWN_LIVE_ENTRIES: u32 = 1 << 14;
/// Entries of [`MAP_OWN_LEVELS`]: the images that have maps of their own
/// at once; the others spill to `LIVE_ALLOCS`.
pub const OWN_LEVELS_ENTRIES: u32 = 1 << 12;

/// The blocks level `level` of an image's spill holds:
/// [`OWN_FIRST_BLOCKS`] × 2^level.
#[must_use]
pub const fn own_level_blocks(level: u32) -> u64 {
    (OWN_FIRST_BLOCKS as u64) << level
}

/// The blocks the first `levels` levels hold together.
#[must_use]
pub const fn own_levels_blocks(levels: u32) -> u64 {
    // 1 + 2 + ... + 2^(levels-1) = 2^levels - 1
    (OWN_FIRST_BLOCKS as u64) * ((1u64 << levels) - 1)
}

/// Whether an image whose `levels` levels hold `held` blocks asks for the
/// next level: once they are 3/4 full. The programs put blocks in the
/// newest level only, so each level is left at 3/4 when the next is in use
/// (a rule on the room left would leave small levels emptier and fill the
/// newest past what the count says).
#[must_use]
pub const fn own_wants_next(levels: u32, held: u64) -> bool {
    held.saturating_mul(4) >= own_levels_blocks(levels).saturating_mul(3)
}

/// Value of [`MAP_OWN_LEVELS`]: an image's levels, each the id (the key
/// in [`MAP_OWN_LIVE`]) of its map. tracerd replaces a value whole; the
/// programs read `count` and then the ids below it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnLevelMaps {
    /// Levels the image has, at most [`OWN_LEVELS_MAX`].
    pub count: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// The map of each level: its key in [`MAP_OWN_LIVE`].
    pub maps: [u32; OWN_LEVELS_MAX as usize],
}
const _: () = assert!(size_of::<OwnLevelMaps>() == 72);

// SAFETY: #[repr(C)], Copy, made only of integers with explicit padding, so
// every bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for OwnLevelMaps {}

/// Key of [`MAP_OWN_LEVELS`] for image (`tgid`, `generation`).
#[must_use]
pub const fn own_image_key(tgid: u32, generation: u32) -> u64 {
    ((tgid as u64) << 32) | generation as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_holds_twice_the_one_before_and_the_last_holds_tens_of_millions() {
        assert_eq!(own_level_blocks(0), 1024);
        assert_eq!(own_level_blocks(1), 2048);
        assert_eq!(own_level_blocks(OWN_LEVELS_MAX - 1), 32 << 20);
        let all: u64 = (0..OWN_LEVELS_MAX).map(own_level_blocks).sum();
        assert_eq!(all, 1024 * 65_535);
        for levels in 0..=OWN_LEVELS_MAX {
            let sum: u64 = (0..levels).map(own_level_blocks).sum();
            assert_eq!(own_levels_blocks(levels), sum, "{levels}");
        }
    }

    #[test]
    fn a_level_is_asked_for_at_three_quarters_of_the_levels() {
        assert!(!own_wants_next(1, 767));
        assert!(own_wants_next(1, 768));
        assert!(!own_wants_next(2, 2303));
        assert!(own_wants_next(2, 2304));
        assert!(own_wants_next(5, 23_808));
    }

    #[test]
    fn image_keys_keep_tgid_and_generation_apart() {
        assert_eq!(own_image_key(1, 2), (1 << 32) | 2);
        assert_ne!(own_image_key(1, 2), own_image_key(2, 1));
    }
}
