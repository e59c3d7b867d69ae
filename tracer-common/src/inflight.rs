//! Allocator calls between entry and return: the record an entry program
//! leaves for its return program ([`Inflight`]), and the slot of
//! `INFLIGHT_SLOTS` that holds it ([`InflightSlot`]) when the calling thread
//! owns one.
//!
//! Protocol of a slot: its `owner` goes from 0 to the thread's id by one
//! compare-and-swap at the outermost call's entry, and back to 0, by that
//! thread only, after its return copied the call out (or when the thread
//! exits). A thread whose slot is taken keeps its call in `INFLIGHT`.

use core::mem::size_of;

#[cfg(doc)]
use crate::{MAP_INFLIGHT, MAP_INFLIGHT_SLOTS};

/// Number of slots of [`MAP_INFLIGHT_SLOTS`] as compiled (a power of two);
/// tracerd sets the real number at load time.
pub const INFLIGHT_SLOT_COUNT: u32 = 1 << 16;

/// Value of [`MAP_INFLIGHT`]: an allocator call between entry and return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inflight {
    /// Size in bytes the call would allocate, overflow-checked.
    pub size: u64,
    /// `realloc`/`reallocarray`: the old block; `posix_memalign`: the
    /// `memptr` out-pointer; a call whose return is not run
    /// ([`INFLIGHT_NO_RETURN`]): its return address. 0 otherwise.
    pub ptr: u64,
    /// The user stack pointer at the call's entry (the address of its
    /// return address; at its return the stack pointer is 8 bytes above).
    /// A probed call of the same thread deeper in the stack is nested in
    /// this one (glibc's `realloc` calls `malloc` itself) and not a separate
    /// allocation; one at or above it means this call is over and its
    /// return was not seen (its probes were removed meanwhile).
    pub sp: u64,
    /// [`INFLIGHT_OVERFLOW`] when `n * m` overflowed (`calloc`,
    /// `reallocarray`: the call fails), [`INFLIGHT_UNSAMPLED`] when sampling
    /// passed this call over, [`INFLIGHT_NO_RETURN`] when its return is
    /// not run.
    pub overflow: u32,
    /// What the return does with the result: [`INFLIGHT_NEW`] (it is the
    /// new block), [`INFLIGHT_RESIZE`] (it replaces `ptr`'s) or
    /// [`INFLIGHT_MEMPTR`] (0 for success, the new block written to `ptr`).
    /// One return program reads it for every call.
    pub shape: u32,
}

/// [`Inflight::overflow`] bit: `n * m` overflowed.
pub const INFLIGHT_OVERFLOW: u32 = 1;
/// [`Inflight::overflow`] bit: not sampled (its block is not recorded).
pub const INFLIGHT_UNSAMPLED: u32 = 2;
/// [`Inflight::overflow`] bit: a call whose return is not run (a uprobe
/// session's entry returned 1: sampling passed it over). Its record stays
/// after the call returned, only to say that the thread is inside an
/// allocator call while it is: then `ptr` holds the call's return address
/// (the word at `sp`, read at its entry), and the thread is inside the
/// call while its stack is below `sp` and that word is unchanged. The
/// thread's next probed call replaces it, whatever its stack pointer
/// (the calls a session skips, `malloc`'s and `calloc`'s shapes, call no
/// probed function).
pub const INFLIGHT_NO_RETURN: u32 = 4;
/// [`Inflight::shape`]: a call that returns the new block (`malloc`,
/// `calloc`, `aligned_alloc`, ...).
pub const INFLIGHT_NEW: u32 = 0;
/// [`Inflight::shape`]: a call that resizes the block at `ptr` (`realloc`,
/// `reallocarray`, ...).
pub const INFLIGHT_RESIZE: u32 = 1;
/// [`Inflight::shape`]: `posix_memalign(ptr, align, size)`.
pub const INFLIGHT_MEMPTR: u32 = 2;
const _: () = assert!(size_of::<Inflight>() == 32);

/// Value of [`MAP_INFLIGHT_SLOTS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InflightSlot {
    /// `bpf_get_current_pid_tgid()` of the thread using the slot; 0 when free.
    pub owner: u64,
    /// Its call.
    pub call: Inflight,
}
const _: () = assert!(size_of::<InflightSlot>() == 40);

// SAFETY: #[repr(C)], Copy, made only of integers with explicit padding, so
// every bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for Inflight {}
