//! `tracerd`: dispatch only. No subcommand runs the daemon
//! ([`tracer_daemon::app::run`]); `tracerd config check FILE` and
//! `tracerd config default` check or print configuration files.
use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::Parser as _;
use tracer_daemon::config::{Cli, Command, Config, ConfigCommand, Flags};

/// tracerd's allocator: mimalloc, linked in, which takes its memory from the
/// kernel with mmap. With glibc's malloc every allocation of tracerd would
/// trap into the kernel at the uprobes tracerd itself placed on it (the
/// programs skip tracerd, but the trap is paid first: about half of its CPU
/// under heavy requests). tracerd's own executable is never probed (its
/// allocator discovery skips its own process), so nothing of this traps.
/// The eBPF counter `tracerd_calls` counts the calls that still do (C code
/// in libc calling malloc). Each thread's net bytes are counted
/// ([`tracer_daemon::sys::alloc`]): a request's memory budget.
#[global_allocator]
static ALLOCATOR: tracer_daemon::sys::alloc::Counting<mimalloc::MiMalloc> =
    tracer_daemon::sys::alloc::Counting(mimalloc::MiMalloc);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Config(ConfigCommand::Default)) => print_default(),
        Some(Command::Config(ConfigCommand::Check { file })) => check(&file),
        None => daemon(&cli.flags),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tracerd: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_default() -> anyhow::Result<()> {
    let text = Config::default().to_toml()?;
    println!("# tracerd's default configuration (/etc/tracer/tracerd.toml)\n{text}");
    Ok(())
}

fn check(file: &std::path::Path) -> anyhow::Result<()> {
    let text = Config::from_file(file)?.to_toml()?;
    println!("# {}: ok; the settings it gives:\n{text}", file.display());
    Ok(())
}

fn daemon(flags: &Flags) -> anyhow::Result<()> {
    let config = Config::load(flags)?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&config.logging.log).context("log")?,
        )
        .with_writer(std::io::stderr)
        .init();
    // A big snapshot's grouping runs on helper threads besides the
    // request's: at the request's own nice, so that the cheap routes get a
    // CPU first.
    tracer_model::on_helper_thread_start(|| {
        tracer_daemon::sys::lower_this_threads_priority(tracer_daemon::sys::EXPENSIVE_NICE);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(tracer_daemon::app::run(config));
    // Blocking work still running (a request cut, rendering what it will
    // never send) must not hold the stop: whatever it holds is released by
    // the kernel at exit, and no probe is left to it.
    runtime.shutdown_timeout(Duration::from_millis(200));
    Ok(result?)
}
