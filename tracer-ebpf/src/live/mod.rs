//! Live blocks: insert ([`record_alloc`], [`record_block`]), find
//! ([`find_block`]) and remove ([`remove_block`], [`take_block`]) a block of a process in the fast table (`LIVE_KEYS` +
//! `LIVE_VALUES`) or its spill (`LIVE_ALLOCS`), with the process's totals
//! and its totals per stack (`STACK_TOTALS`) kept in step: the thread that
//! puts a block in the maps adds it to its stack's totals
//! ([`record_block`], `mmap`'s pieces), the one that takes it out
//! subtracts it ([`remove_block`], `mmap`'s cut, or a replacement in
//! [`insert_block`]).
//!
//! The own spill, an image's own hash maps for blocks past the fast table
//! ([`own_spill`]), and the totals per stack ([`stack_totals`]) are files of
//! their own.
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

use aya_ebpf::{
    EbpfContext as _, bindings::BPF_NOEXIST, helpers::bpf_get_attach_cookie,
    programs::RetProbeContext,
};
use own_spill::{OWN_LOST, OWN_TAKEN, own_lookup, own_put, own_take};
use stack_totals::{count_in_stack, uncount_in_stack};
pub(crate) use stack_totals::{count_in_stack_fn, uncount_in_stack_fn};
use tracer_common::{
    AllocInfo, AllocKey, Counter, LIVE_BUSY, LIVE_EMPTY, LIVE_WAYS, LiveBucket, ProcStats, live_key,
};

use crate::{
    atomic::{compare_exchange, fetch_add},
    counters::count,
    globals::{live_bucket_mask, process_max_blocks},
    maps::{EEXIST, LIVE_ALLOCS, LIVE_KEYS, LIVE_VALUES},
    procs::{add_block, find_proc, proc_stats, shared_spill_counter, sub_block},
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

// The own spill, here where its code was in one file: see `crate::stack`
// on the order of definitions.
mod own_spill;

/// Removes the live block `ptr` of `tgid`; a pointer that is not a live block
/// of the current image is counted as an unknown free when `count_unknown`.
/// A BPF function of its own, so that its locals stay out of the frame of
/// `realloc`'s program, which also walks a stack (see [`store_block`]).
#[inline(never)]
pub(crate) fn remove_block(tgid: u32, ptr: u64, count_unknown: bool) {
    // The generation is defined on every path (0 when not found): the
    // verifier refuses a stack slot that LLVM leaves unwritten on some.
    let (stats, generation) = match find_proc(tgid) {
        Some((stats, generation)) => (Some(stats), generation),
        None => (None, 0),
    };
    if let Some((stats, info)) = take_block::<true>(tgid, ptr, (stats, generation), count_unknown) {
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
    (stats, generation): (Option<*mut ProcStats>, u32),
    count_unknown: bool,
) -> Option<(*mut ProcStats, AllocInfo)> {
    let place = live_place(tgid, ptr);
    if let Some((bucket, index, key)) = place {
        let way = find_way(bucket, key);
        if way < LIVE_WAYS {
            // The value was written before the key was stored, and stays as
            // it is while the key is there.
            let info = LIVE_VALUES.get(index * LIVE_WAYS + way).copied()?;
            let stats = current_image(stats, generation, &info, count_unknown)?;
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
        match own_take(stats, tgid, generation, ptr, &raw mut info) {
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
    let stats = current_image(stats, generation, &info, count_unknown)?;
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

/// The live block `ptr` of `tgid`'s image `generation`, read and left in place;
/// None when there is none.
#[inline(always)]
pub(crate) fn find_block<const OWN: bool>(
    tgid: u32,
    ptr: u64,
    generation: u32,
) -> Option<AllocInfo> {
    let place = live_place(tgid, ptr);
    if let Some((bucket, index, key)) = place {
        let way = find_way(bucket, key);
        if way < LIVE_WAYS {
            let info = LIVE_VALUES.get(index * LIVE_WAYS + way).copied()?;
            return (info.generation == generation).then_some(info);
        }
        // SAFETY: as in take_block.
        if unsafe { core::ptr::read_volatile(&raw const (*bucket).spilled) } == 0 {
            return None;
        }
    }
    let mut info = AllocInfo::default();
    if OWN && own_lookup(tgid, generation, ptr, &raw mut info) != 0 {
        return Some(info);
    }
    let key = AllocKey {
        tgid,
        _pad: 0,
        addr: ptr,
    };
    // SAFETY: a LIVE_ALLOCS value, copied out at once.
    let info = unsafe { *LIVE_ALLOCS.get_ptr(key)? };
    (info.generation == generation).then_some(info)
}

/// The totals of the process (`stats` of generation `generation`, from
/// [`find_proc`]) when `info` is a block of its current image; else None (a
/// block of an earlier image of this pid, which userspace removes), counted
/// as an unknown free when `count_unknown`.
#[inline(always)]
fn current_image(
    stats: Option<*mut ProcStats>,
    generation: u32,
    info: &AllocInfo,
    count_unknown: bool,
) -> Option<*mut ProcStats> {
    let stats = stats?;
    if generation != info.generation {
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
/// `(stats, generation)` of `tgid`, with the user stack walked from `regs`;
/// returns whether it is live now (else it was dropped, and counted).
#[inline(always)]
pub(crate) fn record_block<const OWN: bool>(
    regs: UserRegs,
    (stats, generation): (*mut ProcStats, u32),
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
    let stack_id = stack_id(regs, tgid, generation, stats);
    let info = AllocInfo {
        size,
        stack_id,
        frame0: regs.ip,
        generation,
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

// The totals per stack, here where their code was in one file.
mod stack_totals;

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
                replace_block(stats, &*value, info.generation);
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
            || (OWN
                && own_lookup(
                    hash_key.tgid,
                    info.generation,
                    hash_key.addr,
                    &raw mut found,
                ) != 0))
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
/// address, out of the totals when it belongs to the current image `generation`,
/// so that no phantom leak remains.
#[inline(always)]
fn replace_block(stats: *mut ProcStats, old: &AllocInfo, generation: u32) {
    if old.generation == generation {
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
    let (tgid, generation) = (key.tgid, info.generation);
    let mut old = AllocInfo::default();
    let took = own_take(stats, tgid, generation, key.addr, &raw mut old) == OWN_TAKEN;
    if took {
        replace_block(stats, &old, generation);
    }
    if own_put(stats, tgid, generation, key.addr, info) {
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
        replace_block(stats, &old, info.generation);
        if old.generation == info.generation {
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
