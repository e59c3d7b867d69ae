//! The differential against binutils: for every row that
//! `readelf --debug-dump=frames-interp` prints for a file (its CFA, `rbp`
//! and `ra` columns at each LOC), the table compiled from the same file,
//! looked up at the LOC's file offset, must hold the same rule; so must
//! offsets between rows (the last byte before the next row, the middle),
//! and the byte after each FDE that no other FDE covers must be unknown.
//! Segments come from `readelf -lW`, the expressions behind readelf's
//! `exp` from `readelf --debug-dump=frames` (the raw program), so nothing
//! of the compiler's own parsing serves as its judge.
//!
//! Where readelf itself cannot judge, rows are not compared but counted
//! (`rules.rs` pins those cases by address): its `u` is both "not saved
//! yet" and an explicit `DW_CFA_undefined`, so `rbp` rows of FDEs whose raw
//! program has `DW_CFA_undefined: r6` are skipped; and it reads CFA offsets
//! into 32 bits (both dumps print `0x100000008` as 8), so the fixture's one
//! FDE with such an offset is skipped by address.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use tracer_common::{
    UNWIND_CFA_RBP, UNWIND_CFA_RSP, UNWIND_END, UNWIND_PLT, UNWIND_SIGNAL, UNWIND_UNKNOWN,
};

use super::super::FileTable;
use super::super::{compile, row_at};
use super::{Scratch, assert_invariants, build, system_files};

/// An executable `PT_LOAD`: `(p_vaddr, p_offset, p_filesz)`.
pub(super) type Text = (u64, u64, u64);

/// `(kind, rbp_slot, cfa_offset)`.
type Rule = (u8, i8, i32);

const UNKNOWN: Rule = (UNWIND_UNKNOWN, 0, 0);

/// The threshold T of the `.plt` CFA expression that `UNWIND_PLT`
/// implements, as readelf prints it (T in the row's `cfa_offset`).
fn plt_threshold(expression: &str) -> Option<i64> {
    let rest = expression.strip_prefix(
        "DW_OP_breg7 (rsp): 8; DW_OP_breg16 (rip): 0; DW_OP_lit15; DW_OP_and; DW_OP_lit",
    )?;
    let (threshold, tail) = rest.split_once(';')?;
    (tail == " DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus")
        .then(|| threshold.parse().ok())
        .flatten()
}

/// Runs `readelf args file` and returns its standard output.
fn readelf(args: &[&str], file: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .expect("running readelf (binutils)");
    assert!(out.status.success(), "readelf {args:?} {}", file.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The executable `PT_LOAD` segments of `file`, by `readelf -lW`.
pub(super) fn segments(file: &Path) -> Vec<Text> {
    readelf(&["-lW"], file)
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.first() != Some(&"LOAD") || words.len() < 8 {
                return None;
            }
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
            // Flags are words 6.. but the last (the alignment): "R E", "RW".
            let flags = words[6..words.len() - 1].concat();
            flags
                .contains('E')
                .then(|| Some((hex(words[2])?, hex(words[1])?, hex(words[4])?)))
                .flatten()
        })
        .collect()
}

/// The file offset of `vaddr`, if an executable segment holds it.
pub(super) fn to_offset(text: &[Text], vaddr: u64) -> Option<u64> {
    text.iter()
        .find(|&&(start, _, size)| vaddr >= start && vaddr - start < size)
        .map(|&(start, offset, _)| vaddr - start + offset)
}

/// One CIE or FDE as readelf prints it.
#[derive(Debug, Default)]
struct Entry {
    /// Its offset in the section.
    offset: u64,
    /// FDE: the CIE's offset; CIE: `None`.
    cie: Option<u64>,
    /// CIE: its augmentation string.
    augmentation: String,
    /// FDE: `pc=start..end`.
    pc: (u64, u64),
    /// The interpreted table: LOC and column → value.
    rows: Vec<(u64, HashMap<String, String>)>,
}

/// The entries of the section `section` (`.eh_frame`, `.debug_frame`) in
/// readelf's `frames-interp` dump `text`.
fn parse_interp(text: &str, section: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut inside = false;
    let mut header: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Contents of the ") {
            inside = rest.starts_with(&format!("{section} section"));
            continue;
        }
        if !inside || line.trim().is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 4 && (words[3] == "CIE" || words[3] == "FDE") {
            let mut entry = Entry {
                offset: u64::from_str_radix(words[0], 16).unwrap(),
                ..Entry::default()
            };
            if words[3] == "CIE" {
                entry.augmentation = words[4].trim_matches('"').to_string();
            } else {
                let cie = words[4].strip_prefix("cie=").unwrap();
                entry.cie = Some(u64::from_str_radix(cie, 16).unwrap());
                let pc = words[5].strip_prefix("pc=").unwrap();
                let (start, end) = pc.split_once("..").unwrap();
                entry.pc = (
                    u64::from_str_radix(start, 16).unwrap(),
                    u64::from_str_radix(end, 16).unwrap(),
                );
            }
            entries.push(entry);
            continue;
        }
        if words.first() == Some(&"LOC") {
            header = words.iter().map(ToString::to_string).collect();
            continue;
        }
        if words.get(1) == Some(&"ZERO") {
            continue;
        }
        // A row: values split like the header, but a register value reads
        // "r3 (rbx)": glue a "(name)" word to the one before it.
        let mut values: Vec<String> = Vec::new();
        for word in words {
            match values.last_mut() {
                Some(last) if word.starts_with('(') => {
                    last.push(' ');
                    last.push_str(word);
                }
                _ => values.push(word.to_string()),
            }
        }
        assert_eq!(values.len(), header.len(), "row {line:?} under {header:?}");
        let loc = u64::from_str_radix(&values[0], 16).unwrap();
        let columns = header.iter().cloned().zip(values).skip(1).collect();
        entries.last_mut().unwrap().rows.push((loc, columns));
    }
    entries
}

/// What the raw program of an entry says that `frames-interp` hides.
#[derive(Debug, Default)]
struct Raw {
    /// The `DW_CFA_def_cfa_expression` texts.
    expressions: Vec<String>,
    /// `DW_CFA_undefined: r6 (rbp)`.
    undefines_rbp: bool,
}

/// The raw programs of the section `section` in readelf's `frames` dump,
/// by entry offset.
fn parse_raw(text: &str, section: &str) -> HashMap<u64, Raw> {
    let mut raws: HashMap<u64, Raw> = HashMap::new();
    let mut inside = false;
    let mut current = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Contents of the ") {
            inside = rest.starts_with(&format!("{section} section"));
            continue;
        }
        if !inside {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 4 && (words[3] == "CIE" || words[3] == "FDE") {
            let offset = u64::from_str_radix(words[0], 16).unwrap();
            raws.entry(offset).or_default();
            current = Some(offset);
            continue;
        }
        let (Some(offset), Some(op)) = (current, line.trim().strip_prefix("DW_CFA_")) else {
            continue;
        };
        let raw = raws.get_mut(&offset).unwrap();
        if let Some(expression) = op.strip_prefix("def_cfa_expression (") {
            raw.expressions
                .push(expression.trim_end_matches(')').to_string());
        }
        if op.starts_with("undefined: r6 ") {
            raw.undefines_rbp = true;
        }
    }
    raws
}

/// The rule readelf's row states (`None`: not comparable, see the module
/// doc), in the FDE whose CIE has augmentation `augmentation` and whose
/// raw program (with its CIE's) is `raw`.
fn expected(columns: &HashMap<String, String>, augmentation: &str, raw: &Raw) -> Option<Rule> {
    if augmentation.contains('S') {
        return Some((UNWIND_SIGNAL, 0, 0));
    }
    match columns.get("ra").map(String::as_str) {
        Some("u") => return Some((UNWIND_END, 0, 0)),
        Some("c-8") => {}
        _ => return Some(UNKNOWN),
    }
    let cfa = columns.get("CFA").expect("a CFA column");
    let (kind, offset) = if let Some(n) = cfa.strip_prefix("rsp") {
        (UNWIND_CFA_RSP, n.parse::<i64>().unwrap())
    } else if let Some(n) = cfa.strip_prefix("rbp") {
        (UNWIND_CFA_RBP, n.parse::<i64>().unwrap())
    } else if cfa == "exp" {
        match raw.expressions.as_slice() {
            [one] if plt_threshold(one).is_some_and(|t| t <= 16) => {
                (UNWIND_PLT, plt_threshold(one).unwrap_or(0))
            }
            [_] => return Some(UNKNOWN),
            // No or several expressions: which one is in force is unclear.
            _ => return None,
        }
    } else {
        return Some(UNKNOWN);
    };
    let Ok(offset) = i32::try_from(offset) else {
        return Some(UNKNOWN);
    };
    let slot = match columns.get("rbp").map(String::as_str) {
        None | Some("s") => 0,
        Some("u") if raw.undefines_rbp => return None,
        Some("u") => 0,
        Some(saved) => {
            let Some(n) = saved.strip_prefix('c').and_then(|n| n.parse::<i64>().ok()) else {
                return Some(UNKNOWN);
            };
            match i8::try_from(n / 8) {
                Ok(slot) if n % 8 == 0 && n != 0 => slot,
                _ => return Some(UNKNOWN),
            }
        }
    };
    Some((kind, slot, offset))
}

/// What comparing one file found.
#[derive(Debug, Default)]
struct Compared {
    /// FDEs compared.
    fdes: usize,
    /// readelf rows compared (at their LOC).
    rows: usize,
    /// Offsets between rows compared.
    between: usize,
    /// Offsets after FDEs compared (unknown).
    gaps: usize,
    /// Rows not comparable (see the module doc).
    skipped: usize,
    /// Mismatches, described.
    mismatches: Vec<String>,
}

/// Compares the table of `file` with readelf's dump of the CFI section the
/// compiler reads (`.eh_frame`, else `.debug_frame`), but for the rows of
/// FDEs that start at one of the addresses `unjudged`.
fn compare(file: &Path, unjudged: &[u64]) -> Compared {
    let bytes = std::fs::read(file).unwrap();
    let table = compile(&bytes).unwrap_or_else(|e| panic!("compile {}: {e}", file.display()));
    assert_invariants(&table);
    let section = if table.stats.from_debug_frame {
        ".debug_frame"
    } else {
        ".eh_frame"
    };
    // Not following .gnu_debuglink: the file's own sections only.
    let interp = parse_interp(
        &readelf(&["--debug-dump=frames-interp,no-follow-links"], file),
        section,
    );
    let raws = parse_raw(
        &readelf(&["--debug-dump=frames,no-follow-links"], file),
        section,
    );
    let text = segments(file);
    let cies: HashMap<u64, &Entry> = interp
        .iter()
        .filter(|e| e.cie.is_none())
        .map(|e| (e.offset, e))
        .collect();
    let kept = kept_fdes(&interp, &text);
    let mut out = Compared::default();
    let no_raw = Raw::default();
    for (i, fde) in kept.iter().enumerate() {
        out.fdes += 1;
        let cie = cies[&fde.cie.unwrap()];
        let fde_raw = raws.get(&fde.offset).unwrap_or(&no_raw);
        let cie_raw = raws.get(&cie.offset).unwrap_or(&no_raw);
        let raw = merged_raw(cie_raw, fde_raw);
        let rows = fde_rows(fde, cie);
        for (j, &(loc, columns)) in rows.iter().enumerate() {
            let end = rows.get(j + 1).map_or(fde.pc.1, |next| next.0);
            let judged = if unjudged.contains(&fde.pc.0) {
                None
            } else {
                expected(columns, &cie.augmentation, &raw)
            };
            let Some(want) = judged else {
                out.skipped += 1;
                continue;
            };
            let mut probes = vec![(loc, true)];
            if end - loc > 1 {
                probes.push((end - 1, false));
            }
            if end - loc > 2 {
                probes.push((loc + (end - loc) / 2, false));
            }
            for (address, at_loc) in probes {
                // Past the segment's file bytes the compiler cuts the FDE.
                let Some(offset) = to_offset(&text, address) else {
                    continue;
                };
                let row = row_at(&table, offset);
                let got = (row.kind, row.rbp_slot, row.cfa_offset);
                if at_loc {
                    out.rows += 1;
                } else {
                    out.between += 1;
                }
                if got != want {
                    out.mismatches.push(format!(
                        "{}: FDE {:#x} pc {:#x}..{:#x}, address {address:#x} (row {loc:#x}): \
                         got {got:?}, want {want:?} from {columns:?}",
                        file.display(),
                        fde.offset,
                        fde.pc.0,
                        fde.pc.1
                    ));
                }
            }
        }
        // The byte after the FDE, when no kept FDE starts there.
        let after = fde.pc.1;
        if kept.get(i + 1).is_none_or(|next| next.pc.0 > after)
            && let Some(offset) = to_offset(&text, after)
        {
            out.gaps += 1;
            let row = row_at(&table, offset);
            if row.kind != UNWIND_UNKNOWN {
                out.mismatches.push(format!(
                    "{}: after FDE {:#x} (pc {:#x}..{after:#x}): got {row:?}, want unknown",
                    file.display(),
                    fde.offset,
                    fde.pc.0
                ));
            }
        }
    }
    out
}

/// FDEs as the compiler keeps them: in executable segments (`text`), not
/// empty, by start (then place), none overlapping one kept before.
fn kept_fdes<'a>(interp: &'a [Entry], text: &[Text]) -> Vec<&'a Entry> {
    let mut fdes: Vec<&Entry> = interp
        .iter()
        .filter(|e| e.cie.is_some() && e.pc.0 < e.pc.1)
        .filter(|e| to_offset(text, e.pc.0).is_some())
        .collect();
    fdes.sort_by_key(|e| e.pc.0);
    let mut kept: Vec<&Entry> = Vec::new();
    for fde in fdes {
        if kept.last().is_none_or(|last| fde.pc.0 >= last.pc.1) {
            kept.push(fde);
        }
    }
    kept
}

/// The raw facts of an FDE with its CIE's: their expressions together
/// (sorted, once each), and whether either undefines `rbp`.
fn merged_raw(cie_raw: &Raw, fde_raw: &Raw) -> Raw {
    Raw {
        expressions: cie_raw
            .expressions
            .iter()
            .chain(&fde_raw.expressions)
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        undefines_rbp: cie_raw.undefines_rbp || fde_raw.undefines_rbp,
    }
}

/// The rows `readelf` prints for `fde` (of CIE `cie`): (location, its
/// columns), in the FDE's range, one per location.
fn fde_rows<'a>(fde: &'a Entry, cie: &'a Entry) -> Vec<(u64, &'a HashMap<String, String>)> {
    // An FDE of only nops prints no table: the CIE's rules hold.
    let rows: Vec<(u64, &HashMap<String, String>)> = if fde.rows.is_empty() {
        cie.rows
            .iter()
            .map(|(_, c)| (fde.pc.0, c))
            .take(1)
            .collect()
    } else {
        fde.rows.iter().map(|(loc, c)| (*loc, c)).collect()
    };
    // A LOC printed twice (advance by 0): the later row holds.
    let mut rows: Vec<(u64, &HashMap<String, String>)> = rows
        .into_iter()
        .filter(|(loc, _)| *loc < fde.pc.1)
        .collect();
    rows.dedup_by(|later, earlier| {
        if later.0 == earlier.0 {
            *earlier = *later;
            true
        } else {
            false
        }
    });
    rows
}

/// Compares `file` (but for FDEs at `unjudged`), prints the counts, fails
/// on any mismatch or on a file with (almost) nothing compared.
fn assert_same_as_readelf(file: &Path, unjudged: &[u64]) -> Compared {
    let compared = compare(file, unjudged);
    eprintln!(
        "{}: {} FDEs, {} rows, {} between, {} gaps compared; {} rows skipped",
        file.display(),
        compared.fdes,
        compared.rows,
        compared.between,
        compared.gaps,
        compared.skipped
    );
    assert!(
        compared.mismatches.is_empty(),
        "{} mismatches:\n{}",
        compared.mismatches.len(),
        compared.mismatches[..compared.mismatches.len().min(30)].join("\n")
    );
    assert!(
        compared.rows >= 10,
        "{}: too little compared",
        file.display()
    );
    compared
}

#[test]
fn system_files_match_readelf() {
    for file in system_files() {
        assert_same_as_readelf(&file, &[]);
    }
}

/// The fixture builds the differential compares: `(name, source, flags)`.
const FIXTURE_BUILDS: &[(&str, &str, &[&str])] = &[
    (
        "chain-O2",
        "unwind_chain.c",
        &["-O2", "-fomit-frame-pointer", "-g"],
    ),
    (
        "chain-O2-nopie",
        "unwind_chain.c",
        &["-O2", "-fomit-frame-pointer", "-g", "-no-pie"],
    ),
    (
        "chain-O0-fp",
        "unwind_chain.c",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    ),
    ("cfi", "unwind_cfi.c", &["-O2", "-g"]),
    // A lazy IBT .plt: binutils 2.40 gives it the threshold 9, not 11.
    (
        "chain-ibtplt",
        "unwind_chain.c",
        &[
            "-O2",
            "-fcf-protection=full",
            "-Wl,-z,ibtplt",
            "-Wl,-z,lazy",
        ],
    ),
];

#[test]
fn compiled_fixtures_match_readelf() {
    let dir = Scratch::new("readelf");
    let mut rows_by_kind = [0usize; 6];
    for (name, source, flags) in FIXTURE_BUILDS {
        let binary = build(&dir, source, flags, name);
        // The 4 GiB CFA offset readelf reads as 8 (rules.rs pins it).
        let unjudged = if *name == "cfi" {
            vec![symbols(&binary)["cfi_cfa_huge"]]
        } else {
            Vec::new()
        };
        let compared = assert_same_as_readelf(&binary, &unjudged);
        let table: FileTable = compile(&std::fs::read(&binary).unwrap()).unwrap();
        for row in table.pages.values().flatten() {
            rows_by_kind[usize::from(row.kind)] += 1;
        }
        if *name == "cfi" {
            // readelf's `u` (rbp undefined) and the 4 GiB CFA: 2 rows each.
            assert_eq!(compared.skipped, 4, "{compared:?}");
        }
        if *name == "chain-ibtplt" {
            // IBT's threshold (9 here): still UNWIND_PLT, counted apart.
            assert!(table.stats.plt_other_rows > 0, "{:?}", table.stats);
            assert!(table.stats.plt_rows > 0, "{:?}", table.stats);
        }
    }
    // The fixtures between them have every kind of row.
    assert!(rows_by_kind.iter().all(|&n| n > 0), "{rows_by_kind:?}");
}

#[test]
fn debug_frame_only_file_matches_readelf() {
    let dir = Scratch::new("debugframe");
    let built = build(
        &dir,
        "unwind_chain.c",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
        "chain-df",
    );
    // crt's objects bring an .eh_frame: remove it, keep .debug_frame.
    let only: PathBuf = dir.path().join("chain-df-only");
    let status = Command::new("objcopy")
        .args([
            "--remove-section",
            ".eh_frame",
            "--remove-section",
            ".eh_frame_hdr",
        ])
        .arg(&built)
        .arg(&only)
        .status()
        .unwrap();
    assert!(status.success());
    let table = compile(&std::fs::read(&only).unwrap()).unwrap();
    assert!(table.stats.from_debug_frame);
    assert_same_as_readelf(&only, &[]);
}

/// The value of every defined symbol of `binary`, by `nm`.
pub(super) fn symbols(binary: &Path) -> BTreeMap<String, u64> {
    let out = Command::new("nm").arg(binary).output().expect("running nm");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let value = u64::from_str_radix(words.next()?, 16).ok()?;
            let _kind = words.next()?;
            Some((words.next()?.to_string(), value))
        })
        .collect()
}
