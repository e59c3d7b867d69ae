//! Every rule of the classification, each pinned at a known address: on
//! `fixtures/unwind_cfi.c` (hand-written CFI, assembled by `cc`) looked up
//! at its symbols, and on synthetic ELF files for what no assembler emits
//! (overlapping FDEs, FDEs outside the segments, addresses that are not
//! file offsets). Also the errors: other machines, not ELF at all.

use std::path::Path;
use std::process::Command;

use tracer_common::{
    UNWIND_CFA_RBP, UNWIND_CFA_RSP, UNWIND_END, UNWIND_PLT, UNWIND_SIGNAL, UNWIND_UNKNOWN,
};

use super::super::{CompileError, compile, row_at};
use super::synth::{self, EM_X86_64, Fde, R, RX};
use super::{Scratch, assert_invariants, build};

/// `(kind, rbp_slot, cfa_offset)`.
type Want = (u8, i8, i32);

const UNKNOWN: Want = (UNWIND_UNKNOWN, 0, 0);

/// `cfa = rsp + offset`, `rbp` at `slot` (0: unchanged).
const fn rsp(offset: i32, slot: i8) -> Want {
    (UNWIND_CFA_RSP, slot, offset)
}

/// The rule the table of `binary` has at `symbol + delta` (PIE: the text
/// segment's addresses are its file offsets; checked).
fn rules_at(binary: &Path, checks: &[(&str, i64, Want)]) {
    let bytes = std::fs::read(binary).unwrap();
    let table = compile(&bytes).expect("compile the fixture");
    assert_invariants(&table);
    let symbols = super::readelf::symbols(binary);
    let text = super::readelf::segments(binary);
    let mut wrong = Vec::new();
    for &(symbol, delta, want) in checks {
        let address = symbols[symbol].checked_add_signed(delta).unwrap();
        let offset = super::readelf::to_offset(&text, address).expect("in the text");
        let row = row_at(&table, offset);
        let got = (row.kind, row.rbp_slot, row.cfa_offset);
        if got != want {
            wrong.push(format!("{symbol}{delta:+}: got {got:?}, want {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn hand_written_cfi_compiles_to_the_rules_it_states() {
    let dir = Scratch::new("rules");
    let binary = build(&dir, "unwind_cfi.c", &["-O2", "-g"], "cfi");
    rules_at(
        &binary,
        &[
            ("cfi_outermost", 0, (UNWIND_END, 0, 0)),
            ("cfi_outermost", 7, (UNWIND_END, 0, 0)),
            ("cfi_rbp_frame", 0, rsp(8, 0)),
            ("cfi_rbp_frame", 1, rsp(16, -2)),
            ("cfi_rbp_frame", 3, rsp(16, -2)),
            ("cfi_rbp_frame", 4, (UNWIND_CFA_RBP, -2, 16)),
            ("cfi_rbp_frame", 9, (UNWIND_CFA_RBP, -2, 16)),
            ("cfi_rbp_frame", 10, rsp(8, -2)),
            // No CFI: a gap.
            ("cfi_none", 0, UNKNOWN),
            ("cfi_none", 5, UNKNOWN),
            // The nop before the trampoline is covered; the one before not.
            ("cfi_signal", -2, UNKNOWN),
            ("cfi_signal", -1, (UNWIND_SIGNAL, 0, 0)),
            ("cfi_signal", 0, (UNWIND_SIGNAL, 0, 0)),
            ("cfi_signal", 6, (UNWIND_SIGNAL, 0, 0)),
            ("cfi_rbp_in_register", 0, rsp(8, 0)),
            ("cfi_rbp_in_register", 1, UNKNOWN),
            ("cfi_rbp_in_register", 2, rsp(8, 0)),
            ("cfi_rbp_far", 0, rsp(8, 0)),
            ("cfi_rbp_far", 1, UNKNOWN),
            ("cfi_rbp_undefined", 1, UNKNOWN),
            ("cfi_cfa_r10", 4, rsp(8, 0)),
            ("cfi_cfa_r10", 5, UNKNOWN),
            ("cfi_cfa_huge", 1, UNKNOWN),
            ("cfi_cfa_large", 1, rsp(0x10_0008, 0)),
            ("cfi_ra_elsewhere", 1, UNKNOWN),
            ("cfi_plt11", 0, rsp(8, 0)),
            ("cfi_plt11", 1, (UNWIND_PLT, 0, 11)),
            ("cfi_plt10", 1, (UNWIND_PLT, 0, 10)),
            ("cfi_cfa_deref", 1, UNKNOWN),
            ("cfi_remember", 1, rsp(16, 1)),
            ("cfi_remember", 2, rsp(24, 1)),
            ("cfi_remember", 3, rsp(16, 1)),
        ],
    );
}

#[test]
fn hand_written_cfi_counts_what_it_could_not_compile() {
    let dir = Scratch::new("counts");
    let binary = build(&dir, "unwind_cfi.c", &["-O2", "-g"], "cfi");
    let stats = compile(&std::fs::read(binary).unwrap()).unwrap().stats;
    assert_eq!(stats.signal_fdes, 1);
    assert_eq!(stats.unsupported_ra_rows, 1, "{stats:?}");
    // rbp in rbx, 2048 bytes below the CFA, undefined.
    assert_eq!(stats.unsupported_rbp_rows, 3, "{stats:?}");
    assert_eq!(stats.plt_other_rows, 1, "{stats:?}");
    // r10, beyond i32, the deref.
    assert!(stats.unsupported_rows >= 3, "{stats:?}");
    // cfi_outermost, and crt1's _start.
    assert!(stats.end_rows >= 2, "{stats:?}");
    assert!(stats.plt_rows >= 1, "{stats:?}");
    assert!(!stats.from_debug_frame);
}

/// `DW_CFA_advance_loc` by `delta` (below 64).
fn advance(delta: u8) -> u8 {
    0x40 | delta
}

/// `DW_CFA_def_cfa_offset` `offset` (below 128).
const fn cfa_offset(offset: u8) -> [u8; 2] {
    [0x0e, offset]
}

#[test]
fn fde_addresses_become_file_offsets_through_their_segment() {
    // Text at 0x401000.. from file offset 0x1000.
    let frame = synth::eh_frame(&[Fde::new(
        0x40_1010,
        0x20,
        &[advance(4), cfa_offset(16)[0], cfa_offset(16)[1]],
    )]);
    let elf = synth::elf(
        EM_X86_64,
        &[(0x40_1000, 0x1000, 0x1000, RX)],
        &frame,
        0x2000,
    );
    let table = compile(&elf).unwrap();
    assert_invariants(&table);
    let at = |offset| {
        let r = row_at(&table, offset);
        (r.kind, r.rbp_slot, r.cfa_offset)
    };
    assert_eq!(at(0x100f), UNKNOWN);
    assert_eq!(at(0x1010), rsp(8, 0));
    assert_eq!(at(0x1014), rsp(16, 0));
    assert_eq!(at(0x102f), rsp(16, 0));
    assert_eq!(at(0x1030), UNKNOWN);
    assert_eq!(table.stats.fdes, 1);
    assert_eq!(table.stats.cfi_rows, 2);
}

#[test]
fn overlapping_fde_is_left_out_whole_and_counted() {
    let frame = synth::eh_frame(&[
        Fde::new(0x1000, 0x20, &[advance(4), 0x0e, 16]),
        // Overlaps the first: left out, though its own tail is free.
        Fde::new(0x1010, 0x40, &[0x0e, 32]),
        // Starts where the first ends: kept.
        Fde::new(0x1020, 0x10, &[0x0e, 24]),
    ]);
    let elf = synth::elf(EM_X86_64, &[(0x1000, 0x1000, 0x1000, RX)], &frame, 0x2000);
    let table = compile(&elf).unwrap();
    assert_invariants(&table);
    assert_eq!(table.stats.fdes_overlapping, 1);
    let kinds: Vec<_> = table.pages[&0]
        .iter()
        .map(|r| (r.pc, r.kind, r.cfa_offset))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (0, UNWIND_UNKNOWN, 0),
            (0x1000, UNWIND_CFA_RSP, 8),
            (0x1004, UNWIND_CFA_RSP, 16),
            (0x1020, UNWIND_CFA_RSP, 24),
            (0x1030, UNWIND_UNKNOWN, 0),
        ]
    );
}

#[test]
fn fdes_outside_executable_segments_are_left_out_and_long_ones_cut() {
    let frame = synth::eh_frame(&[
        // In the read-only segment: no code there.
        Fde::new(0x100, 0x10, &[]),
        // Nowhere.
        Fde::new(0x9000, 0x10, &[]),
        // Empty.
        Fde::new(0x1000, 0, &[]),
        // Runs past the text's file bytes (0x1000..0x1800): cut.
        Fde::new(0x1700, 0x200, &[]),
    ]);
    let elf = synth::elf(
        EM_X86_64,
        &[(0, 0, 0x400, R), (0x1000, 0x1000, 0x800, RX)],
        &frame,
        0x1800,
    );
    let table = compile(&elf).unwrap();
    assert_invariants(&table);
    let stats = table.stats;
    assert_eq!(
        (
            stats.fdes,
            stats.fdes_unmapped,
            stats.fdes_empty,
            stats.fdes_clipped
        ),
        (4, 2, 1, 1)
    );
    assert_eq!(row_at(&table, 0x17ff).kind, UNWIND_CFA_RSP);
    assert_eq!(row_at(&table, 0x1800).kind, UNWIND_UNKNOWN);
    assert_eq!(row_at(&table, 0x100).kind, UNWIND_UNKNOWN);
}

#[test]
fn signal_frame_fde_is_one_signal_range_whatever_its_program() {
    let frame = synth::eh_frame(&[Fde {
        start: 0x1000,
        len: 0x10,
        // An expression CFA, as glibc's __restore_rt has.
        program: vec![0x0f, 0x03, 0x77, 0xa0, 0x01, advance(4), 0x0e, 16],
        signal: true,
    }]);
    let elf = synth::elf(EM_X86_64, &[(0x1000, 0x1000, 0x1000, RX)], &frame, 0x2000);
    let table = compile(&elf).unwrap();
    assert_eq!(
        table.pages[&0]
            .iter()
            .map(|r| (r.pc, r.kind))
            .collect::<Vec<_>>(),
        vec![
            (0, UNWIND_UNKNOWN),
            (0x1000, UNWIND_SIGNAL),
            (0x1010, UNWIND_UNKNOWN)
        ]
    );
    assert_eq!(table.stats.signal_fdes, 1);
    assert_eq!(table.stats.cfi_rows, 0);
}

#[test]
fn rows_past_the_fde_end_are_cut() {
    // The program advances beyond its 8 bytes.
    let frame = synth::eh_frame(&[Fde::new(
        0x1000,
        8,
        &[advance(4), 0x0e, 16, advance(20), 0x0e, 32],
    )]);
    let elf = synth::elf(EM_X86_64, &[(0x1000, 0x1000, 0x1000, RX)], &frame, 0x2000);
    let table = compile(&elf).unwrap();
    assert_invariants(&table);
    assert_eq!(row_at(&table, 0x1007).cfa_offset, 16);
    assert_eq!(row_at(&table, 0x1008).kind, UNWIND_UNKNOWN);
    assert_eq!(row_at(&table, 0x1018).kind, UNWIND_UNKNOWN);
}

#[test]
fn program_gimli_cannot_evaluate_keeps_its_rows_up_to_there() {
    // As libgcrypt 1.10's: DW_CFA_def_cfa_register after a CFA expression
    // (DWARF leaves it undefined; gimli refuses it).
    let program = [
        advance(4),
        0x0e,
        16,
        advance(4),
        // cfa = *(rsp + 536) + 56
        0x0f,
        6,
        0x77,
        0x98,
        0x04,
        0x06,
        0x23,
        0x38,
        advance(4),
        // DW_CFA_def_cfa_register rsp
        0x0d,
        7,
    ];
    let frame = synth::eh_frame(&[
        Fde::new(0x1000, 0x10, &program),
        Fde::new(0x1010, 0x10, &[advance(1), 0x0e, 16]),
    ]);
    let elf = synth::elf(EM_X86_64, &[(0x1000, 0x1000, 0x1000, RX)], &frame, 0x2000);
    let table = compile(&elf).expect("one odd FDE does not refuse the file");
    assert_invariants(&table);
    let rows: Vec<_> = table.pages[&0]
        .iter()
        .map(|r| (r.pc, r.kind, r.cfa_offset))
        .collect();
    assert_eq!(
        rows,
        vec![
            (0, UNWIND_UNKNOWN, 0),
            (0x1000, UNWIND_CFA_RSP, 8),
            (0x1004, UNWIND_CFA_RSP, 16),
            // The expression, then the cut: unknown up to the next FDE.
            (0x1008, UNWIND_UNKNOWN, 0),
            (0x1010, UNWIND_CFA_RSP, 8),
            (0x1011, UNWIND_CFA_RSP, 16),
            (0x1020, UNWIND_UNKNOWN, 0),
        ]
    );
    assert_eq!((table.stats.fdes_cut, table.stats.unsupported_rows), (1, 1));
}

#[test]
fn fde_whose_cie_cannot_be_read_is_left_out_alone() {
    let mut frame = synth::eh_frame(&[Fde::new(0x1000, 0x10, &[]), Fde::new(0x1010, 0x10, &[])]);
    // The first FDE follows the two 24-byte CIEs, at 48; its CIE pointer
    // (at 52, relative to itself) is made to point at the FDE itself.
    frame[52..56].copy_from_slice(&4u32.to_le_bytes());
    let elf = synth::elf(EM_X86_64, &[(0x1000, 0x1000, 0x1000, RX)], &frame, 0x2000);
    let table = compile(&elf).unwrap();
    assert_eq!((table.stats.fdes, table.stats.fdes_malformed), (2, 1));
    assert_eq!(row_at(&table, 0x1008).kind, UNWIND_UNKNOWN);
    assert_eq!(row_at(&table, 0x1018).kind, UNWIND_CFA_RSP);
}

#[test]
fn unframeable_section_is_an_error() {
    let mut frame = synth::eh_frame(&[Fde::new(0x1000, 0x10, &[])]);
    // The FDE's length runs past the section's end.
    frame[48..52].copy_from_slice(&0x1000u32.to_le_bytes());
    let elf = synth::elf(EM_X86_64, &[(0x1000, 0x1000, 0x1000, RX)], &frame, 0x2000);
    let err = compile(&elf).expect_err("no way to the next entry");
    assert!(
        matches!(
            err,
            CompileError::Cfi {
                section: ".eh_frame",
                offset: 24,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn other_machines_classes_and_non_elf_bytes_are_refused() {
    let frame = synth::eh_frame(&[Fde::new(0x1000, 8, &[])]);
    let arm = synth::elf(0xb7, &[(0x1000, 0x1000, 0x1000, RX)], &frame, 0x2000);
    let err = compile(&arm).expect_err("aarch64");
    assert!(
        matches!(&err, CompileError::Machine { what } if what == "e_machine 0xb7"),
        "{err}"
    );
    let mut elf32 = synth::elf(EM_X86_64, &[], &frame, 0);
    elf32[4] = 1;
    assert!(matches!(compile(&elf32), Err(CompileError::Machine { .. })));
    let mut big_endian = synth::elf(EM_X86_64, &[], &frame, 0);
    big_endian[5] = 2;
    assert!(matches!(
        compile(&big_endian),
        Err(CompileError::Machine { .. })
    ));
    assert!(matches!(compile(b"#!/bin/sh\n"), Err(CompileError::Elf(_))));
    assert!(matches!(compile(b""), Err(CompileError::Elf(_))));
    assert!(matches!(compile(b"\x7fELF"), Err(CompileError::Elf(_))));
}

#[test]
fn files_without_cfi_or_segments_have_empty_tables() {
    let dir = Scratch::new("nocfi");
    let binary = build(&dir, "unwind_chain.c", &["-O2"], "chain");
    let stripped = dir.path().join("stripped");
    let status = Command::new("objcopy")
        .args([
            "--remove-section",
            ".eh_frame",
            "--remove-section",
            ".eh_frame_hdr",
        ])
        .args(["--remove-section", ".debug_frame"])
        .arg(&binary)
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(status.success());
    let table = compile(&std::fs::read(&stripped).unwrap()).unwrap();
    assert!(table.pages.is_empty());
    assert_eq!(table.stats.fdes, 0);
    // A relocatable object: FDEs, but no segment to place them.
    let object = build(&dir, "unwind_chain.c", &["-O2", "-c"], "chain.o");
    let table = compile(&std::fs::read(&object).unwrap()).unwrap();
    assert!(table.pages.is_empty());
    assert!(table.stats.fdes > 0);
    assert_eq!(table.stats.fdes_unmapped, table.stats.fdes);
}

#[test]
fn long_cie_shared_by_many_fdes_is_refused_not_evaluated_each_time() {
    // 1 MiB of CIE instructions, evaluated again for each of 40 000 FDEs:
    // 40 G instructions from a 2 MiB file, unless refused.
    let fdes: Vec<Fde> = (0..40_000)
        .map(|i| Fde::new(0x1000 + i * 4, 4, &[]))
        .collect();
    let frame = synth::eh_frame_with_long_cie(&fdes, 1 << 20);
    let elf = synth::elf(EM_X86_64, &[(0x1000, 0x1000, 0x30000, RX)], &frame, 0x40000);
    let started = std::time::Instant::now();
    let err = compile(&elf).expect_err("too much work");
    assert!(
        matches!(
            err,
            CompileError::TooMuchWork {
                section: ".eh_frame",
                ..
            }
        ),
        "{err}"
    );
    // Not a timing test: only a guard against evaluating it all.
    assert!(started.elapsed().as_secs() < 60);
}
