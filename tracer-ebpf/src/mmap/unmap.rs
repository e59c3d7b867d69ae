//! The unmap of a range of a traced image: each block of source `mmap` it
//! covers is taken out, each it covers in part is cut (a prefix or suffix
//! shrinks it, a hole in the middle splits it in two). Every mapping that can
//! reach into the range starts in a slot of the `MMAP_REGIONS` pages from the
//! range's start less the image's longest mapping: the loops go over those
//! pages and their slots.

use core::ffi::c_void;

use tracer_common::{
    AllocInfo, FAMILY_MMAP, MMAP_PAGE_SHIFT, MMAP_PAGES, MMAP_REGION_SLOTS, MmapRegions, ProcStats,
};

use super::{Image, claim_slot, drop_region, has_regions, page_of, release_slot, run_loop};
use crate::{
    atomic::compare_exchange,
    live::{count_in_stack_fn, find_block, insert_block, take_block, uncount_in_stack_fn},
    procs::{mmap_max_len_counter, unmap_bytes},
};

/// What [`unmap`] hands to each step of its loop over one page's slots
/// (and [`cut_start`]).
struct Unmap {
    tgid: u32,
    image: Image,
    /// The page whose slots are looked at (null for [`cut_start`]).
    regions: *mut MmapRegions,
    /// The unmapped range: [start, end).
    start: u64,
    end: u64,
    /// Bytes of blocks unmapped so far.
    unmapped: u64,
}

/// What [`unmap`] hands to each step of its loop over pages.
struct UnmapPages {
    tgid: u32,
    image: Image,
    start: u64,
    end: u64,
    /// The first page looked at.
    first_page: u64,
    /// Bytes of blocks unmapped so far.
    unmapped: u64,
}

/// Takes [`start`, `end`) out of the mappings `tgid`'s image holds as
/// blocks; returns the bytes of blocks it covered (0: none).
///
/// A range that begins at a mapping's start and ends within it (a whole
/// `munmap`, a prefix, an `mremap`'s old range) is that mapping alone: one
/// lookup. Any other range may cover parts of several: every slot of the
/// pages where a mapping that reaches into it can start is looked at
/// (from `start` less the image's longest mapping to `end`: one or two
/// pages of 256 slots but for a process that holds a mapping of more than
/// 64 MiB).
#[inline(always)]
pub(super) fn unmap(tgid: u32, (stats, generation): Image, start: u64, end: u64) -> u64 {
    unmap_range(tgid, stats, generation, start, end)
}

/// [`unmap`]: a BPF function of its own, not inlined, so that the many
/// paths of its loops' set-up do not multiply the states the verifier
/// follows through the unmap program's paths into it.
#[inline(never)]
fn unmap_range(tgid: u32, stats: *mut ProcStats, generation: u32, start: u64, end: u64) -> u64 {
    let image = (stats, generation);
    if !has_regions(stats) {
        return 0;
    }
    if let Some(block) = find_block::<false>(tgid, start, generation)
        && block.source == FAMILY_MMAP
        && start.wrapping_add(block.size) >= end
    {
        let mut state = Unmap {
            tgid,
            image,
            regions: core::ptr::null_mut(),
            start,
            end,
            unmapped: 0,
        };
        // A callback, so that the verifier checks `cut` apart from the rest
        // of the program.
        run_loop(1, cut_start, &mut state);
        return state.unmapped;
    }
    // SAFETY: a word of the image's totals, changed only atomically.
    let longest = unsafe { core::ptr::read_volatile(mmap_max_len_counter(stats)) };
    let first = start.saturating_sub(longest) >> MMAP_PAGE_SHIFT;
    let last = end.wrapping_sub(1) >> MMAP_PAGE_SHIFT;
    let pages = if last < first {
        0
    } else {
        (last - first + 1).min(u64::from(MMAP_PAGES))
    };
    let mut state = UnmapPages {
        tgid,
        image,
        start,
        end,
        first_page: first,
        unmapped: 0,
    };
    run_loop(pages as u32, unmap_page, &mut state);
    state.unmapped
}

/// [`unmap`]'s one lookup: the mapping at the range's start loses the part
/// the range covers. Returns 1 (stop), the bpf_loop contract.
extern "C" fn cut_start(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the Unmap that `unmap` handed to bpf_loop.
    let state = unsafe { &mut *(ctx as *mut Unmap) };
    let at = state.start;
    cut(state, at, core::ptr::null_mut());
    1
}

/// One page of [`unmap`]'s loop (page `first_page + index`): every slot of
/// it, when the image has it. Returns 0 (go on), the bpf_loop contract.
extern "C" fn unmap_page(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the UnmapPages that `unmap` handed to bpf_loop.
    let pages = unsafe { &mut *(ctx as *mut UnmapPages) };
    let at = (pages.first_page + index) << MMAP_PAGE_SHIFT;
    let Some(regions) = page_of(pages.tgid, pages.image, at, false) else {
        return 0;
    };
    let mut state = Unmap {
        tgid: pages.tgid,
        image: pages.image,
        regions,
        start: pages.start,
        end: pages.end,
        unmapped: 0,
    };
    run_loop(MMAP_REGION_SLOTS as u32, unmap_slot, &mut state);
    pages.unmapped += state.unmapped;
    0
}

/// One slot of [`unmap_page`]'s loop: the mapping there, if the range
/// covers any of it, loses that part. Returns 0 (go on), the bpf_loop
/// contract.
extern "C" fn unmap_slot(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the Unmap that `unmap_page` handed to bpf_loop; its
    // pointers are map values, alive while the program runs.
    let state = unsafe { &mut *(ctx as *mut Unmap) };
    let i = (index as usize) & (MMAP_REGION_SLOTS - 1);
    // SAFETY: a MMAP_REGIONS value; i is in bounds.
    let slot = unsafe { (&raw mut (*state.regions).starts).cast::<u64>().add(i) };
    // SAFETY: as above; slots change only by compare-and-swap.
    let at = unsafe { core::ptr::read_volatile(slot) };
    if at != 0 && at < state.end {
        cut(state, at, slot);
    }
    0
}

/// Takes the part the range of `state` covers out of the mapping at `at`
/// (its slot `slot`, or looked for in its window when null): what is left
/// before the range stays at `at`, what is left after it becomes a block
/// of its own with the same stack.
///
/// A BPF function of its own, not inlined: the loops that call it are
/// checked once by the verifier, not once per path through it.
#[inline(never)]
fn cut(state: *mut Unmap, at: u64, slot: *mut u64) {
    // SAFETY: state is the caller's Unmap, on its stack.
    let state = unsafe { &mut *state };
    let clear = |state: &Unmap| {
        if slot.is_null() {
            release_slot(state.tgid, state.image, at);
        } else {
            compare_exchange(slot, at, 0);
        }
    };
    let (tgid, generation) = (state.tgid, state.image.1);
    let Some(block) = find_block::<false>(tgid, at, generation) else {
        // Its block is gone (freed as a pointer, or the maps were cleaned).
        clear(state);
        return;
    };
    if block.source != FAMILY_MMAP || at.wrapping_add(block.size) <= state.start {
        return;
    }
    // Only the thread that takes the block out changes it.
    let Some((stats, block)) =
        take_block::<false>(tgid, at, (Some(state.image.0), generation), false)
    else {
        return;
    };
    uncount_in_stack_fn(&raw const block);
    let block_end = at.wrapping_add(block.size);
    let mut kept = 0;
    let mut pieces = 0;
    if state.start > at {
        let left = AllocInfo {
            size: state.start - at,
            ..block
        };
        if insert_block::<false>(stats, tgid, at, &left) {
            count_in_stack_fn(stats, &raw const left);
            kept += left.size;
            pieces += 1;
        } else {
            clear(state);
            drop_region(stats);
        }
    } else {
        clear(state);
    }
    if block_end > state.end {
        let right = AllocInfo {
            size: block_end - state.end,
            ..block
        };
        if claim_slot(tgid, (stats, generation), state.end) {
            if insert_block::<false>(stats, tgid, state.end, &right) {
                count_in_stack_fn(stats, &raw const right);
                kept += right.size;
                pieces += 1;
            } else {
                release_slot(tgid, (stats, generation), state.end);
                drop_region(stats);
            }
        } else {
            drop_region(stats);
        }
    }
    unmap_bytes(stats, block.size - kept, FAMILY_MMAP, pieces);
    state.unmapped += block.size - kept;
}
