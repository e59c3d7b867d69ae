//! `cargo xtask`: what cargo alone cannot do.
//!
//! - `setup`: install what building the eBPF programs needs (the nightly
//!   toolchain's `rust-src`, `bpf-linker` 0.10.0) when missing; idempotent and
//!   silent when everything is present.
//! - `run [-- TRACERD_ARGS]`: setup, build, start `tracerd` (needs root).
//! - `test`: setup, build, run every test (integration tests as root, one at
//!   a time: they share the kernel's probes).
//! - `fuzz`, `load`, `soak`: the long runs of [`service_tasks`], kept out of
//!   `test`.
use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

mod bench;
mod bench_model;
mod service_tasks;

/// The bpf-linker release whose default feature links the nightly rustc's own
/// LLVM (newer ones need a system LLVM 21+ that Debian 12 lacks).
const BPF_LINKER_VERSION: &str = "0.10.0";
/// The nightly toolchain the eBPF crate is built with.
const NIGHTLY: &str = "nightly";

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
    BenchModel(bench_model::BenchModelArgs),
    /// Fuzz every parser of untrusted input (cargo fuzz), 10 minutes each.
    Fuzz(service_tasks::FuzzArgs),
    /// Load test: 64 loopback clients on statistics, compare and metrics for
    /// 60 s while a churning workload is traced; p50/p99, zero 5xx.
    Load(service_tasks::LoadArgs),
    /// Soak: 10 minutes of short-lived processes; tracerd's memory and map
    /// entries before and after.
    Soak(service_tasks::SoakArgs),
    /// Set up, build, and run every test.
    Test {
        /// Extra arguments for the test binaries (after `--`), e.g. a filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Task::Setup => setup(),
        Task::Run { args } => {
            setup()?;
            cargo(&["build", "--release", "-p", "tracer-daemon"])?;
            let tracerd = target_dir(&workspace_root()).join("release/tracerd");
            let status = Command::new(&tracerd)
                .args(&args)
                .status()
                .with_context(|| format!("starting {}", tracerd.display()))?;
            if !status.success() {
                bail!("tracerd exited with {status}");
            }
            Ok(())
        }
        Task::Bench(args) => {
            setup()?;
            cargo(&["build", "--release", "-p", "tracer-daemon", "--bins"])?;
            bench::run(&workspace_root(), &args)?;
            if args.no_model {
                return Ok(());
            }
            // The snapshot engine against CPython, on a machine as quiet as
            // the overhead part needed.
            bench_model(&bench_model::BenchModelArgs {
                traces: args.model_traces,
                runs: u32::try_from(args.rounds).unwrap_or(u32::MAX),
                python: std::env::var("TRACER_PYTHON").unwrap_or_else(|_| "python3".into()),
                out: PathBuf::from("target/bench-model"),
                force: args.force,
            })
        }
        Task::Fuzz(args) => {
            setup()?;
            service_tasks::fuzz(&workspace_root(), &args)
        }
        Task::Load(args) => {
            setup()?;
            cargo(&[
                "build",
                "--release",
                "-p",
                "tracer-daemon",
                "--bin",
                "tracerd",
            ])?;
            service_tasks::load(&workspace_root(), &args)
        }
        Task::Soak(args) => {
            setup()?;
            cargo(&[
                "build",
                "--release",
                "-p",
                "tracer-daemon",
                "--bin",
                "tracerd",
            ])?;
            service_tasks::soak(&workspace_root(), &args)
        }
        Task::BenchModel(args) => bench_model(&args),
        Task::Test { args } => {
            setup()?;
            if !is_root() {
                bail!("the integration tests load eBPF programs: run `cargo xtask test` as root");
            }
            // Tests that need no root, in parallel: every crate but the
            // daemon (the model's differential tests included), then the
            // daemon's unit tests. tracer-ebpf is built by aya-build for the
            // BPF target only.
            let extra: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
            let mut pure = vec![
                "test",
                "--workspace",
                "--exclude",
                "tracer-ebpf",
                "--exclude",
                "tracer-daemon",
                "--",
            ];
            pure.extend(extra.iter().copied());
            cargo(&pure)?;
            let mut unit = vec!["test", "-p", "tracer-daemon", "--lib", "--bins", "--"];
            unit.extend(extra.iter().copied());
            cargo(&unit)?;
            // Integration tests: they attach probes host-wide, so one at a time.
            let mut integration = vec![
                "test",
                "-p",
                "tracer-daemon",
                "--test",
                "*",
                "--",
                "--test-threads=1",
            ];
            integration.extend(extra.iter().copied());
            cargo(&integration)
        }
    }
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, else `ROOT/target`.
fn target_dir(root: &Path) -> PathBuf {
    env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Output of a command, or None if it could not run or failed.
fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn setup() -> anyhow::Result<()> {
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    ensure_packages(&[DEBIAN_PACKAGES, service_tasks::SERVICE_PACKAGES].concat())
}

/// Debian packages the tests and benchmarks use: (command that proves it is
/// installed, package).
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("gcc", "gcc"),
    ("python3", "python3"),
    ("bpftrace", "bpftrace"),
    ("heaptrack", "heaptrack"),
    ("valgrind", "valgrind"),
    ("sqlite3", "sqlite3"),
];

/// Installs the packages whose command is missing (apt-get update once,
/// then apt-get install -y); silent when all are present.
fn ensure_packages(packages: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(command, _)| output("sh", &["-c", &format!("command -v {command}")]).is_none())
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn ensure_nightly() -> anyhow::Result<()> {
    if output("rustc", &[&format!("+{NIGHTLY}"), "--version"]).is_some() {
        return Ok(());
    }
    eprintln!("xtask: installing the {NIGHTLY} toolchain");
    run_checked(Command::new("rustup").args([
        "toolchain",
        "install",
        NIGHTLY,
        "--profile",
        "minimal",
    ]))
}

fn ensure_rust_src() -> anyhow::Result<()> {
    let sysroot = output("rustc", &[&format!("+{NIGHTLY}"), "--print", "sysroot"])
        .context("rustc +nightly --print sysroot")?;
    let rustlib = PathBuf::from(sysroot.trim()).join("lib/rustlib");
    if rustlib.join("src/rust/library/core/Cargo.toml").exists() {
        return Ok(());
    }
    eprintln!("xtask: installing rust-src for {NIGHTLY}");
    let added = Command::new("rustup")
        .args(["component", "add", "rust-src", "--toolchain", NIGHTLY])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if added && rustlib.join("src/rust/library/core/Cargo.toml").exists() {
        return Ok(());
    }
    // Offline fallback: the same component, shipped beside the project.
    let tarball = workspace_root().join("../shared/toolchain/rust-src-nightly-2026-05-19.tar.xz");
    if !tarball.exists() {
        bail!(
            "rustup could not add rust-src and {} is missing",
            tarball.display()
        );
    }
    eprintln!("xtask: extracting {}", tarball.display());
    let dir = env::temp_dir().join("tracer-rust-src");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    run_checked(
        Command::new("tar")
            .arg("-xJf")
            .arg(&tarball)
            .arg("-C")
            .arg(&dir),
    )?;
    // The tarball is a rust-installer package: rust-src-*/rust-src/lib/rustlib/src.
    let found = walk_for(&dir, "lib/rustlib/src").context("no lib/rustlib/src in the tarball")?;
    run_checked(Command::new("cp").arg("-a").arg(&found).arg(&rustlib))?;
    if !rustlib.join("src/rust/library/core/Cargo.toml").exists() {
        bail!("rust-src is still missing under {}", rustlib.display());
    }
    Ok(())
}

fn walk_for(dir: &Path, suffix: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.ends_with(suffix) {
            return Some(path);
        }
        if path.is_dir()
            && let Some(found) = walk_for(&path, suffix)
        {
            return Some(found);
        }
    }
    None
}

fn ensure_bpf_linker() -> anyhow::Result<()> {
    if output("bpf-linker", &["--version"]).is_some_and(|v| v.contains(BPF_LINKER_VERSION)) {
        return Ok(());
    }
    eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} (a few minutes)");
    run_checked(Command::new("cargo").args([
        "install",
        &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        "--locked",
        "--force",
    ]))
}

fn run_checked(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// Builds the model's benchmark and runs it beside CPython's tracemalloc.
fn bench_model(args: &bench_model::BenchModelArgs) -> anyhow::Result<()> {
    cargo(&[
        "build",
        "--release",
        "-p",
        "tracer-model",
        "--example",
        "bench_model",
    ])?;
    let example = bench_model::example_path(&target_dir(&workspace_root()));
    bench_model::run(&workspace_root(), &example, args)
}
