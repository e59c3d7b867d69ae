//! The unwinder's tables on tracerd's side: each mapped file's `.eh_frame`
//! (or `.debug_frame`) compiled into rows ([`compile`]), the rows and pages
//! written into the kernel maps once per file and shared by every process
//! that maps it, and each process's executable mappings (`PROC_MAPS`). The
//! rules the rows encode and the walk that reads them are in
//! `tracer_common::unwind`.
use std::collections::BTreeMap;

use tracer_common::UnwindRow;

pub mod compile;
pub mod maps;
pub mod tables;

/// One file's compiled unwind table: for each 64 KiB page of file offsets
/// that unwind information covers, its rows, sorted by `pc`, the first at
/// `pc` 0 (the rule in force where the page begins, `UNWIND_UNKNOWN` if
/// none). Pages without any unwind information are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileTable {
    /// `file offset >> UNWIND_PAGE_SHIFT` → the page's rows.
    pub pages: BTreeMap<u32, Vec<UnwindRow>>,
    /// What the compiler saw, for the budget and the logs.
    pub stats: TableStats,
}

impl FileTable {
    /// Rows in all pages: what the table costs in `UNWIND_ROWS`.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.pages.values().map(Vec::len).sum()
    }
}

/// Counts of what compiling a file found. "CFI rows" are the rows of the
/// FDEs' call frame programs, each clipped to its FDE's range, before
/// merging; the kinds they compiled to are counted per CFI row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Frame description entries read.
    pub fdes: u64,
    /// Rows whose CFA rule is neither `rsp`/`rbp` plus an offset nor a
    /// known PLT or signal-frame rule (compiled as `UNWIND_UNKNOWN`).
    pub unsupported_rows: u64,
    /// True when the table came from `.debug_frame` (no `.eh_frame`).
    pub from_debug_frame: bool,
    /// CFI rows evaluated (signal-frame FDEs are not evaluated).
    pub cfi_rows: u64,
    /// CFI rows whose `rbp` rule the row cannot hold (a register, an
    /// expression, undefined, or an offset from the CFA that is not a
    /// non-zero multiple of 8 within `i8` slots): `UNWIND_UNKNOWN`.
    pub unsupported_rbp_rows: u64,
    /// CFI rows whose return address is neither at `CFA - 8` nor undefined:
    /// `UNWIND_UNKNOWN`.
    pub unsupported_ra_rows: u64,
    /// CFI rows with the `.plt` CFA expression of a threshold other than
    /// the 11 that `UNWIND_PLT` implies (also in `unsupported_rows`).
    pub plt_other_rows: u64,
    /// CFI rows compiled as `UNWIND_PLT`.
    pub plt_rows: u64,
    /// CFI rows compiled as `UNWIND_END` (return address undefined).
    pub end_rows: u64,
    /// FDEs of a signal trampoline (CIE augmentation `S`), compiled as one
    /// `UNWIND_SIGNAL` range each.
    pub signal_fdes: u64,
    /// FDEs with an empty address range (nothing to compile).
    pub fdes_empty: u64,
    /// FDEs whose first address is in no executable `PT_LOAD` segment
    /// (no file offset to key them by): left out.
    pub fdes_unmapped: u64,
    /// FDEs that run past the end of their segment's file bytes: cut there.
    pub fdes_clipped: u64,
    /// FDEs left out whole because they overlap one kept before them (by
    /// file offset, then by place in the section).
    pub fdes_overlapping: u64,
    /// FDEs left out because their header or CIE cannot be parsed.
    pub fdes_malformed: u64,
    /// FDEs whose call frame program could not be evaluated to its end:
    /// their rows before the failing instruction are kept, the rest of
    /// their range is `UNWIND_UNKNOWN`.
    pub fdes_cut: u64,
    /// Rows not written because the row before them has the same rule
    /// (within an FDE, across FDEs, and gaps next to unknown rows).
    pub rows_merged: u64,
}
