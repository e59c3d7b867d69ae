//! Tests of the probe points: compare skips on fixed code, families known
//! by what an object defines.
use std::fs;

use super::*;

#[test]
fn free_is_entered_past_its_null_check_and_nothing_else_moves() {
    // glibc 2.36's free: test %rdi,%rdi; je +0xbf; push %rbp
    let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
    assert_eq!(entry_skip("free", &free, 0x98ef0), 9);
    // The same bytes in another function, or another register: only
    // the compare is skipped (the probe goes on the je, every call's).
    assert_eq!(entry_skip("malloc", &free, 0x98ef0), 3);
    let rsi = [0x48, 0x85, 0xf6, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
    assert_eq!(entry_skip("free", &rsi, 0), 3);
    // A push first (malloc's shape), or too few bytes: the entry.
    assert_eq!(entry_skip("free", &[0x41, 0x54, 0x55], 0), 0);
    assert_eq!(entry_skip("free", &free[..4], 0), 0);
}

#[test]
fn leading_compares_are_skipped_for_both_probes() {
    // jemalloc 5.3's malloc: cmp $0x1000,%rdi; ja +0x93.
    let malloc = [
        0x48, 0x81, 0xff, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x87, 0x93, 0x00, 0x00, 0x00,
    ];
    assert_eq!(compare_skip(&malloc, 0x23910), 7);
    assert_eq!(entry_skip("malloc", &malloc, 0x23910), 7);
    // test %rdi,%rdi; cmp $5,%esi; jne: both compares.
    let two = [0x48, 0x85, 0xff, 0x83, 0xfe, 0x05, 0x75, 0x02];
    assert_eq!(compare_skip(&two, 0), 6);
    // A mov first: nothing is skipped.
    assert_eq!(compare_skip(&[0x48, 0x89, 0xf8, 0xc3], 0), 0);
    assert_eq!(compare_skip(&[], 0), 0);
}

/// Each family's blocks are reported under its own name.
#[test]
fn each_family_is_the_source_of_its_name() {
    for family in [
        Family::Glibc,
        Family::Musl,
        Family::Jemalloc,
        Family::Tcmalloc,
        Family::Mimalloc,
        Family::Malloc,
    ] {
        let source = tracer_model::AllocatorFamily::from_code(family.source());
        assert_eq!(source.name(), family.name());
        assert!(!source.is_unknown());
    }
}

/// The families of Debian's allocator libraries, musl and libstdc++
/// (which defines `operator new` over glibc's `malloc`: not probed).
#[test]
fn objects_are_probed_by_what_they_define() {
    let lib = "/usr/lib/x86_64-linux-gnu";
    for (path, family, has) in [
        (
            format!("{lib}/libjemalloc.so.2"),
            Family::Jemalloc,
            &["malloc", "mallocx", "sdallocx", "_Znwm", "_ZdlPvm"][..],
        ),
        (
            format!("{lib}/libtcmalloc.so.4"),
            Family::Tcmalloc,
            &["malloc", "free", "tc_new"],
        ),
        (
            format!("{lib}/libmimalloc.so.2"),
            Family::Mimalloc,
            &["malloc", "mi_malloc_aligned", "mi_new"],
        ),
        (
            "/lib/x86_64-linux-musl/libc.so".into(),
            Family::Musl,
            &["malloc", "free", "calloc", "reallocarray"],
        ),
    ] {
        let Ok(data) = fs::read(&path) else {
            // Installed by `cargo xtask setup`; a unit test run without it checks the rest.
            continue;
        };
        let probes = object_probes(data.as_slice()).expect(&path).expect(&path);
        // Read through a cache of the file (as discovery reads), the
        // same probes, at the same offsets, with the same skips.
        let cache = object::ReadCache::new(fs::File::open(&path).expect(&path));
        let cached = object_probes(&cache).expect(&path).expect(&path);
        assert_eq!(format!("{cached:?}"), format!("{probes:?}"), "{path}");
        assert_eq!(probes.family, family, "{path}");
        let names: Vec<_> = probes.points.iter().map(|p| p.spec.symbol).collect();
        // An alias is probed under its first name in PROBES
        // (tcmalloc's `_Znwm` is `tc_new`, mimalloc's `mi_new`).
        for name in has {
            assert!(names.contains(name), "{path}: {name} in {names:?}");
        }
        let offsets: HashSet<_> = probes.points.iter().map(|p| p.function).collect();
        assert_eq!(
            offsets.len(),
            probes.points.len(),
            "{path}: one probe per address"
        );
    }
    let stdcxx = fs::read(format!("{lib}/libstdc++.so.6")).expect("g++ is installed");
    assert!(
        object_probes(stdcxx.as_slice())
            .expect("libstdc++ reads")
            .is_none()
    );
    assert!(object_probes(&b"not an ELF file"[..]).is_err());
}

/// An object is of a family by any of that family's own probed
/// functions: what an executable linking the allocator statically
/// keeps of it (Rust's tikv-jemallocator and mimalloc crates: a
/// release build of a program on each, `nm`) has no `mi_malloc`.
#[test]
fn a_family_is_known_by_any_of_its_own_functions() {
    let of = |names: &[&str]| Family::of(&|name| names.contains(&name));
    assert_eq!(
        of(&[
            "mi_free",
            "mi_malloc_aligned",
            "mi_realloc_aligned",
            "mi_zalloc_aligned"
        ]),
        Some(Family::Mimalloc)
    );
    assert_eq!(
        of(&[
            "_rjem_calloc",
            "_rjem_malloc",
            "_rjem_mallocx",
            "_rjem_rallocx",
            "_rjem_realloc",
            "_rjem_sdallocx"
        ]),
        Some(Family::Jemalloc)
    );
    assert_eq!(of(&["_rjem_sdallocx"]), Some(Family::Jemalloc));
    assert_eq!(of(&["sdallocx"]), Some(Family::Jemalloc));
    assert_eq!(of(&["tc_free"]), Some(Family::Tcmalloc));
    // The C API besides: still the allocator's (Debian's libmimalloc).
    assert_eq!(
        of(&["malloc", "free", "__libc_memalign", "mi_free"]),
        Some(Family::Mimalloc)
    );
    // The C API alone, by the C library's own names.
    assert_eq!(
        of(&["malloc", "free", "__libc_memalign"]),
        Some(Family::Glibc)
    );
    assert_eq!(
        of(&["malloc", "free", "__libc_start_main"]),
        Some(Family::Musl)
    );
    assert_eq!(of(&["malloc", "free"]), Some(Family::Malloc));
    // Half the C API, or C++'s operators alone (libstdc++): nothing.
    assert_eq!(of(&["malloc"]), None);
    assert_eq!(of(&["_Znwm", "_ZdlPv"]), None);
    // Every probed function belongs to one of the families' own APIs,
    // or is the C API's or an operator.
    let c_api = [
        "malloc",
        "calloc",
        "realloc",
        "reallocarray",
        "free",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
        "free_sized",
        "free_aligned_sized",
    ];
    for spec in PROBES {
        assert_eq!(
            Family::owning(spec.symbol).is_none(),
            c_api.contains(&spec.symbol) || tracer_common::is_operator(spec.symbol),
            "{}",
            spec.symbol
        );
    }
}
