//! Spans of rules into the pages of a [`super::FileTable`].
//!
//! Input: spans sorted by file offset, not overlapping (others are ignored).
//! Output: for each 64 KiB page of file offsets that some span with a rule
//! other than `UNWIND_UNKNOWN` touches, its rows sorted by `pc`, strictly
//! increasing, the first at `pc` 0 with the rule in force where the page
//! begins, no two neighbours with the same rule (across pages too: a page's
//! first row may repeat the last rule of the page before). Offsets between
//! spans are `UNWIND_UNKNOWN`; pages with only `UNWIND_UNKNOWN` are absent.
use std::collections::BTreeMap;

use tracer_common::{UNWIND_PAGE_SHIFT, UNWIND_UNKNOWN, UnwindRow};

use super::{CompileError, Rule, Span, TableStats};

/// The offsets within a page: its low bits.
const PAGE_MASK: u64 = (1 << UNWIND_PAGE_SHIFT) - 1;

/// The pages of `spans` (see the module doc), at most `max_rows` rows in
/// all ([`super::MAX_FILE_ROWS`] in [`super::compile`]); rules equal to the one
/// before them are counted in `stats.rows_merged`.
///
/// # Errors
/// [`CompileError::TooManyRows`] beyond `max_rows` rows;
/// [`CompileError::OffsetTooLarge`] for an offset whose page does not fit
/// `u32`.
pub(super) fn pages(
    spans: &[Span],
    max_rows: usize,
    stats: &mut TableStats,
) -> Result<BTreeMap<u32, Vec<UnwindRow>>, CompileError> {
    let mut pages = Pages {
        max_rows,
        ..Pages::default()
    };
    let mut end: Option<u64> = None;
    for span in spans {
        if span.start >= span.end {
            continue;
        }
        if let Some(end) = end {
            if span.start < end {
                continue;
            }
            if span.start > end {
                pages.set(end, Rule::UNKNOWN, stats)?;
            }
        }
        pages.set(span.start, span.rule, stats)?;
        end = Some(span.end);
    }
    if let Some(end) = end {
        pages.set(end, Rule::UNKNOWN, stats)?;
    }
    Ok(pages.finish())
}

/// The pages being built, a step function of the offset: each [`Pages::set`]
/// changes the rule from its offset on.
#[derive(Default)]
struct Pages {
    /// Finished pages.
    done: BTreeMap<u32, Vec<UnwindRow>>,
    /// The page being built, if any.
    page: Option<u32>,
    /// Its rows so far.
    rows: Vec<UnwindRow>,
    /// The rule in force after the last row.
    in_force: Rule,
    /// Rows in `done` and `rows`.
    total: usize,
    /// The most rows allowed in all.
    max_rows: usize,
}

impl Pages {
    /// From `offset` on (above every earlier one), `rule` is in force.
    fn set(&mut self, offset: u64, rule: Rule, stats: &mut TableStats) -> Result<(), CompileError> {
        if rule == self.in_force {
            stats.rows_merged += 1;
            return Ok(());
        }
        let page = u32::try_from(offset >> UNWIND_PAGE_SHIFT)
            .map_err(|_| CompileError::OffsetTooLarge { offset })?;
        // Within its page: below 1 << UNWIND_PAGE_SHIFT, fits u16.
        let pc = (offset & PAGE_MASK) as u16;
        if self.page != Some(page) {
            let previous = self.page;
            self.close();
            // Pages wholly under the rule in force have one row.
            if let Some(previous) = previous
                && self.in_force != Rule::UNKNOWN
            {
                for between in previous.saturating_add(1)..page {
                    self.count(1)?;
                    self.done.insert(between, vec![self.in_force.row(0)]);
                }
            }
            self.page = Some(page);
            if pc != 0 {
                self.push(self.in_force.row(0))?;
            }
        }
        self.push(rule.row(pc))?;
        self.in_force = rule;
        Ok(())
    }

    /// Adds `row` to the page being built.
    fn push(&mut self, row: UnwindRow) -> Result<(), CompileError> {
        self.count(1)?;
        self.rows.push(row);
        Ok(())
    }

    /// Counts `n` more rows.
    ///
    /// # Errors
    /// [`CompileError::TooManyRows`] beyond `max_rows`.
    fn count(&mut self, n: usize) -> Result<(), CompileError> {
        self.total = self.total.saturating_add(n);
        if self.total > self.max_rows {
            return Err(CompileError::TooManyRows {
                limit: self.max_rows,
            });
        }
        Ok(())
    }

    /// Finishes the page being built: kept if any row says more than
    /// `UNWIND_UNKNOWN`.
    fn close(&mut self) {
        let rows = std::mem::take(&mut self.rows);
        if let Some(page) = self.page.take() {
            if rows.iter().any(|row| row.kind != UNWIND_UNKNOWN) {
                self.done.insert(page, rows);
            } else {
                self.total = self.total.saturating_sub(rows.len());
            }
        }
    }

    /// The finished pages.
    fn finish(mut self) -> BTreeMap<u32, Vec<UnwindRow>> {
        self.close();
        self.done
    }
}
