//! The flattening of spans into pages, on synthetic spans: page splits,
//! merging, the row at `pc` 0, the unknown gaps, the limits; and
//! [`row_at`], the walker's lookup.

use std::collections::BTreeMap;

use tracer_common::{
    UNWIND_CFA_RBP, UNWIND_CFA_RSP, UNWIND_PLT, UNWIND_SIGNAL, UNWIND_UNKNOWN, UnwindRow,
};

use super::super::{CompileError, MAX_FILE_ROWS, Rule, Span, flatten::pages, row_at};
use super::super::{FileTable, TableStats};
use super::assert_invariants;

/// `cfa = rsp + offset`, `rbp` unchanged.
fn rsp(offset: i32) -> Rule {
    Rule {
        kind: UNWIND_CFA_RSP,
        rbp_slot: 0,
        cfa_offset: offset,
    }
}

/// `cfa = rbp + 16`, `rbp` at `cfa - 16`.
fn rbp_frame() -> Rule {
    Rule {
        kind: UNWIND_CFA_RBP,
        rbp_slot: -2,
        cfa_offset: 16,
    }
}

/// The span `start..end` of `rule`.
fn span(start: u64, end: u64, rule: Rule) -> Span {
    Span { start, end, rule }
}

/// The row at `pc` of `rule`.
fn row(pc: u16, rule: Rule) -> UnwindRow {
    rule.row(pc)
}

/// The pages of `spans` with the real limit, checked against the
/// invariants, and the counts.
fn flat(spans: &[Span]) -> (BTreeMap<u32, Vec<UnwindRow>>, TableStats) {
    let mut stats = TableStats::default();
    let pages = pages(spans, MAX_FILE_ROWS, &mut stats).expect("flatten");
    assert_invariants(&FileTable {
        pages: pages.clone(),
        stats,
    });
    (pages, stats)
}

#[test]
fn span_inside_a_page_gets_an_unknown_row_at_pc0_and_one_at_its_end() {
    let (pages, _) = flat(&[span(0x1_1010, 0x1_1020, rsp(8))]);
    let want = BTreeMap::from([(
        1,
        vec![
            row(0, Rule::UNKNOWN),
            row(0x1010, rsp(8)),
            row(0x1020, Rule::UNKNOWN),
        ],
    )]);
    assert_eq!(pages, want);
}

#[test]
fn span_at_a_page_start_needs_no_extra_row_at_pc0() {
    let (pages, _) = flat(&[span(0x2_0000, 0x2_0010, rsp(16))]);
    assert_eq!(
        pages,
        BTreeMap::from([(2, vec![row(0, rsp(16)), row(0x10, Rule::UNKNOWN)])])
    );
}

#[test]
fn adjacent_spans_with_one_rule_merge_into_one_row() {
    let (pages, stats) = flat(&[
        span(0, 0x10, rsp(8)),
        span(0x10, 0x20, rsp(8)),
        span(0x20, 0x30, rsp(16)),
    ]);
    assert_eq!(
        pages,
        BTreeMap::from([(
            0,
            vec![row(0, rsp(8)), row(0x20, rsp(16)), row(0x30, Rule::UNKNOWN)]
        )])
    );
    assert_eq!(stats.rows_merged, 1);
}

#[test]
fn gap_between_spans_is_unknown() {
    let (pages, _) = flat(&[span(0, 0x10, rsp(8)), span(0x20, 0x30, rsp(8))]);
    assert_eq!(
        pages,
        BTreeMap::from([(
            0,
            vec![
                row(0, rsp(8)),
                row(0x10, Rule::UNKNOWN),
                row(0x20, rsp(8)),
                row(0x30, Rule::UNKNOWN),
            ]
        )])
    );
}

#[test]
fn unknown_span_and_the_gap_after_it_are_one_row() {
    let (pages, stats) = flat(&[
        span(0, 0x10, rsp(8)),
        span(0x10, 0x20, Rule::UNKNOWN),
        span(0x30, 0x40, rbp_frame()),
    ]);
    assert_eq!(
        pages,
        BTreeMap::from([(
            0,
            vec![
                row(0, rsp(8)),
                row(0x10, Rule::UNKNOWN),
                row(0x30, rbp_frame()),
                row(0x40, Rule::UNKNOWN),
            ]
        )])
    );
    // The gap at 0x20 repeats the unknown row at 0x10.
    assert_eq!(stats.rows_merged, 1);
}

#[test]
fn span_across_pages_starts_each_page_with_its_rule() {
    let (pages, _) = flat(&[span(0xfff0, 0x3_0010, rsp(24))]);
    assert_eq!(
        pages,
        BTreeMap::from([
            (0, vec![row(0, Rule::UNKNOWN), row(0xfff0, rsp(24))]),
            (1, vec![row(0, rsp(24))]),
            (2, vec![row(0, rsp(24))]),
            (3, vec![row(0, rsp(24)), row(0x10, Rule::UNKNOWN)]),
        ])
    );
}

#[test]
fn rule_changing_in_a_later_page_fills_the_pages_between() {
    let (pages, _) = flat(&[
        span(0x10, 0x2_0008, rsp(8)),
        span(0x2_0008, 0x2_0010, rsp(16)),
    ]);
    assert_eq!(
        pages,
        BTreeMap::from([
            (0, vec![row(0, Rule::UNKNOWN), row(0x10, rsp(8))]),
            (1, vec![row(0, rsp(8))]),
            (
                2,
                vec![row(0, rsp(8)), row(0x8, rsp(16)), row(0x10, Rule::UNKNOWN)]
            ),
        ])
    );
}

#[test]
fn span_ending_at_a_page_boundary_leaves_no_unknown_only_page() {
    let (pages, _) = flat(&[span(0x100, 0x1_0000, rsp(8))]);
    assert_eq!(
        pages,
        BTreeMap::from([(0, vec![row(0, Rule::UNKNOWN), row(0x100, rsp(8))])])
    );
}

#[test]
fn pages_between_distant_spans_are_absent() {
    let (pages, _) = flat(&[
        span(0x10, 0x20, rsp(8)),
        span(0x5_0010, 0x5_0020, Rule::of(UNWIND_PLT)),
    ]);
    assert_eq!(pages.keys().copied().collect::<Vec<_>>(), vec![0, 5]);
    assert_eq!(
        pages[&5],
        vec![
            row(0, Rule::UNKNOWN),
            row(0x10, Rule::of(UNWIND_PLT)),
            row(0x20, Rule::UNKNOWN)
        ]
    );
}

#[test]
fn unknown_spans_alone_give_no_pages() {
    let (pages, _) = flat(&[
        span(0, 0x10, Rule::UNKNOWN),
        span(0x1_0000, 0x1_0010, Rule::UNKNOWN),
    ]);
    assert!(pages.is_empty(), "{pages:?}");
    let (pages, _) = flat(&[]);
    assert!(pages.is_empty());
}

#[test]
fn empty_and_overlapping_spans_are_ignored() {
    let (pages, _) = flat(&[
        span(0, 0x10, rsp(8)),
        span(0x8, 0x18, rsp(16)),
        span(0x20, 0x20, rsp(32)),
        span(0x30, 0x28, rsp(32)),
    ]);
    assert_eq!(
        pages,
        BTreeMap::from([(0, vec![row(0, rsp(8)), row(0x10, Rule::UNKNOWN)])])
    );
}

#[test]
fn rows_beyond_the_limit_are_an_error() {
    let spans = [
        span(0, 0x10, rsp(8)),
        span(0x10, 0x20, rsp(16)),
        span(0x20, 0x30, rsp(24)),
    ];
    let mut stats = TableStats::default();
    // rsp+8, rsp+16, rsp+24, unknown: 4 rows.
    assert_eq!(
        pages(&spans, 4, &mut stats)
            .expect("4 rows fit")
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        4
    );
    let err = pages(&spans, 3, &mut stats).expect_err("3 rows do not");
    assert!(
        matches!(err, CompileError::TooManyRows { limit: 3 }),
        "{err}"
    );
    // The pages a long span fills count too.
    let err = pages(&[span(0x10, 0x10_0000, rsp(8))], 8, &mut stats).expect_err("16 pages");
    assert!(
        matches!(err, CompileError::TooManyRows { limit: 8 }),
        "{err}"
    );
}

#[test]
fn offset_whose_page_exceeds_u32_is_an_error() {
    let start = 1u64 << 48;
    let err = pages(
        &[span(start, start + 1, rsp(8))],
        MAX_FILE_ROWS,
        &mut TableStats::default(),
    )
    .expect_err("page 2^32");
    assert!(
        matches!(err, CompileError::OffsetTooLarge { offset } if offset == start),
        "{err}"
    );
}

#[test]
fn row_at_finds_the_row_in_force_as_the_walker_does() {
    let (pages, stats) = flat(&[
        span(0xfff0, 0x1_0008, rsp(8)),
        span(0x1_0008, 0x1_0010, Rule::of(UNWIND_SIGNAL)),
        span(0x3_0000, 0x3_0004, rbp_frame()),
    ]);
    let table = FileTable { pages, stats };
    let rule_at = |offset: u64| {
        let r = row_at(&table, offset);
        (r.kind, r.rbp_slot, r.cfa_offset)
    };
    let of = |rule: Rule| (rule.kind, rule.rbp_slot, rule.cfa_offset);
    assert_eq!(rule_at(0), of(Rule::UNKNOWN));
    assert_eq!(rule_at(0xffef), of(Rule::UNKNOWN));
    assert_eq!(rule_at(0xfff0), of(rsp(8)));
    assert_eq!(rule_at(0xffff), of(rsp(8)));
    assert_eq!(rule_at(0x1_0000), of(rsp(8)));
    assert_eq!(rule_at(0x1_0007), of(rsp(8)));
    assert_eq!(rule_at(0x1_0008), of(Rule::of(UNWIND_SIGNAL)));
    assert_eq!(rule_at(0x1_0010), of(Rule::UNKNOWN));
    // Page 2 is absent: unknown.
    assert_eq!(rule_at(0x2_0000), of(Rule::UNKNOWN));
    assert_eq!(rule_at(0x3_0003), of(rbp_frame()));
    assert_eq!(rule_at(0x3_0004).0, UNWIND_UNKNOWN);
    assert_eq!(rule_at(u64::MAX).0, UNWIND_UNKNOWN);
}
