//! `tracerd`: load the probes, serve the API and /metrics, stop cleanly on
//! SIGTERM/SIGINT; `tracerd config check FILE` and `tracerd config default`.
use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser as _;
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};
use tracer_common::ProcEvent;
use tracer_daemon::{
    api,
    capture::{Capture, CaptureConfig},
    config::{Cli, Command, Config, ConfigCommand, Flags},
    daemon::Daemon,
    metrics::{Metrics, MetricsOptions},
    server::{self, Limits, Token},
    views::{self, AutoPolicy},
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Config(ConfigCommand::Default)) => print_default(),
        Some(Command::Config(ConfigCommand::Check { file })) => match Config::from_file(&file) {
            Ok(config) => config.to_toml().map(|text| {
                println!("# {}: ok; the settings it gives:\n{text}", file.display());
            }),
            Err(err) => Err(err),
        }
        .map_err(anyhow::Error::from),
        None => daemon_main(&cli.flags),
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

fn daemon_main(flags: &Flags) -> anyhow::Result<()> {
    let config = Config::load(flags)?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&config.log).context("log")?)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(run(config));
    // Blocking work still running (a long snapshot) must not hold the stop:
    // whatever it holds is released by the kernel at exit.
    runtime.shutdown_timeout(Duration::from_millis(500));
    result
}

async fn run(config: Config) -> anyhow::Result<()> {
    let token = config
        .auth_token_file
        .as_deref()
        .map(Token::read)
        .transpose()?;
    // Bind first: a port in use fails at once, before any probe is attached.
    let tcp = server::bind_tcp(config.listen).await?;
    let unix = config
        .unix_socket
        .as_deref()
        .map(server::bind_unix)
        .transpose()?;
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("creating state_dir {}", config.state_dir.display()))?;
    // Held open for tracerd's life: the kernel keeps BPF run-time statistics
    // only while some process holds a BPF_ENABLE_STATS fd.
    let bpf_stats = if config.bpf_stats {
        match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Some(fd),
            Err(err) => {
                tracing::warn!(err = %err, "BPF_ENABLE_STATS refused: tracer_bpf_program_* stay 0");
                None
            }
        }
    } else {
        None
    };

    let scope = tracer_daemon::scope::Scope {
        pids: config.scope_pids.iter().copied().collect(),
        exes: config.scope_exes.iter().cloned().collect(),
        cgroups: config.scope_cgroups.iter().cloned().collect(),
    };
    let mut capture = Capture::load(CaptureConfig {
        nframe: config.nframe,
        max_live_blocks: config.max_live_blocks,
        live_table_blocks: config.live_table_blocks,
        max_stacks: config.max_stacks,
        max_procs: config.max_procs,
        max_inflight: config.max_inflight,
        inflight_slots: config.inflight_slots,
        events_ring_bytes: config.events_ring_bytes,
        libc: config.libc.clone(),
        sample_interval: config.sample_interval,
        system_wide: scope.is_all(),
    })
    .context("loading the eBPF probes (tracerd needs root, or CAP_BPF and CAP_PERFMON)")?;
    for library in capture.libraries() {
        tracing::info!(target = %library.path.display(), probes = library.probes.len(), "probe points");
    }
    let events = capture.take_events().context("the event ring buffer")?;
    let daemon = Arc::new(Daemon::new(
        capture,
        Duration::from_secs(config.exited_retention),
    ));
    if !scope.is_all() {
        let attached = daemon
            .set_scope(scope)
            .map_err(anyhow::Error::msg)
            .context("scope")?;
        tracing::info!(
            processes = attached.len(),
            "scoped: probes registered per process"
        );
    }
    let policy = AutoPolicy {
        interval_secs: config.snapshot_interval,
        retention_secs: config.snapshot_retention,
    };
    views::start(&daemon, &config.state_dir, policy)
        .context("opening the snapshot store in state_dir")?;

    let mut metrics = Metrics::new();
    metrics.collect_daemon(
        daemon.clone(),
        MetricsOptions {
            top_processes: config.metrics_top_processes as usize,
            call_sites: config.metrics_call_sites as usize,
            bpf_stats_enabled: bpf_stats.is_some(),
        },
    );
    let metrics = Arc::new(metrics);
    let limits = Limits {
        body_limit_bytes: usize::try_from(config.body_limit_bytes).unwrap_or(usize::MAX),
        request_timeout: Duration::from_secs(config.request_timeout_secs),
        max_expensive_requests: config.max_expensive_requests as usize,
    };
    let tcp_app = server::app(api::router(daemon.clone()), metrics.clone(), &limits, token);
    // The socket's mode (0660) is its access control: no token there.
    let unix = unix.map(|listener| {
        (
            listener,
            server::app(api::router(daemon.clone()), metrics.clone(), &limits, None),
        )
    });

    let event_loop = tokio::spawn(handle_events(daemon.clone(), events));
    server::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!("tracing; API on {}", config.listen)),
    ]);
    tracing::info!(listen = %config.listen, unix_socket = ?config.unix_socket, nframe = config.nframe, "tracerd ready");

    let grace = Duration::from_secs(config.shutdown_grace_secs);
    let drained = server::serve((tcp, tcp_app), unix, shutdown_signal(), grace).await;
    server::notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!(drained, "stopping: API closed");
    event_loop.abort();
    let _ = event_loop.await;
    drop(metrics);
    // Requests cut at the end of the grace period may still hold the
    // capture lock in blocking work: the record gets one second, never
    // more, so the stop stays within 5 s.
    let record = tokio::task::spawn_blocking({
        let daemon = daemon.clone();
        let state_dir = config.state_dir.clone();
        move || server::write_last_stop(&state_dir, &daemon, drained)
    });
    match tokio::time::timeout(Duration::from_secs(1), record).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(err))) => {
            tracing::warn!(err = %err, "cannot record the stop in the state directory")
        }
        Ok(Err(_)) | Err(_) => tracing::warn!("the stop record did not finish within 1 s: skipped"),
    }
    if let Some(path) = &config.unix_socket {
        let _ = std::fs::remove_file(path);
    }
    // Dropping the last reference drops the Capture: every probe detached,
    // every map freed. A request still running holds one; the kernel then
    // detaches everything when the process exits a moment later.
    match Arc::try_unwrap(daemon) {
        Ok(daemon) => {
            drop(daemon);
            tracing::info!("probes detached");
        }
        Err(_) => tracing::info!("a request still holds the probes; they detach at exit"),
    }
    drop(bpf_stats);
    Ok(())
}

async fn shutdown_signal() {
    let term = tokio::signal::unix::signal(SignalKind::terminate());
    let int = tokio::signal::unix::signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => {
            tracing::warn!("no signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

/// Drains the kernel's process events as they come (one wake-up per process
/// image start or end, never per allocation) and expires old ones each second.
async fn handle_events(daemon: Arc<Daemon>, ring: aya::maps::RingBuf<aya::maps::MapData>) {
    // SAFETY: the RingBuf owns its map fd for its whole life inside the
    // AsyncFd, and as_raw_fd always returns that same fd.
    let mut fd = match unsafe {
        AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE)
    } {
        Ok(fd) => fd,
        Err(err) => {
            tracing::error!(err = %err, map = tracer_common::MAP_EVENTS, "cannot poll the ring buffer");
            return;
        }
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            guard = fd.readable_mut() => {
                let Ok(mut guard) = guard else { continue };
                let mut batch = Vec::new();
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    if item.len() >= size_of::<ProcEvent>() {
                        // SAFETY: the record holds a ProcEvent written by our
                        // eBPF program; read_unaligned copes with alignment.
                        batch.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<ProcEvent>()) });
                    }
                }
                guard.clear_ready();
                let daemon = daemon.clone();
                let _ = tokio::task::spawn_blocking(move || daemon.handle_events(&batch)).await;
            }
            _ = tick.tick() => {
                ticks += 1;
                let daemon = daemon.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    daemon.expire();
                    if ticks.is_multiple_of(10) {
                        let removed = daemon.sweep_orphans();
                        if removed > 0 {
                            tracing::info!(removed, map = tracer_common::MAP_LIVE_ALLOCS, "removed orphaned blocks");
                        }
                        // Ended images of large processes leave big freed
                        // blocks in glibc's heap, which it keeps: give them
                        // back so tracerd's RSS follows what it holds.
                        // SAFETY: malloc_trim has no preconditions.
                        unsafe { libc::malloc_trim(0) };
                    }
                })
                .await;
            }
        }
    }
}
