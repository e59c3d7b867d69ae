//! User stacks: the walk at an allocator's return (with the unwind tables
//! tracerd compiles from each file's CFI, frame pointers where none covers
//! an address), and the store of each distinct stack once in `STACKS`,
//! behind a per-CPU cache of the last stack (`STACK_CACHE`). A block names
//! its stack by id.
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

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_loop},
};
use tracer_common::{
    Counter, MAX_WALK_FRAMES, ProcStats, STACK_CHECK_SEED, STACK_ID_NONE, STACK_WORDS,
    stack_check_frame, stack_check_word,
    unwind::{
        MAX_PROC_MAPPINGS, ProcMapping, ProcMappings, SIGFRAME_RBP, STACK_WINDOW_BYTES,
        UNWIND_CFA_RBP, UNWIND_CFA_RSP, UNWIND_END, UNWIND_FILE_NONE, UNWIND_FILE_PENDING,
        UNWIND_PAGE_SHIFT, UNWIND_PLT, UNWIND_SIGNAL, UNWIND_UNKNOWN, UnwindPage, UnwindPageKey,
        UnwindRow, stack_window_index, stack_window_len,
    },
};

use crate::{
    atomic::{compare_exchange, fetch_add},
    counters::{count, count_n},
    globals::{self, switch},
    maps::{
        EEXIST, NO_MAPPINGS, PROC_MAPS, STACK_CACHE, STACK_SCRATCH, STACKS, UNWIND_PAGES,
        UNWIND_ROWS, WALK_SCRATCH,
    },
    procs::{cut_counter, stacks_counter},
    vma,
};

/// Whether tracerd has written the executable mappings of image `gen_` of
/// `tgid` in PROC_MAPS: its stacks are walked with the unwind tables.
#[inline(always)]
pub(crate) fn has_mappings(tgid: u32, gen_: u32) -> bool {
    match PROC_MAPS.get_ptr(tgid) {
        // SAFETY: a PROC_MAPS value, read only.
        Some(maps) => (unsafe { (*maps).gen_ }) == gen_,
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
    if unsafe { (*maps).gen_ } != parent_gen
        || PROC_MAPS.insert(child, unsafe { &*maps }, 0).is_err()
    {
        return;
    }
    if let Some(copy) = PROC_MAPS.get_ptr_mut(child) {
        // SAFETY: the child's new entry; the child does not run yet.
        unsafe { (*copy).gen_ = child_gen };
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
/// `gen_` is the process image's generation: the mappings in PROC_MAPS are
/// used only when they are of that image; otherwise (tracerd has not
/// written them yet, or the unwinder is off) the walk follows frame
/// pointers alone, as the kernel's `bpf_get_stack` does.
#[inline(always)]
pub(crate) fn stack_id(regs: UserRegs, tgid: u32, gen_: u32, stats: *mut ProcStats) -> u64 {
    let (id, lost) = walk_and_store(regs, tgid, gen_, stats);
    if lost || id == STACK_ID_NONE {
        count(Counter::CutTracebacks);
        fetch_add(cut_counter(stats), 1);
    }
    id
}

/// [`stack_id`]'s walk and store: the id (or STACK_ID_NONE), and whether
/// the walk stopped before the outermost frame for want of mappings or
/// readable memory (a walk that reached its frames' limit is whole as far
/// as nframe asks).
#[inline(always)]
fn walk_and_store(regs: UserRegs, tgid: u32, gen_: u32, stats: *mut ProcStats) -> (u64, bool) {
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
    let UserRegs { ip, rsp, rbp } = regs;
    // SAFETY: buf is this CPU's scratch value of STACK_WORDS u64s.
    let words = unsafe { &mut *buf };
    // The scratches are ours while this word is our thread id; written
    // before the walk's state, so that a task that overwrites that state
    // has overwritten this word first.
    let owner = bpf_get_current_pid_tgid() | (1 << 62);
    // SAFETY: as above; volatile so the store is not merged with later ones.
    unsafe { core::ptr::write_volatile(&raw mut words[0], owner) };
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
    match PROC_MAPS.get_ptr(tgid) {
        // SAFETY: a PROC_MAPS value, read only.
        Some(maps) if unsafe { (*maps).gen_ } == gen_ => unwind(maps, walk, buf, limit),
        // Not written yet (or of an earlier image): every address is
        // looked up in the kernel's own VMAs.
        _ => match NO_MAPPINGS.get_ptr(0) {
            Some(none) if vma::enabled() => {
                count(Counter::UnwindVmaWalks);
                unwind(none, walk, buf, limit);
            }
            _ => {
                count(Counter::UnwindNoProcMaps);
                walk_frame_pointers();
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
            let max = globals::process_max_stacks();
            // SAFETY: a PROCS value's counter, changed only atomically.
            if max != 0 && unsafe { core::ptr::read_volatile(stacks) } >= max {
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
/// checks [`unwind_step`] once rather than once per frame. Another task on
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
    /// has not named ([`UNWIND_FILE_PENDING`]): if it ends at a zero
    /// return address it is cut, not complete (code built without frame
    /// pointers ends a chain early).
    guessed: u64,
    /// How the walk ended: 0 running or complete, [`CUT_NO_MAPPING`],
    /// [`CUT_STOPPED`] or [`CUT_LIMIT`].
    cut: u64,
    /// The two hashes of the frames recorded so far (the stack's id and
    /// its check).
    id: u64,
    check: u64,
    /// The mapping of the last frame, + 1 (0: none yet): a caller is most
    /// often in the same file, and checking it first saves the search.
    last_mapping: u64,
    /// The two words [`read_words`] read last.
    read: [u64; 2],
    /// The last mapping found in the kernel's VMAs ([`vma::lookup`]) in
    /// this walk (`end` 0: none yet): the frames of a file PROC_MAPS does
    /// not hold are most often next to each other.
    vma: ProcMapping,
    /// A copy of user memory from `window_base` (8-aligned), `window_len`
    /// bytes of it valid (0: none yet in this walk): one read of the stack
    /// serves the frames it holds ([`read_words`]).
    window_base: u64,
    window_len: u64,
    window: [u64; WINDOW_WORDS],
    /// This CPU's cache of `UNWIND_PAGES`, kept from walk to walk: 64
    /// slots of (check, `first | count << 32`) for the key `file << 32 |
    /// page`, a key's slot by its hash ([`page_slot`]). A page found here
    /// skips the hash lookup ([`find_row`]).
    ///
    /// Valid across walks because a file's table id is never reused
    /// (tracerd numbers tables from 1 up): the rows of a table tracerd
    /// dropped are looked up by no process's mappings any more.
    ///
    /// Self-validating, because another task's walk on this CPU can write
    /// the same slot between our two stores, or our two reads (and the
    /// cache outlives the walk, so the claim of `STACK_SCRATCH` does not
    /// cover it): the check is the key mixed with the value
    /// ([`slot_check`]), and an entry is used only when the check read
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

/// The row in force at `offset` of `file`, from this CPU's row cache
/// ([`Walk::rows`]) or [`find_row`] (then cached). Offsets past 4 GiB are
/// not cached.
#[inline(always)]
fn cached_row(walk: &mut Walk, file: u32, offset: u64) -> UnwindRow {
    if offset > u64::from(u32::MAX) {
        return find_row(walk, file, offset);
    }
    let packed = (u64::from(file) << 32) | offset;
    let slot = ((packed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 57) as usize & (ROW_SLOTS - 1)) * 2;
    let (check_at, value_at) = (
        &raw mut walk.rows[slot & (2 * ROW_SLOTS - 1)],
        &raw mut walk.rows[(slot + 1) & (2 * ROW_SLOTS - 1)],
    );
    // SAFETY: words of this CPU's WALK_SCRATCH value; volatile, each read
    // once (the protocol of `Walk::pages`).
    let (check, mut value) = unsafe {
        (
            core::ptr::read_volatile(check_at),
            core::ptr::read_volatile(value_at),
        )
    };
    if check != slot_check(packed, value) {
        let row = find_row(walk, file, offset);
        value = u64::from(row.pc)
            | (u64::from(row.kind) << 16)
            | (u64::from(row.rbp_slot as u8) << 24)
            | (u64::from(row.cfa_offset as u32) << 32);
        // SAFETY: as above.
        unsafe {
            core::ptr::write_volatile(value_at, value);
            core::ptr::write_volatile(check_at, slot_check(packed, value));
        }
    }
    UnwindRow {
        pc: value as u16,
        kind: (value >> 16) as u8,
        rbp_slot: (value >> 24) as u8 as i8,
        cfa_offset: (value >> 32) as u32 as i32,
    }
}

/// Slots of the per-CPU page cache ([`Walk::pages`]).
const PAGE_SLOTS: usize = 64;

/// The slot of page key `packed` in [`Walk::pages`].
#[inline(always)]
fn page_slot(packed: u64) -> usize {
    (packed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize & (PAGE_SLOTS - 1)
}

/// The check word of a cache slot ([`Walk::pages`], [`Walk::rows`]) that
/// holds `value` for `key`: the key xor a bijective mix of the value
/// (xor-shift, multiply by an odd constant, xor-shift: each step is a
/// bijection, so two values mix alike only when they are equal). An
/// all-zero slot holds key 0 (table 0, `UNWIND_FILE_NONE`), which is never
/// looked up.
#[inline(always)]
fn slot_check(key: u64, value: u64) -> u64 {
    let mixed = (value ^ (value >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    key ^ mixed ^ (mixed >> 29)
}

/// Reads the two words of user memory at `addr` into `walk.read`; false
/// when they cannot be read. Served from the walk's window of the stack
/// when it holds them; else the window is read anew from `addr`
/// ([`stack_window_len`]), so that the callers' frames above come from the
/// same read.
#[inline(always)]
fn read_words(addr: u64, walk: &mut Walk) -> bool {
    if let Some(at) = stack_window_index(walk.window_base, walk.window_len, addr) {
        walk.read = [
            walk.window[at & (WINDOW_WORDS - 1)],
            walk.window[(at + 1) & (WINDOW_WORDS - 1)],
        ];
        return true;
    }
    if read_window(addr, walk) {
        walk.read = [walk.window[0], walk.window[1]];
        return true;
    }
    read_user_words(addr, walk)
}

/// Reads the walk's window from `addr`, [`stack_window_len`] bytes; false
/// (and no window) when that is none or the read fails.
#[inline(never)]
fn read_window(addr: u64, walk: *mut Walk) -> bool {
    // Bounded again where the verifier sees it: at most the window's size.
    let len = stack_window_len(addr) & (2 * STACK_WINDOW_BYTES - 1);
    // SAFETY: this CPU's WALK_SCRATCH value.
    unsafe { (*walk).window_len = 0 };
    if len == 0 || len > STACK_WINDOW_BYTES {
        return false;
    }
    // SAFETY: the destination is the window, of STACK_WINDOW_BYTES >= len
    // bytes; bpf_probe_read_user checks the user address itself.
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            (&raw mut (*walk).window).cast(),
            len as u32,
            addr as *const c_void,
        )
    };
    if read != 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe {
        (*walk).window_base = addr;
        (*walk).window_len = len;
    }
    true
}

/// Reads the two words of user memory at `addr` into `walk.read` with a
/// read of their own; false when they cannot be read.
///
/// A BPF subprogram of its own, not inlined, for the reason
/// [`walk_frame_pointers`] is one: its frame is under 64 bytes, so the
/// read lands on the task's kernel stack even in a program that has a
/// private stack (the tracepoints'), where hardened usercopy's check of
/// the destination ends at once; into a per-CPU private stack, the check
/// walks the heap's areas.
#[inline(never)]
fn read_user_words(addr: u64, walk: *mut Walk) -> bool {
    // SAFETY: bpf_probe_read_user checks the user address itself.
    match unsafe { bpf_probe_read_user(addr as *const [u64; 2]) } {
        Ok(words) => {
            // SAFETY: this CPU's WALK_SCRATCH value; word by word, so that
            // the read is not moved into it.
            unsafe {
                core::ptr::write_volatile(&raw mut (*walk).read[0], words[0]);
                core::ptr::write_volatile(&raw mut (*walk).read[1], words[1]);
            }
            true
        }
        Err(_) => false,
    }
}

/// Adds frame `ip` to the walk's two hashes.
#[inline(always)]
fn hash_frame(walk: &mut Walk, ip: u64) {
    walk.id = (walk.id ^ ip).wrapping_mul(0x0000_0100_0000_01b3);
    walk.check = stack_check_frame(walk.check, ip);
}

/// What each [`unwind_step`] gets, on the program's stack: pointers only,
/// the same at every step.
#[repr(C)]
struct WalkRefs {
    /// The process's mappings (a PROC_MAPS value).
    maps: *const ProcMappings,
    /// This CPU's WALK_SCRATCH value.
    walk: *mut Walk,
    /// This CPU's STACK_SCRATCH value.
    words: *mut [u64; STACK_WORDS],
}

const CUT_NO_MAPPING: u64 = 1;
const CUT_STOPPED: u64 = 2;
const CUT_LIMIT: u64 = 3;

/// Walks with the unwind tables (`tracer_common::unwind` has the rules)
/// into this CPU's scratch; returns the frames written and whether the walk
/// was cut (it could not go on, or reached `limit` frames) rather than
/// ending at the outermost frame.
#[inline(always)]
fn unwind(maps: *const ProcMappings, walk: *mut Walk, words: *mut [u64; STACK_WORDS], limit: u32) {
    let mut refs = WalkRefs { maps, walk, words };
    // SAFETY: bpf_loop calls unwind_step with a pointer to `refs`, on this
    // stack, at most `limit` times (each records at most one frame).
    unsafe {
        bpf_loop(
            limit,
            unwind_step as *mut c_void,
            &raw mut refs as *mut c_void,
            0,
        );
    }
    // SAFETY: this CPU's WALK_SCRATCH value.
    let walk = unsafe { &*walk };
    count_n(Counter::UnwindTableFrames, walk.table_frames);
    if walk.fp_frames != 0 {
        count_n(Counter::UnwindFpFrames, walk.fp_frames);
    }
    match walk.cut {
        CUT_NO_MAPPING => count(Counter::UnwindNoMapping),
        CUT_STOPPED => count(Counter::UnwindStopped),
        _ => {}
    }
}

/// One frame of a table-driven walk: records `walk.ip` if it lies in an
/// executable mapping of the process, then steps to its caller. Returns 0
/// to go on, 1 to stop (the bpf_loop contract).
///
/// Iteration `index` records frame `index`: every iteration but the last
/// records one frame.
extern "C" fn unwind_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the WalkRefs that `unwind` handed to bpf_loop; its
    // pointers are map values, alive while the program runs.
    let (maps, walk, buf) = unsafe {
        let refs = &*(ctx as *const WalkRefs);
        (&*refs.maps, &mut *refs.walk, refs.words)
    };
    let ip = walk.ip;
    let last =
        maps.mappings[(walk.last_mapping.wrapping_sub(1) as usize) & (MAX_PROC_MAPPINGS - 1)];
    let mapping = if walk.last_mapping != 0 && last.start <= ip && ip < last.end {
        last
    } else if let Some(index) = find_mapping(maps, ip) {
        walk.last_mapping = index as u64 + 1;
        maps.mappings[index & (MAX_PROC_MAPPINGS - 1)]
    } else if walk.vma.start <= ip && ip < walk.vma.end {
        walk.vma
    } else if vma::enabled() {
        // Not in PROC_MAPS (not written yet, or mapped since): the
        // kernel's own VMA, under the process's mmap lock.
        count(Counter::UnwindVmaLookups);
        if !vma::lookup(ip, &raw mut walk.vma) {
            count(Counter::UnwindVmaFailed);
            walk.vma.end = 0;
            walk.cut = CUT_NO_MAPPING;
            return 1;
        }
        walk.vma
    } else {
        walk.cut = CUT_NO_MAPPING;
        return 1;
    };
    let n = index as usize;
    if n >= MAX_WALK_FRAMES as usize {
        walk.cut = CUT_LIMIT;
        return 1;
    }
    // SAFETY: this CPU's scratch; 1 + n < STACK_WORDS.
    unsafe { (*buf)[1 + n] = ip };
    walk.n = index + 1;
    hash_frame(walk, ip);

    // The call instruction is before a return address; an interrupted
    // instruction (after a signal frame) is where it is.
    let pc = if walk.exact != 0 {
        ip
    } else {
        ip.wrapping_sub(1)
    };
    walk.exact = 0;
    // A file whose table tracerd has not named yet: stepped with frame
    // pointers (a program built with them walks on, into files with
    // tables), but a chain that ends is not taken for the stack's end.
    walk.guessed |= u64::from(mapping.file == UNWIND_FILE_PENDING);
    let row = if mapping.file == UNWIND_FILE_NONE || mapping.file == UNWIND_FILE_PENDING {
        UnwindRow::default()
    } else {
        cached_row(
            walk,
            mapping.file,
            pc.wrapping_sub(mapping.start)
                .wrapping_add(mapping.file_offset),
        )
    };
    if row.kind == UNWIND_END {
        return 1;
    }
    if index + 1 >= walk.limit {
        walk.cut = CUT_LIMIT;
        return 1;
    }
    let stepped = match row.kind {
        UNWIND_CFA_RSP | UNWIND_CFA_RBP => step_cfa(walk, &row),
        UNWIND_PLT => step_plt(walk, pc, row.cfa_offset as u64),
        UNWIND_SIGNAL => step_signal(walk),
        UNWIND_UNKNOWN => step_frame_pointer(walk),
        _ => false,
    };
    if !stepped {
        if walk.cut == 0 {
            walk.cut = CUT_STOPPED;
        }
        return 1;
    }
    if walk.ip == 0 {
        // A zero return address: nothing called this frame (the end of a
        // frame-pointer chain, or a thread's start), unless the chain went
        // through code of unknown build.
        if walk.guessed != 0 {
            walk.cut = CUT_STOPPED;
        }
        return 1;
    }
    0
}

/// The index of the mapping of `maps` that holds `ip`: the last one starting at or
/// below it, by a branch-free binary search of 8 fixed steps (256
/// mappings), unrolled.
///
/// Fixed steps without a loop counter: the verifier then checks each step
/// once (the two sides of a step join with the same state but for the
/// position, which it need not know exactly), where a searching loop made
/// it follow every path apart.
#[inline(always)]
fn find_mapping(maps: &ProcMappings, ip: u64) -> Option<usize> {
    let count = maps.count as usize;
    // below: mappings known to start at or below ip.
    let mut below = 0usize;
    macro_rules! step {
        ($half:expr) => {
            let candidate = below + $half;
            if candidate <= count
                && maps.mappings[(candidate - 1) & (MAX_PROC_MAPPINGS - 1)].start <= ip
            {
                below = candidate;
            }
        };
    }
    step!(128);
    step!(64);
    step!(32);
    step!(16);
    step!(8);
    step!(4);
    step!(2);
    step!(1);
    if below == 0 {
        return None;
    }
    let index = (below - 1) & (MAX_PROC_MAPPINGS - 1);
    (ip < maps.mappings[index].end).then_some(index)
}

/// The row in force at `offset` of `file`: the last row of the offset's
/// page at or below it (the page's first row is at its offset 0), by a
/// branch-free binary search of 16 fixed steps (a page has at most 65,536
/// rows), unrolled as in [`find_mapping`]; [`UNWIND_UNKNOWN`] when no page
/// of the table holds the offset.
#[inline(always)]
fn find_row(walk: &mut Walk, file: u32, offset: u64) -> UnwindRow {
    let key = UnwindPageKey {
        file,
        page: (offset >> UNWIND_PAGE_SHIFT) as u32,
    };
    let packed = (u64::from(key.file) << 32) | u64::from(key.page);
    let slot = page_slot(packed) * 2;
    let (check_at, value_at) = (
        &raw mut walk.pages[slot & (2 * PAGE_SLOTS - 1)],
        &raw mut walk.pages[(slot + 1) & (2 * PAGE_SLOTS - 1)],
    );
    // SAFETY: words of this CPU's WALK_SCRATCH value; volatile, each read
    // once (the protocol of `Walk::pages`).
    let (check, mut value) = unsafe {
        (
            core::ptr::read_volatile(check_at),
            core::ptr::read_volatile(value_at),
        )
    };
    if check != slot_check(packed, value) {
        // SAFETY: a value of UNWIND_PAGES, copied out at once.
        let Some(page) = (unsafe { UNWIND_PAGES.get(&key) }).copied() else {
            return UnwindRow::default();
        };
        value = u64::from(page.first) | (u64::from(page.count) << 32);
        // SAFETY: as above.
        unsafe {
            core::ptr::write_volatile(value_at, value);
            core::ptr::write_volatile(check_at, slot_check(packed, value));
        }
    }
    let page = UnwindPage {
        first: value as u32,
        count: (value >> 32) as u32,
    };
    let pc = (offset & ((1 << UNWIND_PAGE_SHIFT) - 1)) as u16;
    // at: the last row known to start at or below pc (row 0 starts at 0).
    let mut at = 0u32;
    macro_rules! step {
        ($half:expr) => {
            let candidate = at + $half;
            if candidate < page.count {
                if let Some(row) = UNWIND_ROWS.get(page.first.wrapping_add(candidate)) {
                    if row.pc <= pc {
                        at = candidate;
                    }
                }
            }
        };
    }
    step!(32768);
    step!(16384);
    step!(8192);
    step!(4096);
    step!(2048);
    step!(1024);
    step!(512);
    step!(256);
    step!(128);
    step!(64);
    step!(32);
    step!(16);
    step!(8);
    step!(4);
    step!(2);
    step!(1);
    match UNWIND_ROWS.get(page.first.wrapping_add(at)) {
        Some(row) => *row,
        None => UnwindRow::default(),
    }
}

/// One step by a CFA row: `cfa = rsp|rbp + cfa_offset`, the return address
/// at `cfa - 8`, the caller's `rbp` saved at `cfa + 8 * rbp_slot` (or kept).
#[inline(always)]
fn step_cfa(walk: &mut Walk, row: &UnwindRow) -> bool {
    let base = if row.kind == UNWIND_CFA_RSP {
        walk.rsp
    } else {
        walk.rbp
    };
    let cfa = base.wrapping_add(row.cfa_offset as i64 as u64);
    // The caller's frame is above the callee's.
    if cfa <= walk.rsp || cfa % 8 != 0 {
        return false;
    }
    // The return address and the word below it (the caller's rbp where
    // it was pushed first, the most common place) in one read.
    if !read_words(cfa - 16, walk) {
        return false;
    }
    let (ret, below) = (walk.read[1], walk.read[0]);
    let rbp = match row.rbp_slot {
        -2 => below,
        0 => walk.rbp,
        slot => {
            let at = cfa.wrapping_add((slot as i64 * 8) as u64);
            if !read_words(at, walk) {
                return false;
            }
            walk.read[0]
        }
    };
    walk.ip = ret;
    walk.rsp = cfa;
    walk.rbp = rbp;
    walk.table_frames += 1;
    true
}

/// One step out of a PLT stub: `cfa = rsp + 8`, plus 8 from the stub's
/// `threshold` byte on (the psABI's `.plt` expression).
#[inline(always)]
fn step_plt(walk: &mut Walk, pc: u64, threshold: u64) -> bool {
    let mut cfa = walk.rsp.wrapping_add(8);
    if pc & 15 >= threshold {
        cfa = cfa.wrapping_add(8);
    }
    if !read_words(cfa - 16, walk) {
        return false;
    }
    walk.ip = walk.read[1];
    walk.rsp = cfa;
    walk.table_frames += 1;
    true
}

/// One step out of a signal trampoline: the interrupted code's registers
/// from the `ucontext` at `rsp`; its `ip` is exact. The interrupted `rsp`
/// may be anywhere (an alternate signal stack), so it is not compared.
#[inline(always)]
fn step_signal(walk: &mut Walk) -> bool {
    // rbp at SIGFRAME_RBP, rsp at SIGFRAME_RSP = +40, rip at SIGFRAME_RIP = +48.
    // SAFETY: bpf_probe_read_user checks the user address itself.
    let Ok(regs) = (unsafe { bpf_probe_read_user((walk.rsp + SIGFRAME_RBP) as *const [u64; 7]) })
    else {
        return false;
    };
    walk.rbp = regs[0];
    walk.rsp = regs[5];
    walk.ip = regs[6];
    walk.exact = 1;
    walk.table_frames += 1;
    true
}

/// One frame-pointer step: `[rbp]` is the caller's `rbp`, `[rbp + 8]` the
/// return address. An `rbp` of 0 ends the chain (complete); one that is
/// not above `rsp` or not aligned cuts it.
#[inline(always)]
fn step_frame_pointer(walk: &mut Walk) -> bool {
    let fp = walk.rbp;
    if fp == 0 {
        walk.ip = 0;
        return true;
    }
    if fp < walk.rsp || fp % 8 != 0 {
        return false;
    }
    if !read_words(fp, walk) {
        return false;
    }
    walk.ip = walk.read[1];
    walk.rsp = fp + 16;
    walk.rbp = walk.read[0];
    walk.fp_frames += 1;
    true
}

/// Walks the frame-pointer chain of the user stack from this CPU's
/// WALK_SCRATCH state into its STACK_SCRATCH `words[1..]`: frame 0 is `ip`
/// (at a uretprobe, the return address in the allocator's caller), then
/// the return address of each frame found through the saved `rbp`, at most
/// `limit` in all; the frames and their hashes go to the walk's state. Used
/// for a process whose mappings tracerd has not written (or with the
/// unwinder off): no mapping is checked.
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
fn walk_frame_pointers() {
    let (Some(buf), Some(walk)) = (STACK_SCRATCH.get_ptr_mut(0), WALK_SCRATCH.get_ptr_mut(0))
    else {
        return;
    };
    // SAFETY: this CPU's scratch values.
    let (words, walk) = unsafe { (&mut *buf, &mut *walk) };
    let mut fp = walk.rbp;
    let nframe = walk.limit;
    words[1] = walk.ip;
    hash_frame(walk, walk.ip);
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
        hash_frame(walk, ret);
        fp = if next > fp { next } else { 0 };
    }
    walk.n = n as u64;
}

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

#[inline(always)]
fn drop_stack() -> u64 {
    count(Counter::DropStack);
    STACK_ID_NONE
}
