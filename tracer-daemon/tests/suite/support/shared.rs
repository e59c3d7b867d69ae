//! A tracerd that consecutive tests started with the same arguments share
//! ([`Tracerd::shared`]), so that a run of them pays one start (about 3 s
//! of the kernel's verifier) and one stop instead of one each. Only for a
//! test that changes nothing tracerd-wide (no scope, tracing switch,
//! config or snapshot of another process) and asserts only on its own
//! processes: what it reads of a tracerd that has traced earlier tests is
//! then what it would read of a fresh one, as on a host where tracerd has
//! run for days.
//!
//! The shared tracerd is stopped (by pid, as every tracerd here) when a
//! test asks for other arguments, when any tracerd is started otherwise
//! ([`stop_shared`]: every launcher of the suite calls it first, so that
//! two tracerds never trace the same processes), when a test using it
//! fails (the next starts afresh), and at the test binary's exit
//! (`atexit`).

use std::{
    ops::Deref,
    sync::{Mutex, MutexGuard, Once, PoisonError, TryLockError},
};

use super::tracerd::Tracerd;

/// The shared tracerd and the arguments it was started with.
struct Slot {
    args: Vec<String>,
    tracerd: Tracerd,
}

/// The one shared tracerd, if any. The tests run one at a time
/// (`--test-threads=1`): the lock is only ever waited on by the exit hook.
static SHARED: Mutex<Option<Slot>> = Mutex::new(None);

/// A test's hold of the shared tracerd: derefs to it for the test's
/// duration.
pub struct SharedTracerd {
    guard: MutexGuard<'static, Option<Slot>>,
}

impl Deref for SharedTracerd {
    type Target = Tracerd;

    fn deref(&self) -> &Tracerd {
        &self
            .guard
            .as_ref()
            .expect("a shared tracerd is running while held")
            .tracerd
    }
}

impl Drop for SharedTracerd {
    fn drop(&mut self) {
        // A failed test may have left it anywhere: the next one starts
        // afresh.
        if std::thread::panicking() {
            self.guard.take();
        }
    }
}

fn lock() -> MutexGuard<'static, Option<Slot>> {
    SHARED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The shared tracerd taken out of its slot (None when none runs), or
/// Err when a test holds it.
fn take() -> Result<Option<Slot>, ()> {
    match SHARED.try_lock() {
        Ok(mut guard) => Ok(guard.take()),
        Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner().take()),
        Err(TryLockError::WouldBlock) => Err(()),
    }
}

/// Stops the shared tracerd at the test binary's exit (never panics: a
/// panic here would abort; a tracerd still held by a test thread that
/// never ended is stopped by its own drop, or not at all).
extern "C" fn stop_at_exit() {
    drop(take().ok().flatten());
}

impl Tracerd {
    /// The tracerd started with `extra` that consecutive tests share
    /// (see the module's documentation): the running one when it was
    /// started with the same arguments, else a new one (the other
    /// stopped first).
    pub fn shared(extra: &[&str]) -> SharedTracerd {
        static AT_EXIT: Once = Once::new();
        AT_EXIT.call_once(|| {
            // SAFETY: registers a plain function that takes a lock and
            // stops a child; it is called once, at exit.
            let _ = unsafe { libc::atexit(stop_at_exit) };
        });
        let args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let mut guard = lock();
        if guard.as_ref().is_none_or(|slot| slot.args != args) {
            // The old one stops before the new one starts.
            guard.take();
            *guard = Some(Slot {
                args,
                tracerd: Tracerd::start_own(extra),
            });
        }
        SharedTracerd { guard }
    }
}

/// Stops the shared tracerd, if one runs, and waits for its exit: every
/// other start of a tracerd in the suite calls it first.
///
/// # Panics
/// When the shared tracerd is held (a test that holds it starts another
/// tracerd: they would trace the same processes), instead of waiting for
/// ever.
pub fn stop_shared() {
    let slot = take()
        .unwrap_or_else(|()| panic!("a test holding the shared tracerd starts another tracerd"));
    drop(slot);
}
