//! The own spill: the levels of hash maps (`OWN_LIVE`, named per image by
//! `OWN_LEVELS`) that hold an image's blocks the fast table has no room
//! for, newest level first; tracerd adds a level when the newest is three
//! quarters full.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_map_delete_elem, bpf_map_lookup_elem, bpf_map_update_elem, generated::bpf_loop},
};
use tracer_common::{
    AllocInfo, OWN_LEVELS_MAX, OwnLevelMaps, ProcStats, own_image_key, own_wants_next,
};

use crate::{
    atomic::{compare_exchange, fetch_add},
    maps::{OWN_LEVELS, OWN_LIVE},
    procs::{own_asked_counter, own_spill_counter, send_spill_event},
};

/// Levels of image (`tgid`, `generation`)'s own spill (0: none yet), at most
/// OWN_LEVELS_MAX.
#[inline(always)]
fn own_levels(tgid: u32, generation: u32) -> u32 {
    match OWN_LEVELS.get_ptr(own_image_key(tgid, generation)) {
        Some(levels) => level_count(levels),
        None => 0,
    }
}

/// The count of `levels` (an image's OWN_LEVELS value), read once, at
/// most OWN_LEVELS_MAX.
#[inline(always)]
fn level_count(levels: *const OwnLevelMaps) -> u32 {
    // SAFETY: an OWN_LEVELS value (tracerd replaces it whole).
    unsafe { core::ptr::read_volatile(&raw const (*levels).count) }.min(OWN_LEVELS_MAX)
}

/// Image (`tgid`, `generation`)'s own spill map of `level`, as the helpers take a
/// map: the map OWN_LEVELS names for the level, in OWN_LIVE.
#[inline(always)]
fn own_map(tgid: u32, generation: u32, level: u32) -> Option<*mut c_void> {
    let levels = OWN_LEVELS.get_ptr(own_image_key(tgid, generation))?;
    // SAFETY: an OWN_LEVELS value (tracerd replaces it whole).
    own_level_map(unsafe { &*levels }, level)
}

/// The map of `level` among `levels` (an image's OWN_LEVELS value), in
/// OWN_LIVE, as the helpers take a map.
#[inline(always)]
fn own_level_map(levels: &OwnLevelMaps, level: u32) -> Option<*mut c_void> {
    // Masked, not compared: the verifier must see the index bounded in the
    // register that indexes (callers pass a level below the count, at
    // most OWN_LEVELS_MAX, a power of two).
    let index = (level & (OWN_LEVELS_MAX - 1)) as usize;
    // SAFETY: index is below the length of the array.
    let id = unsafe { core::ptr::read_volatile(&raw const levels.maps[index]) };
    // SAFETY: only the inner map's address is used, and only by the map
    // helpers (nothing is read through the reference).
    unsafe { OWN_LIVE.get(&id) }.map(|map| core::ptr::from_ref(map).cast_mut().cast::<c_void>())
}

/// The block at `addr` in the own spill map `map`, copied out.
#[inline(always)]
fn own_get(map: *mut c_void, addr: u64) -> Option<AllocInfo> {
    // SAFETY: map is an inner map of OWN_LIVE; the key is a whole u64.
    let value = unsafe { bpf_map_lookup_elem(map, (&raw const addr).cast()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: a value of an own spill map, an AllocInfo, copied out at once.
    Some(unsafe { *value.cast::<AllocInfo>() })
}

/// Deletes the block at `addr` from the own spill map `map`; true for the
/// one thread whose delete took it.
#[inline(always)]
fn own_remove(map: *mut c_void, addr: u64) -> bool {
    // SAFETY: as in own_get.
    unsafe { bpf_map_delete_elem(map, (&raw const addr).cast()) == 0 }
}

/// Puts `info` at `addr` in the own spill map `map` as a new entry; false
/// when the map is full (or holds the address).
#[inline(always)]
fn own_insert(map: *mut c_void, addr: u64, info: &AllocInfo) -> bool {
    // SAFETY: as in own_get; the value is a whole AllocInfo.
    unsafe {
        bpf_map_update_elem(
            map,
            (&raw const addr).cast(),
            core::ptr::from_ref(info).cast(),
            u64::from(BPF_NOEXIST),
        ) == 0
    }
}

/// The state of [`own_lookup`]'s loop: the image's levels (its OWN_LEVELS
/// value, looked up once: one lookup a free, not one per level it passes;
/// a pointer, not a copy, which the 512 bytes of the programs' stack have
/// no room for), the block looked for, and where it was found.
#[repr(C)]
struct OwnLookup {
    maps: *const OwnLevelMaps,
    /// The levels' count read once, at most OWN_LEVELS_MAX.
    levels: u32,
    /// The level it was found in + 1; 0 while not found.
    found: u32,
    addr: u64,
    info: AllocInfo,
}

/// One level of [`own_lookup`]: iteration `index` looks in the level
/// `index` below the newest. Returns 1 to stop (found, or past the oldest
/// level), 0 to go on (the bpf_loop contract).
extern "C" fn own_lookup_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the OwnLookup that own_lookup handed to bpf_loop, on
    // its stack.
    let state = unsafe { &mut *ctx.cast::<OwnLookup>() };
    let i = index as u32;
    if i >= state.levels {
        return 1;
    }
    let level = state.levels - 1 - i;
    // SAFETY: an OWN_LEVELS value, looked up by own_lookup in this run of
    // the program (tracerd replaces a value whole).
    if let Some(map) = own_level_map(unsafe { &*state.maps }, level)
        && let Some(info) = own_get(map, state.addr)
    {
        state.info = info;
        state.found = level + 1;
        return 1;
    }
    0
}

/// Looks for the block at `addr` of image (`tgid`, `generation`) in its own
/// spill maps, newest level first, and copies it to `out`: the level it is
/// in + 1, or 0 when it is in none. The levels are a `bpf_loop` (its step
/// verified once), in a BPF function of its own, so that the verifier's
/// work stays small in the programs that look for blocks many times
/// (`mmap`'s).
#[inline(never)]
pub(super) fn own_lookup(tgid: u32, generation: u32, addr: u64, out: *mut AllocInfo) -> u32 {
    let Some(levels) = OWN_LEVELS.get_ptr(own_image_key(tgid, generation)) else {
        return 0;
    };
    let count = level_count(levels);
    if count == 0 {
        return 0;
    }
    let mut state = OwnLookup {
        maps: levels,
        levels: count,
        found: 0,
        addr,
        info: AllocInfo::default(),
    };
    // SAFETY: bpf_loop calls own_lookup_step with a pointer to `state`, on
    // this stack, at most `count` (<= OWN_LEVELS_MAX) times.
    unsafe {
        bpf_loop(
            count,
            own_lookup_step as *mut c_void,
            (&raw mut state).cast::<c_void>(),
            0,
        );
    }
    if state.found != 0 {
        // SAFETY: out points at the caller's whole AllocInfo.
        unsafe { *out = state.info };
    }
    state.found
}

/// What [`own_take`] did.
pub(super) const OWN_NOT_THERE: u32 = 0;
/// The block was taken by this thread.
pub(super) const OWN_TAKEN: u32 = 1;
/// The block was there, but another thread's delete took it first.
pub(super) const OWN_LOST: u32 = 2;

/// Takes the block at `addr` of image (`tgid`, `generation`, totals `stats`)
/// out of its own spill maps, into `out`: [`OWN_TAKEN`] for the one thread
/// whose delete took it (the image's `own_spill` lowered), [`OWN_LOST`] for
/// the others, [`OWN_NOT_THERE`].
#[inline(never)]
pub(super) fn own_take(
    stats: *mut ProcStats,
    tgid: u32,
    generation: u32,
    addr: u64,
    out: *mut AllocInfo,
) -> u32 {
    let found = own_lookup(tgid, generation, addr, out);
    if found == 0 {
        return OWN_NOT_THERE;
    }
    match own_map(tgid, generation, found - 1) {
        Some(map) if own_remove(map, addr) => {
            fetch_add(own_spill_counter(stats), u64::MAX);
            OWN_TAKEN
        }
        _ => OWN_LOST,
    }
}

/// Puts the block `info` at `addr` of image (`tgid`, `generation`, totals
/// `stats`) in the newest level of its own spill; false when it has none or
/// that one is full, having asked tracerd for the next level.
#[inline(never)]
pub(super) fn own_put(
    stats: *mut ProcStats,
    tgid: u32,
    generation: u32,
    addr: u64,
    info: *const AllocInfo,
) -> bool {
    let levels = own_levels(tgid, generation);
    // SAFETY: info points at the caller's whole AllocInfo.
    if levels > 0
        && let Some(map) = own_map(tgid, generation, levels - 1)
        && own_insert(map, addr, unsafe { &*info })
    {
        // Three quarters full: the next level is asked for now, so that
        // it is there before this one is full.
        let held = fetch_add(own_spill_counter(stats), 1).wrapping_add(1);
        if own_wants_next(levels, held) {
            ask_level(stats, tgid, generation, levels);
        }
        return true;
    }
    ask_level(stats, tgid, generation, levels);
    false
}

/// Asks tracerd for level `level` of the own spill of image (`tgid`,
/// `generation`) whose totals are `stats`, once: the thread whose
/// compare-and-swap raises the image's `own_asked` to `level + 1` sends the
/// event. A BPF function of its own: the event's stack stays out of the
/// frame of the program that stores the block.
#[inline(never)]
fn ask_level(stats: *mut ProcStats, tgid: u32, generation: u32, level: u32) {
    if level >= OWN_LEVELS_MAX {
        return;
    }
    let asked = own_asked_counter(stats);
    let want = u64::from(level) + 1;
    // SAFETY: a field of the image's totals, changed only atomically.
    let seen = unsafe { core::ptr::read_volatile(asked) };
    if seen >= want || compare_exchange(asked, seen, want) != seen {
        return;
    }
    send_spill_event(tgid, generation, level);
}
