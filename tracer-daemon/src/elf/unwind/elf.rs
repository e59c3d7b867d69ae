//! What the compiler needs from an ELF file: that it is x86-64, its
//! executable `PT_LOAD` segments (to turn an FDE's virtual addresses into
//! file offsets) and its CFI section with the base addresses its pointer
//! encodings are relative to. Reads only; every size and offset is checked
//! against the file's length.
use gimli::BaseAddresses;
use object::{
    CompressionFormat, Endianness, Object as _, ObjectSection as _, ReadRef, elf,
    read::elf::{ElfFile64, FileHeader as _, ProgramHeader as _},
};

use super::CompileError;

/// Which CFI section a table comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CfiKind {
    /// `.eh_frame`: pointer encodings, CIE pointers relative to the entry.
    EhFrame,
    /// `.debug_frame`: absolute addresses, CIE offsets from the section.
    DebugFrame,
}

impl CfiKind {
    /// The section's name, for errors.
    pub(super) fn name(self) -> &'static str {
        match self {
            CfiKind::EhFrame => ".eh_frame",
            CfiKind::DebugFrame => ".debug_frame",
        }
    }
}

/// A CFI section's bytes and how to read them.
pub(super) struct CfiSection<'a> {
    /// Which section.
    pub(super) kind: CfiKind,
    /// Its bytes, inside the file.
    pub(super) data: &'a [u8],
    /// The addresses of `.eh_frame`, `.text` and `.got` (pc-, text- and
    /// data-relative pointers); empty for `.debug_frame`.
    pub(super) bases: BaseAddresses,
}

/// An executable `PT_LOAD` segment's file bytes: virtual addresses
/// `vaddr..end` are file offsets `offset..offset + (end - vaddr)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Segment {
    /// `p_vaddr`.
    pub(super) vaddr: u64,
    /// `p_vaddr + p_filesz`, with `p_filesz` cut to the file's end.
    pub(super) end: u64,
    /// `p_offset`.
    pub(super) offset: u64,
}

impl Segment {
    /// The file offset of `vaddr`, one of `self.vaddr..=self.end`.
    pub(super) fn to_offset(self, vaddr: u64) -> u64 {
        vaddr.saturating_sub(self.vaddr).saturating_add(self.offset)
    }
}

/// The executable segments, sorted by `vaddr`.
#[derive(Clone, Debug, Default)]
pub(super) struct Segments(Vec<Segment>);

impl Segments {
    /// Segments from `(p_vaddr, p_offset, p_filesz)` of executable
    /// `PT_LOAD` headers, their file bytes cut to `file_len`; segments with
    /// no bytes in the file left out.
    pub(super) fn new(headers: impl IntoIterator<Item = (u64, u64, u64)>, file_len: u64) -> Self {
        let mut segments: Vec<Segment> = headers
            .into_iter()
            .filter_map(|(vaddr, offset, filesz)| {
                let size = filesz.min(file_len.checked_sub(offset)?);
                let end = vaddr.checked_add(size)?;
                (size > 0).then_some(Segment { vaddr, end, offset })
            })
            .collect();
        segments.sort_by_key(|s| s.vaddr);
        Segments(segments)
    }

    /// The segment whose addresses hold `vaddr` (the last one starting at
    /// or below it, when malformed segments overlap).
    pub(super) fn containing(&self, vaddr: u64) -> Option<Segment> {
        let after = self.0.partition_point(|s| s.vaddr <= vaddr);
        let segment = *self.0.get(after.checked_sub(1)?)?;
        (vaddr < segment.end).then_some(segment)
    }
}

/// What [`ElfInfo::parse`] found.
pub(super) struct ElfInfo<'a> {
    /// The executable segments.
    pub(super) segments: Segments,
    /// The CFI section, if the file has one with entries.
    pub(super) cfi: Option<CfiSection<'a>>,
}

impl<'a> ElfInfo<'a> {
    /// Reads the header, the program headers and the section table of the
    /// ELF file `data`.
    ///
    /// # Errors
    /// [`CompileError::Elf`] for bytes that are not an ELF file object can
    /// read; [`CompileError::Machine`] for anything but 64-bit
    /// little-endian x86-64; [`CompileError::Section`] when the CFI section
    /// lies outside the file or is compressed.
    /// Parses the file `data`: its whole bytes, or a reader of the file
    /// that reads only the ranges asked for (`object::ReadCache`: headers,
    /// the section names and the CFI section).
    pub(super) fn parse<R: ReadRef<'a>>(data: R) -> Result<Self, CompileError> {
        let ident = data
            .read_bytes_at(0, 6)
            .map_err(|()| CompileError::Elf("shorter than an ELF ident".into()))?;
        if ident.get(..4) != Some(&elf::ELFMAG[..]) {
            return Err(CompileError::Elf("no ELF magic".into()));
        }
        if ident.get(4) != Some(&elf::ELFCLASS64) {
            return Err(CompileError::Machine {
                what: format!("ELF class {}", ident.get(4).copied().unwrap_or(0)),
            });
        }
        if ident.get(5) != Some(&elf::ELFDATA2LSB) {
            return Err(CompileError::Machine {
                what: format!("ELF data encoding {}", ident.get(5).copied().unwrap_or(0)),
            });
        }
        let file = ElfFile64::<Endianness, R>::parse(data)
            .map_err(|e| CompileError::Elf(e.to_string()))?;
        let endian = file.endian();
        let machine = file.elf_header().e_machine(endian);
        if machine != elf::EM_X86_64 {
            return Err(CompileError::Machine {
                what: format!("e_machine {machine:#x}"),
            });
        }
        let file_len = data
            .len()
            .map_err(|()| CompileError::Elf("the file's length cannot be read".into()))?;
        let segments = Segments::new(
            file.elf_program_headers()
                .iter()
                .filter(|ph| {
                    ph.p_type(endian) == elf::PT_LOAD && ph.p_flags(endian) & elf::PF_X != 0
                })
                .map(|ph| (ph.p_vaddr(endian), ph.p_offset(endian), ph.p_filesz(endian))),
            file_len,
        );
        let address_of = |name: &str| file.section_by_name(name).map(|s| s.address());
        let mut cfi = None;
        for kind in [CfiKind::EhFrame, CfiKind::DebugFrame] {
            let Some(section) = file.section_by_name(kind.name()) else {
                continue;
            };
            let unreadable = |reason: String| CompileError::Section {
                section: kind.name(),
                reason,
            };
            let range = section
                .compressed_file_range()
                .map_err(|e| unreadable(e.to_string()))?;
            if range.format != CompressionFormat::None {
                return Err(unreadable(format!("compressed ({:?})", range.format)));
            }
            let bytes = section.data().map_err(|e| unreadable(e.to_string()))?;
            // An `.eh_frame` of only its zero terminator has no entries.
            if bytes.len() <= 4 {
                continue;
            }
            let mut bases = BaseAddresses::default();
            if kind == CfiKind::EhFrame {
                bases = bases.set_eh_frame(section.address());
                if let Some(text) = address_of(".text") {
                    bases = bases.set_text(text);
                }
                if let Some(got) = address_of(".got") {
                    bases = bases.set_got(got);
                }
            }
            cfi = Some(CfiSection {
                kind,
                data: bytes,
                bases,
            });
            break;
        }
        Ok(ElfInfo { segments, cfi })
    }
}
