//! `group_by=lineno` on C++ and Rust release builds: the fixtures' "sites"
//! mode allocates 100, 200 and 300 blocks (and Rust 50 maps) at lines of
//! their own, between a snapshot and the compare. Each line must hold
//! exactly its blocks, and no statistic may start in the allocation
//! machinery (`new_op.cc`, `alloc.rs`, `raw_vec`, hashbrown).

use std::path::Path;

use crate::suite::support::{
    Fixture, TempDir, Tracerd, fixture_path, fixture_text, line_of, stat_at,
};

/// Runs `exe sites` traced: a snapshot at "ready", then after "done" the
/// compare grouped by line; each `(marker, count, size)` must be that
/// line's `count_diff` and `size_diff`, and every statistic that grew must
/// start at a line of `source`.
fn compare_sites(exe: &Path, source: &str, sites: &[(&str, i64, i64)]) {
    let path = fixture_path(source);
    let text = fixture_text(source);
    let tracerd = Tracerd::shared(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, exe, &["sites"]);
    let pid = fx.pid();
    super::wait_unwinder(&tracerd, pid);
    let (status, snapshot) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{snapshot}");
    fx.go();
    fx.expect_line("done");
    let body = tracerd.get_ok(&format!("/pid/{pid}/compare?group_by=lineno&limit=0"));
    let stats = &body["statistics"];
    for &(marker, count, size) in sites {
        let line = line_of(&text, marker);
        let stat = stat_at(stats, &path, line)
            .unwrap_or_else(|| panic!("{marker} ({source}:{line}) missing in {stats}"));
        assert_eq!(
            (stat["count_diff"].as_i64(), stat["size_diff"].as_i64()),
            (Some(count), Some(size)),
            "{marker} at {source}:{line}: {stat}"
        );
    }
    let elsewhere: Vec<&serde_json::Value> = stats
        .as_array()
        .expect("statistics")
        .iter()
        // Blocks allocated between the snapshot and the compare (a block
        // freed then may be from before the unwinder had the process).
        .filter(|s| s["count_diff"].as_i64() > Some(0))
        .filter(|s| s["traceback"][0]["filename"].as_str() != path.to_str())
        .collect();
    assert!(
        elsewhere.is_empty(),
        "statistics that start outside {source}: {elsewhere:?}"
    );
    fx.end();
}

#[test]
fn cpp_group_by_lineno_counts_each_users_line_exactly() {
    let dir = TempDir::new("sites-cpp");
    let exe = super::build_cpp(dir.path());
    compare_sites(
        &exe,
        "unwind_cpp.cpp",
        &[
            // struct Node is 48 bytes, Big2 96; std::string(200, 'y') holds
            // 201 bytes (its terminator).
            ("CPP_SITE_NEW", 100, 100 * 48),
            ("CPP_SITE_UNIQUE", 200, 200 * 96),
            ("CPP_SITE_STRING", 300, 300 * 201),
        ],
    );
}

#[test]
fn rust_group_by_lineno_counts_each_users_line_exactly() {
    let dir = TempDir::new("sites-rust");
    let exe = super::build_rust(dir.path());
    compare_sites(
        &exe,
        "unwind_rust.rs",
        &[
            ("RUST_SITE_BOX", 100, 100 * 48),
            // Vec<u32> with capacity 24: 96 bytes.
            ("RUST_SITE_VEC", 200, 200 * 96),
            ("RUST_SITE_STRING", 300, 300 * 201),
            // HashMap<u32, u32>::with_capacity(10): 16 buckets of 8 bytes
            // and 16 + 16 control bytes (hashbrown's table layout).
            ("RUST_SITE_MAP", 50, 50 * 160),
        ],
    );
}
