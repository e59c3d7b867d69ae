//! Sampling (`--sample-interval`): the estimates of counts and sizes stay
//! within the stated error of an exact run of the same program.

use super::build;
use crate::suite::support::{Fixture, Tracerd, stat_at};

/// (count, size) per marker line of `fixtures/sampled.c`, compared with
/// the start of tracing.
fn sampled_run(extra: &[&str]) -> Vec<(f64, f64)> {
    let prog = build("sampled");
    let tracerd = Tracerd::start(extra);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    fx.step("done");
    // Sampled, a process is first seen at its first sampled allocation: the
    // loops above make sure there is one.
    tracerd.wait_traced(pid);
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?limit=0"));
    let figures = ["SMALL", "MEDIUM", "LARGE"]
        .iter()
        .map(|marker| {
            let line = prog.line(&format!("/* {marker} */"));
            let stat = stat_at(&body["statistics"], &prog.source, line)
                .unwrap_or_else(|| panic!("no statistic at {marker}: {body}"));
            (
                stat["count"].as_f64().expect("count"),
                stat["size"].as_f64().expect("size"),
            )
        })
        .collect();
    fx.end();
    figures
}

#[test]
fn sampling_estimates_are_within_the_stated_error_of_an_exact_run() {
    let exact = sampled_run(&[]);
    assert_eq!(
        exact,
        vec![
            (100_000.0, 3_200_000.0),
            (20_000.0, 20_000_000.0),
            (200.0, 20_000_000.0)
        ]
    );
    // Mean interval 8 KiB: about 390, 2440 and 200 samples at the three
    // sites; the bounds are about 4 standard deviations of each estimate.
    let sampled = sampled_run(&["--sample-interval", "8192"]);
    for ((site, bound), ((count, size), (exact_count, exact_size))) in
        [("SMALL", 0.20), ("MEDIUM", 0.08), ("LARGE", 0.02)]
            .iter()
            .zip(sampled.iter().zip(&exact))
    {
        let count_error = (count - exact_count).abs() / exact_count;
        let size_error = (size - exact_size).abs() / exact_size;
        eprintln!(
            "sampling {site}: count {count} ({count_error:.3}), size {size} ({size_error:.3})"
        );
        assert!(
            count_error <= *bound,
            "{site}: count {count} vs {exact_count} ({count_error:.3} > {bound})"
        );
        assert!(
            size_error <= *bound,
            "{site}: size {size} vs {exact_size} ({size_error:.3} > {bound})"
        );
    }
}
