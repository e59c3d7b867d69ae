//! Compiling one ELF file's call frame information into a [`FileTable`].
//!
//! Contract: [`compile`] takes the whole bytes of any file a traced process
//! maps (untrusted) and either refuses it with a [`CompileError`] or returns
//! rows keyed by file offset that follow `tracer_common::unwind`'s rules:
//! for every file offset, [`row_at`] gives the rule the file's CFI states
//! there (as `readelf --debug-dump=frames-interp` prints it), or
//! `UNWIND_UNKNOWN` where no FDE covers it or its rule has no row kind. It
//! never panics, and its work and memory grow with the input's size, capped
//! at [`MAX_FILE_ROWS`] rows.
//!
//! Stages, one file each: `elf` finds the machine, the executable
//! `PT_LOAD` segments (virtual address to file offset) and the CFI section
//! (`.eh_frame`, else `.debug_frame`); `cfi` evaluates every FDE with
//! gimli and classifies each of its rows into a rule, keyed by file offset,
//! sorted, without overlaps; `flatten` merges equal neighbours, fills the
//! gaps with `UNWIND_UNKNOWN` and cuts the result into 64 KiB pages.
use std::collections::BTreeMap;

use tracer_common::{UNWIND_PAGE_SHIFT, UNWIND_UNKNOWN, UnwindRow};

mod cfi;
mod elf;
mod flatten;
#[cfg(test)]
mod tests;

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

/// The most rows one file's table may have (before and after merging):
/// 16 Mi rows, 128 MiB of `UnwindRow`s, far above any real file (libc has
/// tens of thousands) and above what the kernel's `UNWIND_ROWS` can hold.
pub const MAX_FILE_ROWS: usize = 1 << 24;

/// Why a file's unwind information could not be compiled. The file is then
/// refused whole: its frames are stepped with frame pointers.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The bytes are not an ELF file this tracerd reads.
    #[error("not a readable ELF file: {0}")]
    Elf(String),
    /// An ELF file of another machine, class or byte order than x86-64.
    #[error("unsupported ELF file ({what}): only 64-bit little-endian x86-64 is unwound")]
    Machine {
        /// What the header says instead (e.g. `e_machine 0xb7`).
        what: String,
    },
    /// The CFI section's bytes cannot be had (out of the file, compressed).
    #[error("section {section} cannot be read: {reason}")]
    Section {
        /// `.eh_frame` or `.debug_frame`.
        section: &'static str,
        /// Why.
        reason: String,
    },
    /// The CFI section's entries cannot be framed (an entry's length or
    /// CIE pointer is unreadable), so the entries after it are lost.
    #[error("malformed {section} entry at or after offset {offset:#x}: {source}")]
    Cfi {
        /// `.eh_frame` or `.debug_frame`.
        section: &'static str,
        /// The offset in the section of the entry (or of the last good one,
        /// when the entry's own start could not be read).
        offset: u64,
        /// What gimli found.
        #[source]
        source: gimli::Error,
    },
    /// Evaluating every FDE would read far more call frame instructions
    /// than the section holds (a long CIE shared by many FDEs: its initial
    /// instructions are evaluated again for each).
    #[error("{section}: its FDEs would evaluate over {limit} bytes of call frame instructions")]
    TooMuchWork {
        /// `.eh_frame` or `.debug_frame`.
        section: &'static str,
        /// The budget, in bytes of CIE and FDE entries.
        limit: u64,
    },
    /// The table would have more than [`MAX_FILE_ROWS`] rows.
    #[error("more than {limit} unwind rows: the file's table is too large")]
    TooManyRows {
        /// [`MAX_FILE_ROWS`].
        limit: usize,
    },
    /// A file offset whose page number does not fit the 32 bits of a page
    /// key (a file of 256 TiB or more).
    #[error("file offset {offset:#x} is beyond the pages a table can key")]
    OffsetTooLarge {
        /// The offset, in bytes.
        offset: u64,
    },
}

/// Compiles the call frame information of the ELF file `elf` (its whole
/// bytes, as mapped from offset 0) into rows keyed by file offset.
///
/// The CFI comes from `.eh_frame`, or from `.debug_frame` when there is no
/// `.eh_frame` with any entry in it; FDE addresses are turned into file
/// offsets through the executable `PT_LOAD` segment that holds them. A file
/// with neither section (or no executable segment) gives an empty table.
///
/// An FDE that cannot be parsed is left out, and one whose program cannot
/// be evaluated to its end is cut there (both counted in the stats): a
/// single odd FDE does not cost a file its whole table.
///
/// # Errors
/// [`CompileError`] when the file is not a 64-bit little-endian x86-64 ELF
/// file, when its CFI section cannot be read or its entries cannot be
/// framed, or when the table would exceed [`MAX_FILE_ROWS`].
pub fn compile(elf: &[u8]) -> Result<FileTable, CompileError> {
    compile_from(elf)
}

/// [`compile`] of the file `file` reads: only its headers, section names
/// and CFI section are read (through an `object::ReadCache`), so that a
/// large file (a debug build of hundreds of MiB) costs its CFI section's
/// size in memory, not its own.
///
/// # Errors
/// As [`compile`].
pub fn compile_file(file: std::fs::File) -> Result<FileTable, CompileError> {
    let cache = object::ReadCache::new(file);
    compile_from(&cache)
}

fn compile_from<'a, R: object::ReadRef<'a>>(elf: R) -> Result<FileTable, CompileError> {
    let file = elf::ElfInfo::parse(elf)?;
    let mut stats = TableStats::default();
    let Some(section) = file.cfi else {
        return Ok(FileTable {
            pages: std::collections::BTreeMap::new(),
            stats,
        });
    };
    stats.from_debug_frame = section.kind == elf::CfiKind::DebugFrame;
    let spans = cfi::spans(&section, &file.segments, MAX_FILE_ROWS, &mut stats)?;
    let pages = flatten::pages(&spans, MAX_FILE_ROWS, &mut stats)?;
    Ok(FileTable { pages, stats })
}

/// The row in force at file offset `offset` of `table`, found as the
/// walker finds it: the page `offset >> UNWIND_PAGE_SHIFT`, then its last
/// row whose `pc` is at or below the offset within the page. A page absent
/// from the table gives the default row (`UNWIND_UNKNOWN`, `pc` 0).
#[must_use]
pub fn row_at(table: &FileTable, offset: u64) -> UnwindRow {
    let Ok(page) = u32::try_from(offset >> UNWIND_PAGE_SHIFT) else {
        return UnwindRow::default();
    };
    let Some(rows) = table.pages.get(&page) else {
        return UnwindRow::default();
    };
    // The low 16 bits: the offset within its page.
    let pc = (offset & ((1 << UNWIND_PAGE_SHIFT) - 1)) as u16;
    let after = rows.partition_point(|row| row.pc <= pc);
    after
        .checked_sub(1)
        .and_then(|i| rows.get(i))
        .copied()
        .unwrap_or(UnwindRow {
            kind: UNWIND_UNKNOWN,
            ..UnwindRow::default()
        })
}

/// One rule of a row, without its place: how to find the caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rule {
    /// `UNWIND_*`.
    pub(crate) kind: u8,
    /// Where the caller's `rbp` is, in 8-byte slots from the CFA; 0:
    /// unchanged.
    pub(crate) rbp_slot: i8,
    /// The CFA's offset from `rsp` or `rbp`, in bytes.
    pub(crate) cfa_offset: i32,
}

impl Rule {
    /// No unwind information: one frame-pointer step.
    pub(crate) const UNKNOWN: Rule = Rule::of(UNWIND_UNKNOWN);

    /// The rule of kind `kind` with no offset and `rbp` unchanged.
    pub(crate) const fn of(kind: u8) -> Rule {
        Rule {
            kind,
            rbp_slot: 0,
            cfa_offset: 0,
        }
    }

    /// This rule as a row starting at `pc` within its page.
    pub(crate) const fn row(self, pc: u16) -> UnwindRow {
        UnwindRow {
            pc,
            kind: self.kind,
            rbp_slot: self.rbp_slot,
            cfa_offset: self.cfa_offset,
        }
    }
}

/// A rule over the file offsets `start..end` (bytes, `start < end`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    /// First file offset.
    pub(crate) start: u64,
    /// One past the last file offset.
    pub(crate) end: u64,
    /// The rule in force there.
    pub(crate) rule: Rule,
}
