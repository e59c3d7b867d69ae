//! Property tests: whatever the bytes (random, a real file with bits
//! flipped or cut short, a synthetic file with random CFI programs),
//! [`compile`] returns, never panics, and every table it returns keeps the
//! invariants. Seeded, so a failure reproduces.

use rand::rngs::StdRng;
use rand::{Rng as _, RngCore as _, SeedableRng as _};

use super::super::compile;
use super::synth::{self, EH_FRAME_OFFSET, EM_X86_64, Fde, RX};
use super::{Scratch, assert_invariants, build};

/// Compiles `bytes`; a table must keep the invariants. Returns whether it
/// compiled.
fn survives(bytes: &[u8]) -> bool {
    match compile(bytes) {
        Ok(table) => {
            assert_invariants(&table);
            true
        }
        Err(_) => false,
    }
}

/// Flips `1..=max_flips` random bits of `bytes`, each within `range`
/// when given (else anywhere).
fn flip(rng: &mut StdRng, bytes: &mut [u8], range: Option<std::ops::Range<usize>>, max_flips: u32) {
    let range = range.unwrap_or(0..bytes.len());
    for _ in 0..rng.random_range(1..=max_flips) {
        let at = rng.random_range(range.clone());
        bytes[at] ^= 1 << rng.random_range(0..8);
    }
}

/// The file range of `.eh_frame` in `elf`, by `object`.
fn eh_frame_range(elf: &[u8]) -> std::ops::Range<usize> {
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(elf).unwrap();
    let (start, size) = file
        .section_by_name(".eh_frame")
        .unwrap()
        .file_range()
        .unwrap();
    usize::try_from(start).unwrap()..usize::try_from(start + size).unwrap()
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = StdRng::seed_from_u64(0x756e_7769_6e64);
    let header = synth::elf(
        EM_X86_64,
        &[(0x1000, 0x1000, 0x1000, RX)],
        &synth::eh_frame(&[]),
        0,
    );
    for i in 0..3000 {
        let mut bytes = vec![0u8; rng.random_range(0..2048)];
        rng.fill_bytes(&mut bytes);
        // Two in three start as an x86-64 ELF header, to get further.
        if i % 3 != 0 {
            let n = bytes.len().min(64);
            bytes[..n].copy_from_slice(&header[..n]);
        }
        survives(&bytes);
    }
}

#[test]
fn bit_flipped_and_truncated_fixture_never_panics() {
    let dir = Scratch::new("flip");
    let binary = build(
        &dir,
        "unwind_chain.c",
        &["-O2", "-fomit-frame-pointer"],
        "chain",
    );
    let original = std::fs::read(binary).unwrap();
    assert!(survives(&original));
    let frame = eh_frame_range(&original);
    let mut rng = StdRng::seed_from_u64(11);
    let mut compiled = 0;
    for i in 0..1500 {
        let mut bytes = original.clone();
        match i % 4 {
            // Headers (ELF, program, section): where sizes and offsets are.
            0 => flip(&mut rng, &mut bytes, Some(0..0x400), 4),
            3 => {
                let cut = rng.random_range(0..bytes.len());
                bytes.truncate(cut);
            }
            _ => flip(&mut rng, &mut bytes, Some(frame.clone()), 3),
        }
        compiled += usize::from(survives(&bytes));
    }
    // Most flips in .eh_frame still parse: the deep paths ran.
    assert!(compiled > 300, "{compiled} of 1500 compiled");
}

#[test]
fn bit_flipped_libc_eh_frame_never_panics() {
    let original = std::fs::read("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let frame = eh_frame_range(&original);
    let mut rng = StdRng::seed_from_u64(6);
    for _ in 0..12 {
        let mut bytes = original.clone();
        flip(&mut rng, &mut bytes, Some(frame.clone()), 16);
        survives(&bytes);
    }
}

#[test]
fn random_cfi_programs_never_panic() {
    let mut rng = StdRng::seed_from_u64(0xcf1);
    // Opcodes worth drawing often: advance, def_cfa*, offset, restore,
    // remember/restore state, expressions, undefined, same value.
    const OPS: &[u8] = &[
        0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x2e, 0x41, 0x46, 0x86, 0x90, 0xc6,
    ];
    let mut compiled = 0;
    for _ in 0..3000 {
        let fdes: Vec<Fde> = (0..rng.random_range(1..6))
            .map(|_| {
                let mut program = Vec::new();
                for _ in 0..rng.random_range(0..24) {
                    if rng.random_bool(0.6) {
                        program.push(OPS[rng.random_range(0..OPS.len())]);
                    } else {
                        program.push(rng.random());
                    }
                }
                Fde {
                    start: 0x1000 + rng.random_range(0..0x40) * 8,
                    len: rng.random_range(0..0x200),
                    program,
                    signal: rng.random_bool(0.05),
                }
            })
            .collect();
        let frame = synth::eh_frame(&fdes);
        let elf = synth::elf(EM_X86_64, &[(0x1000, 0x1000, 0x2000, RX)], &frame, 0x3000);
        assert!(elf.len() > EH_FRAME_OFFSET);
        compiled += usize::from(survives(&elf));
    }
    assert!(compiled > 300, "{compiled} of 3000 compiled");
}

/// A reader of a file that counts the bytes read through it.
struct Counting {
    file: std::fs::File,
    read: std::rc::Rc<std::cell::Cell<u64>>,
}

impl std::io::Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

impl std::io::Seek for Counting {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.file.seek(pos)
    }
}

/// Compiled from a reader of the file, a table is the one its whole bytes
/// give, and only the headers, section names and CFI section are read: for
/// this test binary (a debug build of hundreds of MiB, the kind tracerd
/// read whole at every new program of a busy build host, 1 GiB peaks) and
/// for libc.
#[test]
fn a_file_read_through_a_cache_compiles_the_same_table_from_a_fraction_of_its_bytes() {
    for path in [
        std::env::current_exe().unwrap(),
        std::path::PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6"),
    ] {
        let whole = std::fs::read(&path).unwrap();
        let read = std::rc::Rc::new(std::cell::Cell::new(0));
        let cache = object::ReadCache::new(Counting {
            file: std::fs::File::open(&path).unwrap(),
            read: read.clone(),
        });
        let from_cache = super::super::compile_from(&cache).unwrap();
        assert_eq!(from_cache, compile(&whole).unwrap(), "{}", path.display());
        assert!(from_cache.rows() > 1000, "{}", path.display());
        let file = std::fs::File::open(&path).unwrap();
        assert_eq!(super::super::compile_file(file).unwrap(), from_cache);
        // Read: the ELF, program and section headers, the section names,
        // the symbol tables (object reads them at parse) and the CFI.
        let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*whole).unwrap();
        use object::{Object as _, ObjectSection as _};
        let needed: u64 = [
            ".eh_frame",
            ".shstrtab",
            ".symtab",
            ".strtab",
            ".dynsym",
            ".dynstr",
        ]
        .iter()
        .filter_map(|name| elf.section_by_name(name))
        .map(|s| s.size())
        .sum();
        let headers = 64 + 56 * 32 + 64 * elf.sections().count() as u64;
        eprintln!(
            "{}: {} of {} bytes read",
            path.display(),
            read.get(),
            whole.len()
        );
        assert!(
            read.get() <= needed + headers + 64 * 1024,
            "{}: {} bytes read of {} for {} bytes of sections",
            path.display(),
            read.get(),
            whole.len(),
            needed
        );
    }
}
