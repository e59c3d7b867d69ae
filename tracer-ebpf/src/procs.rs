//! Per-process totals and generations, and the events of a process image's
//! life (first allocation, end by exec or exit) that carry them to tracerd.
//!
//! Protocol. A process image is identified by (tgid, generation); a new
//! generation comes from `GENERATION` at the image's first allocation
//! ([`proc_stats`]), which also sends a `New` event. Its totals live in its
//! direct-mapped slot of `PROC_SLOTS` when the slot was free then (no owner,
//! no spill), else in `PROCS`, counted first in the slot's spill count so
//! that lookups ([`find_proc`]) go to the hash only while some process of
//! the slot is there. A slot's word (owner, spill count, generation)
//! changes only by compare-and-swap; the totals only atomically
//! ([`add_block`], [`sub_block`]). At exec or exit ([`end_generation`]) the
//! final totals go out in an event and the slot is freed (or the `PROCS`
//! entry removed and uncounted from its slot).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_ktime_get_ns,
        generated::{bpf_get_current_comm, bpf_loop},
    },
};
use tracer_common::{
    Counter, FAMILY_COUNT, FamilyTotals, MMAP_PAGES, MmapPageKey, PROC_SLOT_GEN_SHIFT,
    PROC_SLOT_OWNER_MASK, PROC_SLOT_SPILL_MAX, PROC_SLOT_SPILL_SHIFT, ProcEvent, ProcEventKind,
    ProcSlot, ProcStats, ProcTotals, proc_slot_gen, proc_slot_index, proc_slot_owner,
    proc_slot_spill,
};

use crate::{
    atomic::{compare_exchange, fetch_add},
    counters::count,
    maps::{EEXIST, EVENTS, GENERATION, MMAP_REGIONS, PROC_MAPS, PROC_SLOTS, PROCS},
};

/// The slot of `tgid` in PROC_SLOTS.
#[inline(always)]
fn proc_slot(tgid: u32) -> Option<*mut ProcSlot> {
    PROC_SLOTS.get_ptr_mut(proc_slot_index(tgid))
}

/// The totals of `tgid`'s current image and its generation: in its slot of
/// PROC_SLOTS when it owns it, else in PROCS, looked up only while some
/// process of the slot is there (its spill count is not 0). None: not seen.
#[inline(always)]
pub(crate) fn find_proc(tgid: u32) -> Option<(*mut ProcStats, u32)> {
    let slot = proc_slot(tgid)?;
    // SAFETY: a PROC_SLOTS value; its word changes only atomically.
    let word = unsafe { core::ptr::read_volatile(&raw const (*slot).word) };
    if proc_slot_owner(word) == tgid {
        // SAFETY: as above.
        return Some((
            unsafe { &raw mut (*slot).totals.stats },
            proc_slot_gen(word),
        ));
    }
    if proc_slot_spill(word) == 0 {
        return None;
    }
    let totals = PROCS.get_ptr_mut(tgid)?;
    // SAFETY: a PROCS value.
    Some(unsafe { (&raw mut (*totals).stats, (*totals).stats.generation) })
}

/// A new generation (unique per process image).
#[inline(always)]
fn new_generation() -> Option<u32> {
    let slot = GENERATION.get_ptr_mut(0)?;
    Some(fetch_add(slot, 1).wrapping_add(1) as u32)
}

/// The totals of `tgid` and its generation, created (with a new generation,
/// and a `New` event for userspace) at the process image's first allocation
/// ([`register_proc`]).
#[inline(always)]
pub(crate) fn proc_stats(tgid: u32) -> Option<(*mut ProcStats, u32)> {
    if let Some(found) = find_proc(tgid) {
        return Some(found);
    }
    if !register_proc(tgid, 0) {
        return None;
    }
    find_proc(tgid)
}

/// Starts a new image of `tgid` now (at its fork, `parent` its parent's
/// tgid; at its exec, `parent` 0): its totals and generation, and a `New`
/// event, so that a process is traced from its start whether it allocates
/// or not. Returns its generation (None: no room, counted; or `tgid`
/// has an image already).
#[inline(always)]
pub(crate) fn start_image(tgid: u32, parent: u32) -> Option<u32> {
    if find_proc(tgid).is_some() || !register_proc(tgid, parent) {
        return None;
    }
    find_proc(tgid).map(|(_, generation)| generation)
}

/// Creates the totals of `tgid`'s image (or finds that another thread of it
/// did); false when there is no room (counted). `parent` goes in the `New`
/// event (0: not started by a fork).
///
/// A free slot (no owner, no spill) is claimed by one compare-and-swap of
/// its word to the tgid and generation; its totals were zeroed when it was
/// freed. Else the process goes to PROCS, after one compare-and-swap that
/// counts it in the slot's spill count (so that it is looked for there, and
/// so that the slot is not claimed meanwhile by another thread of it).
///
/// A BPF function of its own, not inlined: the zeroed totals and the event
/// it builds take their stack in its frame, not in the frame of the
/// allocator program that calls it, whose frame plus the unwinder's must
/// stay within the kernel's 512 bytes (see [`crate::programs::on_task_stack`]).
#[inline(never)]
fn register_proc(tgid: u32, parent: u32) -> bool {
    let Some(slot) = proc_slot(tgid) else {
        return false;
    };
    // SAFETY: a PROC_SLOTS value.
    let word_ptr = unsafe { &raw mut (*slot).word };
    let fits = u64::from(tgid) <= PROC_SLOT_OWNER_MASK;
    let mut tries = 0;
    while tries < 4 {
        // SAFETY: as above; the word changes only atomically.
        let word = unsafe { core::ptr::read_volatile(word_ptr) };
        let spill = proc_slot_spill(word);
        if proc_slot_owner(word) == tgid {
            return true;
        }
        if fits && proc_slot_owner(word) == 0 && spill == 0 {
            let Some(generation) = new_generation() else {
                return false;
            };
            let owned = u64::from(tgid) | (u64::from(generation) << PROC_SLOT_GEN_SHIFT);
            if compare_exchange(word_ptr, word, owned) == word {
                send_event_detail(
                    ProcEventKind::New,
                    tgid,
                    generation,
                    parent,
                    &ProcStats::default(),
                );
                return true;
            }
        } else if spill < PROC_SLOT_SPILL_MAX {
            if compare_exchange(word_ptr, word, word + (1 << PROC_SLOT_SPILL_SHIFT)) == word {
                return hash_proc(tgid, parent, word_ptr);
            }
        } else {
            break;
        }
        tries += 1;
    }
    count(Counter::DropProcsFull);
    false
}

/// Puts `tgid` in PROCS, counted already in the spill count at `word`;
/// false when PROCS is full.
#[inline(always)]
fn hash_proc(tgid: u32, parent: u32, word: *mut u64) -> bool {
    let unspill = || fetch_add(word, (1u64 << PROC_SLOT_SPILL_SHIFT).wrapping_neg());
    let Some(generation) = new_generation() else {
        unspill();
        return false;
    };
    let totals = ProcTotals {
        stats: ProcStats {
            generation,
            ..ProcStats::default()
        },
        ..ProcTotals::default()
    };
    match PROCS.insert(tgid, totals, BPF_NOEXIST as u64) {
        Ok(()) => send_event_detail(
            ProcEventKind::New,
            tgid,
            generation,
            parent,
            &ProcStats::default(),
        ),
        // Another thread of the process created it first (and counted it).
        Err(e) if e == -EEXIST => {
            unspill();
        }
        Err(_) => {
            unspill();
            count(Counter::DropProcsFull);
            return false;
        }
    }
    true
}

/// Sends a [`ProcEvent`] of `kind` about image (`tgid`, `generation`) with its
/// totals `stats` to tracerd (counted; a full ring is counted as a drop).
#[inline(always)]
pub(crate) fn send_event(kind: ProcEventKind, tgid: u32, generation: u32, stats: &ProcStats) {
    send_event_detail(kind, tgid, generation, 0, stats);
}

/// [`send_event`] with its `detail` ([`ProcEvent::detail`]: a `New`
/// event's parent). The record is written in place in the ring, not built
/// on the stack: [`register_proc`]'s frame, which sends `New` events, must
/// stay small beside the allocator program's.
#[inline(always)]
fn send_event_detail(
    kind: ProcEventKind,
    tgid: u32,
    generation: u32,
    detail: u32,
    stats: &ProcStats,
) {
    let Some(mut entry) = EVENTS.reserve::<ProcEvent>(0) else {
        count(Counter::DropEvents);
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: the reserved record is ours until submitted; every field is
    // written (the comm by the helper, or zeroed when it fails).
    unsafe {
        (*event).kind = kind as u32;
        (*event).tgid = tgid;
        (*event).generation = generation;
        (*event).detail = detail;
        (*event).ktime_ns = bpf_ktime_get_ns();
        (*event).stats = *stats;
        let comm = &raw mut (*event).comm;
        if bpf_get_current_comm(comm.cast(), 16) != 0 {
            core::ptr::write_bytes(comm.cast::<u8>(), 0, 16);
        }
    }
    entry.submit(0);
    count(Counter::ProcEvents);
}

/// The totals of source `source` ([`tracer_common::AllocInfo::source`]) of
/// the process whose totals are `stats`; None for a source out of range.
#[inline(always)]
fn source_totals(stats: *mut ProcStats, source: u32) -> Option<*mut FamilyTotals> {
    let index = source as usize;
    if index >= FAMILY_COUNT {
        return None;
    }
    // SAFETY: every ProcStats the programs change is the first field of a
    // ProcTotals (a PROCS value or a slot's totals), so the cast is that
    // ProcTotals; index is in bounds (masked again for the verifier).
    Some(unsafe {
        (&raw mut (*stats.cast::<ProcTotals>()).sources)
            .cast::<FamilyTotals>()
            .add(index & (FAMILY_COUNT - 1))
    })
}

/// The longest anonymous mapping held ([`ProcTotals::mmap_max_len`]) of
/// the process whose totals are `stats`.
#[inline(always)]
pub(crate) fn mmap_max_len_counter(stats: *mut ProcStats) -> *mut u64 {
    // SAFETY: as in source_totals: stats is the first field of a ProcTotals.
    unsafe { &raw mut (*stats.cast::<ProcTotals>()).mmap_max_len }
}

/// Word `word` (0 to 3) of the bitmap of pages of `MMAP_REGIONS`
/// ([`ProcTotals::mmap_pages`]) of the process whose totals are `stats`.
#[inline(always)]
pub(crate) fn mmap_pages_word(stats: *mut ProcStats, word: u32) -> *mut u64 {
    // SAFETY: as in source_totals; word is in bounds (masked).
    unsafe {
        (&raw mut (*stats.cast::<ProcTotals>()).mmap_pages)
            .cast::<u64>()
            .add((word & 3) as usize)
    }
}

/// The count of blocks recorded with a cut traceback ([`ProcStats::cut`])
/// of the process whose totals are `stats`.
#[inline(always)]
pub(crate) fn cut_counter(stats: *mut ProcStats) -> *mut u64 {
    // SAFETY: stats points at a PROCS value or a slot's totals.
    unsafe { &raw mut (*stats).cut }
}

/// The stacks counter ([`ProcTotals::stacks`]) of the process whose totals
/// are `stats`.
#[inline(always)]
pub(crate) fn stacks_counter(stats: *mut ProcStats) -> *mut u64 {
    // SAFETY: as in source_totals: stats is the first field of a ProcTotals.
    unsafe { &raw mut (*stats.cast::<ProcTotals>()).stacks }
}

/// The counter of blocks whose `STACK_TOTALS` key could not be inserted
/// ([`ProcTotals::stack_totals_lost`]) of the process whose totals are
/// `stats`.
#[inline(always)]
pub(crate) fn stack_totals_lost_counter(stats: *mut ProcStats) -> *mut u64 {
    // SAFETY: as in source_totals: stats is the first field of a ProcTotals.
    unsafe { &raw mut (*stats.cast::<ProcTotals>()).stack_totals_lost }
}

/// The count of keys the image put in `STACK_TOTALS`
/// ([`ProcTotals::stack_keys`]) of the process whose totals are `stats`.
#[inline(always)]
pub(crate) fn stack_keys_counter(stats: *mut ProcStats) -> *mut u64 {
    // SAFETY: as in source_totals: stats is the first field of a ProcTotals.
    unsafe { &raw mut (*stats.cast::<ProcTotals>()).stack_keys }
}

/// The count of the image's blocks in LIVE_ALLOCS
/// ([`ProcTotals::shared_spill`]) of the process whose totals are `stats`.
#[inline(always)]
pub(crate) fn shared_spill_counter(stats: *mut ProcStats) -> *mut u64 {
    // SAFETY: as in source_totals: stats is the first field of a ProcTotals.
    unsafe { &raw mut (*stats.cast::<ProcTotals>()).shared_spill }
}

/// The levels of its own spill the image asked for
/// ([`ProcTotals::own_asked`]) of the process whose totals are `stats`.
#[inline(always)]
pub(crate) fn own_asked_counter(stats: *mut ProcStats) -> *mut u64 {
    // SAFETY: as in source_totals: stats is the first field of a ProcTotals.
    unsafe { &raw mut (*stats.cast::<ProcTotals>()).own_asked }
}

/// The count of the image's blocks in its own spill maps
/// ([`ProcTotals::own_spill`]) of the process whose totals are `stats`.
#[inline(always)]
pub(crate) fn own_spill_counter(stats: *mut ProcStats) -> *mut u64 {
    // SAFETY: as in source_totals: stats is the first field of a ProcTotals.
    unsafe { &raw mut (*stats.cast::<ProcTotals>()).own_spill }
}

/// Asks tracerd for level `level` of the own spill of image (`tgid`,
/// `generation`): a `Spill` event, written in place in the ring (no stack for
/// it), counted like [`send_event`]'s.
#[inline(always)]
pub(crate) fn send_spill_event(tgid: u32, generation: u32, level: u32) {
    let Some(mut entry) = EVENTS.reserve::<ProcEvent>(0) else {
        count(Counter::DropEvents);
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: the reserved record is ours until submitted; every field is
    // written (the stats zeroed, the comm left zero: not read for Spill).
    unsafe {
        core::ptr::write_bytes(event.cast::<u8>(), 0, core::mem::size_of::<ProcEvent>());
        (*event).kind = ProcEventKind::Spill as u32;
        (*event).tgid = tgid;
        (*event).generation = generation;
        (*event).detail = level;
    }
    entry.submit(0);
    count(Counter::ProcEvents);
}

/// Raises the peak at `peak` to `now` if it is below: a bounded
/// compare-and-swap (the verifier rejects unbounded loops).
#[inline(always)]
pub(crate) fn raise_peak(peak: *mut u64, now: u64) {
    // SAFETY: peak points into a PROCS value (see fetch_add).
    let mut seen = unsafe { core::ptr::read_volatile(peak) };
    let mut tries = 0;
    while seen < now && tries < 8 {
        let old = compare_exchange(peak, seen, now);
        if old == seen {
            break;
        }
        seen = old;
        tries += 1;
    }
}

/// Adds a block of `size` bytes from `source` to the totals `stats`
/// (current, blocks, allocations, and the peak; the source's current and
/// peak).
#[inline(always)]
pub(crate) fn add_block(stats: *mut ProcStats, size: u64, source: u32) {
    // SAFETY: stats points into a PROCS value (see fetch_add).
    let (current, peak, blocks, allocs) = unsafe {
        (
            &raw mut (*stats).current,
            &raw mut (*stats).peak,
            &raw mut (*stats).blocks,
            &raw mut (*stats).allocs,
        )
    };
    let now = fetch_add(current, size).wrapping_add(size);
    fetch_add(blocks, 1);
    fetch_add(allocs, 1);
    raise_peak(peak, now);
    if let Some(totals) = source_totals(stats, source) {
        // SAFETY: as above.
        let (current, peak) = unsafe { (&raw mut (*totals).current, &raw mut (*totals).peak) };
        let now = fetch_add(current, size).wrapping_add(size);
        raise_peak(peak, now);
    }
}

/// Takes a freed block of `size` bytes from `source` out of the totals
/// `stats`.
#[inline(always)]
pub(crate) fn sub_block(stats: *mut ProcStats, size: u64, source: u32) {
    // SAFETY: stats points into a PROCS value (see fetch_add).
    let (current, blocks, frees) = unsafe {
        (
            &raw mut (*stats).current,
            &raw mut (*stats).blocks,
            &raw mut (*stats).frees,
        )
    };
    fetch_add(current, size.wrapping_neg());
    fetch_add(blocks, u64::MAX);
    fetch_add(frees, 1);
    if let Some(totals) = source_totals(stats, source) {
        // SAFETY: as above.
        fetch_add(unsafe { &raw mut (*totals).current }, size.wrapping_neg());
    }
}

/// Takes `bytes` of a block of `source` out of the totals `stats` as a
/// partial `munmap` does: the block stays (smaller) or becomes two
/// (`pieces` of it remain, 0 to 2), with no allocation or free counted
/// but when none remains.
#[inline(always)]
pub(crate) fn unmap_bytes(stats: *mut ProcStats, bytes: u64, source: u32, pieces: u64) {
    if pieces == 0 {
        sub_block(stats, bytes, source);
        return;
    }
    // SAFETY: stats points into a PROCS value (see fetch_add).
    let (current, blocks) = unsafe { (&raw mut (*stats).current, &raw mut (*stats).blocks) };
    fetch_add(current, bytes.wrapping_neg());
    fetch_add(blocks, pieces - 1);
    if let Some(totals) = source_totals(stats, source) {
        // SAFETY: as above.
        fetch_add(unsafe { &raw mut (*totals).current }, bytes.wrapping_neg());
    }
}

/// Ends the current generation of `tgid`: its totals go to userspace in an
/// event, which then removes its blocks from the live maps. Its slot of
/// PROC_SLOTS is freed (totals zeroed first, for the next owner; the spill
/// count kept), or its PROCS entry removed (and uncounted from the slot).
#[inline(always)]
pub(crate) fn end_generation(kind: ProcEventKind, tgid: u32) {
    let Some(slot) = proc_slot(tgid) else {
        return;
    };
    // SAFETY: a PROC_SLOTS value; its word changes only atomically.
    let word_ptr = unsafe { &raw mut (*slot).word };
    // SAFETY: as above.
    let word = unsafe { core::ptr::read_volatile(word_ptr) };
    if proc_slot_owner(word) == tgid {
        // SAFETY: as above. No thread of the process runs any more (exit of
        // the last one, or exec, which ended the others).
        let (mut stats, pages) = unsafe { ((*slot).totals.stats, (*slot).totals.mmap_pages) };
        stats.generation = proc_slot_gen(word);
        // SAFETY: as above.
        unsafe { (*slot).totals = ProcTotals::default() };
        // Only the owner and generation go: the spill count may change
        // meanwhile, by compare-and-swap, and is kept.
        let mut seen = word;
        let mut tries = 0;
        while tries < 8 && proc_slot_owner(seen) == tgid {
            let free = seen & (PROC_SLOT_SPILL_MAX << PROC_SLOT_SPILL_SHIFT);
            let old = compare_exchange(word_ptr, seen, free);
            if old == seen {
                break;
            }
            seen = old;
            tries += 1;
        }
        forget_regions(tgid, pages);
        forget_mappings(tgid);
        send_event(kind, tgid, stats.generation, &stats);
        return;
    }
    if proc_slot_spill(word) == 0 {
        return;
    }
    let Some(totals) = PROCS.get_ptr(tgid) else {
        return;
    };
    // SAFETY: a PROCS value, copied out at once.
    let (stats, pages) = unsafe { ((*totals).stats, (*totals).mmap_pages) };
    if PROCS.remove(tgid).is_ok() {
        fetch_add(word_ptr, (1u64 << PROC_SLOT_SPILL_SHIFT).wrapping_neg());
    }
    forget_regions(tgid, pages);
    forget_mappings(tgid);
    send_event(kind, tgid, stats.generation, &stats);
}

/// Forgets the executable mappings of `tgid`'s ended image in PROC_MAPS:
/// after an exec they are another program's, and an entry a fork copied
/// (`stack::inherit_mappings`) has no other owner to remove it.
#[inline(always)]
pub(crate) fn forget_mappings(tgid: u32) {
    let _ = PROC_MAPS.remove(tgid);
}

/// What [`forget_regions`] hands to each step of its loop.
struct Forget {
    tgid: u32,
    pages: [u64; 4],
}

/// Forgets the anonymous mappings of `tgid`'s ended image (their blocks
/// go with the image's other blocks): the pages of MMAP_REGIONS that its
/// totals name (`ProcTotals::mmap_pages`).
#[inline(always)]
fn forget_regions(tgid: u32, pages: [u64; 4]) {
    if pages == [0; 4] {
        return;
    }
    let mut state = Forget { tgid, pages };
    // SAFETY: bpf_loop calls forget_page at most MMAP_PAGES times with a
    // pointer to `state`, on this stack.
    unsafe {
        bpf_loop(
            MMAP_PAGES,
            forget_page as *mut c_void,
            (&raw mut state).cast(),
            0,
        );
    }
}

/// One page of [`forget_regions`]: removed if the image had it.
extern "C" fn forget_page(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the Forget that forget_regions handed to bpf_loop.
    let state = unsafe { &*(ctx as *const Forget) };
    let word = state.pages[(index as usize / 64) & 3];
    if word & (1 << (index % 64)) != 0 {
        let _ = MMAP_REGIONS.remove(&MmapPageKey {
            tgid: state.tgid,
            page: index as u32,
        });
    }
    0
}
