//! `cargo xtask test`: set up, then run every test exactly once, in two
//! passes (what CI runs, as root, on a fresh clone):
//!
//! 1. tests that need no root, in parallel: every crate but the daemon and
//!    the eBPF crate (the model's unit and differential tests,
//!    tracer-common, the `tracer` command's unit tests and its test with
//!    no tracerd, xtask), then the daemon's unit tests and its two test
//!    binaries that need no root (`docs`, `layering`, `size_budget`, `symbolize`);
//! 2. tests that need root, serially, in the daemon's one integration
//!    binary: they attach probes host-wide and share the kernel's state
//!    (its `cli` tests run the `tracer` binary, which they build first
//!    with the same cargo, target directory and profile). They run
//!    against the release tracerd, the one users run: the heavy queries
//!    of the debug build (a process of a million blocks read whole, a
//!    stripped service symbolized) took most of the pass's time;
//! 3. the hostile suite ([`crate::hostile`]) against that release tracerd,
//!    the very binary pass 2 ran (built as pass 2 builds it, with the test
//!    build's features: `cargo build` alone would build another, minutes
//!    of it), unless arguments were given (a filter names tests).
//!
//! Arguments after `--` (e.g. a test-name filter) go to every test binary
//! of every pass (pass 2 builds `tracer` first, with none). Each pass prints one summary line: what ran, whether it
//! passed, how long it took. A failed pass does not stop the next one, so
//! one run reports on everything; the task fails if any pass failed.
use std::{ffi::OsString, time::Instant};

use anyhow::bail;

use crate::{
    setup::setup,
    util::cmd::{cargo, display, is_root},
};

/// One pass: cargo commands run one after the other.
#[derive(Debug, PartialEq)]
struct Pass {
    name: &'static str,
    commands: Vec<Vec<OsString>>,
}

/// `cargo ARGS -- EXTRA`.
fn command(args: &[&str], extra: &[OsString]) -> Vec<OsString> {
    args.iter()
        .map(OsString::from)
        .chain(extra.iter().cloned())
        .collect()
}

/// The passes, each test in exactly one of them. tracer-ebpf is built by
/// aya-build for the BPF target only, never tested on the host.
fn passes(extra: &[OsString]) -> Vec<Pass> {
    vec![
        Pass {
            name: "pass 1 (no root, parallel)",
            commands: vec![
                command(
                    &[
                        "test",
                        "--workspace",
                        "--exclude",
                        "tracer-ebpf",
                        "--exclude",
                        "tracer-daemon",
                        "--",
                    ],
                    extra,
                ),
                command(
                    &[
                        "test",
                        "-p",
                        "tracer-daemon",
                        "--lib",
                        "--bins",
                        "--test",
                        "docs",
                        "--test",
                        "layering",
                        "--test",
                        "size_budget",
                        "--test",
                        "symbolize",
                        "--",
                    ],
                    extra,
                ),
            ],
        },
        Pass {
            name: "pass 2 (root, serial)",
            // `tracer` first: the `cli` tests build it in the tests'
            // profile if it is missing, which would be a release build of
            // its dependencies under a tracer that traces every process.
            commands: vec![
                BUILD_TRACER.iter().map(OsString::from).collect(),
                command(
                    &[&INTEGRATION_RELEASE[..], &["--", "--test-threads=1"]].concat(),
                    extra,
                ),
            ],
        },
    ]
}

/// The root suite in the release profile: pass 2 runs it, and pass 3 runs
/// the hostile suite on the tracerd it built (with `--no-run`: built by
/// the same command, the dev-dependencies' features unified in, so pass 3
/// builds nothing after pass 2).
const INTEGRATION_RELEASE: [&str; 6] = [
    "test",
    "--release",
    "-p",
    "tracer-daemon",
    "--test",
    "integration",
];

/// `tracer` in the release profile, which pass 2's `cli` tests run.
const BUILD_TRACER: [&str; 6] = ["build", "--release", "-p", "tracer-cli", "--bin", "tracer"];

/// The daemon's test binaries (`tracer-daemon/tests/*.rs`): each must be
/// in one pass, so that none is silently left out.
const DAEMON_TEST_BINARIES: [&str; 5] = [
    "docs",
    "integration",
    "layering",
    "size_budget",
    "symbolize",
];

/// Refuses to run when `tracer-daemon/tests/` holds a test binary that no
/// pass names.
fn check_daemon_test_binaries(root: &std::path::Path) -> anyhow::Result<()> {
    let dir = root.join("tracer-daemon/tests");
    let mut unknown = Vec::new();
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".rs")
            && !DAEMON_TEST_BINARIES.contains(&stem)
        {
            unknown.push(name);
        }
    }
    if !unknown.is_empty() {
        bail!(
            "tracer-daemon/tests has test binaries no pass runs: {}; add them to a pass in xtask/src/test.rs (or to tests/suite/)",
            unknown.join(", ")
        );
    }
    Ok(())
}

/// Starts building the Rust fixtures ([`tracer_testkit::RUST_FIXTURE_FEATURES`])
/// on a thread of its own, one after the other at the lowest priority
/// (`nice -n 19`), with the very command the root suite runs
/// ([`tracer_testkit::rust_fixture_build`], the same cargo, into its
/// `CARGO_TARGET_TMPDIR`), so that it takes the passes' idle CPU: on a
/// fresh clone jemalloc's C build alone took 81 s of pass 2. The suite's
/// own build then finds the fixture up to date, or waits on cargo's lock of
/// that target directory while this one finishes. Output goes to
/// `target/tmp/rust_allocators-prebuild.log`; a build that fails or cannot
/// start is left for the suite's own build to report.
fn prebuild_rust_fixtures() -> std::thread::JoinHandle<()> {
    let root = crate::util::paths::workspace_root();
    let scratch = crate::util::paths::target_dir(&root).join("tmp");
    let manifest = root.join("tracer-daemon/tests/fixtures/rust_allocators/Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    std::thread::spawn(move || {
        let _ = std::fs::create_dir_all(&scratch);
        let Ok(log) = std::fs::File::create(scratch.join("rust_allocators-prebuild.log")) else {
            return;
        };
        for feature in tracer_testkit::RUST_FIXTURE_FEATURES {
            let (Ok(stdout), Ok(stderr)) = (log.try_clone(), log.try_clone()) else {
                return;
            };
            let _ = std::process::Command::new("nice")
                .args(["-n", "19"])
                .arg(&cargo)
                .args(tracer_testkit::rust_fixture_build(
                    &manifest, &scratch, feature,
                ))
                .stdin(std::process::Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .status();
        }
    })
}

pub fn run(extra: &[OsString]) -> anyhow::Result<()> {
    check_daemon_test_binaries(&crate::util::paths::workspace_root())?;
    setup()?;
    if !is_root() {
        bail!("the integration tests load eBPF programs: run `cargo xtask test` as root");
    }
    // Only a whole run reaches the Rust fixtures; a filtered one may not.
    let fixtures = extra.is_empty().then(prebuild_rust_fixtures);
    let mut summaries = Vec::new();
    let mut failed = false;
    for pass in passes(extra) {
        let start = Instant::now();
        let mut outcome = Ok(());
        for args in &pass.commands {
            if let Err(err) = cargo(args) {
                eprintln!("xtask: {err:#}");
                outcome = Err(err);
            }
        }
        let ran: Vec<String> = pass
            .commands
            .iter()
            .map(|args| format!("cargo {}", display(args)))
            .collect();
        let summary = format!(
            "xtask test: {}: {}: {} in {:.0} s",
            pass.name,
            ran.join("; "),
            if outcome.is_ok() { "passed" } else { "FAILED" },
            start.elapsed().as_secs_f64()
        );
        eprintln!("{summary}");
        failed |= outcome.is_err();
        summaries.push(summary);
    }
    if extra.is_empty() {
        let start = Instant::now();
        let tracerd_as_tested = [&INTEGRATION_RELEASE[..], &["--no-run"]].concat();
        let outcome = cargo(&tracerd_as_tested)
            .and_then(|()| crate::hostile::suite(&crate::hostile::HostileArgs::default()));
        if let Err(err) = &outcome {
            eprintln!("xtask: {err:#}");
        }
        let summary = format!(
            "xtask test: pass 3 (hostile): cargo {}; xtask hostile: {} in {:.0} s",
            display(&tracerd_as_tested),
            if outcome.is_ok() { "passed" } else { "FAILED" },
            start.elapsed().as_secs_f64()
        );
        eprintln!("{summary}");
        failed |= outcome.is_err();
        summaries.push(summary);
    }
    if let Some(build) = fixtures {
        // Long done by now (it had the passes' idle time).
        let _ = build.join();
    }
    // Again together, below the last pass's output.
    eprintln!();
    for summary in &summaries {
        eprintln!("{summary}");
    }
    if failed {
        bail!("some tests failed (see the summary above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(pass: &Pass) -> Vec<String> {
        pass.commands.iter().map(|c| display(c)).collect()
    }

    #[test]
    fn passes_run_the_documented_commands() {
        let passes = passes(&[]);
        assert_eq!(passes.len(), 2);
        assert_eq!(
            strings(&passes[0]),
            [
                "test --workspace --exclude tracer-ebpf --exclude tracer-daemon --",
                "test -p tracer-daemon --lib --bins --test docs --test layering --test size_budget --test symbolize --",
            ]
        );
        assert_eq!(
            strings(&passes[1]),
            [
                "build --release -p tracer-cli --bin tracer",
                "test --release -p tracer-daemon --test integration -- --test-threads=1"
            ]
        );
    }

    #[test]
    fn every_daemon_test_binary_is_in_a_pass() {
        let root = crate::util::paths::workspace_root();
        check_daemon_test_binaries(&root).expect("every binary runs");
        let commands: Vec<String> = passes(&[])
            .iter()
            .flat_map(|p| p.commands.iter().map(|c| display(c)))
            .collect();
        for binary in DAEMON_TEST_BINARIES {
            let named = format!("--test {binary} ");
            assert_eq!(
                commands.iter().filter(|c| c.contains(&named)).count(),
                1,
                "{binary} runs exactly once"
            );
        }
    }

    #[test]
    fn extra_arguments_go_to_every_test_command() {
        let extra = [OsString::from("realloc"), OsString::from("--nocapture")];
        for pass in passes(&extra) {
            for command in pass.commands.iter().filter(|c| c[0] == "test") {
                assert!(
                    command.ends_with(&extra),
                    "{} lacks the extra arguments",
                    display(command)
                );
            }
        }
    }
}
