//! The unwinder's tables: what tracerd compiles from each mapped file's
//! `.eh_frame` (or `.debug_frame`) and what the eBPF walker reads to unwind
//! a user stack without frame pointers.
//!
//! **Rows.** A file's table is a list of [`UnwindRow`]s sorted by file
//! offset: from a row's offset up to the next row's, the row says how to
//! find the Canonical Frame Address (CFA) and the caller's `rbp`; the return
//! address is always at `CFA - 8` (x86-64). Offsets are file offsets (not
//! virtual addresses), so that the walker needs only the mapping:
//! `offset = address - mapping.start + mapping.file_offset`.
//!
//! **Pages.** Rows are grouped by 64 KiB page of file offset
//! ([`UNWIND_PAGE_SHIFT`]). [`MAP_UNWIND_PAGES`] maps (file, page) to the
//! page's rows, a contiguous run of [`MAP_UNWIND_ROWS`]; each run starts
//! with a row at offset 0 of its page (the rule in force where the page
//! begins, [`UNWIND_UNKNOWN`] if none), so a binary search within one page
//! always finds the row in force. A row stores only its offset within the
//! page ([`UnwindRow::pc`]).
//!
//! **Mappings.** [`MAP_PROC_MAPS`] maps a tgid to its executable mappings
//! ([`ProcMappings`]), sorted by start, written by tracerd when it learns of
//! a process image and when its mappings change. An address in none of them
//! is never reported as a frame: the walk stops there.
//!
//! **Walk.** Frame 0 is the return address at the allocator's uretprobe.
//! For each frame: find its mapping (else stop: cut), record it, find its
//! row (looked up at `ip - 1`, the call instruction, except right after a
//! signal frame, whose `ip` is exact), and step to the caller:
//! - [`UNWIND_CFA_RSP`] / [`UNWIND_CFA_RBP`]: `cfa = rsp|rbp + cfa_offset`;
//!   `ip = *(cfa - 8)`; `rbp = *(cfa + 8 * rbp_slot)` when `rbp_slot` != 0,
//!   else unchanged; `rsp = cfa`.
//! - [`UNWIND_PLT`]: a PLT stub: `cfa = rsp + 8`, plus 8 when
//!   `(ip & 15) >= cfa_offset` (the `.plt` expression of the x86-64 psABI,
//!   whose threshold is 11 in classic `.plt`s, 9 or 10 with IBT, 5 with
//!   MPX: the row carries it in `cfa_offset`); the return address is at
//!   `cfa - 8` and `rbp` is unchanged.
//! - [`UNWIND_SIGNAL`]: a signal trampoline (`__restore_rt`): `rsp` points
//!   at the `ucontext` of the interrupted code: `rbp`, `rsp` and `rip` are
//!   read from its `mcontext` ([`SIGFRAME_RBP`], [`SIGFRAME_RSP`],
//!   [`SIGFRAME_RIP`]), and the next `ip` is exact.
//! - [`UNWIND_END`]: the outermost frame (the return address is undefined):
//!   the walk ends, complete.
//! - [`UNWIND_UNKNOWN`], or no table for the file ([`UNWIND_FILE_NONE`]):
//!   one frame-pointer step: `ip = *(rbp + 8)`, `rsp = rbp + 16`,
//!   `rbp = *rbp`, counted.
//!
//! A caller's `rsp` must be above the callee's (the stack grows down), and
//! a return address must not be 0; otherwise the walk stops (cut). A stack
//! that was cut is stored with [`STACK_CUT`] in its check word, and tracerd
//! reports one more frame than it has (tracemalloc's `total_nframe`).

#[cfg(doc)]
use crate::MAP_STACKS;

/// Unwind rows of every file, [`UnwindRow`]s, indexed from the runs that
/// [`MAP_UNWIND_PAGES`] names. An array sized by tracerd's
/// `unwind_table_rows` ([`UNWIND_ROWS`] as compiled).
pub const MAP_UNWIND_ROWS: &str = "UNWIND_ROWS";
/// Rows as compiled: 2^21 (16 MiB); tracerd sets the real number at load.
pub const UNWIND_ROWS: u32 = 1 << 21;
/// The pages of every file's table: [`UnwindPageKey`] → [`UnwindPage`]. A
/// hash of `unwind_table_pages` entries ([`UNWIND_PAGES`] as compiled).
pub const MAP_UNWIND_PAGES: &str = "UNWIND_PAGES";
/// Pages as compiled; tracerd sets the real number at load.
pub const UNWIND_PAGES: u32 = 1 << 17;
/// Executable mappings of each traced process: tgid → [`ProcMappings`]
/// (`BPF_F_NO_PREALLOC`: memory only for processes that have an entry).
pub const MAP_PROC_MAPS: &str = "PROC_MAPS";
/// Processes with an entry in [`MAP_PROC_MAPS`] as compiled; tracerd sets
/// the real number at load.
pub const PROC_MAPS_ENTRIES: u32 = 1 << 13;

/// A page of file offsets is `1 << UNWIND_PAGE_SHIFT` bytes (64 KiB).
pub const UNWIND_PAGE_SHIFT: u32 = 16;

/// The file id of a mapping with no table: its frames are stepped with
/// frame pointers (JIT code, a file over the table budget, one whose
/// unwind info could not be read).
pub const UNWIND_FILE_NONE: u32 = 0;

/// The file id of a file-backed mapping whose table tracerd has not named
/// in `FILE_TABLES` (`crate::vma`): not compiled yet (a library `dlopen`ed
/// a moment ago), evicted, or a file the kernel names by another inode
/// (overlayfs). Its frame is stepped with frame pointers, as a file with no
/// table, but a walk through it that ends at a zero return address is cut
/// (`unwind_stopped`), not complete: code built without frame pointers
/// ends a chain early and silently. tracerd never gives a table this id.
pub const UNWIND_FILE_PENDING: u32 = u32::MAX;

/// No unwind information covers the offset: one frame-pointer step.
pub const UNWIND_UNKNOWN: u8 = 0;
/// `cfa = rsp + cfa_offset`.
pub const UNWIND_CFA_RSP: u8 = 1;
/// `cfa = rbp + cfa_offset`.
pub const UNWIND_CFA_RBP: u8 = 2;
/// A PLT stub (the x86-64 `.plt` CFA expression; its threshold in
/// `cfa_offset`).
pub const UNWIND_PLT: u8 = 3;
/// A signal trampoline: registers come from the `ucontext` at `rsp`.
pub const UNWIND_SIGNAL: u8 = 4;
/// The outermost frame: the walk is complete.
pub const UNWIND_END: u8 = 5;

/// Offset of `uc_mcontext.rbp` in the `ucontext` a signal trampoline's
/// `rsp` points at (x86-64: 40 bytes of `uc_flags`, `uc_link`,
/// `uc_stack`, then the general registers r8..r15, rdi, rsi, rbp, ...).
pub const SIGFRAME_RBP: u64 = 120;
/// Offset of `uc_mcontext.rsp` in that `ucontext`.
pub const SIGFRAME_RSP: u64 = 160;
/// Offset of `uc_mcontext.rip` in that `ucontext`.
pub const SIGFRAME_RIP: u64 = 168;

/// One row of a file's unwind table (see the module doc for the rules).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    /// The row's first file offset within its 64 KiB page.
    pub pc: u16,
    /// `UNWIND_*`: how to find the caller.
    pub kind: u8,
    /// Where the caller's `rbp` is saved, in 8-byte slots from the CFA
    /// (`-2`: at `cfa - 16`, as after `push %rbp`); 0: `rbp` unchanged.
    pub rbp_slot: i8,
    /// The CFA's offset from `rsp` or `rbp`, in bytes.
    pub cfa_offset: i32,
}
const _: () = assert!(size_of::<UnwindRow>() == 8);

/// Key of [`MAP_UNWIND_PAGES`]: a page of one file's offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindPageKey {
    /// The file's id (never [`UNWIND_FILE_NONE`]), given by tracerd.
    pub file: u32,
    /// `file offset >> UNWIND_PAGE_SHIFT`.
    pub page: u32,
}
const _: () = assert!(size_of::<UnwindPageKey>() == 8);

/// Value of [`MAP_UNWIND_PAGES`]: the page's rows in [`MAP_UNWIND_ROWS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindPage {
    /// Index of its first row (the one at page offset 0).
    pub first: u32,
    /// Its rows, at least 1, sorted by [`UnwindRow::pc`].
    pub count: u32,
}
const _: () = assert!(size_of::<UnwindPage>() == 8);

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcMapping {
    /// First address (inclusive).
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Offset in the file of the byte mapped at `start`.
    pub file_offset: u64,
    /// The file's table id, or [`UNWIND_FILE_NONE`].
    pub file: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<ProcMapping>() == 32);

/// Executable mappings one process can have in [`MAP_PROC_MAPS`]; a process
/// with more keeps the first ones by address (its others stop the walk).
pub const MAX_PROC_MAPPINGS: usize = 256;

/// Value of [`MAP_PROC_MAPS`]: a process's executable mappings.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcMappings {
    /// Mappings in use, sorted by `start`, not overlapping.
    pub count: u32,
    /// The process image these mappings are of (`ProcStats::generation`); the
    /// walker uses them only for that generation.
    pub generation: u32,
    /// The mappings; those at `count` and after are unused.
    pub mappings: [ProcMapping; MAX_PROC_MAPPINGS],
}
const _: () = assert!(size_of::<ProcMappings>() == 8 + 32 * MAX_PROC_MAPPINGS);

/// Set in the first word of a [`MAP_STACKS`] value when the walk was cut
/// (it could not go on, or reached the frames walked) rather than ending at
/// the outermost frame; the check hash is the other 63 bits.
pub const STACK_CUT: u64 = 1 << 63;

/// The check hash of a stack before its first frame: the start of the
/// hash the first word of a [`MAP_STACKS`] value holds, independent of the
/// stack's id (its key). The programs hash each frame as they walk it;
/// tracerd hashes the frames it reads again, and takes a stack whose first
/// word is not its hash as not stored (a copy torn by a preemption).
pub const STACK_CHECK_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The check hash `check` followed by frame `ip`.
#[inline(always)]
#[must_use]
pub const fn stack_check_frame(check: u64, ip: u64) -> u64 {
    (check ^ ip.rotate_left(29)).wrapping_mul(0xff51_afd7_ed55_8ccd)
}

/// The first word of a [`MAP_STACKS`] value: the check hash `check` of its
/// `walked` frames, finished, with [`STACK_CUT`] when the walk was cut.
#[inline(always)]
#[must_use]
pub const fn stack_check_word(check: u64, walked: u64, cut: bool) -> u64 {
    let head = walked | ((cut as u64) << 32);
    let mut check = (check ^ head).wrapping_mul(0xff51_afd7_ed55_8ccd);
    check ^= check >> 33;
    if cut {
        check | STACK_CUT
    } else {
        check & !STACK_CUT
    }
}

/// Bytes of user stack the walker copies in one read (its window, in the
/// walk's per-CPU scratch): the steps whose words fall in the copy read
/// nothing more. A power of two.
pub const STACK_WINDOW_BYTES: u64 = 1024;

/// Bytes of a window read at `addr`: up to [`STACK_WINDOW_BYTES`], not
/// past the end of `addr`'s 4 KiB page (the next page may not be mapped,
/// and a read that touches it fails whole); 0 when `addr` is not 8-aligned
/// or fewer than two words are left on its page (the words are then read
/// alone).
#[inline(always)]
#[must_use]
pub const fn stack_window_len(addr: u64) -> u64 {
    let to_page_end = 4096 - (addr & 4095);
    if addr & 7 != 0 || to_page_end < 16 {
        0
    } else if to_page_end < STACK_WINDOW_BYTES {
        to_page_end
    } else {
        STACK_WINDOW_BYTES
    }
}

/// The word index, in a window of `len` valid bytes copied from `base`, of
/// the two words at `addr`; None unless both are in it: `addr` not
/// 8-aligned, below `base` (where the offset wraps past `len`), or within
/// 8 bytes of the window's end or past it.
#[inline(always)]
#[must_use]
pub const fn stack_window_index(base: u64, len: u64, addr: u64) -> Option<usize> {
    let offset = addr.wrapping_sub(base);
    if addr & 7 != 0 || offset >= len || len - offset < 16 {
        None
    } else {
        Some((offset / 8) as usize)
    }
}

// SAFETY: integers only, with explicit padding; no invalid bit patterns.
#[cfg(feature = "user")]
unsafe impl aya::Pod for UnwindRow {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for UnwindPageKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for UnwindPage {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcMappings {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_read_to_the_end_of_its_page_at_most() {
        assert_eq!(stack_window_len(0x7ffc_0000_1000), STACK_WINDOW_BYTES);
        assert_eq!(stack_window_len(0x7ffc_0000_1c00), STACK_WINDOW_BYTES);
        assert_eq!(stack_window_len(0x7ffc_0000_1e00), 512);
        assert_eq!(stack_window_len(0x7ffc_0000_1e08), 504);
        assert_eq!(stack_window_len(0x7ffc_0000_1ff0), 16);
        // One word left on the page, or not aligned: the words are read alone.
        assert_eq!(stack_window_len(0x7ffc_0000_1ff8), 0);
        assert_eq!(stack_window_len(0x7ffc_0000_1004), 0);
    }

    #[test]
    fn only_two_words_wholly_in_the_window_are_served_from_it() {
        let base = 0x7ffc_0000_1000;
        assert_eq!(stack_window_index(base, 512, base), Some(0));
        assert_eq!(stack_window_index(base, 512, base + 496), Some(62));
        // The second word would be past the end.
        assert_eq!(stack_window_index(base, 512, base + 504), None);
        assert_eq!(stack_window_index(base, 512, base + 512), None);
        // Below the base (a saved rbp under the return address just read
        // with a window of its own): the offset wraps, and must not be
        // taken for one within the window.
        assert_eq!(stack_window_index(base, 512, base - 8), None);
        assert_eq!(stack_window_index(base, 512, base - 24), None);
        assert_eq!(stack_window_index(base, 16, base - 8), None);
        assert_eq!(stack_window_index(base, 512, base + 4), None);
        // No window yet.
        assert_eq!(stack_window_index(0, 0, base), None);
    }
}
