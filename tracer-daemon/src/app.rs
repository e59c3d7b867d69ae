//! Start-up and shutdown of `tracerd`, in order.
//!
//! Start: read the token, bind the listeners (a port in use fails at once,
//! before any probe is attached), create the state directory, load the eBPF
//! programs and attach within the scope, open the snapshot store, start the
//! background tasks, serve, tell systemd we are ready.
//!
//! Stop (SIGTERM or SIGINT): start detaching every probe (a uprobe_multi
//! link costs the kernel one wait for all its probes, and links on several
//! threads wait at once; a perf event, where the kernel has no such links,
//! a wait per probe, one after another), close the API and give
//! requests in flight the grace period (they read the maps as they were
//! at the signal), then raise the service's stop (every request and pass
//! still running ends at its next block: none holds a lock of the service
//! for long), stop the background tasks, record the stop in the state
//! directory, wait for the probes to be gone, and drop the service, which
//! frees every map. With the default grace of 3 s, tracerd is gone within
//! 5 s of the signal whatever it was doing and however many probes it has;
//! with perf events only, as long as it has few probes (the figures are in
//! `docs/design/0011-measured-figures.md`).
use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::signal::unix::SignalKind;

use crate::capture::{Capture, CaptureConfig, CaptureError};
use crate::config::{Config, ConfigError};
use crate::http::{self, Limits, ServerError, Token, TokenError};
use crate::lifecycle::Scope;
use crate::metrics::{Metrics, MetricsOptions};
use crate::service::{AutoPolicy, LastStop, Service, ServiceError, Unwinder};
use crate::snapshot::FramePatterns;
use crate::store::StoreError;
use crate::sys::fsync::{WriteError, write_atomically};
use crate::tasks;

/// Name of the file in the state directory that records the last stop.
pub const LAST_STOP_FILE: &str = "last-stop.json";

/// What can stop tracerd from starting.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A listener.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The token file.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The state directory cannot be created.
    #[error("creating state_dir {}: {source}", path.display())]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The eBPF programs could not be loaded or attached.
    #[error("loading the eBPF probes (tracerd needs root, or CAP_BPF and CAP_PERFMON): {0}")]
    Capture(#[from] CaptureError),
    /// The event ring buffer was taken already.
    #[error("the event ring buffer is not available")]
    Events,
    /// The configured scope cannot be applied.
    #[error("scope: {0}")]
    Scope(#[from] ServiceError),
    /// The snapshot store cannot be opened.
    #[error("opening the snapshot store in state_dir: {0}")]
    Store(#[from] StoreError),
    /// A setting is invalid (`Config::load` refuses it first; this is
    /// for a `Config` built otherwise).
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Runs tracerd with `config` until SIGTERM or SIGINT, then stops cleanly.
///
/// # Errors
/// [`AppError`] when start-up fails; nothing is left attached then.
pub async fn run(config: Config) -> Result<(), AppError> {
    let allocator_frames = FramePatterns::compile(&config.capture.allocator_frames)?;
    let token = config
        .api
        .auth_token_file
        .as_deref()
        .map(Token::read)
        .transpose()?;
    // Bind first: a port in use fails at once, before any probe is attached.
    let tcp = http::bind_tcp(config.api.listen).await?;
    let unix = config
        .api
        .unix_socket
        .as_deref()
        .map(http::bind_unix)
        .transpose()?;
    create_state_dir(&config.store.state_dir)?;
    // Held open for tracerd's life: the kernel keeps BPF run-time statistics
    // only while some process holds a BPF_ENABLE_STATS fd.
    let bpf_stats = enable_bpf_stats(config.metrics.bpf_stats);

    let (service, events) = start_service(&config, allocator_frames)?;

    let metrics = metrics_of(&config, &service, bpf_stats.is_some());
    let (limits, connections) = limits_of(&config);
    let operators = Arc::new(http::Operators::named(&config.api.operators_group));
    if operators.gid.is_none() {
        tracing::info!(group = %config.api.operators_group, "no such group: only root and token holders may change tracing");
    }
    let tcp_app = http::app(
        http::api_router(service.clone()),
        metrics.clone(),
        &limits,
        token.clone(),
        operators.clone(),
    );
    // On the socket every peer is named by the kernel (SO_PEERCRED), so the
    // token is never required there; sent, it makes its holder an operator
    // as on TCP.
    let unix = unix.map(|listener| {
        (
            listener,
            http::app(
                http::api_router(service.clone()),
                metrics.clone(),
                &limits,
                token,
                operators.clone(),
            ),
        )
    });

    let holds = hold_execs(config.allocators.hold_exec, &service);
    let background = [
        tokio::spawn(tasks::events_and_housekeeping(service.clone(), events)),
        tokio::spawn(tasks::automatic_snapshots(
            service.clone(),
            AutoPolicy::from(&config),
        )),
        tokio::spawn(tasks::watch(service.clone())),
    ];
    // The processes of a chosen scope ran before tracerd: their tables
    // before it says ready, so that their walks are whole from the first.
    preload_scope_tables(&service).await;
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!("tracing; API on {}", config.api.listen)),
    ]);
    tracing::info!(listen = %config.api.listen, unix_socket = ?config.api.unix_socket, nframe = config.capture.nframe, "tracerd ready");

    let grace = Duration::from_secs(config.api.shutdown_grace_secs);
    // The signal starts the probes' detaching at once: it costs the kernel
    // grace periods (about 0.6 s for hundreds of probes in uprobe_multi
    // links, 0.09 s a probe as perf events), and so runs beside the grace
    // period rather than after it.
    let signalled_at = Arc::new(std::sync::OnceLock::new());
    let (signalled, on_signal) = tokio::sync::oneshot::channel::<()>();
    let detaching = tokio::spawn(detach_on_signal(service.clone(), on_signal));
    let shutdown = {
        let signalled_at = signalled_at.clone();
        async move {
            shutdown_signal().await;
            let _ = signalled_at.set(Instant::now());
            let _ = signalled.send(());
        }
    };
    let drained = http::serve((tcp, tcp_app), unix, connections, shutdown, grace).await;
    let deadline = signalled_at.get().copied().unwrap_or_else(Instant::now) + DETACH_DEADLINE;
    notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!(drained, "stopping: API closed");
    service.begin_stop();
    if let Some(holds) = holds {
        holds.stop();
    }
    for task in background {
        task.abort();
        let _ = task.await;
    }
    drop(metrics);
    record_stop(&service, &config.store.state_dir, drained).await;
    if let Some(path) = &config.api.unix_socket {
        let _ = std::fs::remove_file(path);
    }
    detach_and_free(service, deadline, detaching).await;
    drop(bpf_stats);
    Ok(())
}

/// Creates the state directory `state_dir` (0700) if it does not exist.
///
/// # Errors
/// [`AppError::StateDir`] when it cannot be created.
fn create_state_dir(state_dir: &std::path::Path) -> Result<(), AppError> {
    crate::sys::fsync::create_private_dir(state_dir).map_err(|source| AppError::StateDir {
        path: state_dir.to_path_buf(),
        source,
    })
}

/// Starts holding execs when `hold_exec` is on; None when off or when it
/// cannot start (logged).
fn hold_execs(hold_exec: bool, service: &Arc<Service>) -> Option<tasks::ExecHolds> {
    if hold_exec {
        tasks::ExecHolds::start(service.clone())
            .map_err(|err| tracing::warn!(%err, "execs are not held: a program whose allocator is new to tracerd is traced from a moment after its start"))
            .ok()
    } else {
        None
    }
}

/// Holds BPF_ENABLE_STATS on when `on` (for tracerd's life: the kernel
/// keeps BPF run-time statistics only while some process holds the fd);
/// None when off or refused (logged).
fn enable_bpf_stats(on: bool) -> Option<std::os::fd::OwnedFd> {
    if on {
        match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Some(fd),
            Err(err) => {
                tracing::warn!(err = %err, "BPF_ENABLE_STATS refused: tracer_bpf_program_* stay 0");
                None
            }
        }
    } else {
        None
    }
}

/// Loads the eBPF programs, makes the service over them (allocator
/// discovery as configured), attaches within the scope and opens the
/// snapshot store; returns the service and the ring buffer of its events.
///
/// # Errors
/// [`AppError`] when a program cannot load, the events cannot be taken,
/// the scope cannot be attached or the store cannot be opened.
fn start_service(
    config: &Config,
    allocator_frames: FramePatterns,
) -> Result<(Arc<Service>, aya::maps::RingBuf<aya::maps::MapData>), AppError> {
    let scope = Scope::from(config);
    let mut capture = Capture::load(CaptureConfig::from(config))?;
    for library in capture.libraries() {
        tracing::info!(target = %library.path.display(), probes = library.probes.len(), "probe points");
    }
    let events = capture.take_events().ok_or(AppError::Events)?;
    let service = Service::new(
        Box::new(capture),
        Duration::from_secs(config.processes.exited_retention),
        allocator_frames,
    );
    let service = service.with_exact(crate::service::ExactPolicy::from(config));
    let allocators = &config.allocators;
    let service = Arc::new(if !allocators.discover_allocators {
        service.without_discovery()
    } else if allocators.probe_installed_allocators {
        service.with_installed_allocators()
    } else {
        service
    });
    if !scope.is_all() {
        let attached = service.set_scope(scope)?;
        tracing::info!(
            processes = attached.len(),
            "scoped: probes registered per process"
        );
    }
    service.open_store(&config.store.state_dir, crate::store::Quotas::from(config))?;
    Ok((service, events))
}

/// The metrics: the service's collected at each scrape, with the options
/// of `config`.
fn metrics_of(config: &Config, service: &Arc<Service>, bpf_stats_enabled: bool) -> Arc<Metrics> {
    let mut metrics = Metrics::new();
    metrics.collect_service(
        service.clone(),
        MetricsOptions {
            bpf_stats_enabled,
            ..MetricsOptions::from(config)
        },
    );
    Arc::new(metrics)
}

/// The bounds of requests and of connections, from `config`.
fn limits_of(config: &Config) -> (Limits, http::Connections) {
    (Limits::from(config), http::Connections::from(config))
}

/// Compiles the unwind tables of the scope's running processes, when a
/// scope is chosen: they ran before tracerd, and their walks must be whole
/// from the first.
async fn preload_scope_tables(service: &Arc<Service>) {
    if !service.scope_is_all() {
        let scoped = service.clone();
        let started = std::time::Instant::now();
        if let Ok(files) =
            tokio::task::spawn_blocking(move || Unwinder::new(&scoped).preload_running_tables())
                .await
        {
            tracing::info!(
                files,
                ms = started.elapsed().as_millis() as u64,
                "unwind tables of the scope's running processes compiled"
            );
        }
    }
}

/// Waits for the probes' detaching until `deadline`, then detaches what is
/// left and drops the service if nobody else holds it (every map freed).
async fn detach_and_free(
    service: Arc<Service>,
    deadline: Instant,
    detaching: tokio::task::JoinHandle<()>,
) {
    if tokio::time::timeout_at(deadline.into(), detaching)
        .await
        .is_err()
    {
        tracing::warn!(
            deadline_ms = DETACH_DEADLINE.as_millis() as u64,
            "the probes were not detached in time: the kernel detaches the rest at exit"
        );
    }
    // A stop that came without the signal (a listener failed) detaches
    // here; otherwise nothing is left.
    detach_probes(&service, deadline).await;
    // Dropping the last reference drops the Capture: every map freed. A
    // request cut at the end of the grace period may still hold one for a
    // moment (rendering what it will never send), as does a detaching
    // past its deadline; the maps then go when the process exits, which
    // costs the kernel no grace period.
    match Arc::try_unwrap(service) {
        Ok(service) => {
            drop(service);
            tracing::info!("maps freed");
        }
        Err(_) => tracing::info!(
            "the service is still held (a request cut, or probes still detaching): its maps go at exit"
        ),
    }
}

/// How long after the signal the stop waits at most for the probes to be
/// detached (uprobe_multi links: well under a second for hundreds of
/// probes; perf events, where the kernel has no such links: about 0.09 s
/// each, one after another, 48 probes take 4.2 s): past it the kernel
/// detaches the rest at tracerd's exit, and the stop takes longer than its
/// 5 s.
const DETACH_DEADLINE: Duration = Duration::from_millis(4500);

/// Detaches every probe ([`Service::detach_probes`]) once `signal` comes;
/// nothing if it never does (its sender dropped).
async fn detach_on_signal(service: Arc<Service>, signal: tokio::sync::oneshot::Receiver<()>) {
    if signal.await.is_err() {
        return;
    }
    let started = Instant::now();
    if let Ok(probes) = tokio::task::spawn_blocking(move || service.detach_probes()).await {
        tracing::info!(
            probes,
            ms = started.elapsed().as_millis() as u64,
            "probes detached"
        );
    }
}

/// Detaches what is still attached ([`Service::detach_probes`]: nothing
/// once [`detach_on_signal`] is done), on a blocking thread, waiting until
/// `deadline` at most.
async fn detach_probes(service: &Arc<Service>, deadline: Instant) {
    let detach = tokio::task::spawn_blocking({
        let service = service.clone();
        move || service.detach_probes()
    });
    match tokio::time::timeout_at(deadline.into(), detach).await {
        Ok(Ok(0)) => {}
        Ok(Ok(probes)) => tracing::info!(probes, "probes detached"),
        Ok(Err(_)) | Err(_) => tracing::warn!(
            "the probes were not detached in time: the kernel detaches the rest at exit"
        ),
    }
}

/// Records the stop in `state_dir/last-stop.json` (atomically): when,
/// whether the API drained in time, the eBPF counters and the processes
/// traced at the end, from the service. Requests cut at the end of the
/// grace period give up the service's locks at their next block (the stop
/// is raised before): the record gets one second, never more, so the stop
/// stays within 5 s. Past it, the stop is recorded all the same, without
/// what needed the service (`complete: false`): a stop is never left
/// unrecorded.
async fn record_stop(service: &Arc<Service>, state_dir: &std::path::Path, drained: bool) {
    let path = state_dir.join(LAST_STOP_FILE);
    let gave_up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let record = tokio::task::spawn_blocking({
        let service = service.clone();
        let path = path.clone();
        let gave_up = gave_up.clone();
        move || -> Result<(), WriteError> {
            let record = service.last_stop(drained);
            if gave_up.load(std::sync::atomic::Ordering::Acquire) {
                return Ok(());
            }
            let bytes = serde_json::to_vec_pretty(&record).unwrap_or_default();
            write_atomically(&path, &bytes)
        }
    });
    match tokio::time::timeout(Duration::from_secs(1), record).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(err))) => {
            tracing::warn!(err = %err, "cannot record the stop in the state directory")
        }
        Ok(Err(_)) | Err(_) => {
            gave_up.store(true, std::sync::atomic::Ordering::Release);
            let record = LastStop::without_service(service.started_at(), drained);
            let bytes = serde_json::to_vec_pretty(&record).unwrap_or_default();
            match write_atomically(&path, &bytes) {
                Ok(()) => tracing::warn!(
                    "the stop's counters and processes were not read within 1 s: recorded without them"
                ),
                Err(err) => {
                    tracing::warn!(err = %err, "cannot record the stop in the state directory")
                }
            }
        }
    }
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

/// Tells systemd (`Type=notify`) something, if tracerd runs under it;
/// a no-op elsewhere.
pub fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(err) = sd_notify::notify(false, state) {
        tracing::warn!(err = %err, "cannot notify systemd");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::fake::FakeKernel;

    /// A stop whose service stays locked past the record's second is
    /// recorded all the same, without what needs the service, in about 1 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_is_recorded_even_while_the_service_stays_locked() {
        let service = Arc::new(Service::new(
            Box::new(FakeKernel::new(16)),
            Duration::from_secs(60),
            FramePatterns::default(),
        ));
        let dir = std::env::temp_dir().join(format!("tracer-last-stop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let holder = service.hold_all_locks(Duration::from_secs(3));
        let started = std::time::Instant::now();
        record_stop(&service, &dir, false).await;
        let took = started.elapsed();
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join(LAST_STOP_FILE)).expect("last-stop.json written"),
        )
        .expect("JSON");
        let _ = holder.join();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(took < Duration::from_millis(1500), "took {took:?}");
        assert_eq!(record["complete"], false, "{record}");
        assert_eq!(record["drained"], false, "{record}");
        assert!(record["stopped_at_ms"].as_u64().is_some(), "{record}");

        // Unlocked, the record is whole.
        std::fs::create_dir_all(&dir).expect("temp dir");
        record_stop(&service, &dir, true).await;
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join(LAST_STOP_FILE)).expect("last-stop.json written"),
        )
        .expect("JSON");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(record["complete"], true, "{record}");
        assert!(record["counters"].is_object(), "{record}");
    }
}
