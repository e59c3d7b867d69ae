//! Tests of the table compiler: the flattening on synthetic spans
//! (`flatten`). The shared pieces are here: the table's invariants.

use tracer_common::{UNWIND_END, UNWIND_PAGE_SHIFT, UNWIND_UNKNOWN};

use super::super::FileTable;
use super::MAX_FILE_ROWS;

mod flatten;

/// Checks what every table must be (the `FileTable` contract): each page
/// has rows, the first at `pc` 0, `pc`s strictly increasing, no two
/// neighbours with the same rule, some row that is not `UNWIND_UNKNOWN`,
/// kinds known, at most [`MAX_FILE_ROWS`] rows in all.
pub(super) fn assert_invariants(table: &FileTable) {
    assert!(table.rows() <= MAX_FILE_ROWS);
    for (page, rows) in &table.pages {
        assert_eq!(rows.first().map(|r| r.pc), Some(0), "page {page:#x}");
        assert!(
            rows.iter().any(|r| r.kind != UNWIND_UNKNOWN),
            "page {page:#x} has only unknown rows"
        );
        for row in rows {
            assert!(row.kind <= UNWIND_END, "page {page:#x}: {row:?}");
        }
        for pair in rows.windows(2) {
            assert!(pair[0].pc < pair[1].pc, "page {page:#x}: {pair:?}");
            let same = (pair[0].kind, pair[0].rbp_slot, pair[0].cfa_offset)
                == (pair[1].kind, pair[1].rbp_slot, pair[1].cfa_offset);
            assert!(!same, "page {page:#x}: unmerged {pair:?}");
        }
    }
    // Pages are keyed by page number: every key fits the file-offset space.
    if let Some((&last, _)) = table.pages.last_key_value() {
        assert!(u64::from(last) < (u64::MAX >> UNWIND_PAGE_SHIFT));
    }
}
