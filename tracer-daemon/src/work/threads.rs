//! The threads of the work that grows with the traced data (an expensive
//! route's, an automatic snapshot of every image): at a lower priority
//! than the cheap routes' ([`spawn_expensive`]).
use std::sync::LazyLock;

use crate::sys::EXPENSIVE_NICE;

/// The threads of [`spawn_expensive`]: the blocking pool of a runtime of
/// their own (none of its futures run: it only lends its threads), each
/// at [`EXPENSIVE_NICE`] from its start. Linux's nice is per thread and
/// only CAP_SYS_NICE lowers it again, which tracerd's service does not
/// have: so a thread once lowered serves only expensive work, never a
/// cheap route. The runtime drives no timer and no I/O: work on these
/// threads waits on the server's runtime, never on this one (a streamed
/// answer's wait for room does). None when the runtime could not be built.
static EXPENSIVE_THREADS: LazyLock<Option<tokio::runtime::Runtime>> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .thread_name("tracerd-expensive")
        .on_thread_start(|| crate::sys::lower_this_threads_priority(EXPENSIVE_NICE))
        .build()
        .inspect_err(
            |err| tracing::warn!(%err, "expensive work runs at the cheap routes' priority"),
        )
        .ok()
});

/// Runs `work`, which grows with the traced data (an expensive route's,
/// an automatic snapshot of every image), on a blocking thread at
/// [`EXPENSIVE_NICE`]; on tokio's own blocking threads when those could
/// not be made. The handle is awaited from any runtime.
pub fn spawn_expensive<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    match EXPENSIVE_THREADS.as_ref() {
        Some(runtime) => runtime.spawn_blocking(work),
        None => tokio::task::spawn_blocking(work),
    }
}
