//! Anonymous mappings as blocks of source `mmap`: a traced image's own
//! `mmap`, `munmap` and `mremap`, seen at each system call's exit, where the
//! result is known and the task's saved user registers
//! (`bpf_task_pt_regs`) still hold the arguments and the user stack.
//!
//! A mapping is a live block at its start address ([`crate::live`]), of its
//! length rounded up to pages, with the stack of the call; the start is also
//! kept in a slot of the process's `MMAP_REGIONS` page for that 64 MiB of
//! address space (`tracer_common::MmapPageKey`), so that an `munmap` of any
//! part of it finds it (looking at the pages where a mapping reaching into
//! the range can start, from the range's start less the image's longest
//! mapping): an unmapped prefix or suffix shrinks the block, a
//! hole in the middle splits it in two (the second keeps the stack), an
//! `mremap` moves or resizes it (the block takes the `mremap`'s stack, as a
//! `realloc` takes its caller's).
//!
//! Not recorded: a mapping made inside a probed allocator call (the
//! allocator's own, whose blocks the allocator's probes record: never
//! counted twice; an `munmap` there still takes out what it covers, as
//! when a call that could not be recorded in flight mapped what a later
//! call unmaps); file and `PROT_NONE` mappings (reservations, no memory);
//! `MAP_STACK` (thread stacks); `MAP_FIXED` (it replaces part of a mapping
//! already there: the dynamic loader's `.bss`, an allocator committing its
//! reservation), which only unmaps what it replaces; images with no
//! allocator call recorded yet (an image starts at its fork or exec: the
//! dynamic loader's mappings at start, made before its first allocation,
//! are not the program's); and
//! mappings made before tracerd has written the image's mappings in
//! `PROC_MAPS` (its first few hundred milliseconds): until then its stacks
//! would be walked by frame pointers, which skip the caller of the C
//! library's system call wrapper; and an allocator linked into the
//! executable is not probed yet in its first milliseconds, when its own
//! mappings (mimalloc reserves 1 GiB at its first allocation) would look
//! like the program's.
//!
//! The unmap (an `munmap` taking out what it covers, cutting what it
//! covers in part) is a file of its own, [`mod@unmap`].

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, pt_regs},
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_loop, bpf_task_pt_regs},
    },
};
use tracer_common::{
    Counter, FAMILY_MMAP, MMAP_REGION_SLOTS, MmapPageKey, MmapRegions, ProcStats, mmap_page,
};
use unmap::unmap;

use crate::{
    atomic::{compare_exchange, fetch_add, fetch_or},
    counters::count,
    globals::{current_in_scope, page_size},
    inflight::in_call,
    live::record_block,
    maps::{EEXIST, MMAP_EMPTY, MMAP_REGIONS},
    procs::{find_proc, mmap_max_len_counter, mmap_pages_word, raise_peak},
    stack::{UserRegs, has_mappings},
};

/// `mmap(2)` flags (x86-64).
const MAP_FIXED: u64 = 0x10;
const MAP_ANONYMOUS: u64 = 0x20;
const MAP_STACK: u64 = 0x2_0000;
/// `PROT_EXEC` of mmap(2).
const PROT_EXEC: u64 = 4;
/// The first errno a system call returns (as `-errno`); results above
/// `-MAX_ERRNO` as unsigned are errors.
const MAX_ERRNO: i64 = 4095;

/// A traced image: its totals and generation ([`find_proc`]).
type Image = (*mut ProcStats, u32);

/// Whether a system call's result `ret` is an errno (`-MAX_ERRNO..0`).
#[inline(always)]
fn is_errno(ret: i64) -> bool {
    ret < 0 && ret >= -MAX_ERRNO
}

/// The calling task's saved user registers (`bpf_task_pt_regs`), to be read
/// by `bpf_probe_read_kernel`.
#[inline(always)]
fn saved_regs() -> *const pt_regs {
    // SAFETY: helpers with no preconditions but a valid task, which the
    // first returns.
    unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs }
}

/// The system call's arguments 0 to 4 (`rdi`, `rsi`, `rdx`, `r10`, `r8`)
/// and the user registers a stack walk starts from, read from the task's
/// saved registers.
#[inline(always)]
fn syscall_regs() -> Option<(UserRegs, [u64; 5])> {
    // SAFETY: the registers are copied out by a checked read.
    let regs = unsafe { bpf_probe_read_kernel(saved_regs()).ok()? };
    Some((
        UserRegs {
            ip: regs.rip,
            rsp: regs.rsp,
            rbp: regs.rbp,
        },
        [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8],
    ))
}

/// The system call's first two arguments (`rdi`, `rsi`), read from the
/// task's saved registers: two words, where [`syscall_regs`] copies all of
/// them (168 bytes of the program's stack, which the unmap program, whose
/// calls nest four deep, cannot spare).
#[inline(always)]
fn syscall_args01() -> Option<[u64; 2]> {
    /// `rsi` and `rdi`, adjacent in x86-64's `pt_regs`.
    #[repr(C)]
    struct SiDi {
        rsi: u64,
        rdi: u64,
    }
    const _: () =
        assert!(core::mem::offset_of!(pt_regs, rdi) == core::mem::offset_of!(pt_regs, rsi) + 8);
    // SAFETY: a checked read of two words within pt_regs.
    let args = unsafe {
        let at = saved_regs()
            .cast::<u8>()
            .add(core::mem::offset_of!(pt_regs, rsi));
        bpf_probe_read_kernel(at.cast::<SiDi>()).ok()?
    };
    Some([args.rdi, args.rsi])
}

/// The calling thread's image when it is traced, and whether the thread is
/// inside a probed allocator call (whose mappings are the allocator's:
/// never recorded, but still taken out of what was recorded, as when a
/// call that could not be recorded in flight mapped a block that a later
/// call unmaps).
#[inline(always)]
fn traced_caller() -> Option<(u32, Image, bool)> {
    let (id, tgid) = current_in_scope()?;
    let image = find_proc(tgid)?;
    Some((tgid, image, in_call(id, user_sp)))
}

/// The calling thread's user stack pointer at its system call (0 if it
/// cannot be read).
#[inline(always)]
fn user_sp() -> u64 {
    // SAFETY: a checked read of one word within pt_regs.
    unsafe {
        let at = saved_regs()
            .cast::<u8>()
            .add(core::mem::offset_of!(pt_regs, rsp));
        bpf_probe_read_kernel(at.cast::<u64>()).unwrap_or(0)
    }
}

/// `len` rounded up to whole pages (the kernel maps and unmaps pages; it
/// refuses a length that would wrap, so the result of a call that
/// succeeded never does).
#[inline(always)]
fn pages(len: u64) -> u64 {
    let mask = page_size().wrapping_sub(1);
    len.wrapping_add(mask) & !mask
}

/// Whether the image whose totals are `stats` has had an allocator call
/// recorded (its dynamic loader's start is over, its allocators probed).
#[inline(always)]
fn allocated(stats: *mut ProcStats) -> bool {
    // SAFETY: a word of the image's totals, changed only atomically.
    unsafe { core::ptr::read_volatile(&raw const (*stats).allocs) != 0 }
}

/// Whether the image whose totals are `stats` holds any anonymous mapping
/// (a page of `MMAP_REGIONS`): most do not, and skip the rest.
#[inline(always)]
fn has_regions(stats: *mut ProcStats) -> bool {
    let mut any = 0;
    for word in 0..4 {
        // SAFETY: a word of the image's totals, changed only atomically.
        any |= unsafe { core::ptr::read_volatile(mmap_pages_word(stats, word)) };
    }
    any != 0
}

/// The page of `MMAP_REGIONS` of image (`stats`, `generation`) of `tgid` that
/// holds the mappings starting in `start`'s 64 MiB of address space; when
/// `create`, made (or taken over from an earlier image of the pid) if
/// there is none, and named in the image's totals.
#[inline(always)]
fn page_of(
    tgid: u32,
    (stats, generation): Image,
    start: u64,
    create: bool,
) -> Option<*mut MmapRegions> {
    let page = page_lookup(tgid, stats, generation, start, create);
    (!page.is_null()).then_some(page)
}

/// [`page_of`], null for none: a BPF function of its own, not inlined (its
/// branches would multiply the states the verifier follows through the
/// stack walk of the `mmap` exit), whose result fits a register.
#[inline(never)]
fn page_lookup(
    tgid: u32,
    stats: *mut ProcStats,
    generation: u32,
    start: u64,
    create: bool,
) -> *mut MmapRegions {
    let page = mmap_page(start);
    let key = MmapPageKey { tgid, page };
    if let Some(regions) = MMAP_REGIONS.get_ptr_mut(&key) {
        // SAFETY: a MMAP_REGIONS value.
        if unsafe { (*regions).generation } == generation {
            return regions;
        }
    }
    if !create {
        return core::ptr::null_mut();
    }
    // The value is copied from an all-zero map value: it is too large for
    // the program's stack.
    let Some(empty) = MMAP_EMPTY.get(0) else {
        return core::ptr::null_mut();
    };
    // An entry of an earlier image of the pid (its end was not seen: its
    // generation is another, never 0) is replaced; one that another thread
    // of this image has just made (generation 0 until it writes it, or
    // this one) is kept.
    match MMAP_REGIONS.insert(&key, empty, BPF_NOEXIST as u64) {
        Ok(()) => {}
        Err(e) if e == -EEXIST => {
            let Some(regions) = MMAP_REGIONS.get_ptr_mut(&key) else {
                return core::ptr::null_mut();
            };
            // SAFETY: a MMAP_REGIONS value.
            let found = unsafe { (*regions).generation };
            if found != 0 && found != generation && MMAP_REGIONS.insert(&key, empty, 0).is_err() {
                return core::ptr::null_mut();
            }
        }
        Err(_) => return core::ptr::null_mut(),
    }
    let Some(regions) = MMAP_REGIONS.get_ptr_mut(&key) else {
        return core::ptr::null_mut();
    };
    // SAFETY: a MMAP_REGIONS value; another thread creating it at the same
    // moment writes the same generation.
    unsafe { (*regions).generation = generation };
    fetch_or(mmap_pages_word(stats, page / 64), 1 << (page % 64));
    regions
}

/// Slots a mapping's start may take in its page of `MMAP_REGIONS`: from the
/// one its address hashes to, this many on (wrapping).
const PROBE_WINDOW: usize = 32;

/// Slot `i` of `regions`' window for `start` ([`PROBE_WINDOW`]).
#[inline(always)]
fn window_slot(regions: *mut MmapRegions, start: u64, i: usize) -> *mut u64 {
    let home = ((start >> 12).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize;
    let index = home.wrapping_add(i) & (MMAP_REGION_SLOTS - 1);
    // SAFETY: a MMAP_REGIONS value; index is in bounds.
    unsafe { (&raw mut (*regions).starts).cast::<u64>().add(index) }
}

/// What [`claim_slot`] and [`release_slot`] hand to each step of their
/// loop over a window.
struct SlotSearch {
    regions: *mut MmapRegions,
    start: u64,
    found: bool,
}

/// Runs `step` over the window of `start` in `regions` until it stops
/// (returns 1); whether it found what it looked for. A callback, so that
/// the verifier checks the loop once.
#[inline(always)]
fn search_window(
    regions: *mut MmapRegions,
    start: u64,
    step: extern "C" fn(u64, *mut c_void) -> i64,
) -> bool {
    let mut search = SlotSearch {
        regions,
        start,
        found: false,
    };
    run_loop(PROBE_WINDOW as u32, step, &mut search);
    search.found
}

/// Calls `step(i, state)` for i from 0 until `n` or until it returns 1
/// (`bpf_loop`): each step is a callback the verifier checks once, and
/// `state` is how it reads and returns what it needs.
#[inline(always)]
fn run_loop<T>(n: u32, step: extern "C" fn(u64, *mut c_void) -> i64, state: &mut T) {
    // SAFETY: bpf_loop calls step at most n times with the pointer to
    // `state`, which lives on this stack for the call's duration.
    unsafe {
        bpf_loop(n, step as *mut c_void, (state as *mut T).cast(), 0);
    }
}

/// One slot of [`claim_slot`]'s window: claimed if free.
extern "C" fn claim_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the SlotSearch that search_window handed to bpf_loop.
    let search = unsafe { &mut *(ctx as *mut SlotSearch) };
    let slot = window_slot(search.regions, search.start, index as usize);
    // SAFETY: a slot of a MMAP_REGIONS value, changed only by
    // compare-and-swap.
    if unsafe { core::ptr::read_volatile(slot) } == 0
        && compare_exchange(slot, 0, search.start) == 0
    {
        search.found = true;
        return 1;
    }
    0
}

/// One slot of [`release_slot`]'s window: freed if it holds the start.
extern "C" fn release_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: as in claim_step.
    let search = unsafe { &mut *(ctx as *mut SlotSearch) };
    let slot = window_slot(search.regions, search.start, index as usize);
    if compare_exchange(slot, search.start, 0) == search.start {
        search.found = true;
        return 1;
    }
    0
}

/// Claims a free slot for a mapping of `tgid`'s image at `start`, in the
/// window of its page (made if need be).
#[inline(always)]
fn claim_slot(tgid: u32, image: Image, start: u64) -> bool {
    match page_of(tgid, image, start, true) {
        Some(regions) => search_window(regions, start, claim_step),
        None => false,
    }
}

/// Frees the slot that holds `start` among the mappings of `tgid`'s
/// image, if one does (in its window: a slot is looked for there whatever
/// the slots before it hold, so that freeing one never hides another).
#[inline(always)]
fn release_slot(tgid: u32, image: Image, start: u64) {
    if let Some(regions) = page_of(tgid, image, start, false) {
        search_window(regions, start, release_step);
    }
}

/// A mapping of the image that could not be kept: counted as a drop.
#[inline(always)]
fn drop_region(stats: *mut ProcStats) {
    count(Counter::DropMmapRegions);
    // SAFETY: a PROCS value; its counters change only atomically.
    fetch_add(unsafe { &raw mut (*stats).drops }, 1);
}

/// Records the new mapping (`start`, `len` bytes) of `tgid`'s image as a
/// block with the stack walked from `regs`.
#[inline(always)]
fn add_region(regs: UserRegs, tgid: u32, image: Image, start: u64, len: u64) {
    let stats = image.0;
    if !claim_region(tgid, stats, image.1, start, len) {
        drop_region(stats);
        return;
    }
    if record_block::<false>(regs, image, tgid, (start, len), FAMILY_MMAP) {
        count(Counter::MmapRegions);
    } else {
        release_slot(tgid, image, start);
    }
}

/// Claims a slot for the new mapping (`start`, `len` bytes) of image
/// (`stats`, `generation`) of `tgid`, and raises the image's longest mapping to
/// `len` before the block is there (so that an `munmap` that finds the
/// block reaching into its range looks back far enough); false when no
/// slot is free.
///
/// Not inlined, as [`page_of`].
#[inline(never)]
fn claim_region(tgid: u32, stats: *mut ProcStats, generation: u32, start: u64, len: u64) -> bool {
    if !claim_slot(tgid, (stats, generation), start) {
        return false;
    }
    raise_peak(mmap_max_len_counter(stats), len);
    true
}

// The unmap, here where its code was in one file: see `crate::stack` on
// the order of definitions.
mod unmap;

/// x86-64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
const SYS_MMAP: i32 = 9;
const SYS_MUNMAP: i32 = 11;
const SYS_MREMAP: i32 = 25;

/// What a program does after [`mapped`]: nothing more, or tail-call the
/// unmap program (a `MAP_FIXED` mapping replaced what it covers).
#[derive(PartialEq, Eq)]
pub(crate) enum Then {
    Done,
    Unmap,
}

/// At the exit of `mmap`, and of an `mremap` whose old range held a block
/// (result `ret`; system call `nr`): the new anonymous mapping of a traced
/// image becomes a block, with the stack of the call (the `mremap`'s block
/// takes it, as a `realloc`'s takes its caller's). A `MAP_FIXED` one only
/// unmaps what it replaced: [`Then::Unmap`].
#[inline(always)]
pub(crate) fn mapped(nr: i32, ret: i64) -> Then {
    if is_errno(ret) || nr != SYS_MMAP && nr != SYS_MREMAP {
        return Then::Done;
    }
    let Some((tgid, image, in_call)) = traced_caller() else {
        return Then::Done;
    };
    let moved = nr == SYS_MREMAP;
    // A new mapping is recorded only once the image has allocated and
    // tracerd has its mappings (see the module doc); a MAP_FIXED one
    // unmaps what it replaced. An image starts at its exec now: without
    // the first condition, the dynamic loader's own mappings at start were
    // recorded whenever tracerd wrote the mappings before the loader made
    // them (1, 2 or none of them: a program's runs counted differently).
    // An allocator's own mremap moves only its own mappings: none of them
    // is a block of this source.
    let settled = !moved && !in_call && allocated(image.0) && has_mappings(tgid, image.1);
    if moved && in_call || !moved && !settled && !has_regions(image.0) {
        return Then::Done;
    }
    let Some((regs, [_, len, arg2, flags, _])) = syscall_regs() else {
        return Then::Done;
    };
    // mmap's third argument is its protection, mremap's its new length.
    let len = if moved {
        pages(arg2)
    } else if flags & MAP_FIXED != 0 {
        return Then::Unmap;
    } else if !settled || flags & MAP_ANONYMOUS == 0 || flags & MAP_STACK != 0 || arg2 == 0 {
        return Then::Done;
    } else {
        pages(len)
    };
    if len != 0 {
        add_region(regs, tgid, image, ret as u64, len);
    }
    Then::Done
}

/// A tail call between the anonymous-mapping programs that failed (a
/// slot of `MMAP_PROGRAMS` tracerd did not fill): the call's change to the
/// mappings is lost, counted as a mapping not kept, in the calling image's
/// drops too (its answers are then incomplete), as [`drop_region`] counts.
#[inline(always)]
pub(crate) fn chain_failed() {
    match traced_caller() {
        Some((_, (stats, _), _)) => drop_region(stats),
        None => count(Counter::DropMmapRegions),
    }
}

/// At the exit of `mmap` (result `ret`): whether the call mapped a file's
/// code (`PROT_EXEC`, not anonymous, a file descriptor given), read from
/// the task's saved registers.
#[inline(always)]
pub(crate) fn mapped_code(ret: i64) -> bool {
    if is_errno(ret) {
        return false;
    }
    let Some((_, [_, _, prot, flags, fd])) = syscall_regs() else {
        return false;
    };
    // An anonymous mapping's fd is -1 (as an unsigned long).
    prot & PROT_EXEC != 0 && flags & MAP_ANONYMOUS == 0 && (fd as i64) >= 0
}

/// At the exit of `munmap`, of `mremap`, and of a `MAP_FIXED` `mmap`
/// (result `ret`; system call `nr`): the blocks of a traced image in the
/// range the call unmapped lose that part. Returns the bytes of blocks it
/// covered: an `mremap` that covered some records its new mapping next
/// ([`mapped`], tail-called).
#[inline(always)]
pub(crate) fn unmapped(nr: i32, ret: i64) -> u64 {
    if is_errno(ret) {
        return 0;
    }
    let Some((tgid, image, in_call)) = traced_caller() else {
        return 0;
    };
    // An allocator's own mremap moves only its own mappings (see
    // `mapped`). Most processes hold no mapping: no need to read the
    // registers.
    if nr == SYS_MREMAP && in_call || !has_regions(image.0) {
        return 0;
    }
    let Some([addr, len]) = syscall_args01() else {
        return 0;
    };
    // munmap's and mremap's range starts at their first argument, a
    // MAP_FIXED mapping's at its result.
    let start = match nr {
        SYS_MMAP => ret as u64,
        SYS_MUNMAP | SYS_MREMAP => addr,
        _ => return 0,
    };
    unmap(tgid, image, start, start.wrapping_add(pages(len)))
}

/// Whether system call `nr` is `mremap` (whose unmap is followed by its
/// new mapping).
#[inline(always)]
pub(crate) fn is_mremap(nr: i32) -> bool {
    nr == SYS_MREMAP
}
