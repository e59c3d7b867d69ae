//! Live blocks: insert ([`record_alloc`], [`record_block`]), find
//! ([`find_block`]) and remove ([`remove_block`], [`take_block`]) a block of a process in the fast table (`LIVE_KEYS` +
//! `LIVE_VALUES`) or its spill (`LIVE_ALLOCS`), with the process's totals
//! and its totals per stack (`STACK_TOTALS`) kept in step: the thread that
//! puts a block in the maps adds it to its stack's totals
//! ([`record_block`], `mmap`'s pieces), the one that takes it out
//! subtracts it ([`remove_block`], `mmap`'s cut, or a replacement in
//! [`insert_block`]).
//!
//! Protocol of the fast table (see `tracer_common::live_table`): a key slot
//! goes from `LIVE_EMPTY` to `LIVE_BUSY` by compare-and-swap, the value is
//! written, then the key stored, so a reader never sees a key with another
//! block's value; a block is taken out by one compare-and-swap of its key to
//! `LIVE_EMPTY`, and only the thread whose swap succeeds accounts for it. A
//! block goes to `LIVE_ALLOCS` when its bucket is full or its key cannot be
//! packed, counted first in its bucket's spill count, so that a free looks
//! in the hash only while some block of the bucket is there. A block of an
//! earlier image of the pid (another generation) is never accounted to the
//! current one: tracerd removes those.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_attach_cookie, bpf_map_delete_elem, bpf_map_lookup_elem, bpf_map_update_elem,
        generated::bpf_loop,
    },
    programs::RetProbeContext,
};
use tracer_common::{
    AllocInfo, AllocKey, Counter, LIVE_BUSY, LIVE_EMPTY, LIVE_WAYS, LiveBucket, OWN_LEVELS_MAX,
    OwnLevelMaps, ProcStats, STACK_TOTALS_KEY_OFFSET, StackTotalsKey, live_key, own_image_key,
    own_wants_next,
};

use crate::{
    atomic::{compare_exchange, fetch_add},
    counters::count,
    globals::{live_bucket_mask, process_max_blocks},
    maps::{
        EEXIST, LIVE_ALLOCS, LIVE_KEYS, LIVE_VALUES, OWN_LEVELS, OWN_LIVE, STACK_TOTALS,
        STACK_TOTALS_ZERO,
    },
    procs::{
        add_block, find_proc, own_asked_counter, own_spill_counter, proc_stats, send_spill_event,
        shared_spill_counter, stack_keys_counter, stack_totals_lost_counter, sub_block,
    },
    stack::{UserRegs, stack_id},
};

/// Where block `addr` of `tgid` lives in the fast table: its bucket, the
/// bucket's index and the block's key; None when it cannot (see
/// [`live_key`]): then it can only be in LIVE_ALLOCS.
#[inline(always)]
fn live_place(tgid: u32, addr: u64) -> Option<(*mut LiveBucket, u32, u64)> {
    let mask = live_bucket_mask();
    let (index, key) = live_key(tgid, addr, mask)?;
    Some((LIVE_KEYS.get_ptr_mut(index)?, index, key))
}

/// Key slot `way` of `bucket` (way < LIVE_WAYS).
#[inline(always)]
fn way_ptr(bucket: *mut LiveBucket, way: u32) -> *mut u64 {
    // SAFETY: bucket points into a LIVE_KEYS value; way is in bounds.
    unsafe { (&raw mut (*bucket).keys).cast::<u64>().add(way as usize) }
}

#[inline(always)]
fn read_key(slot: *const u64) -> u64 {
    // SAFETY: a key slot of a LIVE_KEYS value, changed only atomically.
    unsafe { core::ptr::read_volatile(slot) }
}

/// The way of `bucket` holding `key`, or LIVE_WAYS.
#[inline(always)]
fn find_way(bucket: *mut LiveBucket, key: u64) -> u32 {
    let mut way = 0;
    while way < LIVE_WAYS {
        if read_key(way_ptr(bucket, way)) == key {
            return way;
        }
        way += 1;
    }
    LIVE_WAYS
}

/// Levels of image (`tgid`, `gen_`)'s own spill (0: none yet), at most
/// OWN_LEVELS_MAX.
#[inline(always)]
fn own_levels(tgid: u32, gen_: u32) -> u32 {
    match OWN_LEVELS.get_ptr(own_image_key(tgid, gen_)) {
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

/// Image (`tgid`, `gen_`)'s own spill map of `level`, as the helpers take a
/// map: the map OWN_LEVELS names for the level, in OWN_LIVE.
#[inline(always)]
fn own_map(tgid: u32, gen_: u32, level: u32) -> Option<*mut c_void> {
    let levels = OWN_LEVELS.get_ptr(own_image_key(tgid, gen_))?;
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

/// Looks for the block at `addr` of image (`tgid`, `gen_`) in its own
/// spill maps, newest level first, and copies it to `out`: the level it is
/// in + 1, or 0 when it is in none. The levels are a `bpf_loop` (its step
/// verified once), in a BPF function of its own, so that the verifier's
/// work stays small in the programs that look for blocks many times
/// (`mmap`'s).
#[inline(never)]
fn own_lookup(tgid: u32, gen_: u32, addr: u64, out: *mut AllocInfo) -> u32 {
    let Some(levels) = OWN_LEVELS.get_ptr(own_image_key(tgid, gen_)) else {
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
const OWN_NOT_THERE: u32 = 0;
/// The block was taken by this thread.
const OWN_TAKEN: u32 = 1;
/// The block was there, but another thread's delete took it first.
const OWN_LOST: u32 = 2;

/// Takes the block at `addr` of image (`tgid`, `gen_`, totals `stats`)
/// out of its own spill maps, into `out`: [`OWN_TAKEN`] for the one thread
/// whose delete took it (the image's `own_spill` lowered), [`OWN_LOST`] for
/// the others, [`OWN_NOT_THERE`].
#[inline(never)]
fn own_take(stats: *mut ProcStats, tgid: u32, gen_: u32, addr: u64, out: *mut AllocInfo) -> u32 {
    let found = own_lookup(tgid, gen_, addr, out);
    if found == 0 {
        return OWN_NOT_THERE;
    }
    match own_map(tgid, gen_, found - 1) {
        Some(map) if own_remove(map, addr) => {
            fetch_add(own_spill_counter(stats), u64::MAX);
            OWN_TAKEN
        }
        _ => OWN_LOST,
    }
}

/// Puts the block `info` at `addr` of image (`tgid`, `gen_`, totals
/// `stats`) in the newest level of its own spill; false when it has none or
/// that one is full, having asked tracerd for the next level.
#[inline(never)]
fn own_put(stats: *mut ProcStats, tgid: u32, gen_: u32, addr: u64, info: *const AllocInfo) -> bool {
    let levels = own_levels(tgid, gen_);
    // SAFETY: info points at the caller's whole AllocInfo.
    if levels > 0
        && let Some(map) = own_map(tgid, gen_, levels - 1)
        && own_insert(map, addr, unsafe { &*info })
    {
        // Three quarters full: the next level is asked for now, so that
        // it is there before this one is full.
        let held = fetch_add(own_spill_counter(stats), 1).wrapping_add(1);
        if own_wants_next(levels, held) {
            ask_level(stats, tgid, gen_, levels);
        }
        return true;
    }
    ask_level(stats, tgid, gen_, levels);
    false
}

/// Asks tracerd for level `level` of the own spill of image (`tgid`,
/// `gen_`) whose totals are `stats`, once: the thread whose
/// compare-and-swap raises the image's `own_asked` to `level + 1` sends the
/// event. A BPF function of its own: the event's stack stays out of the
/// frame of the program that stores the block.
#[inline(never)]
fn ask_level(stats: *mut ProcStats, tgid: u32, gen_: u32, level: u32) {
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
    send_spill_event(tgid, gen_, level);
}

/// Removes the live block `ptr` of `tgid`; a pointer that is not a live block
/// of the current image is counted as an unknown free when `count_unknown`.
/// A BPF function of its own, so that its locals stay out of the frame of
/// `realloc`'s program, which also walks a stack (see [`store_block`]).
#[inline(never)]
pub(crate) fn remove_block(tgid: u32, ptr: u64, count_unknown: bool) {
    // The generation is defined on every path (0 when not found): the
    // verifier refuses a stack slot that LLVM leaves unwritten on some.
    let (stats, gen_) = match find_proc(tgid) {
        Some((stats, gen_)) => (Some(stats), gen_),
        None => (None, 0),
    };
    if let Some((stats, info)) = take_block::<true>(tgid, ptr, (stats, gen_), count_unknown) {
        uncount_in_stack(&raw const info);
        sub_block(stats, info.size, info.source);
        count(Counter::Frees);
    }
}

/// Takes the live block `ptr` of `tgid` out of the live maps and returns it
/// with the totals it counts in (`proc`: the process's totals and
/// generation, from [`find_proc`]), leaving the accounting to the caller;
/// None when it is not a live block of the current image (counted as an
/// unknown free when `count_unknown`).
///
/// The fast table first: a key found there is taken out with one
/// compare-and-swap, and only the thread whose swap succeeds gets the
/// block. A key not there is looked up in LIVE_ALLOCS only if some block
/// of its bucket spilled there.
#[inline(always)]
pub(crate) fn take_block<const OWN: bool>(
    tgid: u32,
    ptr: u64,
    (stats, gen_): (Option<*mut ProcStats>, u32),
    count_unknown: bool,
) -> Option<(*mut ProcStats, AllocInfo)> {
    let place = live_place(tgid, ptr);
    if let Some((bucket, index, key)) = place {
        let way = find_way(bucket, key);
        if way < LIVE_WAYS {
            // The value was written before the key was stored, and stays as
            // it is while the key is there.
            let info = LIVE_VALUES.get(index * LIVE_WAYS + way).copied()?;
            let stats = current_image(stats, gen_, &info, count_unknown)?;
            if compare_exchange(way_ptr(bucket, way), key, LIVE_EMPTY) == key {
                return Some((stats, info));
            }
            return None;
        }
        // SAFETY: a LIVE_KEYS value; the counter is changed only atomically.
        if unsafe { core::ptr::read_volatile(&raw const (*bucket).spilled) } == 0 {
            if count_unknown {
                unknown_free(stats);
            }
            return None;
        }
    }
    // The image's own spill maps, then LIVE_ALLOCS. Only the thread whose
    // delete succeeds gets the block.
    if OWN && let Some(stats) = stats {
        let mut info = AllocInfo::default();
        match own_take(stats, tgid, gen_, ptr, &raw mut info) {
            OWN_TAKEN => {
                spill_left(place);
                return Some((stats, info));
            }
            OWN_LOST => return None,
            _ => {}
        }
    }
    let key = AllocKey {
        tgid,
        _pad: 0,
        addr: ptr,
    };
    let info = match LIVE_ALLOCS.get_ptr(key) {
        // SAFETY: a LIVE_ALLOCS value, copied out at once.
        Some(info) => unsafe { *info },
        None => {
            if count_unknown {
                unknown_free(stats);
            }
            return None;
        }
    };
    let stats = current_image(stats, gen_, &info, count_unknown)?;
    if LIVE_ALLOCS.remove(key).is_ok() {
        spill_left(place);
        fetch_add(shared_spill_counter(stats), u64::MAX);
        return Some((stats, info));
    }
    None
}

/// A block of the bucket of `place` left the spill: its spill count goes
/// down.
#[inline(always)]
fn spill_left(place: Option<(*mut LiveBucket, u32, u64)>) {
    if let Some((bucket, _, _)) = place {
        // SAFETY: a LIVE_KEYS value.
        fetch_add(unsafe { &raw mut (*bucket).spilled }, u64::MAX);
    }
}

/// The live block `ptr` of `tgid`'s image `gen_`, read and left in place;
/// None when there is none.
#[inline(always)]
pub(crate) fn find_block<const OWN: bool>(tgid: u32, ptr: u64, gen_: u32) -> Option<AllocInfo> {
    let place = live_place(tgid, ptr);
    if let Some((bucket, index, key)) = place {
        let way = find_way(bucket, key);
        if way < LIVE_WAYS {
            let info = LIVE_VALUES.get(index * LIVE_WAYS + way).copied()?;
            return (info.gen_ == gen_).then_some(info);
        }
        // SAFETY: as in take_block.
        if unsafe { core::ptr::read_volatile(&raw const (*bucket).spilled) } == 0 {
            return None;
        }
    }
    let mut info = AllocInfo::default();
    if OWN && own_lookup(tgid, gen_, ptr, &raw mut info) != 0 {
        return Some(info);
    }
    let key = AllocKey {
        tgid,
        _pad: 0,
        addr: ptr,
    };
    // SAFETY: a LIVE_ALLOCS value, copied out at once.
    let info = unsafe { *LIVE_ALLOCS.get_ptr(key)? };
    (info.gen_ == gen_).then_some(info)
}

/// The totals of the process (`stats` of generation `gen_`, from
/// [`find_proc`]) when `info` is a block of its current image; else None (a
/// block of an earlier image of this pid, which userspace removes), counted
/// as an unknown free when `count_unknown`.
#[inline(always)]
fn current_image(
    stats: Option<*mut ProcStats>,
    gen_: u32,
    info: &AllocInfo,
    count_unknown: bool,
) -> Option<*mut ProcStats> {
    let stats = stats?;
    if gen_ != info.gen_ {
        if count_unknown {
            unknown_free(Some(stats));
        }
        return None;
    }
    Some(stats)
}

#[inline(always)]
fn unknown_free(stats: Option<*mut ProcStats>) {
    count(Counter::UnknownFrees);
    if let Some(stats) = stats {
        // SAFETY: a PROCS value.
        fetch_add(unsafe { &raw mut (*stats).unknown_frees }, 1);
    }
}

/// Records the new block `addr` of `size` bytes with the current user stack.
/// Called at a uretprobe, where the instruction pointer is the return
/// address into the allocator's caller; the probe's attach cookie is the
/// block's source (its allocator's family, set by tracerd at attach).
#[inline(always)]
pub(crate) fn record_alloc(ctx: &RetProbeContext, tgid: u32, addr: u64, size: u64) {
    // SAFETY: the helper reads the running probe's own link.
    let source = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let Some(proc_) = proc_stats(tgid) else {
        return;
    };
    // SAFETY: regs points at the probe's saved registers for its duration.
    let regs = unsafe {
        UserRegs {
            ip: (*ctx.regs).rip,
            rsp: (*ctx.regs).rsp,
            rbp: (*ctx.regs).rbp,
        }
    };
    record_block::<true>(regs, proc_, tgid, (addr, size), source);
}

/// Records the new block (`addr`, `size` bytes) of `source` in the image
/// `(stats, gen_)` of `tgid`, with the user stack walked from `regs`;
/// returns whether it is live now (else it was dropped, and counted).
#[inline(always)]
pub(crate) fn record_block<const OWN: bool>(
    regs: UserRegs,
    (stats, gen_): (*mut ProcStats, u32),
    tgid: u32,
    (addr, size): (u64, u64),
    source: u32,
) -> bool {
    // Past its share of the live-block maps: dropped before its stack is
    // walked, so that one process cannot starve the others.
    let max = process_max_blocks();
    // SAFETY: a PROCS value; its counters change only atomically.
    if max != 0 && unsafe { core::ptr::read_volatile(&raw const (*stats).blocks) } >= max {
        count(Counter::DropShare);
        // SAFETY: as above.
        fetch_add(unsafe { &raw mut (*stats).drops }, 1);
        return false;
    }
    let stack_id = stack_id(regs, tgid, gen_, stats);
    let info = AllocInfo {
        size,
        stack_id,
        frame0: regs.ip,
        gen_,
        source,
    };
    store_block::<OWN>(stats, tgid, addr, &raw const info)
}

/// Puts the new block `info` of `tgid` at `addr` in the live maps and
/// counts it (the process's totals, its stack's totals); false when both
/// maps are full (counted as a drop). A BPF function of its own: the live
/// maps' insertion and the stack's totals take their locals in its frame,
/// not in the frame of the program that walked the stack (which shares
/// the 512-byte limit with the walk's callback).
#[inline(never)]
fn store_block<const OWN: bool>(
    stats: *mut ProcStats,
    tgid: u32,
    addr: u64,
    info: *const AllocInfo,
) -> bool {
    // SAFETY: info points at the caller's whole AllocInfo.
    let info = unsafe { &*info };
    if insert_block::<OWN>(stats, tgid, addr, info) {
        count_in_stack(stats, info);
        add_block(stats, info.size, info.source);
        count(Counter::Allocs);
        true
    } else {
        drop_block(stats);
        false
    }
}

/// Puts `info` in the live maps as block `addr` of `tgid` (in place of a
/// live block of that address: see [`replace_block`]), leaving the
/// accounting of the new block to the caller; false when both maps are
/// full.
#[inline(always)]
pub(crate) fn insert_block<const OWN: bool>(
    stats: *mut ProcStats,
    tgid: u32,
    addr: u64,
    info: &AllocInfo,
) -> bool {
    let hash_key = AllocKey {
        tgid,
        _pad: 0,
        addr,
    };
    let place = live_place(tgid, addr);
    if let Some((bucket, index, key)) = place
        && table_insert::<OWN>(stats, (bucket, index, key), &hash_key, info)
    {
        return true;
    }
    // The spill: the bucket is full, the key cannot be packed, or the block
    // is in LIVE_ALLOCS already. Counted in its bucket before it is there,
    // so that a free meanwhile looks for it.
    let spilled = place.map(|(bucket, _, _)| {
        // SAFETY: a LIVE_KEYS value.
        let counter = unsafe { &raw mut (*bucket).spilled };
        fetch_add(counter, 1);
        counter
    });
    let inserted = spill_insert::<OWN>(stats, &hash_key, info);
    if inserted != Some(true)
        && let Some(counter) = spilled
    {
        // No new entry: the map was full, or the block replaced one.
        fetch_add(counter, u64::MAX);
    }
    inserted.is_some()
}

/// The [`StackTotalsKey`] of block `info`: the tail of its own value (see
/// [`STACK_TOTALS_KEY_OFFSET`]), so that no stack space goes to a key.
#[inline(always)]
fn stack_key(info: *const AllocInfo) -> *const StackTotalsKey {
    // SAFETY: the key's layout is the tail of AllocInfo's (pinned in
    // tracer-common); info points at a whole AllocInfo.
    unsafe {
        info.cast::<u8>()
            .add(STACK_TOTALS_KEY_OFFSET)
            .cast::<StackTotalsKey>()
    }
}

/// Adds block `info` of the image `stats` to its stack's totals: a new key
/// is put in at 0 (from `STACK_TOTALS_ZERO`, no stack space for a value)
/// and added to like any other; a key the full map refuses is counted
/// ([`Counter::StackTotalsRefused`] and the image's `stack_totals_lost`).
#[inline(always)]
fn count_in_stack(stats: *mut ProcStats, info: *const AllocInfo) {
    let key = stack_key(info);
    // SAFETY: info points at a whole AllocInfo.
    let size = unsafe { (*info).size };
    // SAFETY: key points into info (above).
    if add_to_stack(unsafe { &*key }, size) {
        return;
    }
    if let Some(zero) = STACK_TOTALS_ZERO.get(0) {
        // SAFETY: as above.
        let key = unsafe { &*key };
        match STACK_TOTALS.insert(key, zero, BPF_NOEXIST as u64) {
            // Another thread may have put the key in meanwhile: either way
            // it is there now. A key put in is counted before a block is
            // added to it (tracerd reads an image's totals by the keys it
            // knows while that count is unchanged).
            Ok(()) => {
                fetch_add(stack_keys_counter(stats), 1);
                if add_to_stack(key, size) {
                    return;
                }
            }
            Err(e) if e == -EEXIST && add_to_stack(key, size) => return,
            Err(_) => {}
        }
    }
    count(Counter::StackTotalsRefused);
    fetch_add(stack_totals_lost_counter(stats), 1);
}

/// Adds one block of `size` bytes to the totals of `key`; false when the
/// key is not in the map.
#[inline(always)]
fn add_to_stack(key: &StackTotalsKey, size: u64) -> bool {
    let Some(totals) = STACK_TOTALS.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: a STACK_TOTALS value; its fields change only atomically.
    unsafe {
        fetch_add(&raw mut (*totals).count, 1);
        fetch_add(&raw mut (*totals).size, size);
    }
    true
}

/// [`count_in_stack`] as a BPF function of its own, for the programs
/// that put blocks in several places (`mmap`'s partial unmaps): the
/// verifier then follows its branches once per call, not once per path
/// through the caller. (The allocator programs inline it: a call costs
/// their frame the registers it spills.)
#[inline(never)]
pub(crate) fn count_in_stack_fn(stats: *mut ProcStats, info: *const AllocInfo) {
    count_in_stack(stats, info);
}

/// [`uncount_in_stack`] as a BPF function of its own (see
/// [`count_in_stack_fn`]).
#[inline(never)]
pub(crate) fn uncount_in_stack_fn(info: *const AllocInfo) {
    uncount_in_stack(info);
}

/// Takes block `info`, just taken out of the live maps, out of its stack's
/// totals (nothing when its key is not there: its image counted it lost).
#[inline(always)]
pub(crate) fn uncount_in_stack(info: *const AllocInfo) {
    // SAFETY: key points into info, a whole AllocInfo (see stack_key).
    let (key, size) = unsafe { (&*stack_key(info), (*info).size) };
    if let Some(totals) = STACK_TOTALS.get_ptr_mut(key) {
        // SAFETY: as in add_to_stack.
        unsafe {
            fetch_add(&raw mut (*totals).count, u64::MAX);
            fetch_add(&raw mut (*totals).size, size.wrapping_neg());
        }
    }
}

/// Puts `info` under `key` in the fast table (a live block of that key is
/// replaced: see [`replace_block`]); false when the block must go to
/// LIVE_ALLOCS: no way is free, or the key is there already.
///
/// A way is claimed from LIVE_EMPTY to LIVE_BUSY by compare-and-swap, the
/// value written, then the key stored: readers never see a key with another
/// block's value.
#[inline(always)]
fn table_insert<const OWN: bool>(
    stats: *mut ProcStats,
    (bucket, index, key): (*mut LiveBucket, u32, u64),
    hash_key: &AllocKey,
    info: &AllocInfo,
) -> bool {
    let way = find_way(bucket, key);
    if way < LIVE_WAYS {
        // The address is live already: its free was missed, or it is a
        // stale block of an earlier image.
        let slot = way_ptr(bucket, way);
        if compare_exchange(slot, key, LIVE_BUSY) != key {
            return false;
        }
        if let Some(value) = LIVE_VALUES.get_ptr_mut(index * LIVE_WAYS + way) {
            // SAFETY: the way is claimed: its value is ours until the key
            // is stored again.
            unsafe {
                replace_block(stats, &*value, info.gen_);
                *value = *info;
            }
            // SAFETY: as for read_key.
            unsafe { core::ptr::write_volatile(slot, key) };
            return true;
        }
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(slot, LIVE_EMPTY) };
        return false;
    }
    let mut found = AllocInfo::default();
    // SAFETY: a LIVE_KEYS value.
    if unsafe { core::ptr::read_volatile(&raw const (*bucket).spilled) } != 0
        && (LIVE_ALLOCS.get_ptr(hash_key).is_some()
            || (OWN && own_lookup(hash_key.tgid, info.gen_, hash_key.addr, &raw mut found) != 0))
    {
        return false;
    }
    let mut way = 0;
    while way < LIVE_WAYS {
        let slot = way_ptr(bucket, way);
        if read_key(slot) == LIVE_EMPTY
            && compare_exchange(slot, LIVE_EMPTY, LIVE_BUSY) == LIVE_EMPTY
        {
            if let Some(value) = LIVE_VALUES.get_ptr_mut(index * LIVE_WAYS + way) {
                // SAFETY: the way is claimed (as above).
                unsafe { *value = *info };
                // SAFETY: as for read_key.
                unsafe { core::ptr::write_volatile(slot, key) };
                return true;
            }
            // SAFETY: as above.
            unsafe { core::ptr::write_volatile(slot, LIVE_EMPTY) };
            return false;
        }
        way += 1;
    }
    false
}

/// Takes the block `old`, about to be replaced by a new block of the same
/// address, out of the totals when it belongs to the current image `gen_`,
/// so that no phantom leak remains.
#[inline(always)]
fn replace_block(stats: *mut ProcStats, old: &AllocInfo, gen_: u32) {
    if old.gen_ == gen_ {
        sub_block(stats, old.size, old.source);
        uncount_in_stack_fn(old);
        count(Counter::Overwrites);
    }
}

/// Puts the spilled block `info` under `key` in its image's own spill (the
/// newest level) or, when it has none or that one is full, in LIVE_ALLOCS
/// (asking tracerd for the next level): Some(true) as a new entry,
/// Some(false) in place of a live block of that address (taken out first,
/// from wherever it was, and accounted as [`replace_block`] does), None
/// when no map had room.
#[inline(always)]
fn spill_insert<const OWN: bool>(
    stats: *mut ProcStats,
    key: &AllocKey,
    info: &AllocInfo,
) -> Option<bool> {
    if !OWN {
        return hash_insert(stats, key, info);
    }
    let (tgid, gen_) = (key.tgid, info.gen_);
    let mut old = AllocInfo::default();
    let took = own_take(stats, tgid, gen_, key.addr, &raw mut old) == OWN_TAKEN;
    if took {
        replace_block(stats, &old, gen_);
    }
    if own_put(stats, tgid, gen_, key.addr, info) {
        return Some(!took);
    }
    hash_insert(stats, key, info).map(|new| new && !took)
}

/// Puts `info` in LIVE_ALLOCS under `key`: Some(true) as a new entry,
/// Some(false) in place of a live block of that address (see
/// [`replace_block`]), None when the map is full.
///
/// The block in place is taken out by a delete, as a free takes it
/// ([`take_block`]): only the thread whose delete succeeds accounts for it,
/// and hands its place in the bucket's spill count to the new block
/// (Some(false)). Were it overwritten in place instead, a free taking it
/// between the failed insert and the overwrite would account for it too and
/// give back its spill count, and the new block, counted nowhere, would
/// never be looked for: a phantom leak.
///
/// The image's `shared_spill` is raised before the block is put in and
/// lowered after a block of the image leaves (or when ours did not get
/// in), so that it is never below the image's blocks there.
#[inline(always)]
fn hash_insert(stats: *mut ProcStats, key: &AllocKey, info: &AllocInfo) -> Option<bool> {
    let shared = shared_spill_counter(stats);
    fetch_add(shared, 1);
    match LIVE_ALLOCS.insert(key, info, BPF_NOEXIST as u64) {
        Ok(()) => return Some(true),
        Err(e) if e == -EEXIST => {}
        Err(_) => {
            fetch_add(shared, u64::MAX);
            return None;
        }
    }
    // SAFETY: a LIVE_ALLOCS value, copied out at once.
    let old = LIVE_ALLOCS.get_ptr(key).map(|old| unsafe { *old });
    let took = LIVE_ALLOCS.remove(key).is_ok();
    if took && let Some(old) = old {
        replace_block(stats, &old, info.gen_);
        if old.gen_ == info.gen_ {
            fetch_add(shared, u64::MAX);
        }
    }
    match LIVE_ALLOCS.insert(key, info, BPF_NOEXIST as u64) {
        // Another thread took the old block (and its count): ours is new.
        Ok(()) => Some(!took),
        // Yet another block of the address got in first, or the map filled
        // meanwhile: ours is dropped (a spill count the old block held stays,
        // which costs a lookup, never a block).
        Err(_) => {
            fetch_add(shared, u64::MAX);
            None
        }
    }
}

#[inline(always)]
fn drop_block(stats: *mut ProcStats) {
    count(Counter::DropLiveFull);
    // SAFETY: a PROCS value.
    fetch_add(unsafe { &raw mut (*stats).drops }, 1);
}
