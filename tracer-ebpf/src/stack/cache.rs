//! This CPU's caches of the unwind tables, kept from walk to walk: rows by
//! return address ([`Walk::rows`]) and pages ([`Walk::pages`]), each slot
//! checked against its key ([`slot_check`]).

use tracer_common::unwind::UnwindRow;

use super::{PAGE_SLOTS, ROW_SLOTS, Walk, unwind::find_row};

/// The row in force at `offset` of `file`, from this CPU's row cache
/// ([`Walk::rows`]) or [`find_row`] (then cached). Offsets past 4 GiB are
/// not cached.
#[inline(always)]
pub(super) fn cached_row(walk: &mut Walk, file: u32, offset: u64) -> UnwindRow {
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

/// The slot of page key `packed` in [`Walk::pages`].
#[inline(always)]
pub(super) fn page_slot(packed: u64) -> usize {
    (packed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize & (PAGE_SLOTS - 1)
}

/// The check word of a cache slot ([`Walk::pages`], [`Walk::rows`]) that
/// holds `value` for `key`: the key xor a bijective mix of the value
/// (xor-shift, multiply by an odd constant, xor-shift: each step is a
/// bijection, so two values mix alike only when they are equal). An
/// all-zero slot holds key 0 (table 0, `UNWIND_FILE_NONE`), which is never
/// looked up.
#[inline(always)]
pub(super) fn slot_check(key: u64, value: u64) -> u64 {
    let mixed = (value ^ (value >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    key ^ mixed ^ (mixed >> 29)
}
