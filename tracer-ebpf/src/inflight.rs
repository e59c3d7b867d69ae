//! Allocator calls between entry and return (the in-flight calls): an
//! entry program records its call ([`record_entry`]), the return program
//! takes it back ([`take_inflight`]).
//!
//! Protocol. A thread's call lives in its slot of `INFLIGHT_SLOTS`
//! (`tid & INFLIGHT_SLOT_MASK`), claimed by one compare-and-swap of the
//! slot's owner from 0 to the thread id, and freed by the owner only (after
//! its return copied the call out, or when the thread exits:
//! [`forget_thread`]). A thread whose slot is taken by another keeps its
//! call in `INFLIGHT` (the spill), counted in `INFLIGHT_SPILL` so that no
//! entry looks there while no thread spilled.
//!
//! Nesting: glibc's `realloc` calls `malloc`, and so on. Only the outermost
//! call is recorded, with the stack pointer at its entry: a probed call of
//! the thread deeper in the stack is nested in it, and only the return 8
//! bytes above that entry is its own. A call recorded whose thread enters
//! or returns from a call at or above it in the stack is over, its return
//! unseen (its return probe was removed while it ran, by a scope change or
//! a stop): it is forgotten and counted (`stale_inflight`), so that the
//! thread's later calls are not all taken for nested ones.
//!
//! Calls whose return is not run. In a uprobe session (sampling on), an
//! entry that sampling passes over skips its return; its record
//! ([`INFLIGHT_NO_RETURN`]) stays behind the call only so that a system
//! call made inside it is known to be the allocator's ([`in_call`]), and
//! the thread's next probed call replaces it.

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::bpf_probe_read_user;
use tracer_common::{
    Counter, INFLIGHT_NO_RETURN, INFLIGHT_OVERFLOW, INFLIGHT_UNSAMPLED, Inflight, InflightSlot,
};

use crate::{
    atomic::{compare_exchange, fetch_add},
    counters::count,
    globals::{current, entry_caller, inflight_slot_mask, sample_mean},
    maps::{INFLIGHT, INFLIGHT_SLOTS, INFLIGHT_SPILL},
    procs::find_proc,
    sample::take_sample,
};

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

/// What an entry left for its return ([`record_entry`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The call is recorded in flight: its return has work to do.
    Recorded,
    /// Its return has nothing to do: a nested call, a process not traced,
    /// or a call sampling passed over whose return is skipped.
    Nothing,
    /// Not recorded (both in-flight maps full: counted as a drop), by
    /// process `tgid`.
    Dropped(u32),
}

impl Entry {
    /// What a uprobe session's entry run returns: 1 (the kernel skips the
    /// return) unless the return has work to do.
    #[inline(always)]
    pub(crate) fn session_return(self) -> u32 {
        match self {
            Entry::Recorded => 0,
            Entry::Nothing | Entry::Dropped(_) => 1,
        }
    }
}

/// Records an allocator call's entry (`sp`: the user stack pointer at it;
/// `shape`: what its return does, `Inflight::shape`), for its return.
/// `skippable`: the call's return may be skipped (a uprobe session's
/// `malloc` or `calloc` shape) when sampling passes it over; its record is
/// then [`INFLIGHT_NO_RETURN`].
#[inline(always)]
pub(crate) fn record_entry(
    size: u64,
    ptr: u64,
    overflow: bool,
    sp: u64,
    shape: u32,
    skippable: bool,
) -> Entry {
    let Some((id, tgid)) = entry_caller() else {
        return Entry::Nothing;
    };
    let mut flags = if overflow { INFLIGHT_OVERFLOW } else { 0 };
    let mut ptr = ptr;
    let mean = sample_mean();
    if mean != 0 && !take_sample(size, mean) {
        flags |= INFLIGHT_UNSAMPLED;
        if skippable {
            // Counted here: its return, which counts the others, is not run.
            count(Counter::Unsampled);
            flags |= INFLIGHT_NO_RETURN;
            ptr = return_address(sp);
        }
    }
    let value = Inflight {
        size,
        ptr,
        sp,
        overflow: flags,
        shape,
    };
    let kept = if flags & INFLIGHT_NO_RETURN != 0 {
        Entry::Nothing
    } else {
        Entry::Recorded
    };
    let slot = slot_of(id);
    if let Some(slot) = slot {
        // SAFETY: a slot of the array; its owner field is only changed by
        // compare-and-swap from 0, or reset by its owner.
        let owner = unsafe { core::ptr::read_volatile(&raw const (*slot).owner) };
        if owner == id {
            // SAFETY: the slot is this thread's own.
            let replaced = unsafe { nest_or_replace(&raw mut (*slot).call, &value) };
            return if replaced { kept } else { Entry::Nothing };
        }
    }
    // A call of this thread may be in the spill map (its slot was taken
    // when it began): then this one is nested in it. Only looked at while
    // some thread spilled.
    if spilled() != 0
        && let Some(inflight) = INFLIGHT.get_ptr_mut(id)
    {
        return if nest_or_replace(inflight, &value) {
            kept
        } else {
            Entry::Nothing
        };
    }
    if let Some(slot) = slot
        // SAFETY: as above.
        && compare_exchange(unsafe { &raw mut (*slot).owner }, 0, id) == 0
    {
        // SAFETY: claimed: the slot is this thread's own until it frees it.
        unsafe { (*slot).call = value };
        return kept;
    }
    if INFLIGHT.insert(id, value, BPF_NOEXIST as u64).is_ok() {
        add_spilled(1);
        return kept;
    }
    // Its return will find no entry: nothing of this call is recorded.
    count(Counter::DropInflightFull);
    if let Some((stats, _)) = find_proc(tgid) {
        // SAFETY: a PROCS value.
        fetch_add(unsafe { &raw mut (*stats).drops }, 1);
    }
    Entry::Dropped(tgid)
}

/// The return address of a call whose user stack pointer at its entry is
/// `sp` (the word there), 0 if it cannot be read.
#[inline(always)]
fn return_address(sp: u64) -> u64 {
    // SAFETY: bpf_probe_read_user checks the user address itself.
    unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
}

/// The entry record of the call returning now (`ret_sp`: the user stack
/// pointer at its return), consumed; None for a nested call, or a call
/// whose entry was not recorded.
#[inline(always)]
pub(crate) fn take_inflight(ret_sp: u64) -> Option<(u32, Inflight)> {
    let (id, tgid) = current()?;
    let entry_sp = ret_sp.wrapping_sub(8);
    if let Some(slot) = slot_of(id) {
        // SAFETY: see record_entry.
        let owner = unsafe { core::ptr::read_volatile(&raw const (*slot).owner) };
        if owner == id {
            // SAFETY: the slot is this thread's own.
            let call = unsafe { (*slot).call };
            if call.sp > entry_sp || call.overflow & INFLIGHT_NO_RETURN != 0 {
                // Nested in the call recorded, or the record of a call
                // whose return is skipped (never this one's: a call that
                // recorded itself replaced it).
                return None;
            }
            if call.sp < entry_sp {
                count(Counter::StaleInflight);
            }
            // Free the slot after the call was copied out.
            // SAFETY: as above; the owner field is reset by its owner only.
            unsafe { core::ptr::write_volatile(&raw mut (*slot).owner, 0) };
            return (call.sp == entry_sp).then_some((tgid, call));
        }
    }
    let Some(inflight) = INFLIGHT.get_ptr_mut(id) else {
        count(Counter::ExitWithoutEntry);
        return None;
    };
    // SAFETY: the entry is this thread's own; no other thread writes it.
    let value = unsafe { *inflight };
    if value.sp > entry_sp || value.overflow & INFLIGHT_NO_RETURN != 0 {
        return None;
    }
    if value.sp < entry_sp {
        count(Counter::StaleInflight);
    }
    if INFLIGHT.remove(id).is_ok() {
        add_spilled(u64::MAX);
    }
    (value.sp == entry_sp).then_some((tgid, value))
}

/// A probed call `new` of a thread whose call `recorded` is in flight: nested
/// in it when deeper in the stack (counted), else the recorded call is over
/// and `new` takes its place (true). A recorded call whose return is not
/// run ([`INFLIGHT_NO_RETURN`]) is always replaced: the calls whose return
/// a session skips call no probed function. `recorded` is the thread's own
/// record (its slot or its spill entry).
#[inline(always)]
fn nest_or_replace(recorded: *mut Inflight, new: &Inflight) -> bool {
    // SAFETY: the record is this thread's own; no other thread writes it.
    unsafe {
        if (*recorded).overflow & INFLIGHT_NO_RETURN == 0 {
            if new.sp < (*recorded).sp {
                count(Counter::Nested);
                return false;
            }
            count(Counter::StaleInflight);
        }
        *recorded = *new;
    }
    true
}

/// Whether thread `id` is inside a probed allocator call (between its
/// entry and its return): a system call it makes then is the allocator's.
/// `user_sp` gives the thread's user stack pointer now, read only for a
/// call whose return is not run ([`INFLIGHT_NO_RETURN`]): the thread is
/// inside it while its stack is below the call's entry and the call's
/// return address is still there (a call made since the call returned,
/// at its depth, wrote its own).
#[inline(always)]
pub(crate) fn in_call(id: u64, user_sp: impl Fn() -> u64) -> bool {
    if let Some(slot) = slot_of(id) {
        // SAFETY: see record_entry.
        if unsafe { core::ptr::read_volatile(&raw const (*slot).owner) } == id {
            // SAFETY: the slot is this thread's own.
            return inside(unsafe { &(*slot).call }, &user_sp);
        }
    }
    if spilled() == 0 {
        return false;
    }
    match INFLIGHT.get_ptr(id) {
        // SAFETY: the entry is this thread's own; no other thread writes it.
        Some(call) => inside(unsafe { &*call }, &user_sp),
        None => false,
    }
}

/// Whether the thread whose record is `call` is inside that call (see
/// [`in_call`]).
#[inline(always)]
fn inside(call: &Inflight, user_sp: &impl Fn() -> u64) -> bool {
    call.overflow & INFLIGHT_NO_RETURN == 0
        || user_sp() < call.sp && return_address(call.sp) == call.ptr
}

/// Forgets the call in flight of thread `id`, which is exiting: a thread
/// that dies inside a probed call leaves its state behind.
#[inline(always)]
pub(crate) fn forget_thread(id: u64) {
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
}
