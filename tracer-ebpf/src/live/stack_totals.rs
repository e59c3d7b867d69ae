//! The totals per stack (`STACK_TOTALS`): a block is added to its stack's
//! count and bytes when it is put in the live maps, and taken out when it
//! is taken out.

use aya_ebpf::bindings::BPF_NOEXIST;
use tracer_common::{AllocInfo, Counter, ProcStats, STACK_TOTALS_KEY_OFFSET, StackTotalsKey};

use crate::{
    atomic::fetch_add,
    counters::count,
    maps::{EEXIST, STACK_TOTALS, STACK_TOTALS_ZERO},
    procs::{stack_keys_counter, stack_totals_lost_counter},
};

/// The [`StackTotalsKey`] of block `info`: the tail of its own value (see
/// [`STACK_TOTALS_KEY_OFFSET`]), so that no stack space goes to a key.
#[inline(always)]
fn stack_key(info: *const AllocInfo) -> *const StackTotalsKey {
    // SAFETY: the key's layout is the tail of AllocInfo's (pinned in
    // tracer-common); info points at a whole AllocInfo.
    unsafe {
        info.cast::<u8>()
            .add(STACK_TOTALS_KEY_OFFSET)
            .cast::<StackTotalsKey>()
    }
}

/// Adds block `info` of the image `stats` to its stack's totals: a new key
/// is put in at 0 (from `STACK_TOTALS_ZERO`, no stack space for a value)
/// and added to like any other; a key the full map refuses is counted
/// ([`Counter::StackTotalsRefused`] and the image's `stack_totals_lost`).
#[inline(always)]
pub(super) fn count_in_stack(stats: *mut ProcStats, info: *const AllocInfo) {
    let key = stack_key(info);
    // SAFETY: info points at a whole AllocInfo.
    let size = unsafe { (*info).size };
    // SAFETY: key points into info (above).
    if add_to_stack(unsafe { &*key }, size) {
        return;
    }
    if let Some(zero) = STACK_TOTALS_ZERO.get(0) {
        // SAFETY: as above.
        let key = unsafe { &*key };
        match STACK_TOTALS.insert(key, zero, BPF_NOEXIST as u64) {
            // Another thread may have put the key in meanwhile: either way
            // it is there now. A key put in is counted before a block is
            // added to it (tracerd reads an image's totals by the keys it
            // knows while that count is unchanged).
            Ok(()) => {
                fetch_add(stack_keys_counter(stats), 1);
                if add_to_stack(key, size) {
                    return;
                }
            }
            Err(e) if e == -EEXIST && add_to_stack(key, size) => return,
            Err(_) => {}
        }
    }
    count(Counter::StackTotalsRefused);
    fetch_add(stack_totals_lost_counter(stats), 1);
}

/// Adds one block of `size` bytes to the totals of `key`; false when the
/// key is not in the map.
#[inline(always)]
fn add_to_stack(key: &StackTotalsKey, size: u64) -> bool {
    let Some(totals) = STACK_TOTALS.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: a STACK_TOTALS value; its fields change only atomically.
    unsafe {
        fetch_add(&raw mut (*totals).count, 1);
        fetch_add(&raw mut (*totals).size, size);
    }
    true
}

/// [`count_in_stack`] as a BPF function of its own, for the programs
/// that put blocks in several places (`mmap`'s partial unmaps): the
/// verifier then follows its branches once per call, not once per path
/// through the caller. (The allocator programs inline it: a call costs
/// their frame the registers it spills.)
#[inline(never)]
pub(crate) fn count_in_stack_fn(stats: *mut ProcStats, info: *const AllocInfo) {
    count_in_stack(stats, info);
}

/// [`uncount_in_stack`] as a BPF function of its own (see
/// [`count_in_stack_fn`]).
#[inline(never)]
pub(crate) fn uncount_in_stack_fn(info: *const AllocInfo) {
    uncount_in_stack(info);
}

/// Takes block `info`, just taken out of the live maps, out of its stack's
/// totals (nothing when its key is not there: its image counted it lost).
#[inline(always)]
pub(crate) fn uncount_in_stack(info: *const AllocInfo) {
    // SAFETY: key points into info, a whole AllocInfo (see stack_key).
    let (key, size) = unsafe { (&*stack_key(info), (*info).size) };
    if let Some(totals) = STACK_TOTALS.get_ptr_mut(key) {
        // SAFETY: as in add_to_stack.
        unsafe {
            fetch_add(&raw mut (*totals).count, u64::MAX);
            fetch_add(&raw mut (*totals).size, size.wrapping_neg());
        }
    }
}
