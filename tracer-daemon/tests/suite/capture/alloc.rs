//! Allocations recorded exactly: 20000 blocks at one line, every allocator
//! of glibc with its exact size (and nothing for the calls that fail), and
//! four threads freeing each other's blocks.

use super::build;
use crate::suite::support::{Fixture, Tracerd, stat_at};

#[test]
fn twenty_thousand_mallocs_at_one_line_show_exactly_in_compare() {
    let prog = build("keep");
    let line = prog.line("ALLOC_SITE");
    let tracerd = Tracerd::shared(&[]);
    let (mut fx, base, body) = super::snapshot_step_compare(&tracerd, &prog.exe);
    let pid = fx.pid();
    assert_eq!(body["base"]["kind"], "snapshot");
    assert_eq!(body["base"]["id"], base["id"]);
    let stats = &body["statistics"];
    let top = &stats[0];
    assert_eq!(
        top["traceback"][0]["filename"].as_str(),
        prog.source.to_str(),
        "{top}"
    );
    assert_eq!(top["traceback"][0]["lineno"], line);
    assert_eq!(top["size_diff"], 5_120_000);
    assert_eq!(top["count_diff"], 20_000);
    assert_eq!(top["size"], 5_120_000);
    assert_eq!(top["count"], 20_000);
    let expected = format!(
        "{}:{line}: size=5000 KiB (+5000 KiB), count=20000 (+20000), average=256 B",
        prog.source.display()
    );
    assert_eq!(top["text"], expected);
    // Nothing else changed by more than a few blocks (stdio buffers at most).
    for other in stats.as_array().expect("array").iter().skip(1) {
        assert!(
            other["count_diff"].as_i64().expect("count_diff").abs() <= 2,
            "{other}"
        );
    }

    let (status, text) = tracerd.get_text(&format!(
        "/pid/{pid}/compare?group_by=lineno&limit=1&format=text"
    ));
    assert_eq!(status, 200);
    assert_eq!(text, format!("{expected}\n"));

    let (status, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    assert_eq!(status, 200);
    let current = memory["current"].as_u64().expect("current");
    assert!(current >= 5_120_000 + 160_000, "{memory}");
    assert!(memory["peak"].as_u64().expect("peak") >= current);
    fx.end();
}

#[test]
fn every_allocator_records_its_exact_size_and_failures_record_nothing() {
    let prog = build("allocators");
    let tracerd = Tracerd::shared(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    let pid = fx.pid();
    let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    fx.go();
    assert_eq!(
        fx.read_line(),
        "1 1 1 0 1",
        "glibc's own results as the test assumes"
    );
    fx.expect_line("done");
    let body = tracerd.get_ok(&format!("/pid/{pid}/compare?group_by=lineno&limit=0"));
    let stats = &body["statistics"];
    let expect = |marker: &str, size: i64, count: i64| {
        let line = prog.line(&format!("/* {marker} */"));
        match stat_at(stats, &prog.source, line) {
            Some(stat) => {
                assert_eq!(
                    (stat["size_diff"].as_i64(), stat["count_diff"].as_i64()),
                    (Some(size), Some(count)),
                    "{marker} at line {line}: {stat}"
                );
            }
            None => assert_eq!(
                (size, count),
                (0, 0),
                "{marker} at line {line} missing in {stats}"
            ),
        }
    };
    expect("CALLOC", 300, 1);
    expect("GROW_FROM", 0, 0);
    expect("GROW_TO", 1000, 1);
    expect("SHRINK_FROM", 0, 0);
    expect("SHRINK_TO", 10, 1);
    expect("REALLOC_NULL", 777, 1);
    expect("ZERO_FROM", 0, 0);
    expect("ZERO_TO", 0, 0);
    expect("FAIL_FROM", 444, 1);
    expect("FAIL_TO", 0, 0);
    expect("REALLOCARRAY", 77, 1);
    expect("REALLOCARRAY_OVERFLOW", 0, 0);
    expect("POSIX_MEMALIGN", 640, 1);
    expect("POSIX_MEMALIGN_EINVAL", 0, 0);
    expect("ALIGNED_ALLOC", 128, 1);
    expect("MEMALIGN", 96, 1);
    expect("VALLOC", 200, 1);
    expect("PVALLOC", 4096, 1);
    expect("CALLOC_OVERFLOW", 0, 0);
    expect("FREED", 0, 0);
    fx.end();
}

#[test]
fn four_threads_freeing_across_threads_give_exact_totals() {
    let prog = build("threads");
    let line = prog.line("THREAD_ALLOC");
    let tracerd = Tracerd::shared(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    let pid = fx.pid();
    let (_, before) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    fx.step("done");
    let body = tracerd.get_ok(&format!("/pid/{pid}/compare?group_by=lineno&limit=0"));
    let stat = stat_at(&body["statistics"], &prog.source, line).expect("the worker's malloc line");
    // 2500 live blocks per thread, of 16, 32, 48 and 64 bytes.
    assert_eq!(stat["count_diff"], 10_000, "{stat}");
    assert_eq!(stat["size_diff"], 2500 * (16 + 32 + 48 + 64), "{stat}");
    assert_eq!(stat["count"], 10_000);
    let (_, after) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    let (before, after) = (
        before["current"].as_i64().expect("n"),
        after["current"].as_i64().expect("n"),
    );
    // Thread start-up allocates a little of its own (TLS), freed at join or kept.
    let grew = after - before;
    assert!(
        (400_000..400_000 + 8192).contains(&grew),
        "current grew by {grew}"
    );
    fx.end();
}
