//! The unwinder's tables on tracerd's side: each mapped file's `.eh_frame`
//! (or `.debug_frame`) compiled into rows ([`compile`]), the rows and pages
//! written into the kernel maps once per file and shared by every process
//! that maps it, and each process's executable mappings (`PROC_MAPS`). The
//! rules the rows encode and the walk that reads them are in
//! `tracer_common::unwind`.
use std::collections::BTreeMap;

use tracer_common::UnwindRow;

pub mod compile;

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

/// Counts of what compiling a file found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Frame description entries read.
    pub fdes: u64,
    /// Rows whose CFA rule is neither `rsp`/`rbp` plus an offset nor a
    /// known PLT or signal-frame rule (compiled as `UNWIND_UNKNOWN`).
    pub unsupported_rows: u64,
    /// True when the table came from `.debug_frame` (no `.eh_frame`).
    pub from_debug_frame: bool,
}
