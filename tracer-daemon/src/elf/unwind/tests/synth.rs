//! Synthetic ELF files built byte by byte: an ELF header, `PT_LOAD`
//! segments, one `.eh_frame` of hand-encoded CIEs and FDEs (absolute
//! 8-byte addresses, `DW_EH_PE_udata8`) and a `.shstrtab`. For what no
//! compiler emits on purpose: overlapping FDEs, FDEs outside any segment,
//! segments whose addresses are not their offsets, random CFI programs.

/// `e_machine` of x86-64.
pub(super) const EM_X86_64: u16 = 62;
/// `PF_X | PF_R`.
pub(super) const RX: u32 = 5;
/// `PF_R`.
pub(super) const R: u32 = 4;

/// A `PT_LOAD` segment: `(p_vaddr, p_offset, p_filesz, p_flags)`.
pub(super) type Load = (u64, u64, u64, u32);

/// One FDE: addresses `start..start + len`, its CFI program, and whether
/// its CIE is a signal frame's (augmentation `zRS`).
pub(super) struct Fde {
    /// First address.
    pub(super) start: u64,
    /// Bytes covered.
    pub(super) len: u64,
    /// Call frame instructions after the CIE's `DW_CFA_def_cfa rsp 8;
    /// DW_CFA_offset rip c-8`.
    pub(super) program: Vec<u8>,
    /// Use the `zRS` CIE.
    pub(super) signal: bool,
}

impl Fde {
    /// An FDE of the plain CIE.
    pub(super) fn new(start: u64, len: u64, program: &[u8]) -> Self {
        Fde {
            start,
            len,
            program: program.to_vec(),
            signal: false,
        }
    }
}

/// Appends `entry` (after its length word) padded with `DW_CFA_nop` to a
/// multiple of 8 bytes in all.
fn push_entry(out: &mut Vec<u8>, entry: &[u8]) {
    let mut body = entry.to_vec();
    while !(body.len() + 4).is_multiple_of(8) {
        body.push(0);
    }
    out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
    out.extend_from_slice(&body);
}

/// A CIE: version 1, augmentation `zR` (or `zRS`), code alignment 1, data
/// alignment -8, return address column 16, FDE addresses `udata8`,
/// initial rules `cfa = rsp + 8`, `rip` at `c-8`.
fn cie(signal: bool) -> Vec<u8> {
    let mut cie = vec![0, 0, 0, 0, 1];
    cie.extend_from_slice(if signal { b"zRS\0" } else { b"zR\0" });
    cie.extend_from_slice(&[1, 0x78, 16, 1, 0x04]);
    cie.extend_from_slice(&[0x0c, 7, 8, 0x90, 1]);
    cie
}

/// The `.eh_frame` bytes of `fdes`, with a zero terminator.
pub(super) fn eh_frame(fdes: &[Fde]) -> Vec<u8> {
    eh_frame_with_long_cie(fdes, 0)
}

/// [`eh_frame`], the plain CIE's initial instructions followed by `nops`
/// more `DW_CFA_nop`s (evaluated again for each of its FDEs).
pub(super) fn eh_frame_with_long_cie(fdes: &[Fde], nops: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let plain = out.len();
    let mut long = cie(false);
    long.resize(long.len() + nops, 0);
    push_entry(&mut out, &long);
    let signal = out.len();
    push_entry(&mut out, &cie(true));
    for fde in fdes {
        let here = out.len() + 4;
        let cie_at = if fde.signal { signal } else { plain };
        let mut entry = u32::try_from(here - cie_at).unwrap().to_le_bytes().to_vec();
        entry.extend_from_slice(&fde.start.to_le_bytes());
        entry.extend_from_slice(&fde.len.to_le_bytes());
        entry.push(0);
        entry.extend_from_slice(&fde.program);
        push_entry(&mut out, &entry);
    }
    out.extend_from_slice(&[0, 0, 0, 0]);
    out
}

/// Where `.eh_frame` starts in the files [`elf`] builds.
pub(super) const EH_FRAME_OFFSET: usize = 0x400;

/// An ELF file of machine `machine` with the segments `loads`, the section
/// `.eh_frame` holding `eh_frame` at [`EH_FRAME_OFFSET`], at least
/// `min_len` bytes long (so that segments have file bytes).
pub(super) fn elf(machine: u16, loads: &[Load], eh_frame: &[u8], min_len: usize) -> Vec<u8> {
    let names = b"\0.eh_frame\0.shstrtab\0";
    let names_at = EH_FRAME_OFFSET + eh_frame.len();
    let sections_at = (names_at + names.len()).next_multiple_of(8);
    let mut out = vec![0u8; sections_at + 3 * 64];
    let put = |out: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        out[at..at + bytes.len()].copy_from_slice(bytes);
    };
    // The ELF header.
    put(&mut out, 0, &[0x7f, b'E', b'L', b'F', 2, 1, 1]);
    put(&mut out, 16, &3u16.to_le_bytes());
    put(&mut out, 18, &machine.to_le_bytes());
    put(&mut out, 20, &1u32.to_le_bytes());
    put(&mut out, 32, &64u64.to_le_bytes());
    put(&mut out, 40, &(sections_at as u64).to_le_bytes());
    put(&mut out, 52, &64u16.to_le_bytes());
    put(&mut out, 54, &56u16.to_le_bytes());
    put(
        &mut out,
        56,
        &u16::try_from(loads.len()).unwrap().to_le_bytes(),
    );
    put(&mut out, 58, &64u16.to_le_bytes());
    put(&mut out, 60, &3u16.to_le_bytes());
    put(&mut out, 62, &2u16.to_le_bytes());
    // Program headers.
    assert!(64 + 56 * loads.len() <= EH_FRAME_OFFSET);
    for (i, &(vaddr, offset, filesz, flags)) in loads.iter().enumerate() {
        let at = 64 + 56 * i;
        put(&mut out, at, &1u32.to_le_bytes());
        put(&mut out, at + 4, &flags.to_le_bytes());
        put(&mut out, at + 8, &offset.to_le_bytes());
        put(&mut out, at + 16, &vaddr.to_le_bytes());
        put(&mut out, at + 24, &vaddr.to_le_bytes());
        put(&mut out, at + 32, &filesz.to_le_bytes());
        put(&mut out, at + 40, &filesz.to_le_bytes());
        put(&mut out, at + 48, &0x1000u64.to_le_bytes());
    }
    put(&mut out, EH_FRAME_OFFSET, eh_frame);
    put(&mut out, names_at, names);
    // Section headers: null, .eh_frame (PROGBITS, ALLOC), .shstrtab.
    let section =
        |out: &mut Vec<u8>, i: usize, name: u32, kind: u32, flags: u64, at: usize, size: usize| {
            let base = sections_at + 64 * i;
            put(out, base, &name.to_le_bytes());
            put(out, base + 4, &kind.to_le_bytes());
            put(out, base + 8, &flags.to_le_bytes());
            put(out, base + 16, &(at as u64).to_le_bytes());
            put(out, base + 24, &(at as u64).to_le_bytes());
            put(out, base + 32, &(size as u64).to_le_bytes());
            put(out, base + 48, &1u64.to_le_bytes());
        };
    section(&mut out, 1, 1, 1, 2, EH_FRAME_OFFSET, eh_frame.len());
    section(&mut out, 2, 11, 3, 0, names_at, names.len());
    if out.len() < min_len {
        out.resize(min_len, 0xcc);
    }
    out
}
