//! tracer's eBPF programs.
//!
//! Uprobes on glibc's allocator functions keep, per traced process, the set of
//! live blocks (`LIVE_ALLOCS`: (tgid, address) → size, stack id, generation)
//! and running totals (`PROCS`). Everything is aggregated here in the kernel:
//! userspace is woken only once per process image (first allocation, exec,
//! exit), never per allocation.
//!
//! The stack is taken at the allocator's *return* (uretprobe). There the
//! kernel has already restored the instruction pointer to the return address
//! in the caller, and the caller's frame pointer is intact, so the
//! frame-pointer walk starts at the call site in the allocator's caller
//! (frame 0) and skips nothing. (At the uprobe on entry the walk would skip
//! the immediate caller, because glibc's `malloc` does not begin with
//! `push %rbp`.)
//!
//! Nesting: glibc's `realloc` calls `malloc` for mmapped chunks,
//! `reallocarray` calls `realloc`, the memalign family calls `malloc`. Those
//! inner calls hit our probes too; a per-thread depth in the thread's
//! in-flight record (`INFLIGHT_SLOTS`, or `INFLIGHT` when its slot is taken)
//! makes the outermost call the only one recorded. An inner `free` (realloc(p, 0)) is
//! recorded as a free: it has the same effect as the outer call.
#![no_std]
#![no_main]
// Atomic read-modify-write on map values: the BPF target has no `Atomic*`
// types, but LLVM lowers these intrinsics to BPF atomic instructions (see
// `atomic`).
#![allow(internal_features)]
#![feature(asm_experimental_arch)]

mod atomic;
mod counters;
mod globals;
mod maps;

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{tracepoint, uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use tracer_common::{
    AllocInfo, AllocKey, Counter, EXP_TABLE_LEN, INFLIGHT_OVERFLOW, INFLIGHT_UNSAMPLED, Inflight,
    InflightSlot, LIVE_BUSY, LIVE_EMPTY, LIVE_WAYS, LiveBucket, MAX_NFRAME, PROC_SLOT_GEN_SHIFT,
    PROC_SLOT_OWNER_MASK, PROC_SLOT_SPILL_MAX, PROC_SLOT_SPILL_SHIFT, ProcEvent, ProcEventKind,
    ProcSlot, ProcStats, STACK_ID_NONE, STACK_WORDS, live_key, proc_slot_gen, proc_slot_index,
    proc_slot_owner, proc_slot_spill,
};

use crate::{
    atomic::{compare_exchange, fetch_add},
    counters::count,
    globals::{
        current, inflight_slot_mask, live_bucket_mask, page_size, sample_mean, scoped, switch,
    },
    maps::{
        EEXIST, EVENTS, EXP_TABLE, GENERATION, INFLIGHT, INFLIGHT_SLOTS, INFLIGHT_SPILL,
        LIVE_ALLOCS, LIVE_KEYS, LIVE_VALUES, PROC_SLOTS, PROCS, SAMPLE_LEFT, STACK_CACHE,
        STACK_SCRATCH, STACKS,
    },
};

/// Byte-weighted Poisson sampling, as tcmalloc and jemalloc do it: every
/// byte is sampled with probability 1/mean, so an allocation of `size`
/// bytes is sampled with probability 1 - exp(-size/mean). A per-CPU
/// countdown of bytes is refilled with exponential variates (memoryless,
/// so sharing it between the threads of a CPU keeps the probabilities).
#[inline(always)]
fn take_sample(size: u64, mean: u64) -> bool {
    let Some(left) = SAMPLE_LEFT.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: this CPU's slot.
    let mut remaining = unsafe { *left }.wrapping_sub(size as i64);
    let sampled = remaining <= 0;
    if sampled {
        // SAFETY: a helper with no preconditions.
        let r = unsafe { aya_ebpf::helpers::bpf_get_prandom_u32() };
        let e = EXP_TABLE
            .get(r & (EXP_TABLE_LEN - 1))
            .copied()
            .unwrap_or(1 << 16);
        remaining = ((mean.wrapping_mul(u64::from(e))) >> 16) as i64 + 1;
    }
    // SAFETY: as above.
    unsafe { *left = remaining };
    sampled
}

// ---------------------------------------------------------------- entry side

#[inline(always)]
fn slot_of(id: u64) -> Option<*mut InflightSlot> {
    let mask = inflight_slot_mask();
    INFLIGHT_SLOTS.get_ptr_mut((id as u32) & mask)
}

#[inline(always)]
fn spilled() -> u64 {
    match INFLIGHT_SPILL.get_ptr(0) {
        // SAFETY: an array value; a plain read of a counter kept atomically.
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    }
}

#[inline(always)]
fn add_spilled(delta: u64) {
    if let Some(p) = INFLIGHT_SPILL.get_ptr_mut(0) {
        fetch_add(p, delta);
    }
}

/// Records an allocator call's entry, for its return. Returns the tgid when
/// the call could not be recorded (both in-flight maps full: counted as a
/// drop), else None.
#[inline(always)]
fn record_entry(size: u64, ptr: u64, overflow: bool) -> Option<u32> {
    let (id, tgid) = current()?;
    let mut flags = if overflow { INFLIGHT_OVERFLOW } else { 0 };
    let mean = sample_mean();
    if mean != 0 && !take_sample(size, mean) {
        flags |= INFLIGHT_UNSAMPLED;
    }
    let value = Inflight {
        size,
        ptr,
        depth: 0,
        overflow: flags,
    };
    let slot = slot_of(id);
    if let Some(slot) = slot {
        // SAFETY: a slot of the array; its owner field is only changed by
        // compare-and-swap from 0, or reset by its owner.
        let owner = unsafe { core::ptr::read_volatile(&raw const (*slot).owner) };
        if owner == id {
            // SAFETY: the slot is this thread's own.
            unsafe { (*slot).call.depth += 1 };
            count(Counter::Nested);
            return None;
        }
    }
    // A call of this thread may be in the spill map (its slot was taken
    // when it began): then this one is nested in it. Only looked at while
    // some thread spilled.
    if spilled() != 0
        && let Some(inflight) = INFLIGHT.get_ptr_mut(id)
    {
        // SAFETY: the entry is this thread's own.
        unsafe { (*inflight).depth += 1 };
        count(Counter::Nested);
        return None;
    }
    if let Some(slot) = slot
        // SAFETY: as above.
        && compare_exchange(unsafe { &raw mut (*slot).owner }, 0, id) == 0
    {
        // SAFETY: claimed: the slot is this thread's own until it frees it.
        unsafe { (*slot).call = value };
        return None;
    }
    if INFLIGHT.insert(id, value, BPF_NOEXIST as u64).is_ok() {
        add_spilled(1);
        return None;
    }
    // Its return will find no entry: nothing of this call is recorded.
    count(Counter::DropInflightFull);
    if let Some((stats, _)) = find_proc(tgid) {
        // SAFETY: a PROCS value.
        fetch_add(unsafe { &raw mut (*stats).drops }, 1);
    }
    Some(tgid)
}

/// Entry of an allocator that returns a new block: see [`record_entry`].
#[inline(always)]
fn alloc_entry(size: u64, ptr: u64, overflow: bool) -> u32 {
    let _ = record_entry(size, ptr, overflow);
    0
}

/// Entry of `realloc(old, size)` and `reallocarray`. When the call cannot be
/// recorded, `old` leaves the live set at once: its return will not be seen,
/// and glibc frees or moves the block (or it stays if the call fails: an
/// untraced live block only undercounts), so keeping it would leave a
/// phantom leak.
#[inline(always)]
fn realloc_entry(size: u64, old: u64, overflow: bool) -> u32 {
    if let Some(tgid) = record_entry(size, old, overflow)
        && old != 0
    {
        remove_block(tgid, old, false);
    }
    0
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// `n * m` and whether it overflowed, without 128-bit multiplication (which
/// the BPF target lacks).
#[inline(always)]
fn mul(n: u64, m: u64) -> (u64, bool) {
    if n == 0 {
        return (0, false);
    }
    // black_box keeps LLVM from turning the division back into a widening
    // multiplication.
    let limit = core::hint::black_box(u64::MAX / n);
    (n.wrapping_mul(m), m > limit)
}

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 0), 0, false)
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    let (size, overflow) = mul(arg(&ctx, 0), arg(&ctx, 1));
    alloc_entry(size, 0, overflow)
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    realloc_entry(arg(&ctx, 1), arg(&ctx, 0), false)
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    let (size, overflow) = mul(arg(&ctx, 1), arg(&ctx, 2));
    realloc_entry(size, arg(&ctx, 0), overflow)
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 2), arg(&ctx, 0), false)
}

#[uprobe]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 1), 0, false)
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 1), 0, false)
}

#[uprobe]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 0), 0, false)
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    let page = page_size();
    let n = arg(&ctx, 0);
    let (sum, overflow) = n.overflowing_add(page.wrapping_sub(1));
    alloc_entry(sum & !(page.wrapping_sub(1)), 0, overflow)
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    let Some((_, tgid)) = current() else { return 0 };
    let ptr = arg(&ctx, 0);
    if ptr == 0 {
        count(Counter::NullFrees);
        return 0;
    }
    // Sampled: most freed pointers were never recorded, and that is fine.
    remove_block(tgid, ptr, sample_mean() == 0);
    0
}

// ----------------------------------------------------------------- exit side

/// The outermost call's entry record, consumed; None for nested calls.
#[inline(always)]
fn take_inflight() -> Option<(u32, Inflight)> {
    let (id, tgid) = current()?;
    if let Some(slot) = slot_of(id) {
        // SAFETY: see record_entry.
        let owner = unsafe { core::ptr::read_volatile(&raw const (*slot).owner) };
        if owner == id {
            // SAFETY: the slot is this thread's own.
            let call = unsafe {
                if (*slot).call.depth > 0 {
                    (*slot).call.depth -= 1;
                    return None;
                }
                (*slot).call
            };
            // Free the slot after the call was copied out.
            // SAFETY: as above; the owner field is reset by its owner only.
            unsafe { core::ptr::write_volatile(&raw mut (*slot).owner, 0) };
            return Some((tgid, call));
        }
    }
    let Some(inflight) = INFLIGHT.get_ptr_mut(id) else {
        count(Counter::ExitWithoutEntry);
        return None;
    };
    // SAFETY: the entry is this thread's own; no other thread writes it.
    let value = unsafe {
        if (*inflight).depth > 0 {
            (*inflight).depth -= 1;
            return None;
        }
        *inflight
    };
    if INFLIGHT.remove(id).is_ok() {
        add_spilled(u64::MAX);
    }
    Some((tgid, value))
}

/// The slot of `tgid` in PROC_SLOTS.
#[inline(always)]
fn proc_slot(tgid: u32) -> Option<*mut ProcSlot> {
    PROC_SLOTS.get_ptr_mut(proc_slot_index(tgid))
}

/// The totals of `tgid`'s current image and its generation: in its slot of
/// PROC_SLOTS when it owns it, else in PROCS, looked up only while some
/// process of the slot is there (its spill count is not 0). None: not seen.
#[inline(always)]
fn find_proc(tgid: u32) -> Option<(*mut ProcStats, u32)> {
    let slot = proc_slot(tgid)?;
    // SAFETY: a PROC_SLOTS value; its word changes only atomically.
    let word = unsafe { core::ptr::read_volatile(&raw const (*slot).word) };
    if proc_slot_owner(word) == tgid {
        // SAFETY: as above.
        return Some((unsafe { &raw mut (*slot).stats }, proc_slot_gen(word)));
    }
    if proc_slot_spill(word) == 0 {
        return None;
    }
    let stats = PROCS.get_ptr_mut(tgid)?;
    // SAFETY: a PROCS value.
    Some((stats, unsafe { (*stats).gen_ }))
}

/// A new generation (unique per process image).
#[inline(always)]
fn new_generation() -> Option<u32> {
    let slot = GENERATION.get_ptr_mut(0)?;
    Some(fetch_add(slot, 1).wrapping_add(1) as u32)
}

/// The totals of `tgid` and its generation, created (with a new generation,
/// and a `New` event for userspace) at the process image's first allocation.
///
/// A free slot (no owner, no spill) is claimed by one compare-and-swap of
/// its word to the tgid and generation; its totals were zeroed when it was
/// freed. Else the process goes to PROCS, after one compare-and-swap that
/// counts it in the slot's spill count (so that it is looked for there, and
/// so that the slot is not claimed meanwhile by another thread of it).
#[inline(always)]
fn proc_stats(tgid: u32) -> Option<(*mut ProcStats, u32)> {
    if let Some(found) = find_proc(tgid) {
        return Some(found);
    }
    let slot = proc_slot(tgid)?;
    // SAFETY: a PROC_SLOTS value.
    let word_ptr = unsafe { &raw mut (*slot).word };
    let fits = u64::from(tgid) <= PROC_SLOT_OWNER_MASK;
    let mut tries = 0;
    while tries < 4 {
        // SAFETY: as above; the word changes only atomically.
        let word = unsafe { core::ptr::read_volatile(word_ptr) };
        let spill = proc_slot_spill(word);
        if proc_slot_owner(word) == tgid {
            // SAFETY: as above.
            return Some((unsafe { &raw mut (*slot).stats }, proc_slot_gen(word)));
        }
        if fits && proc_slot_owner(word) == 0 && spill == 0 {
            let gen_ = new_generation()?;
            let owned = u64::from(tgid) | (u64::from(gen_) << PROC_SLOT_GEN_SHIFT);
            if compare_exchange(word_ptr, word, owned) == word {
                send_event(ProcEventKind::New, tgid, gen_, &ProcStats::default());
                // SAFETY: as above.
                return Some((unsafe { &raw mut (*slot).stats }, gen_));
            }
        } else if spill < PROC_SLOT_SPILL_MAX {
            if compare_exchange(word_ptr, word, word + (1 << PROC_SLOT_SPILL_SHIFT)) == word {
                return hash_proc(tgid, word_ptr);
            }
        } else {
            break;
        }
        tries += 1;
    }
    count(Counter::DropProcsFull);
    None
}

/// Puts `tgid` in PROCS, counted already in the spill count at `word`.
#[inline(always)]
fn hash_proc(tgid: u32, word: *mut u64) -> Option<(*mut ProcStats, u32)> {
    let unspill = || fetch_add(word, (1u64 << PROC_SLOT_SPILL_SHIFT).wrapping_neg());
    let Some(gen_) = new_generation() else {
        unspill();
        return None;
    };
    let stats = ProcStats {
        gen_,
        ..ProcStats::default()
    };
    match PROCS.insert(tgid, stats, BPF_NOEXIST as u64) {
        Ok(()) => send_event(ProcEventKind::New, tgid, gen_, &ProcStats::default()),
        // Another thread of the process created it first (and counted it).
        Err(e) if e == -EEXIST => {
            unspill();
        }
        Err(_) => {
            unspill();
            count(Counter::DropProcsFull);
            return None;
        }
    }
    let stats = PROCS.get_ptr_mut(tgid)?;
    // SAFETY: a PROCS value.
    Some((stats, unsafe { (*stats).gen_ }))
}

#[inline(always)]
fn send_event(kind: ProcEventKind, tgid: u32, gen_: u32, stats: &ProcStats) {
    let event = ProcEvent {
        kind: kind as u32,
        tgid,
        gen_,
        _pad: 0,
        // SAFETY: a helper with no preconditions.
        ktime_ns: unsafe { bpf_ktime_get_ns() },
        stats: *stats,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    if EVENTS.output::<ProcEvent>(&event, 0).is_err() {
        count(Counter::DropEvents);
    } else {
        count(Counter::ProcEvents);
    }
}

#[inline(always)]
fn add_block(stats: *mut ProcStats, size: u64) {
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
    // Bounded compare-and-swap: the verifier rejects unbounded loops.
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

#[inline(always)]
fn sub_block(stats: *mut ProcStats, size: u64) {
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
}

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

/// Removes the live block `ptr` of `tgid`; a pointer that is not a live block
/// of the current image is counted as an unknown free when `count_unknown`.
///
/// The fast table first: a key found there is taken out with one
/// compare-and-swap, and only the thread whose swap succeeds accounts for
/// the block. A key not there is looked up in LIVE_ALLOCS only if some block
/// of its bucket spilled there.
#[inline(always)]
fn remove_block(tgid: u32, ptr: u64, count_unknown: bool) {
    // The generation is defined on every path (0 when not found): the
    // verifier refuses a stack slot that LLVM leaves unwritten on some.
    let (stats, gen_) = match find_proc(tgid) {
        Some((stats, gen_)) => (Some(stats), gen_),
        None => (None, 0),
    };
    let place = live_place(tgid, ptr);
    if let Some((bucket, index, key)) = place {
        let way = find_way(bucket, key);
        if way < LIVE_WAYS {
            // The value was written before the key was stored, and stays as
            // it is while the key is there.
            let Some(info) = LIVE_VALUES.get(index * LIVE_WAYS + way).copied() else {
                return;
            };
            let Some(stats) = current_image(stats, gen_, &info, count_unknown) else {
                return;
            };
            if compare_exchange(way_ptr(bucket, way), key, LIVE_EMPTY) == key {
                sub_block(stats, info.size);
                count(Counter::Frees);
            }
            return;
        }
        // SAFETY: a LIVE_KEYS value; the counter is changed only atomically.
        if unsafe { core::ptr::read_volatile(&raw const (*bucket).spilled) } == 0 {
            if count_unknown {
                unknown_free(stats);
            }
            return;
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
            return;
        }
    };
    let Some(stats) = current_image(stats, gen_, &info, count_unknown) else {
        return;
    };
    // Only the thread whose delete succeeds accounts for the block.
    if LIVE_ALLOCS.remove(key).is_ok() {
        if let Some((bucket, _, _)) = place {
            // SAFETY: a LIVE_KEYS value.
            fetch_add(unsafe { &raw mut (*bucket).spilled }, u64::MAX);
        }
        sub_block(stats, info.size);
        count(Counter::Frees);
    }
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

/// Walks the user stack (frame pointers, at most NFRAME frames) and stores
/// it once in STACKS; returns its id, or STACK_ID_NONE (counted) when it
/// cannot be walked or stored.
///
/// The id is one 64-bit hash of the frames; the value's first word is a
/// second, independent one. A stored value whose check hash differs is
/// another stack with the same id: refused, never merged. The stack this
/// CPU found or stored last is cached (`STACK_CACHE`), so a loop allocating
/// from one stack skips the STACKS lookup.
#[inline(always)]
fn stack_id<C: EbpfContext>(ctx: &C) -> u64 {
    let Some(buf) = STACK_SCRATCH.get_ptr_mut(0) else {
        return drop_stack();
    };
    let mut nframe = globals::nframe() as usize;
    if nframe > MAX_NFRAME as usize {
        nframe = MAX_NFRAME as usize;
    }
    if nframe == 0 {
        nframe = 1;
    }
    let regs = ctx.as_ptr() as *const aya_ebpf::bindings::pt_regs;
    // SAFETY: a uprobe's context is its saved user registers.
    let (ip, fp) = unsafe { ((*regs).rip, (*regs).rbp) };
    let walked = walk_frame_pointers(ip, fp, nframe as u64) as usize;
    // SAFETY: buf is this CPU's scratch value of STACK_WORDS u64s.
    let words = unsafe { &mut *buf };
    if walked == 0 {
        return drop_stack();
    }
    // The frames walked identify the stack (the words after them are stale).
    let (mut id, mut check) = (0xcbf2_9ce4_8422_2325u64, 0x9e37_79b9_7f4a_7c15u64);
    id = (id ^ walked as u64).wrapping_mul(0x0000_0100_0000_01b3);
    check = (check ^ walked as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
    let mut i = 1;
    while i < STACK_WORDS {
        if i > walked {
            break;
        }
        let word = words[i];
        id = (id ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        check = (check ^ word.rotate_left(29)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        i += 1;
    }
    id ^= id >> 31;
    check ^= check >> 33;
    if id == STACK_ID_NONE {
        id = STACK_ID_NONE - 1;
    }
    words[0] = check;
    let epoch = switch(tracer_common::SWITCH_STACK_EPOCH).wrapping_add(1);
    let cache = STACK_CACHE.get_ptr_mut(0);
    if let Some(cache) = cache {
        // SAFETY: this CPU's entry; BPF programs are not migrated while they run.
        let hit = unsafe { (*cache)[0] == id && (*cache)[1] == check && (*cache)[2] == epoch };
        if hit {
            return id;
        }
    }
    let stored = match STACKS.get_ptr(id) {
        // SAFETY: a STACKS value holds at least its first word.
        Some(stored) => (unsafe { (*stored)[0] }) == check,
        None => match STACKS.insert(id, zero_tail(words, walked, nframe), BPF_NOEXIST as u64) {
            Ok(()) => true,
            // Another CPU stored the same id meanwhile: check it as above.
            Err(e) if e == -EEXIST => match STACKS.get_ptr(id) {
                // SAFETY: as above.
                Some(stored) => (unsafe { (*stored)[0] }) == check,
                None => false,
            },
            Err(_) => false,
        },
    };
    if !stored {
        return drop_stack();
    }
    if let Some(cache) = cache {
        // SAFETY: as above.
        unsafe { *cache = [id, check, epoch] };
    }
    id
}

/// Walks the frame-pointer chain of the user stack into this CPU's
/// STACK_SCRATCH `words[1..]`: frame 0 is `ip` (at a uretprobe, the return
/// address in the allocator's caller), then the return address of each frame
/// found through `fp` (the saved `rbp`), at most `nframe` in all. The words
/// after them are left as they were (see [`zero_tail`]). Returns the frames
/// written (0: no scratch).
///
/// The same walk as the kernel's `bpf_get_stack(BPF_F_USER_STACK)` (stop at
/// an unreadable frame, a frame pointer that does not move up the stack, or
/// a zero return address), done here with one `bpf_probe_read_user` of 16
/// bytes per frame: about a third of the helper's cost on this kernel, which
/// sets up a perf callchain context for every call.
///
/// A BPF subprogram of its own, not inlined: its frame is under 64 bytes, so
/// the verifier keeps it on the task's kernel stack instead of the per-CPU
/// private stack it gives larger frames (Linux 6.14+). Each read then lands
/// on the task stack, where hardened usercopy's check of the destination
/// ends at once; into the private stack it walks the heap checks, which here
/// cost about half of the read.
#[inline(never)]
fn walk_frame_pointers(ip: u64, fp: u64, nframe: u64) -> u64 {
    let Some(buf) = STACK_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: buf is this CPU's scratch value of STACK_WORDS u64s.
    let words = unsafe { &mut *buf };
    let mut fp = fp;
    words[1] = ip;
    let mut n = 1;
    while n < STACK_WORDS - 1 && (n as u64) < nframe {
        if fp == 0 || fp % 8 != 0 {
            break;
        }
        // SAFETY: bpf_probe_read_user checks the user address itself.
        let Ok(frame) = (unsafe { bpf_probe_read_user(fp as *const [u64; 2]) }) else {
            break;
        };
        let (next, ret) = (frame[0], frame[1]);
        if ret == 0 {
            break;
        }
        n += 1;
        words[n] = ret;
        fp = if next > fp { next } else { 0 };
    }
    n as u64
}

/// `words` with the frames after the `walked` ones up to `nframe` zeroed, as
/// STACKS stores them; done only when a stack is stored, not on every walk.
#[inline(always)]
fn zero_tail(words: &mut [u64; STACK_WORDS], walked: usize, nframe: usize) -> &[u64; STACK_WORDS] {
    let mut i = 2;
    while i < STACK_WORDS {
        if i > nframe {
            break;
        }
        if i > walked {
            words[i] = 0;
        }
        i += 1;
    }
    words
}

#[inline(always)]
fn drop_stack() -> u64 {
    count(Counter::DropStack);
    STACK_ID_NONE
}

/// Records the new block `addr` of `size` bytes with the current user stack.
/// Called at a uretprobe, where the instruction pointer is the return
/// address into the allocator's caller.
#[inline(always)]
fn record_alloc(ctx: &RetProbeContext, tgid: u32, addr: u64, size: u64) {
    let stack_id = stack_id(ctx);
    // SAFETY: regs points at the probe's saved registers for its duration.
    let frame0 = unsafe { (*ctx.regs).rip };
    let Some((stats, gen_)) = proc_stats(tgid) else {
        return;
    };
    let info = AllocInfo {
        size,
        stack_id,
        frame0,
        gen_,
        _pad: 0,
    };
    let hash_key = AllocKey {
        tgid,
        _pad: 0,
        addr,
    };
    let place = live_place(tgid, addr);
    if let Some((bucket, index, key)) = place
        && table_insert(stats, (bucket, index, key), &hash_key, &info)
    {
        add_block(stats, size);
        count(Counter::Allocs);
        return;
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
    let inserted = hash_insert(stats, &hash_key, &info);
    if inserted != Some(true)
        && let Some(counter) = spilled
    {
        // No new entry: the map was full, or the block replaced one.
        fetch_add(counter, u64::MAX);
    }
    if inserted.is_some() {
        add_block(stats, size);
        count(Counter::Allocs);
    } else {
        drop_block(stats);
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
fn table_insert(
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
    // SAFETY: a LIVE_KEYS value.
    if unsafe { core::ptr::read_volatile(&raw const (*bucket).spilled) } != 0
        && LIVE_ALLOCS.get_ptr(hash_key).is_some()
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
        sub_block(stats, old.size);
        count(Counter::Overwrites);
    }
}

/// Puts `info` in LIVE_ALLOCS under `key`: Some(true) as a new entry,
/// Some(false) in place of a live block of that address (see
/// [`replace_block`]), None when the map is full.
#[inline(always)]
fn hash_insert(stats: *mut ProcStats, key: &AllocKey, info: &AllocInfo) -> Option<bool> {
    match LIVE_ALLOCS.insert(key, info, BPF_NOEXIST as u64) {
        Ok(()) => Some(true),
        Err(e) if e == -EEXIST => {
            if let Some(old) = LIVE_ALLOCS.get_ptr(key) {
                // SAFETY: a LIVE_ALLOCS value, copied out at once.
                replace_block(stats, &unsafe { *old }, info.gen_);
            }
            LIVE_ALLOCS.insert(key, info, 0).ok().map(|()| false)
        }
        Err(_) => None,
    }
}

#[inline(always)]
fn drop_block(stats: *mut ProcStats) {
    count(Counter::DropLiveFull);
    // SAFETY: a PROCS value.
    fetch_add(unsafe { &raw mut (*stats).drops }, 1);
}

/// Return of malloc, calloc, aligned_alloc, memalign, valloc, pvalloc.
#[inline(always)]
fn alloc_exit(ctx: &RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight() else {
        return 0;
    };
    let addr: u64 = ctx.ret();
    if addr == 0 {
        count(Counter::FailedAllocs);
        return 0;
    }
    if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
        count(Counter::Unsampled);
        return 0;
    }
    record_alloc(ctx, tgid, addr, inflight.size);
    0
}

#[uretprobe]
pub fn malloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn calloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn aligned_alloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn memalign_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn valloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn pvalloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

/// Return of realloc and reallocarray: see DESIGN.md's capture table.
#[inline(always)]
fn realloc_exit_common(ctx: &RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight() else {
        return 0;
    };
    let addr: u64 = ctx.ret();
    let old = inflight.ptr;
    let exact = sample_mean() == 0;
    if addr != 0 {
        if old != 0 {
            remove_block(tgid, old, exact);
        }
        if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
            count(Counter::Unsampled);
        } else {
            record_alloc(ctx, tgid, addr, inflight.size);
        }
    } else if inflight.size == 0 && inflight.overflow & INFLIGHT_OVERFLOW == 0 && old != 0 {
        // realloc(p, 0) frees p; glibc's inner free() may have removed it
        // already, which is not an unknown free.
        remove_block(tgid, old, false);
    } else {
        count(Counter::FailedAllocs);
    }
    0
}

#[uretprobe]
pub fn realloc_exit(ctx: RetProbeContext) -> u32 {
    realloc_exit_common(&ctx)
}

#[uretprobe]
pub fn reallocarray_exit(ctx: RetProbeContext) -> u32 {
    realloc_exit_common(&ctx)
}

#[uretprobe]
pub fn posix_memalign_exit(ctx: RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight() else {
        return 0;
    };
    let ret: i32 = ctx.ret();
    if ret != 0 || inflight.ptr == 0 {
        count(Counter::FailedAllocs);
        return 0;
    }
    if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
        count(Counter::Unsampled);
        return 0;
    }
    // SAFETY: bpf_probe_read_user checks the user address itself.
    let Ok(addr) = (unsafe { bpf_probe_read_user(inflight.ptr as *const u64) }) else {
        count(Counter::FailedAllocs);
        return 0;
    };
    record_alloc(&ctx, tgid, addr, inflight.size);
    0
}

// ----------------------------------------------------------- process lifecycle

/// Ends the current generation of `tgid`: its totals go to userspace in an
/// event, which then removes its blocks from the live maps. Its slot of
/// PROC_SLOTS is freed (totals zeroed first, for the next owner; the spill
/// count kept), or its PROCS entry removed (and uncounted from the slot).
#[inline(always)]
fn end_generation(kind: ProcEventKind, tgid: u32) {
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
        let mut stats = unsafe { (*slot).stats };
        stats.gen_ = proc_slot_gen(word);
        // SAFETY: as above.
        unsafe { (*slot).stats = ProcStats::default() };
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
        send_event(kind, tgid, stats.gen_, &stats);
        return;
    }
    if proc_slot_spill(word) == 0 {
        return;
    }
    let Some(stats) = PROCS.get_ptr(tgid) else {
        return;
    };
    // SAFETY: a PROCS value, copied out at once.
    let stats = unsafe { *stats };
    if PROCS.remove(tgid).is_ok() {
        fetch_add(word_ptr, (1u64 << PROC_SLOT_SPILL_SHIFT).wrapping_neg());
    }
    send_event(kind, tgid, stats.gen_, &stats);
}

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let Some((_, tgid)) = current() else { return 0 };
    end_generation(ProcEventKind::Exec, tgid);
    if scoped() {
        send_event(ProcEventKind::ExecAny, tgid, 0, &ProcStats::default());
    }
    0
}

/// Offset of `child_pid` in the sched_process_fork record.
const FORK_CHILD_PID_OFFSET: usize = 20;

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    if !scoped() {
        return 0;
    }
    // SAFETY: the offset is within the record (see its format file).
    let child: i32 = unsafe { ctx.read_at(FORK_CHILD_PID_OFFSET) }.unwrap_or(0);
    if child > 0 {
        send_event(ProcEventKind::Fork, child as u32, 0, &ProcStats::default());
    }
    0
}

/// Offset of `group_dead` in the sched_process_exit record
/// (/sys/kernel/tracing/events/sched/sched_process_exit/format).
const EXIT_GROUP_DEAD_OFFSET: usize = 32;

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let Some((id, tgid)) = current() else {
        return 0;
    };
    // A thread that dies inside a probed call leaves its state behind.
    if let Some(slot) = slot_of(id) {
        // SAFETY: see record_entry; only the owner resets its slot.
        unsafe {
            if core::ptr::read_volatile(&raw const (*slot).owner) == id {
                core::ptr::write_volatile(&raw mut (*slot).owner, 0);
            }
        }
    }
    if INFLIGHT.remove(id).is_ok() {
        add_spilled(u64::MAX);
    }
    // SAFETY: the offset is within the record (see the format file).
    let group_dead: u8 = unsafe { ctx.read_at(EXIT_GROUP_DEAD_OFFSET) }.unwrap_or(0);
    if group_dead != 0 {
        end_generation(ProcEventKind::Exit, tgid);
    }
    0
}

// ------------------------------------------------------------ physical floor

/// Does nothing: attached by `tracer-floor` at tracerd's own entry points to
/// measure what the probes cost before any program body runs.
#[uprobe]
pub fn floor_enter(_ctx: ProbeContext) -> u32 {
    0
}

/// Does nothing: the return-probe counterpart of [`floor_enter`].
#[uretprobe]
pub fn floor_exit(_ctx: RetProbeContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
