//! Probe points: where each allocator function is in an ELF object (its
//! dynamic or full symbol table), whose allocator the object is (its
//! family), and where its probes go (past `free`'s NULL check and leading
//! compares, which the kernel cannot emulate). Reads bytes handed in; needs
//! no root.
use std::collections::HashSet;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use tracer_common::PROBES;

/// Where the probes of one allocator function go, as file offsets in the
/// library.
#[derive(Clone, Copy, Debug)]
pub struct ProbePoint {
    /// The function and its programs.
    pub spec: tracer_common::ProbeSpec,
    /// The function's first instruction.
    pub function: u64,
    /// The uretprobe: the first instruction, or past leading compares
    /// (see [`compare_skip`]).
    pub exit: u64,
    /// The entry uprobe: the first instruction, or past a leading NULL check
    /// (see [`entry_skip`]).
    pub entry: u64,
}

// The kernel's per-source totals have one entry per source the model names.
const _: () = assert!(tracer_model::FAMILY_NAMES.len() == tracer_common::FAMILY_COUNT);
const _: () = assert!(tracer_model::AllocatorFamily::MMAP.0 as u32 == tracer_common::FAMILY_MMAP);

/// The allocator family of an object's probed functions: the `source` its
/// blocks are reported with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// GNU libc's allocator (`libc.so.6`, or linked statically).
    Glibc,
    /// musl's (its `libc.so`, which is also its dynamic loader, or linked
    /// statically).
    Musl,
    /// jemalloc, prefixed or not.
    Jemalloc,
    /// gperftools' tcmalloc.
    Tcmalloc,
    /// mimalloc.
    Mimalloc,
    /// Another object that defines the C API (`malloc` and `free`): a
    /// program's own allocator, or a libc tracer does not know by name.
    Malloc,
}

impl Family {
    /// The lowercase name (`glibc`, `musl`, `jemalloc`, `tcmalloc`,
    /// `mimalloc`, `malloc`).
    pub fn name(self) -> &'static str {
        match self {
            Family::Glibc => "glibc",
            Family::Musl => "musl",
            Family::Jemalloc => "jemalloc",
            Family::Tcmalloc => "tcmalloc",
            Family::Mimalloc => "mimalloc",
            Family::Malloc => "malloc",
        }
    }

    /// The [`tracer_common::AllocInfo::source`] of its blocks: the code of
    /// the model's [`tracer_model::AllocatorFamily`] of its name (the kernel keeps
    /// totals for as many codes as the model names: checked at build).
    pub fn source(self) -> u32 {
        tracer_model::AllocatorFamily::from_name(self.name()).map_or(0, |s| u32::from(s.0))
    }

    /// The family whose own API the probed function `symbol` (a name of
    /// [`PROBES`]) is part of: jemalloc's (`mallocx`, `rallocx`,
    /// `sdallocx`, `dallocx`, `je_*`, `_rjem_*`), tcmalloc's (`tc_*`),
    /// mimalloc's (`mi_*`); None for the C API and C++'s operators, which
    /// any allocator may define.
    fn owning(symbol: &str) -> Option<Self> {
        if symbol.starts_with("je_")
            || symbol.starts_with("_rjem_")
            || matches!(symbol, "mallocx" | "rallocx" | "sdallocx" | "dallocx")
        {
            Some(Family::Jemalloc)
        } else if symbol.starts_with("tc_") {
            Some(Family::Tcmalloc)
        } else if symbol.starts_with("mi_") {
            Some(Family::Mimalloc)
        } else {
            None
        }
    }

    /// The family of an object that defines the function names of
    /// `defines`: by any probed function of jemalloc's, tcmalloc's or
    /// mimalloc's own API ([`Family::owning`]; any, not only its `malloc`:
    /// an executable that links one statically keeps only the functions it
    /// calls, and Rust's mimalloc crate calls `mi_malloc_aligned`,
    /// `mi_zalloc_aligned`, `mi_realloc_aligned` and `mi_free`, never
    /// `mi_malloc`), then by the C library's own (`__libc_memalign` is
    /// glibc's; `__libc_start_main` without it, musl's); None when it
    /// defines no allocator entry point tracer probes (no `malloc` and
    /// `free`, and none of a family's own).
    fn of(defines: &dyn Fn(&str) -> bool) -> Option<Self> {
        for family in [Family::Jemalloc, Family::Tcmalloc, Family::Mimalloc] {
            if PROBES
                .iter()
                .any(|spec| Self::owning(spec.symbol) == Some(family) && defines(spec.symbol))
            {
                return Some(family);
            }
        }
        if !(defines("malloc") && defines("free")) {
            return None;
        }
        Some(if defines("__libc_memalign") {
            Family::Glibc
        } else if defines("__libc_start_main") {
            Family::Musl
        } else {
            Family::Malloc
        })
    }
}

/// What one ELF object defines of the allocator API, and where its probes
/// go.
#[derive(Clone, Debug)]
pub struct ObjectProbes {
    /// Whose allocator it is.
    pub family: Family,
    /// One per probed function, aliases (one address) once.
    pub points: Vec<ProbePoint>,
}

/// Reads the allocator entry points `data` (an ELF file: its whole bytes,
/// or an `object::ReadCache` of it, which reads only the headers, symbol
/// tables and the probed functions' first bytes) defines, in
/// its dynamic symbol table (`.dynsym`) and its full one (`.symtab`, which a
/// static binary with symbols keeps), and places their probes
/// (see [`tracer_common::PROBES`] for which, and the rules there): each
/// function at its file offset; of functions that are aliases of one
/// another (one address: `aligned_alloc` and `memalign` in some glibc
/// versions, `malloc` and `tc_malloc`), the first in `PROBES` order, as two
/// probes on one address would count one call twice. C++ operators only
/// in an object of a jemalloc, tcmalloc or mimalloc family. Ok(None) when
/// the object defines no allocator ([`Family::of`]).
///
/// # Errors
/// A message when `data` is not an ELF file `object` can read, or a probed
/// function is in no section with file data.
pub fn object_probes<'a, R: object::ReadRef<'a>>(data: R) -> Result<Option<ObjectProbes>, String> {
    static WANTED: std::sync::LazyLock<HashSet<&'static str>> = std::sync::LazyLock::new(|| {
        PROBES
            .iter()
            .map(|spec| spec.symbol)
            .chain(["__libc_memalign", "__libc_start_main"])
            .collect()
    });
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    let mut by_name = std::collections::HashMap::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        // Names first: most symbols of a large object are not wanted.
        let Ok(name) = symbol.name() else { continue };
        // Versioned names ("malloc@@GLIBC_2.2.5") are reported bare by object.
        let name = name.split('@').next().unwrap_or(name);
        if !WANTED.contains(name)
            || symbol.kind() != object::SymbolKind::Text
            || !symbol.is_definition()
        {
            continue;
        }
        by_name.entry(name.to_string()).or_insert(symbol.address());
    }
    let Some(family) = Family::of(&|name| by_name.contains_key(name)) else {
        return Ok(None);
    };
    let operators = matches!(
        family,
        Family::Jemalloc | Family::Tcmalloc | Family::Mimalloc
    );
    let mut points = Vec::new();
    let mut addresses = HashSet::new();
    for spec in PROBES {
        let Some(&address) = by_name.get(spec.symbol) else {
            continue;
        };
        if (!operators && tracer_common::is_operator(spec.symbol)) || !addresses.insert(address) {
            continue;
        }
        let section = file
            .sections()
            .find(|s| {
                s.kind() == object::SectionKind::Text
                    && (s.address()..s.address() + s.size()).contains(&address)
            })
            .ok_or_else(|| format!("{} is in no text section", spec.symbol))?;
        let (file_start, _) = section
            .file_range()
            .ok_or_else(|| "text section without data".to_string())?;
        let function = address - section.address() + file_start;
        let len = data.len().unwrap_or(0);
        let code = data
            .read_bytes_at(function, 32.min(len.saturating_sub(function)))
            .unwrap_or(&[]);
        let entry = function + entry_skip(spec.symbol, code, address);
        let exit = function + compare_skip(code, address);
        points.push(ProbePoint {
            spec: *spec,
            function,
            exit,
            entry,
        });
    }
    Ok(Some(ObjectProbes { family, points }))
}

/// Bytes of the compares (`cmp`, `test`) that begin the function whose
/// first instructions are `code` (at virtual address `ip`): the kernel
/// cannot emulate them, so a probe on one is single-stepped (about 7x the
/// cost); they write only the flags, so a probe on the instruction after
/// them sees the same arguments and the same stack (the return address at
/// the stack pointer, as a uretprobe needs), and every call reaches it
/// (they do not branch). jemalloc's `malloc` begins `cmp $0x1000,%rdi; ja`:
/// the `ja` is emulated. 0 when the first instruction is not a compare,
/// or the bytes do not decode.
pub fn compare_skip(code: &[u8], ip: u64) -> u64 {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    if !cfg!(target_arch = "x86_64") {
        return 0;
    }
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid()
            || !matches!(instruction.mnemonic(), Mnemonic::Cmp | Mnemonic::Test)
        {
            return instruction.ip() - ip;
        }
    }
    0
}

/// Bytes to skip at the start of `symbol` before its entry uprobe, from its
/// first instructions `code` (at virtual address `ip`), decoded with iced-x86:
/// glibc's `free` NULL check (below), else the leading compares
/// ([`compare_skip`]).
///
/// A uprobe on an instruction the kernel cannot emulate is single-stepped
/// out of line, which costs about 7x more here. glibc's `free` begins with
/// `test %rdi,%rdi; je` (not emulated); the `push` after it is. Skipping the
/// check loses only `free(NULL)`, which changes nothing. Only that exact
/// pattern in `free` is skipped; anything else, or bytes that do not
/// decode, attach at the entry (0).
pub fn entry_skip(symbol: &str, code: &[u8], ip: u64) -> u64 {
    use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic, OpKind, Register};
    if symbol != "free" || !cfg!(target_arch = "x86_64") {
        return compare_skip(code, ip);
    }
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut next = || {
        decoder
            .can_decode()
            .then(|| decoder.decode())
            .filter(|i| !i.is_invalid())
    };
    let (Some(test), Some(branch), Some(push)) = (next(), next(), next()) else {
        return 0;
    };
    let tests_first_arg = test.mnemonic() == Mnemonic::Test
        && test.op_count() == 2
        && test.op0_kind() == OpKind::Register
        && test.op1_kind() == OpKind::Register
        && test.op0_register() == Register::RDI
        && test.op1_register() == Register::RDI;
    let jumps_if_null = matches!(branch.code(), Code::Je_rel8_64 | Code::Je_rel32_64);
    let pushes = push.mnemonic() == Mnemonic::Push && push.op0_kind() == OpKind::Register;
    if tests_first_arg && jumps_if_null && pushes {
        push.ip() - ip
    } else {
        compare_skip(code, ip)
    }
}

#[cfg(test)]
mod tests;
