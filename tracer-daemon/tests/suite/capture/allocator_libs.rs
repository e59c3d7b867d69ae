//! Programs linked with an allocator library in place of glibc's (Debian's
//! libjemalloc, gperftools' libtcmalloc, libmimalloc): tracerd probes the
//! C allocation API each defines (and jemalloc's own `mallocx`,
//! `rallocx`, `sdallocx`, `dallocx`), and every call is recorded once,
//! with its exact size, at its line.

use serde_json::Value;

use crate::suite::support::{Program, Tracerd, stat_at};

/// Each `(marker, count, size)`: the `count_diff` and `size_diff` of the
/// marker's line (no statistic at all for 0 and 0).
fn expect(prog: &Program, stats: &Value, lib: &str, sites: &[(&str, i64, i64)]) {
    for &(marker, count, size) in sites {
        let line = prog.line(&format!("/* {marker} */"));
        let got = stat_at(stats, &prog.source, line)
            .map(|s| (s["count_diff"].as_i64(), s["size_diff"].as_i64()));
        let want = (count != 0).then_some((Some(count), Some(size)));
        assert_eq!(got, want, "{lib}: {marker} at line {line} in {stats}");
    }
}

#[test]
fn jemalloc_tcmalloc_and_mimalloc_programs_are_traced_exactly() {
    let tracerd = Tracerd::start(&["--allocator-libraries", "true"]);
    for flags in [
        &["-ljemalloc", "-DJEMALLOC"][..],
        &["-ltcmalloc"],
        &["-lmimalloc"],
    ] {
        let lib = flags[0];
        let prog = Program::build("allocator_libs", flags);
        let (mut fx, _, body) = super::snapshot_step_compare(&tracerd, &prog.exe);
        let stats = &body["statistics"];
        expect(
            &prog,
            stats,
            lib,
            &[
                // 100 blocks of 1000 bytes, every other one freed.
                ("LIB_MALLOC", 50, 50 * 1000),
                ("LIB_CALLOC", 50, 50 * 300),
                ("LIB_GROW_FROM", 0, 0),
                ("LIB_GROW_TO", 40, 40 * 5000),
                ("LIB_MEMALIGN", 30, 30 * 640),
                ("LIB_ALIGNED", 20, 20 * 2560),
            ],
        );
        if lib == "-ljemalloc" {
            expect(
                &prog,
                stats,
                lib,
                &[
                    ("JE_MALLOCX", 25, 25 * 3000),
                    ("JE_RALLOC_FROM", 0, 0),
                    ("JE_RALLOC_TO", 15, 15 * 7000),
                    ("JE_SDALLOC", 0, 0),
                    ("JE_DALLOC", 0, 0),
                ],
            );
        }
        fx.end();
    }
}
