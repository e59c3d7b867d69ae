//! Probe points: which glibc files to probe (as the dynamic loader finds
//! them), where each allocator function is in them, and where its entry
//! uprobe goes (past `free`'s NULL check, which the kernel cannot emulate).
use std::{
    collections::HashSet,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use tracer_common::PROBES;

use super::CaptureError;

/// Where the probes of one allocator function go, as file offsets in the
/// library.
#[derive(Clone, Copy, Debug)]
pub struct ProbePoint {
    /// The function and its programs.
    pub spec: tracer_common::ProbeSpec,
    /// The function's first instruction: the uretprobe goes here.
    pub function: u64,
    /// The entry uprobe: the first instruction, or past a leading NULL check
    /// (see [`entry_skip`]).
    pub entry: u64,
}

/// One attached library: its path and the probes on it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AttachedLibrary {
    /// The library as found (canonical path).
    pub path: PathBuf,
    /// `symbol@file_offset` of each attached uprobe (aliases share one).
    pub probes: Vec<String>,
}

/// The files to probe: `configured` if given, else every distinct
/// `libc.so.6` the dynamic loader resolves (the one mapped into tracerd
/// itself, /proc/self/maps, and those `ldconfig -p` lists, ld.so.cache),
/// then, with `allocator_libraries`, the allocator libraries `ldconfig -p`
/// lists that replace the C allocation API ([`is_allocator_library`]:
/// jemalloc, tcmalloc, mimalloc), which a program linked with them calls
/// instead of glibc's. Distinct
/// means a distinct (device, inode): symlinks collapse. glibc comes first.
///
/// # Errors
/// [`CaptureError::NoLibc`] when no glibc is found.
pub fn find_libc(
    configured: &[PathBuf],
    allocator_libraries: bool,
) -> Result<Vec<PathBuf>, CaptureError> {
    let mut candidates: Vec<PathBuf> = configured.to_vec();
    if candidates.is_empty() {
        if let Ok(maps) = fs::read_to_string("/proc/self/maps") {
            for line in maps.lines() {
                if let Some(path) = line.split_whitespace().nth(5)
                    && is_libc_name(path)
                {
                    candidates.push(PathBuf::from(path));
                }
            }
        }
        if let Ok(out) = Command::new("ldconfig").arg("-p").output() {
            let text = String::from_utf8_lossy(&out.stdout);
            let mut allocators = Vec::new();
            for line in text.lines() {
                // "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6"
                let line = line.trim();
                let Some((name, path)) = line.split_once(" => ") else {
                    continue;
                };
                let name = name.split_whitespace().next().unwrap_or_default();
                if !host_abi_matches(line) {
                    continue;
                }
                if name == "libc.so.6" {
                    candidates.push(PathBuf::from(path.trim()));
                } else if allocator_libraries && is_allocator_library(name) {
                    allocators.push(PathBuf::from(path.trim()));
                }
            }
            if candidates.is_empty() {
                // No glibc: nothing else is probed (NoLibc below).
                allocators.clear();
            }
            candidates.extend(allocators);
        }
    }
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for candidate in &candidates {
        let Ok(canonical) = fs::canonicalize(candidate) else {
            continue;
        };
        let Ok(meta) = fs::metadata(&canonical) else {
            continue;
        };
        if seen.insert((meta.dev(), meta.ino())) {
            found.push(canonical);
        }
    }
    if found.is_empty() {
        let looked = if configured.is_empty() {
            "/proc/self/maps, ldconfig -p".to_string()
        } else {
            configured
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(CaptureError::NoLibc { looked });
    }
    Ok(found)
}

/// Whether an `ldconfig -p` name is a versioned allocator library that
/// defines the C allocation API (`malloc`, `free`, ...) in place of
/// glibc's: jemalloc (`libjemalloc.so.2`), gperftools' tcmalloc
/// (`libtcmalloc.so.4`, `_minimal`, `_and_profiler`), mimalloc
/// (`libmimalloc.so.2`). Their debug builds (`_debug`) check every block
/// and are left out, as are unversioned development links.
fn is_allocator_library(name: &str) -> bool {
    let Some((stem, version)) = name.split_once(".so.") else {
        return false;
    };
    !version.is_empty()
        && matches!(
            stem,
            "libjemalloc"
                | "libtcmalloc"
                | "libtcmalloc_minimal"
                | "libtcmalloc_and_profiler"
                | "libmimalloc"
        )
}

fn is_libc_name(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "libc.so.6" || (n.starts_with("libc-2.") && n.ends_with(".so")))
}

fn host_abi_matches(ldconfig_line: &str) -> bool {
    if cfg!(target_arch = "x86_64") {
        ldconfig_line.contains("x86-64")
    } else if cfg!(target_arch = "aarch64") {
        ldconfig_line.contains("AArch64")
    } else {
        true
    }
}

/// Resolves each probed function of `PROBES` in the library's dynamic symbol
/// table to its file offset. Functions that are aliases of one another (the
/// same address, e.g. `aligned_alloc` and `memalign` in some glibc versions)
/// get one probe, the first in `PROBES` order: two probes on one address
/// would count one call twice. Functions the library lacks are skipped.
///
/// # Errors
/// [`CaptureError::Libc`] if the file cannot be read, or lacks `malloc` or `free`.
pub fn probe_points(path: &Path) -> Result<Vec<ProbePoint>, CaptureError> {
    let err = |reason: String| CaptureError::Libc {
        path: path.to_path_buf(),
        reason,
    };
    let data = fs::read(path).map_err(|e| err(e.to_string()))?;
    let file = object::File::parse(&*data).map_err(|e| err(e.to_string()))?;
    let mut by_name = std::collections::HashMap::new();
    for symbol in file.dynamic_symbols() {
        if symbol.kind() != object::SymbolKind::Text || !symbol.is_definition() {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        // Versioned names ("malloc@@GLIBC_2.2.5") are reported bare by object.
        let name = name.split('@').next().unwrap_or(name);
        by_name.entry(name.to_string()).or_insert(symbol.address());
    }
    let mut points = Vec::new();
    let mut addresses = HashSet::new();
    for spec in PROBES {
        let Some(&address) = by_name.get(spec.symbol) else {
            if spec.symbol == "malloc" || spec.symbol == "free" {
                return Err(err(format!("no symbol {}", spec.symbol)));
            }
            continue;
        };
        if !addresses.insert(address) {
            continue;
        }
        let section = file
            .sections()
            .find(|s| {
                s.kind() == object::SectionKind::Text
                    && (s.address()..s.address() + s.size()).contains(&address)
            })
            .ok_or_else(|| err(format!("{} is in no text section", spec.symbol)))?;
        let (file_start, _) = section
            .file_range()
            .ok_or_else(|| err("text section without data".into()))?;
        let function = address - section.address() + file_start;
        let code = usize::try_from(function)
            .ok()
            .and_then(|start| data.get(start..start.saturating_add(32).min(data.len())))
            .unwrap_or(&[]);
        let entry = function + entry_skip(spec.symbol, code, address);
        points.push(ProbePoint {
            spec,
            function,
            entry,
        });
    }
    Ok(points)
}

/// Bytes to skip at the start of `symbol` before its entry uprobe, from its
/// first instructions `code` (at virtual address `ip`), decoded with iced-x86.
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
        return 0;
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
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_points_cover_glibc_allocators_once_per_address() {
        let libc = find_libc(&[], false).expect("the host has a glibc");
        let points = probe_points(&libc[0]).expect("glibc has malloc and free");
        let names: Vec<_> = points.iter().map(|p| p.spec.symbol).collect();
        for needed in [
            "malloc",
            "calloc",
            "realloc",
            "free",
            "posix_memalign",
            "valloc",
            "pvalloc",
        ] {
            assert!(names.contains(&needed), "{needed} missing from {names:?}");
        }
        let offsets: HashSet<_> = points.iter().map(|p| p.function).collect();
        assert_eq!(offsets.len(), points.len());
    }

    #[test]
    fn allocator_libraries_are_the_versioned_jemalloc_tcmalloc_and_mimalloc() {
        for yes in [
            "libjemalloc.so.2",
            "libtcmalloc.so.4",
            "libtcmalloc_minimal.so.4",
            "libtcmalloc_and_profiler.so.4",
            "libmimalloc.so.2",
        ] {
            assert!(is_allocator_library(yes), "{yes}");
        }
        for no in [
            "libjemalloc.so",
            "libtcmalloc_debug.so.4",
            "libmimalloc-secure.so.2",
            "libc.so.6",
            "libjemalloc.so.",
        ] {
            assert!(!is_allocator_library(no), "{no}");
        }
    }

    #[test]
    fn free_is_entered_past_its_null_check_and_nothing_else_moves() {
        // glibc 2.36's free: test %rdi,%rdi; je +0xbf; push %rbp
        let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
        assert_eq!(entry_skip("free", &free, 0x98ef0), 9);
        // The same bytes in another function, or another register, stay put.
        assert_eq!(entry_skip("malloc", &free, 0x98ef0), 0);
        let rsi = [0x48, 0x85, 0xf6, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
        assert_eq!(entry_skip("free", &rsi, 0), 0);
        // A push first (malloc's shape), or too few bytes: the entry.
        assert_eq!(entry_skip("free", &[0x41, 0x54, 0x55], 0), 0);
        assert_eq!(entry_skip("free", &free[..4], 0), 0);
    }

    #[test]
    fn the_hosts_free_skips_only_its_null_check() {
        let libc = find_libc(&[], false).expect("the host has a glibc");
        let points = probe_points(&libc[0]).expect("glibc has malloc and free");
        for point in &points {
            let skip = point.entry - point.function;
            match point.spec.symbol {
                // Debian 12's glibc: 3-byte test + 6-byte je.
                "free" => assert_eq!(skip, 9, "{point:?}"),
                _ => assert_eq!(skip, 0, "{point:?}"),
            }
        }
    }

    #[test]
    fn find_libc_refuses_a_missing_configured_path() {
        let err = find_libc(&[PathBuf::from("/nonexistent/libc.so.6")], false).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/libc.so.6"), "{err}");
    }
}
