//! Sampling (`--sample-interval`): the estimates of counts and sizes stay
//! within the stated error of an exact run of the same program, and a call
//! sampling passes over costs no return probe.

use super::build;
use crate::suite::support::{Fixture, Tracerd, sample, stat_at};

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

/// Runs of [`tracer_common::SESSION_PROGRAM`] so far, from `/metrics`.
fn session_runs(tracerd: &Tracerd) -> f64 {
    let text = tracerd
        .request(reqwest::Method::GET, "/metrics")
        .text()
        .expect("metrics");
    sample(
        &text,
        "tracer_bpf_program_runs_total",
        &[("program", tracer_common::SESSION_PROGRAM)],
    )
    .unwrap_or_else(|| panic!("no runs of the session program: {text}"))
}

#[test]
fn calls_sampling_passes_over_skip_their_return() {
    let prog = build("sampled");
    // A mean interval of 1 GiB (the largest): hardly a call is sampled. A call whose
    // return ran would run the session program twice.
    let tracerd = Tracerd::start(&["--sample-interval", "1073741824", "--bpf-stats", "true"]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let before = session_runs(&tracerd);
    fx.step("done");
    let runs = session_runs(&tracerd) - before;
    let calls = 120_200.0;
    // Other processes' calls meanwhile are the slack.
    assert!(
        (calls..calls * 1.5).contains(&runs),
        "{runs} runs for {calls} calls"
    );
    fx.end();
}
