//! The walk of a user stack: one frame after another with the unwind
//! tables tracerd compiles from each file's CFI (`tracer_common::unwind`
//! has the rules: a CFA row, a PLT stub, a signal frame), by frame
//! pointers where no table covers an address, and by frame pointers alone
//! for a process whose mappings tracerd has not written; and the lookup of
//! the row in force at an address (`UNWIND_PAGES`, `UNWIND_ROWS`).

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_probe_read_user, generated::bpf_loop};
use tracer_common::{
    Counter, MAX_WALK_FRAMES, STACK_WORDS, stack_check_frame,
    unwind::{
        MAX_PROC_MAPPINGS, ProcMappings, SIGFRAME_RBP, UNWIND_CFA_RBP, UNWIND_CFA_RSP, UNWIND_END,
        UNWIND_FILE_NONE, UNWIND_FILE_PENDING, UNWIND_PAGE_SHIFT, UNWIND_PLT, UNWIND_SIGNAL,
        UNWIND_UNKNOWN, UnwindPage, UnwindPageKey, UnwindRow,
    },
};

use super::{
    PAGE_SLOTS, Walk,
    cache::{cached_row, page_slot, slot_check},
    read::read_words,
};
use crate::{
    counters::{count, count_n},
    maps::{STACK_SCRATCH, UNWIND_PAGES, UNWIND_ROWS, WALK_SCRATCH},
    vma,
};

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

/// How a walk ended ([`Walk::cut`]): no mapping holds the frame, no step
/// could be taken (an unreadable frame, a table's end or a frame pointer out
/// of place), or `limit` frames were reached.
pub(super) const CUT_NO_MAPPING: u64 = 1;
pub(super) const CUT_STOPPED: u64 = 2;
const CUT_LIMIT: u64 = 3;

/// Walks with the unwind tables (`tracer_common::unwind` has the rules)
/// into this CPU's scratch; returns the frames written and whether the walk
/// was cut (it could not go on, or reached `limit` frames) rather than
/// ending at the outermost frame.
#[inline(always)]
pub(super) fn unwind(
    maps: *const ProcMappings,
    walk: *mut Walk,
    words: *mut [u64; STACK_WORDS],
    limit: u32,
) {
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
/// rows), unrolled as in [`super::unwind::find_mapping`]; [`UNWIND_UNKNOWN`] when no page
/// of the table holds the offset.
#[inline(always)]
pub(super) fn find_row(walk: &mut Walk, file: u32, offset: u64) -> UnwindRow {
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
pub(super) fn walk_frame_pointers() {
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
