//! User stacks: the frame-pointer walk at an allocator's return, and the
//! store of each distinct stack once in `STACKS`, behind a per-CPU cache of
//! the last stack (`STACK_CACHE`). A block names its stack by id.
//!
//! Protocol. A stack's id is one 64-bit hash of its frames; the stored
//! value's first word is a second, independent hash (the check). A stack is
//! inserted with `BPF_NOEXIST`; a stored value whose check differs is
//! another stack with the same id, and the block gets `STACK_ID_NONE`
//! (counted), never a wrong traceback. tracerd removes stacks no live block
//! names, then raises the stack epoch (`SWITCHES`), which empties every
//! CPU's cache.

use aya_ebpf::{EbpfContext, bindings::BPF_NOEXIST, helpers::bpf_probe_read_user};
use tracer_common::{Counter, MAX_NFRAME, STACK_ID_NONE, STACK_WORDS};

use crate::{
    counters::count,
    globals::{self, switch},
    maps::{EEXIST, STACK_CACHE, STACK_SCRATCH, STACKS},
};

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
pub(crate) fn stack_id<C: EbpfContext>(ctx: &C) -> u64 {
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
