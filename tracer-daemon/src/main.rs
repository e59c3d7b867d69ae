//! `tracerd`: load the probes, serve the API, stop cleanly on SIGTERM/SIGINT.
use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser as _;
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};
use tracer_common::ProcEvent;
use tracer_daemon::{
    api,
    capture::{Capture, CaptureConfig},
    config::Config,
    daemon::Daemon,
};

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&config.log).context("--log")?)
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(run(config))
}

async fn run(config: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("creating --state-dir {}", config.state_dir.display()))?;
    let mut capture = Capture::load(CaptureConfig {
        nframe: config.nframe,
        max_live_blocks: config.max_live_blocks,
        max_stacks: config.max_stacks,
        max_procs: config.max_procs,
        libc: config.libc.clone(),
    })
    .context("loading the eBPF probes (tracerd needs root, or CAP_BPF and CAP_PERFMON)")?;
    for library in capture.libraries() {
        tracing::info!(target = %library.path.display(), probes = library.probes.len(), "attached");
    }
    let events = capture.take_events().context("the event ring buffer")?;
    let daemon = Arc::new(Daemon::new(capture, Duration::from_secs(config.exited_retention)));

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    tracing::info!(listen = %config.listen, nframe = config.nframe, "tracerd ready");

    let event_loop = tokio::spawn(handle_events(daemon.clone(), events));
    let app = api::router(daemon.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("serving the API")?;
    event_loop.abort();
    let _ = event_loop.await;
    tracing::info!("stopping: detaching probes");
    drop(daemon);
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
    let mut fd = match unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) } {
        Ok(fd) => fd,
        Err(err) => {
            tracing::error!(err = %err, map = tracer_common::MAP_EVENTS, "cannot poll the ring buffer");
            return;
        }
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
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
                let daemon = daemon.clone();
                let _ = tokio::task::spawn_blocking(move || daemon.expire()).await;
            }
        }
    }
}
