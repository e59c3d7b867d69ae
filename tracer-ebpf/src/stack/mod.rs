//! User stacks: the walk at an allocator's return (with the unwind tables
//! tracerd compiles from each file's CFI, frame pointers where none covers
//! an address), and the store of each distinct stack once in `STACKS`,
//! behind a per-CPU cache of the last stack (`STACK_CACHE`). A block names
//! its stack by id.
//!
//! The walk is [`unwind`] (its reads of user memory [`read`], its caches
//! of the tables' rows and pages [`cache`]); this module holds its state
//! ([`Walk`]) and the store.
//!
//! Protocol. A stack's id is one 64-bit hash of its frames; the stored
//! value's first word is a second, independent hash (the check), with
//! `STACK_CUT` when the walk was cut. A stack is inserted with
//! `BPF_NOEXIST`; a stored value whose check differs is another stack with
//! the same id, and the block gets `STACK_ID_NONE` (counted), never a wrong
//! traceback. tracerd removes stacks no live block names, then raises the
//! stack epoch (`SWITCHES`), which empties every CPU's cache.
//!
//! Preemption. A uprobe program runs with migration disabled, not
//! preemption disabled, so another task on the same CPU can run its own
//! walk on this CPU's per-CPU maps in the middle of ours. What each keeps:
//!
//! - `STACK_SCRATCH` (the frames) and `WALK_SCRATCH` (the registers,
//!   counts and window of the stack of one walk): the first word of
//!   `STACK_SCRATCH` holds the walking thread's id while it walks, written
//!   before the rest. The walk claims the scratch back with one
//!   compare-and-exchange of that word (thread id → check hash) before it
//!   stores the frames, and reads the word again after the insert: if
//!   another task took the scratch meanwhile, the stack is dropped
//!   (`drop_stack_preempted`), and removed again if it was inserted.
//!   tracerd reads a stack only when its check hash is that of its frames
//!   (`tracer_common::stack_check_word`), so a copy torn by a preemption is
//!   never shown, even in the moment before its removal.
//! - The page and row caches of `WALK_SCRATCH` ([`Walk::pages`],
//!   [`Walk::rows`]), kept from walk to walk: each slot is a value and a
//!   check that mixes its key with the value; a slot whose two words
//!   another task wrote between ours is a miss.
//! - `STACK_CACHE` (id, check, epoch), written and read as three words, left
//!   as it is: a hit returns the walk's own id, never the entry's. A torn
//!   entry mixes the words of two stacks, and is a hit only for a stack
//!   whose id is the one stack's and check the other's, two independent
//!   64-bit hashes (a chance of 2^-64, the stacks themselves included); or
//!   it pairs a stack with a newer epoch than its own, a hit for a stack
//!   tracerd may have just collected, whose block keeps its call site, as
//!   when tracerd collects a stack between a walk and its block's insert.

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_get_current_pid_tgid};
use tracer_common::{
    Counter, MAX_WALK_FRAMES, ProcStats, STACK_CHECK_SEED, STACK_ID_NONE, STACK_WORDS,
    stack_check_word, stack_share_refuses,
    unwind::{ProcMapping, STACK_WINDOW_BYTES},
};
use unwind::{CUT_NO_MAPPING, CUT_STOPPED};

use crate::{
    atomic::{compare_exchange, fetch_add},
    counters::count,
    globals::{self, switch},
    maps::{
        EEXIST, NO_MAPPINGS, PROC_MAPS, STACK_CACHE, STACK_SCRATCH, STACKS, STACKS_HELD,
        WALK_SCRATCH,
    },
    procs::{cut_counter, stacks_counter},
    vma,
};

/// Whether tracerd has written the executable mappings of image `generation` of
/// `tgid` in PROC_MAPS: its stacks are walked with the unwind tables.
#[inline(always)]
pub(crate) fn has_mappings(tgid: u32, generation: u32) -> bool {
    match PROC_MAPS.get_ptr(tgid) {
        // SAFETY: a PROC_MAPS value, read only.
        Some(maps) => (unsafe { (*maps).generation }) == generation,
        None => false,
    }
}

/// Gives image `child_gen` of `child`, forked by `parent` (image
/// `parent_gen`), a copy of the parent's PROC_MAPS entry: the child's
/// address space is the parent's until it execs or maps more (and its own
/// entry, which tracerd writes once it has read the child, replaces the
/// copy), so its stacks are walked with the tables from its first
/// instruction. Called at the fork, before the child runs.
#[inline(always)]
pub(crate) fn inherit_mappings(parent: u32, parent_gen: u32, child: u32, child_gen: u32) {
    let Some(maps) = PROC_MAPS.get_ptr(parent) else {
        return;
    };
    // SAFETY: a PROC_MAPS value, read only; the copy is made by the map
    // update from the value itself (it does not fit on the stack).
    if unsafe { (*maps).generation } != parent_gen
        || PROC_MAPS.insert(child, unsafe { &*maps }, 0).is_err()
    {
        return;
    }
    if let Some(copy) = PROC_MAPS.get_ptr_mut(child) {
        // SAFETY: the child's new entry; the child does not run yet.
        unsafe { (*copy).generation = child_gen };
    }
}

/// The user registers a walk starts from: the instruction pointer (a
/// return address into the allocator's caller at a uretprobe; the
/// instruction after `syscall` at a syscall tracepoint), `rsp` and `rbp`.
#[derive(Clone, Copy)]
pub(crate) struct UserRegs {
    pub(crate) ip: u64,
    pub(crate) rsp: u64,
    pub(crate) rbp: u64,
}

/// Walks the user stack (at most NFRAME frames: nframe plus the allocator
/// frames tracerd drops) and stores it once in STACKS; returns its id, or
/// STACK_ID_NONE (counted) when it cannot be walked or stored.
///
/// A stack new to STACKS is stored only while the process (totals `stats`)
/// has fewer than its share (`PROCESS_MAX_STACKS`); past it the block keeps
/// its frame 0 (counted, and a drop of the process).
///
/// `generation` is the process image's generation: the mappings in PROC_MAPS are
/// used only when they are of that image; otherwise (tracerd has not
/// written them yet, or the unwinder is off) the walk follows frame
/// pointers alone, as the kernel's `bpf_get_stack` does.
#[inline(always)]
pub(crate) fn stack_id(regs: UserRegs, tgid: u32, generation: u32, stats: *mut ProcStats) -> u64 {
    let (id, lost) = walk_and_store(regs, tgid, generation, stats);
    if lost || id == STACK_ID_NONE {
        count(Counter::CutTracebacks);
        fetch_add(cut_counter(stats), 1);
    }
    id
}

/// Sets the walk's state `walk` (this CPU's WALK_SCRATCH value) to start
/// at `regs`, with at most `limit` frames.
#[inline(always)]
fn start_walk(walk: *mut Walk, regs: UserRegs, limit: u32) {
    let UserRegs { ip, rsp, rbp } = regs;
    // SAFETY: this CPU's WALK_SCRATCH value; field by field, so that its
    // page cache (valid across walks) stays.
    unsafe {
        let w = &mut *walk;
        w.ip = ip;
        w.rsp = rsp;
        w.rbp = rbp;
        w.limit = limit as u64;
        w.id = 0xcbf2_9ce4_8422_2325;
        w.check = STACK_CHECK_SEED;
        // Volatile: LLVM merges adjacent zero stores into a call of a
        // memset subprogram, which stores byte by byte.
        for field in [
            &raw mut w.n,
            &raw mut w.table_frames,
            &raw mut w.fp_frames,
            &raw mut w.exact,
            &raw mut w.guessed,
            &raw mut w.cut,
            &raw mut w.last_mapping,
            &raw mut w.window_len,
            &raw mut w.vma.end,
        ] {
            core::ptr::write_volatile(field, 0);
        }
    }
}

/// [`stack_id`]'s walk and store: the id (or STACK_ID_NONE), and whether
/// the walk stopped before the outermost frame for want of mappings or
/// readable memory (a walk that reached its frames' limit is whole as far
/// as nframe asks).

/// [`stack_id`]'s walk and store: the id (or STACK_ID_NONE), and whether
/// the walk stopped before the outermost frame for want of mappings or
/// readable memory (a walk that reached its frames' limit is whole as far
/// as nframe asks).
#[inline(always)]
fn walk_and_store(
    regs: UserRegs,
    tgid: u32,
    generation: u32,
    stats: *mut ProcStats,
) -> (u64, bool) {
    let (Some(buf), Some(walk)) = (STACK_SCRATCH.get_ptr_mut(0), WALK_SCRATCH.get_ptr_mut(0))
    else {
        return (drop_stack(), true);
    };
    let mut limit = globals::nframe();
    if limit > MAX_WALK_FRAMES {
        limit = MAX_WALK_FRAMES;
    }
    if limit == 0 {
        limit = 1;
    }
    // SAFETY: buf is this CPU's scratch value of STACK_WORDS u64s.
    let words = unsafe { &mut *buf };
    // The scratches are ours while this word is our thread id; written
    // before the walk's state, so that a task that overwrites that state
    // has overwritten this word first.
    let owner = bpf_get_current_pid_tgid() | (1 << 62);
    // SAFETY: as above; volatile so the store is not merged with later ones.
    unsafe { core::ptr::write_volatile(&raw mut words[0], owner) };
    start_walk(walk, regs, limit);
    match PROC_MAPS.get_ptr(tgid) {
        // SAFETY: a PROC_MAPS value, read only.
        Some(maps) if unsafe { (*maps).generation } == generation => {
            unwind::unwind(maps, walk, buf, limit)
        }
        // Not written yet (or of an earlier image): every address is
        // looked up in the kernel's own VMAs.
        _ => match NO_MAPPINGS.get_ptr(0) {
            Some(none) if vma::enabled() => {
                count(Counter::UnwindVmaWalks);
                unwind::unwind(none, walk, buf, limit);
            }
            _ => {
                count(Counter::UnwindNoProcMaps);
                unwind::walk_frame_pointers();
            }
        },
    }
    // SAFETY: as above (the walk wrote it; read once here, before the
    // claim below checks that no other walk wrote it meanwhile).
    let (walked, cut_by, mut id, check) =
        unsafe { ((*walk).n, (*walk).cut, (*walk).id, (*walk).check) };
    let cut = cut_by != 0;
    let lost = cut_by == CUT_NO_MAPPING || cut_by == CUT_STOPPED;
    if walked == 0 || walked > MAX_WALK_FRAMES as u64 {
        return (drop_stack(), true);
    }
    // The words after the frames are stale: a 0 ends them.
    if let Some(end) = words.get_mut(1 + walked as usize) {
        *end = 0;
    }
    let head = walked | ((cut as u64) << 32);
    id = (id ^ head).wrapping_mul(0x0000_0100_0000_01b3);
    id ^= id >> 31;
    if id == STACK_ID_NONE {
        id = STACK_ID_NONE - 1;
    }
    let check = stack_check_word(check, walked, cut);
    // Claim the scratch back: another task's walk on this CPU meanwhile
    // left its own id or check in the first word, and our frames are gone.
    if compare_exchange(&raw mut words[0], owner, check) != owner {
        count(Counter::DropStackPreempted);
        return (STACK_ID_NONE, true);
    }
    let epoch = switch(tracer_common::SWITCH_STACK_EPOCH).wrapping_add(1);
    let cache = STACK_CACHE.get_ptr_mut(0);
    if let Some(cache) = cache {
        // SAFETY: this CPU's entry; BPF programs are not migrated while they run.
        let hit = unsafe { (*cache)[0] == id && (*cache)[1] == check && (*cache)[2] == epoch };
        if hit {
            return (id, lost);
        }
    }
    let stored = match STACKS.get_ptr(id) {
        // SAFETY: a STACKS value holds at least its first word.
        Some(stored) => (unsafe { (*stored)[0] }) == check,
        None => {
            let stacks = stacks_counter(stats);
            // SAFETY: a PROCS value's counter, changed only atomically.
            if past_share(unsafe { core::ptr::read_volatile(stacks) }) {
                count(Counter::DropStackShare);
                // SAFETY: as above.
                fetch_add(unsafe { &raw mut (*stats).drops }, 1);
                return (STACK_ID_NONE, true);
            }
            match store_new(id, words, check, stacks) {
                Some(stored) => stored,
                None => return (STACK_ID_NONE, true),
            }
        }
    };
    if !stored {
        return (drop_stack(), true);
    }
    if let Some(cache) = cache {
        // SAFETY: as above.
        unsafe { *cache = [id, check, epoch] };
    }
    (id, lost)
}

/// The state of one table-driven walk, in this CPU's `WALK_SCRATCH`: a
/// map value, whose contents the verifier does not follow, so that it
/// checks [`unwind::unwind_step`] once rather than once per frame. Another task on
/// this CPU may overwrite it mid-walk (preemption); the walk is then
/// dropped by the claim of `STACK_SCRATCH` (module doc).
#[repr(C)]
pub(crate) struct Walk {
    /// The frame to record next: a return address (or, after a signal
    /// frame, the interrupted instruction).
    ip: u64,
    /// Its frame's `rsp` and `rbp`.
    rsp: u64,
    rbp: u64,
    /// Frames recorded in the scratch so far.
    n: u64,
    /// Frames to walk at most.
    limit: u64,
    /// Frames stepped with a table and with frame pointers (counted once).
    table_frames: u64,
    fp_frames: u64,
    /// `ip` is exact (after a signal frame): look it up as is, not at
    /// `ip - 1`.
    exact: u64,
    /// The walk followed frame pointers out of a file whose table tracerd
    /// has not named ([`tracer_common::unwind::UNWIND_FILE_PENDING`]): if it ends at a zero
    /// return address it is cut, not complete (code built without frame
    /// pointers ends a chain early).
    guessed: u64,
    /// How the walk ended: 0 running or complete, [`CUT_NO_MAPPING`],
    /// [`CUT_STOPPED`] or [`unwind::CUT_LIMIT`].
    cut: u64,
    /// The two hashes of the frames recorded so far (the stack's id and
    /// its check).
    id: u64,
    check: u64,
    /// The mapping of the last frame, + 1 (0: none yet): a caller is most
    /// often in the same file, and checking it first saves the search.
    last_mapping: u64,
    /// The two words [`read::read_words`] read last.
    read: [u64; 2],
    /// The last mapping found in the kernel's VMAs ([`crate::vma::lookup`]) in
    /// this walk (`end` 0: none yet): the frames of a file PROC_MAPS does
    /// not hold are most often next to each other.
    vma: ProcMapping,
    /// A copy of user memory from `window_base` (8-aligned), `window_len`
    /// bytes of it valid (0: none yet in this walk): one read of the stack
    /// serves the frames it holds ([`read::read_words`]).
    window_base: u64,
    window_len: u64,
    window: [u64; WINDOW_WORDS],
    /// This CPU's cache of `UNWIND_PAGES`, kept from walk to walk: 64
    /// slots of (check, `first | count << 32`) for the key `file << 32 |
    /// page`, a key's slot by its hash ([`cache::page_slot`]). A page found here
    /// skips the hash lookup ([`unwind::find_row`]).
    ///
    /// Valid across walks because a file's table id is never reused
    /// (tracerd numbers tables from 1 up): the rows of a table tracerd
    /// dropped are looked up by no process's mappings any more.
    ///
    /// Self-validating, because another task's walk on this CPU can write
    /// the same slot between our two stores, or our two reads (and the
    /// cache outlives the walk, so the claim of `STACK_SCRATCH` does not
    /// cover it): the check is the key mixed with the value
    /// ([`cache::slot_check`]), and an entry is used only when the check read
    /// agrees with the value read and the key looked up. A check and a
    /// value of two different entries agree for the check's key only when
    /// the two values are equal (and then the value is right for it), and
    /// for any other key by a chance of 2^-64: a torn entry is a miss, not
    /// another key's value.
    pages: [u64; 2 * PAGE_SLOTS],
    /// This CPU's cache of rows by return address: 128 slots of (check,
    /// the row as a u64) for the key `file << 32 | offset`, kept from walk
    /// to walk, checked as [`Walk::pages`] is (and valid for the same
    /// reasons). The same call sites return again and again: a row found
    /// here skips the page and the search of its rows.
    rows: [u64; 2 * ROW_SLOTS],
}

/// Slots of the per-CPU row cache ([`Walk::rows`]).
const ROW_SLOTS: usize = 128;

/// Words of the walk's window of user stack ([`Walk::window`]).
const WINDOW_WORDS: usize = STACK_WINDOW_BYTES as usize / 8;

/// Slots of the per-CPU page cache ([`Walk::pages`]).
const PAGE_SLOTS: usize = 64;

// The walk's parts, declared here, between the walk's state and the store:
// the order of the crate's definitions is the order of LLVM's functions,
// hence the order in which they are inlined, and with it the layout of the
// programs' stack frames. Here they keep the order they had in one file.
mod cache;
mod read;
mod unwind;

/// Stores the walked stack `words` (first word `check`) as `id`, new to
/// STACKS, and counts it in the process's `stacks`: whether STACKS holds
/// this stack under `id` now (false: full, or another stack holds the id),
/// or None when another task's walk overwrote the scratch meanwhile
/// (counted here).
#[inline(always)]
fn store_new(id: u64, words: &[u64; STACK_WORDS], check: u64, stacks: *mut u64) -> Option<bool> {
    match STACKS.insert(id, words, BPF_NOEXIST as u64) {
        Ok(()) => {
            // Another task's walk may have written the scratch while it
            // was copied: then what was stored is not this stack.
            // SAFETY: words is this CPU's scratch, read once.
            if unsafe { core::ptr::read_volatile(&raw const words[0]) } != check {
                let _ = STACKS.remove(id);
                count(Counter::DropStackPreempted);
                return None;
            }
            fetch_add(stacks, 1);
            if let Some(held) = STACKS_HELD.get_ptr_mut(0) {
                fetch_add(held, 1);
            }
            Some(true)
        }
        // Another CPU stored the same id meanwhile: check it as above.
        Err(e) if e == -EEXIST => Some(match STACKS.get_ptr(id) {
            // SAFETY: a STACKS value holds at least its first word.
            Some(stored) => (unsafe { (*stored)[0] }) == check,
            None => false,
        }),
        Err(_) => Some(false),
    }
}

/// Whether a process holding `held` stacks may store no new one
/// ([`tracer_common::stack_share_refuses`], with the stacks in STACKS
/// from `STACKS_HELD`).
#[inline(always)]
fn past_share(held: u64) -> bool {
    let (reserve_from, capacity) = globals::stacks_reserve();
    // SAFETY: slot 0 of STACKS_HELD, changed only atomically.
    let stored = match STACKS_HELD.get_ptr(0) {
        Some(stored) => unsafe { core::ptr::read_volatile(stored) },
        None => 0,
    };
    stack_share_refuses(
        held,
        stored,
        globals::process_max_stacks(),
        reserve_from,
        capacity,
    )
}

#[inline(always)]
fn drop_stack() -> u64 {
    count(Counter::DropStack);
    STACK_ID_NONE
}
