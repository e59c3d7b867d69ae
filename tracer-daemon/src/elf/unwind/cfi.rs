//! Every FDE of a CFI section evaluated with gimli into [`Span`]s: each row
//! of its call frame program classified into a [`Rule`], its addresses
//! turned into file offsets, equal neighbours within the FDE merged.
//!
//! Classification of a row (the first that applies):
//! 1. the FDE's CIE has augmentation `S` (a signal trampoline): the whole
//!    FDE is one `UNWIND_SIGNAL` span, its program not evaluated;
//! 2. the return address is undefined: `UNWIND_END`;
//! 3. the return address is not at `CFA - 8`: `UNWIND_UNKNOWN`;
//! 4. the CFA is `rsp + N` / `rbp + N` (N fits `i32`): `UNWIND_CFA_RSP` /
//!    `UNWIND_CFA_RBP`; the psABI's `.plt` expression (any threshold T,
//!    carried in `cfa_offset`): `UNWIND_PLT`; anything else: `UNWIND_UNKNOWN`;
//! 5. `rbp` unchanged (no rule, or same value): `rbp_slot` 0; saved at
//!    `CFA + 8 * k` with `k` a non-zero `i8`: `rbp_slot` k; anything else:
//!    `UNWIND_UNKNOWN`.
//!
//! The result is sorted by file offset without overlaps: FDEs are ordered
//! by their first offset (then by place in the section), and one that
//! overlaps an FDE kept before it is left out whole.
use std::collections::HashMap;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, Encoding,
    EndianSlice, Expression, Format, FrameDescriptionEntry, LittleEndian, Operation, Register,
    RegisterRule, UnwindContext, UnwindOffset, UnwindSection, UnwindTableRow, X86_64,
};
use tracer_common::{
    UNWIND_CFA_RBP, UNWIND_CFA_RSP, UNWIND_END, UNWIND_PLT, UNWIND_SIGNAL, UNWIND_UNKNOWN,
};

use super::{
    CompileError, Rule, Span, TableStats,
    elf::{CfiKind, CfiSection, Segments},
};

/// How gimli reads the sections: little-endian byte slices.
type Reader<'a> = EndianSlice<'a, LittleEndian>;

/// The work budget of a section of `n` bytes: `WORK_PER_BYTE * n +
/// WORK_BASE` bytes of CIE and FDE entries evaluated (a CIE's initial
/// instructions run again for each of its FDEs). Real files read about 2
/// bytes per byte of section (a CIE of some 20 bytes per FDE of 20 or
/// more), so only a crafted file reaches it; without it, 1 MiB of CIE
/// shared by 40 000 FDEs would be 40 G instructions.
const WORK_PER_BYTE: u64 = 8;
/// See [`WORK_PER_BYTE`].
const WORK_BASE: u64 = 1 << 20;

/// Largest threshold of the `.plt` expression (`(rip & 15) >= T`) that an
/// `UNWIND_PLT` row carries in its `cfa_offset`: 11 in classic `.plt`s, 9 or
/// 10 in IBT ones, 5 in MPX BND ones; beyond 15 the test is never true.
const PLT_THRESHOLD_MAX: u64 = 16;

/// Evaluates every FDE of `section` into spans of file offsets (through
/// `segments`), sorted, not overlapping, each FDE's equal neighbours
/// merged, at most `max_rows` of them ([`super::MAX_FILE_ROWS`] in
/// [`super::compile`]); counts what it saw in `stats`.
///
/// An FDE whose header or CIE cannot be parsed is left out (counted in
/// `fdes_malformed`); one whose program gimli cannot evaluate to its end
/// keeps its rows before the failing instruction (`fdes_cut`): real files
/// have such programs (libgcrypt 1.10 has `DW_CFA_def_cfa_register` after
/// a `DW_CFA_def_cfa_expression`, which DWARF leaves undefined and gimli
/// refuses), and refusing the whole file would lose every other FDE.
///
/// # Errors
/// [`CompileError::Cfi`] when an entry's length cannot be read (nothing
/// after it can be found), [`CompileError::TooMuchWork`] beyond the work
/// budget ([`WORK_PER_BYTE`]), [`CompileError::TooManyRows`] beyond
/// `max_rows` spans.
pub(super) fn spans(
    section: &CfiSection<'_>,
    segments: &Segments,
    max_rows: usize,
    stats: &mut TableStats,
) -> Result<Vec<Span>, CompileError> {
    let budget = (section.data.len() as u64)
        .saturating_mul(WORK_PER_BYTE)
        .saturating_add(WORK_BASE);
    let mut walk = Walk {
        name: section.kind.name(),
        max_rows,
        budget,
        work_limit: budget,
        segments,
        stats,
        spans: Vec::new(),
        fdes: Vec::new(),
    };
    match section.kind {
        CfiKind::EhFrame => {
            let mut eh_frame = EhFrame::new(section.data, LittleEndian);
            eh_frame.set_address_size(8);
            walk.section(&eh_frame, &section.bases)?;
        }
        CfiKind::DebugFrame => {
            let mut debug_frame = DebugFrame::new(section.data, LittleEndian);
            debug_frame.set_address_size(8);
            walk.section(&debug_frame, &section.bases)?;
        }
    }
    Ok(walk.finish())
}

/// One FDE's spans in [`Walk::spans`].
struct FdeSpans {
    /// Its first file offset.
    start: u64,
    /// One past its last file offset.
    end: u64,
    /// Index of its first span.
    first: usize,
    /// One past the index of its last span.
    last: usize,
}

/// The state of one pass over a CFI section.
struct Walk<'s, 'st> {
    /// The section's name, for errors.
    name: &'static str,
    /// The most spans allowed.
    max_rows: usize,
    /// Bytes of CIE and FDE entries that may still be evaluated.
    budget: u64,
    /// The whole budget, for the error.
    work_limit: u64,
    /// Virtual address to file offset.
    segments: &'s Segments,
    /// What was seen.
    stats: &'st mut TableStats,
    /// Every FDE's spans, in section order.
    spans: Vec<Span>,
    /// Every FDE with spans, in section order.
    fdes: Vec<FdeSpans>,
}

impl Walk<'_, '_> {
    /// Reads every entry of `section`, compiling each FDE.
    ///
    /// # Errors
    /// [`CompileError::Cfi`] when an entry's length cannot be read (the
    /// entries after it cannot be found); [`CompileError::TooMuchWork`];
    /// [`CompileError::TooManyRows`].
    fn section<'a, S>(&mut self, section: &S, bases: &BaseAddresses) -> Result<(), CompileError>
    where
        S: UnwindSection<Reader<'a>>,
    {
        let mut cies: HashMap<usize, CommonInformationEntry<Reader<'a>>> = HashMap::new();
        let mut ctx = UnwindContext::new();
        let mut entries = section.entries(bases);
        let mut last_offset = 0u64;
        loop {
            let entry = entries.next().map_err(|source| CompileError::Cfi {
                section: self.name,
                offset: last_offset,
                source,
            })?;
            match entry {
                None => return Ok(()),
                Some(CieOrFde::Cie(cie)) => {
                    last_offset = cie.offset() as u64;
                    cies.insert(cie.offset(), cie);
                }
                Some(CieOrFde::Fde(partial)) => {
                    last_offset = partial.offset() as u64;
                    self.stats.fdes += 1;
                    let parsed = partial.parse(|section, bases, offset| {
                        match cies.get(&UnwindOffset::into(offset)) {
                            Some(cie) => Ok(cie.clone()),
                            None => section.cie_from_offset(bases, offset),
                        }
                    });
                    match parsed {
                        Ok(fde) => {
                            let work = (fde.cie().entry_len() as u64)
                                .saturating_add(fde.entry_len() as u64);
                            self.budget =
                                self.budget
                                    .checked_sub(work)
                                    .ok_or(CompileError::TooMuchWork {
                                        section: self.name,
                                        limit: self.work_limit,
                                    })?;
                            self.fde(section, bases, &mut ctx, &fde)?;
                        }
                        // Its length was read: the entries after it are found.
                        Err(_) => self.stats.fdes_malformed += 1,
                    }
                }
            }
        }
    }

    /// Compiles one FDE: its rows, or one signal-frame span; a program that
    /// gimli cannot evaluate to its end keeps the rows before the failing
    /// instruction (counted in `fdes_cut`), the rest of its range unknown.
    ///
    /// # Errors
    /// [`CompileError::TooManyRows`].
    fn fde<'a, S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        ctx: &mut UnwindContext<usize>,
        fde: &FrameDescriptionEntry<Reader<'a>>,
    ) -> Result<(), CompileError>
    where
        S: UnwindSection<Reader<'a>>,
    {
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()).filter(|&end| end > start) else {
            self.stats.fdes_empty += 1;
            return Ok(());
        };
        let Some(segment) = self.segments.containing(start) else {
            self.stats.fdes_unmapped += 1;
            return Ok(());
        };
        if end > segment.end {
            self.stats.fdes_clipped += 1;
        }
        let end = end.min(segment.end);
        let first = self.spans.len();
        if fde.cie().is_signal_trampoline() {
            self.stats.signal_fdes += 1;
            self.push(
                first,
                segment.to_offset(start),
                segment.to_offset(end),
                Rule::of(UNWIND_SIGNAL),
            )?;
        } else {
            let ra = fde.cie().return_address_register();
            match fde.rows(section, bases, ctx) {
                Err(_) => self.stats.fdes_cut += 1,
                Ok(mut table) => loop {
                    let row = match table.next_row() {
                        Ok(Some(row)) => row,
                        Ok(None) => break,
                        Err(_) => {
                            self.stats.fdes_cut += 1;
                            break;
                        }
                    };
                    let row_start = row.start_address().max(start);
                    let row_end = row.end_address().min(end);
                    if row_start >= row_end {
                        continue;
                    }
                    self.stats.cfi_rows += 1;
                    let rule = classify(row, ra, section, self.stats);
                    self.push(
                        first,
                        segment.to_offset(row_start),
                        segment.to_offset(row_end),
                        rule,
                    )?;
                },
            }
        }
        if self.spans.len() > first {
            self.fdes.push(FdeSpans {
                start: segment.to_offset(start),
                end: segment.to_offset(end),
                first,
                last: self.spans.len(),
            });
        }
        Ok(())
    }

    /// Appends the span `start..end` of `rule` to the FDE whose spans begin
    /// at index `first`, or extends its last span when that one ends at
    /// `start` with the same rule.
    ///
    /// # Errors
    /// [`CompileError::TooManyRows`] beyond `max_rows` spans.
    fn push(&mut self, first: usize, start: u64, end: u64, rule: Rule) -> Result<(), CompileError> {
        if self.spans.len() > first
            && let Some(last) = self.spans.last_mut()
        {
            if last.end == start && last.rule == rule {
                last.end = end;
                self.stats.rows_merged += 1;
                return Ok(());
            }
            if start < last.end {
                // Rows of one program never go back; nothing to add if they did.
                return Ok(());
            }
        }
        if self.spans.len() >= self.max_rows {
            return Err(CompileError::TooManyRows {
                limit: self.max_rows,
            });
        }
        self.spans.push(Span { start, end, rule });
        Ok(())
    }

    /// The FDEs' spans by file offset, an FDE that overlaps one kept before
    /// it left out (counted).
    fn finish(mut self) -> Vec<Span> {
        // Stable: FDEs with the same start keep their order in the section.
        self.fdes.sort_by_key(|fde| fde.start);
        let mut out = Vec::with_capacity(self.spans.len());
        let mut covered = 0u64;
        for fde in &self.fdes {
            if fde.start < covered {
                self.stats.fdes_overlapping += 1;
                continue;
            }
            if let Some(spans) = self.spans.get(fde.first..fde.last) {
                out.extend_from_slice(spans);
            }
            covered = fde.end;
        }
        out
    }
}

/// The rule of one CFI row (see the module doc); `ra` is the CIE's return
/// address column. Counts unsupported rows and special kinds in `stats`.
fn classify<'a, S>(
    row: &UnwindTableRow<usize>,
    ra: Register,
    section: &S,
    stats: &mut TableStats,
) -> Rule
where
    S: UnwindSection<Reader<'a>>,
{
    match row.register(ra) {
        Some(RegisterRule::Undefined) => {
            stats.end_rows += 1;
            return Rule::of(UNWIND_END);
        }
        Some(RegisterRule::Offset(-8)) => {}
        _ => {
            stats.unsupported_ra_rows += 1;
            return Rule::UNKNOWN;
        }
    }
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let kind = match *register {
                X86_64::RSP => UNWIND_CFA_RSP,
                X86_64::RBP => UNWIND_CFA_RBP,
                _ => UNWIND_UNKNOWN,
            };
            match i32::try_from(*offset) {
                Ok(cfa_offset) if kind != UNWIND_UNKNOWN => Some(Rule {
                    kind,
                    rbp_slot: 0,
                    cfa_offset,
                }),
                _ => None,
            }
        }
        CfaRule::Expression(expression) => {
            match expression.get(section).ok().and_then(plt_threshold) {
                Some(threshold) if threshold <= PLT_THRESHOLD_MAX => {
                    if threshold != 11 {
                        stats.plt_other_rows += 1;
                    }
                    Some(Rule {
                        kind: UNWIND_PLT,
                        rbp_slot: 0,
                        cfa_offset: threshold as i32,
                    })
                }
                _ => None,
            }
        }
    };
    let Some(mut rule) = cfa else {
        stats.unsupported_rows += 1;
        return Rule::UNKNOWN;
    };
    match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => {}
        Some(RegisterRule::Offset(offset)) if offset % 8 == 0 && offset != 0 => {
            match i8::try_from(offset / 8) {
                Ok(slot) => rule.rbp_slot = slot,
                Err(_) => {
                    stats.unsupported_rbp_rows += 1;
                    return Rule::UNKNOWN;
                }
            }
        }
        Some(_) => {
            stats.unsupported_rbp_rows += 1;
            return Rule::UNKNOWN;
        }
    }
    if rule.kind == UNWIND_PLT {
        stats.plt_rows += 1;
    }
    rule
}

/// The threshold `T` when `expression` is the x86-64 psABI's `.plt` CFA
/// expression `DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15;
/// DW_OP_and; DW_OP_litT; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`
/// (`cfa = rsp + 8 + ((rip & 15) >= T ? 8 : 0)`), else `None`.
fn plt_threshold(expression: Expression<Reader<'_>>) -> Option<u64> {
    const OPS: usize = 9;
    let encoding = Encoding {
        address_size: 8,
        format: Format::Dwarf32,
        version: 4,
    };
    let mut operations = expression.operations(encoding);
    let mut ops = Vec::with_capacity(OPS);
    while let Some(op) = operations.next().ok()? {
        if ops.len() == OPS {
            return None;
        }
        ops.push(op);
    }
    match ops.as_slice() {
        [
            Operation::RegisterOffset {
                register: X86_64::RSP,
                offset: 8,
                ..
            },
            Operation::RegisterOffset {
                register: X86_64::RA,
                offset: 0,
                ..
            },
            Operation::UnsignedConstant { value: 15 },
            Operation::And,
            Operation::UnsignedConstant { value: threshold },
            Operation::Ge,
            Operation::UnsignedConstant { value: 3 },
            Operation::Shl,
            Operation::Plus,
        ] => Some(*threshold),
        _ => None,
    }
}
