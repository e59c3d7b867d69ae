//! Cooperative interruption of long model work: decoding a large file,
//! running a pickle, filtering or grouping millions of traces.
//!
//! The engine is pure and knows nothing of requests, so the caller (tracerd,
//! for a request whose client left, that timed out, or that went past its
//! memory budget) installs a check for the current thread with
//! [`CheckGuard::install`]; long loops call [`check`] every few thousand
//! steps and return [`Interrupted`] when it says so. With no check
//! installed, [`check`] always returns `Ok(())`.
use std::cell::Cell;

/// Why work stopped before its end: the reason the installed check gave
/// (for instance "the client left" or "the request went past its memory
/// budget of 268435456 bytes").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("interrupted: {reason}")]
pub struct Interrupted {
    /// The installed check's reason, shown to the user.
    pub reason: String,
}

/// A check: `Ok(())` to go on, [`Interrupted`] to stop.
pub type Check = fn() -> Result<(), Interrupted>;

thread_local! {
    static CHECK: Cell<Option<Check>> = const { Cell::new(None) };
}

/// How many loop steps go between two calls of [`check`] in the engine's
/// loops (a call costs a thread-local read and the check itself).
pub const CHECK_EVERY: usize = 4096;

/// Asks the current thread's installed check whether work may go on.
///
/// # Errors
/// [`Interrupted`] when the installed check says to stop.
pub fn check() -> Result<(), Interrupted> {
    match CHECK.with(Cell::get) {
        Some(check) => check(),
        None => Ok(()),
    }
}

/// Calls [`check`] on every [`CHECK_EVERY`]th step (`step` counts from 0).
///
/// # Errors
/// [`Interrupted`] when the installed check says to stop.
pub fn check_every(step: usize) -> Result<(), Interrupted> {
    if step % CHECK_EVERY == CHECK_EVERY - 1 {
        check()
    } else {
        Ok(())
    }
}

/// Keeps a check installed on the current thread while it lives; the
/// previous one comes back on drop.
#[derive(Debug)]
pub struct CheckGuard {
    previous: Option<Check>,
}

impl CheckGuard {
    /// Installs `check` for the current thread until the guard drops.
    #[must_use]
    pub fn install(check: Check) -> Self {
        Self {
            previous: CHECK.with(|c| c.replace(Some(check))),
        }
    }
}

impl Drop for CheckGuard {
    fn drop(&mut self) {
        CHECK.with(|c| c.set(self.previous));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop() -> Result<(), Interrupted> {
        Err(Interrupted {
            reason: "the client left".into(),
        })
    }

    #[test]
    fn a_check_holds_while_its_guard_lives_and_only_on_its_thread() {
        assert_eq!(check(), Ok(()));
        {
            let _guard = CheckGuard::install(stop);
            assert_eq!(
                check().unwrap_err().to_string(),
                "interrupted: the client left"
            );
            assert_eq!(check_every(0), Ok(()));
            assert!(check_every(CHECK_EVERY - 1).is_err());
            assert_eq!(std::thread::spawn(check).join().unwrap(), Ok(()));
        }
        assert_eq!(check(), Ok(()));
    }
}
