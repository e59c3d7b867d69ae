//! `cargo xtask`: what cargo alone cannot do. This file parses the command
//! line and dispatches; each task lives in a file of its own:
//!
//! - `setup` ([`setup`]): install what building the eBPF programs needs
//!   (the nightly toolchain's `rust-src`, `bpf-linker` 0.10.0) and the
//!   Debian packages the tests use, when missing; idempotent and silent
//!   when everything is present.
//! - `run [-- TRACERD_ARGS]` ([`run`]): setup, build, start `tracerd`
//!   (needs root).
//! - `test` ([`test`]): setup, then every test once: those that need no
//!   root in parallel, then the root-only integration binary serially.
//! - `bench`, `bench-model` ([`bench`]): overhead against the reference
//!   tools, the snapshot engine against CPython; `--baseline REV` adds
//!   another revision's build, measured in the same run.
//! - `hostile` ([`hostile`]): a hostile local user's attacks, bounded;
//!   also the last pass of `test`.
//! - `fuzz`, `load`, `soak` ([`fuzz`], [`load`], [`soak`]): the long runs,
//!   kept out of `test`.
//!
//! What the tasks share (cargo, paths, child processes, HTTP, the list of
//! tracers) is in [`util`].
use std::{ffi::OsString, process::ExitCode};

use clap::{Parser, Subcommand};

/// xtask's allocator: TLSF (rlsf), which no tracerd probes. The tracerd
/// that `hostile`, `bench`, `load` and `soak` start traces every process
/// but itself: with glibc's malloc, xtask's own allocations (the answers
/// it reads and parses) would trap at that tracerd's probes and fill its
/// maps, measured and attacked alongside the workloads.
#[global_allocator]
static ALLOCATOR: rlsf::GlobalTlsf = rlsf::GlobalTlsf::new();

mod bench;
mod fuzz;
mod hostile;
mod load;
mod run;
mod setup;
mod soak;
mod test;
mod util;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "tracer's build, run and test tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install rust-src for nightly and bpf-linker if missing.
    Setup,
    /// Set up, build in release mode and start tracerd with its defaults.
    Run {
        /// Arguments passed to tracerd (after `--`), e.g. `-- --nframe 32`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Set up, build in release mode, and measure tracerd's overhead side by
    /// side with the reference tools, then the snapshot engine side by side
    /// with CPython's tracemalloc (prints markdown tables, writes JSON).
    Bench(bench::BenchArgs),
    /// Time the snapshot engine against CPython 3.11's tracemalloc on the
    /// same dump files (prints a markdown table).
    BenchModel(bench::model::BenchModelArgs),
    /// Fuzz every parser of untrusted input (cargo fuzz), 10 minutes each.
    Fuzz(fuzz::FuzzArgs),
    /// Load test: 64 loopback clients on statistics, compare and metrics for
    /// 60 s while a churning workload is traced; p50/p99, zero 5xx.
    Load(load::LoadArgs),
    /// Hostile use: the attacks of a local user (idle and slow connections,
    /// malformed requests and files, pickle bombs, abandoned large answers,
    /// many clients, wide scope changes) on a fresh tracerd each, with
    /// bounds on its memory and on `/health`; run by `test` too.
    Hostile(hostile::HostileArgs),
    /// Soak: 10 minutes of short-lived processes; tracerd's memory and map
    /// entries before and after.
    Soak(soak::SoakArgs),
    /// Set up, build, and run every test: no-root tests in parallel, then
    /// the root-only integration tests one at a time.
    Test {
        /// Extra arguments for the test binaries (after `--`), e.g. a filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Task::Setup => setup::setup(),
        Task::Run { args } => run::run(&args),
        Task::Bench(args) => bench::task(&args),
        Task::BenchModel(args) => bench::model::task(&args),
        Task::Fuzz(args) => fuzz::task(&args),
        Task::Load(args) => load::task(&args),
        Task::Soak(args) => soak::task(&args),
        Task::Hostile(args) => hostile::task(&args),
        Task::Test { args } => test::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn test_passes_arguments_after_double_dash() {
        let cli = Cli::try_parse_from(["xtask", "test", "--", "realloc", "--nocapture"]).unwrap();
        let Task::Test { args } = cli.command else {
            panic!("not the test task");
        };
        assert_eq!(args, ["realloc", "--nocapture"]);
    }

    #[test]
    fn bench_takes_a_baseline_revision() {
        let cli = Cli::try_parse_from([
            "xtask",
            "bench",
            "--rounds",
            "1",
            "--modes",
            "none,tracerd,baseline",
            "--baseline",
            "HEAD~3",
        ])
        .unwrap();
        let Task::Bench(args) = cli.command else {
            panic!("not the bench task");
        };
        assert_eq!(args.baseline.as_deref(), Some("HEAD~3"));
        assert_eq!(args.modes, ["none", "tracerd", "baseline"]);
        let cli = Cli::try_parse_from(["xtask", "bench-model", "--baseline", "main"]).unwrap();
        let Task::BenchModel(args) = cli.command else {
            panic!("not the bench-model task");
        };
        assert_eq!(args.baseline.as_deref(), Some("main"));
    }
}
