//! [`Stopping`]: tracerd's stop as the kernel side's long passes and the
//! snapshot builds see it.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// tracerd's stop as the long passes see it: raised once (SIGTERM or
/// SIGINT, when the API's grace period is over) and never lowered. Clones
/// share it. Once it is raised, reads of the kernel maps and snapshot
/// builds end at their next batch, and what they return then is partial:
/// their callers answer that tracerd is stopping instead of using it, so
/// that no lock of the service (and no probe) is held for long.
#[derive(Clone, Debug, Default)]
pub struct Stopping(Arc<AtomicBool>);

impl Stopping {
    /// Raises it, for every clone.
    pub fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether it was raised.
    #[must_use]
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
