//! The walk's reads of user memory: two words at a time, from the walk's
//! window of the stack ([`Walk::window`]) when it holds them.

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_probe_read_user;
use tracer_common::unwind::{STACK_WINDOW_BYTES, stack_window_index, stack_window_len};

use super::{WINDOW_WORDS, Walk};

/// Reads the two words of user memory at `addr` into `walk.read`; false
/// when they cannot be read. Served from the walk's window of the stack
/// when it holds them; else the window is read anew from `addr`
/// ([`stack_window_len`]), so that the callers' frames above come from the
/// same read.
#[inline(always)]
pub(super) fn read_words(addr: u64, walk: &mut Walk) -> bool {
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
/// [`super::unwind::walk_frame_pointers`] is one: its frame is under 64 bytes, so the
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
