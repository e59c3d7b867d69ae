//! Programs linked with an allocator library in place of glibc's (Debian's
//! libjemalloc, gperftools' libtcmalloc, libmimalloc): tracerd probes the
//! C allocation API each defines, and every call is recorded once, with
//! its exact size, at its line.

use crate::suite::support::{Program, Tracerd, stat_at};

#[test]
fn jemalloc_tcmalloc_and_mimalloc_programs_are_traced_exactly() {
    let tracerd = Tracerd::start(&[]);
    for lib in ["-ljemalloc", "-ltcmalloc", "-lmimalloc"] {
        let prog = Program::build("allocator_libs", &[lib]);
        let (mut fx, _, body) = super::snapshot_step_compare(&tracerd, &prog.exe);
        let stats = &body["statistics"];
        for (marker, count, size) in [
            // 100 blocks of 1000 bytes, every other one freed.
            ("LIB_MALLOC", 50, 50 * 1000),
            ("LIB_CALLOC", 50, 50 * 300),
            ("LIB_GROW_FROM", 0, 0),
            ("LIB_GROW_TO", 40, 40 * 5000),
            ("LIB_MEMALIGN", 30, 30 * 640),
            ("LIB_ALIGNED", 20, 20 * 2560),
        ] {
            let line = prog.line(&format!("/* {marker} */"));
            let got = stat_at(stats, &prog.source, line)
                .map(|s| (s["count_diff"].as_i64(), s["size_diff"].as_i64()));
            let want = (count != 0).then_some((Some(count), Some(size)));
            assert_eq!(got, want, "{lib}: {marker} at line {line} in {stats}");
        }
        fx.end();
    }
}
