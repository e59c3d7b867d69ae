//! Tests of the probe points of glibc on this host, as tracerd finds it.
use super::*;

#[test]
fn probe_points_cover_glibc_allocators_once_per_address() {
    let libc = find_libc(&[]).expect("the host has a glibc");
    let probes = probe_points(&libc[0]).expect("glibc has malloc and free");
    assert_eq!(probes.family, Family::Glibc);
    let points = probes.points;
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
fn the_hosts_free_skips_its_null_check_and_others_only_compares() {
    let libc = find_libc(&[]).expect("the host has a glibc");
    let probes = probe_points(&libc[0]).expect("glibc has malloc and free");
    for point in &probes.points {
        let skip = point.entry - point.function;
        match point.spec.symbol {
            // Debian 12's glibc: 3-byte test + 6-byte je.
            "free" => assert_eq!(skip, 9, "{point:?}"),
            // Debian 12's malloc begins with a push; aligned_alloc,
            // posix_memalign, valloc ... with a 7-byte cmp, skipped
            // by both probes.
            "malloc" => assert_eq!((skip, point.exit), (0, point.function), "{point:?}"),
            _ => {
                assert!(skip == 0 || skip == 7, "{point:?}");
                assert_eq!(point.exit, point.entry, "{point:?}");
            }
        }
    }
}

#[test]
fn find_libc_refuses_a_missing_configured_path() {
    let err = find_libc(&[PathBuf::from("/nonexistent/libc.so.6")]).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/libc.so.6"), "{err}");
}
