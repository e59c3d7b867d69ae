//! The service's shared state and the one way to lock it.
//!
//! Five locks guard it, always taken in this order: kernel → scope →
//! registry → control → store. The kernel's is a reader-writer lock: the
//! long reads of the live blocks (a snapshot, the sweep's walk) share it,
//! and what changes the kernel side (an image's end, the sweep's removals)
//! takes it alone. [`State::locks`] is the only way to them:
//! it starts a [`Locks`] holding nothing, and each step takes one lock and
//! is only available while every later lock is still free, so taking them
//! out of order does not compile. A step may be skipped
//! (`locks().registry()`), and guards are plain fields, so one may be
//! dropped early (`drop(held.kernel)`) while the others are kept.
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::capture::KernelMaps;
use crate::lifecycle::{Registry, Scope, TracingControl};
use crate::store::SnapshotStore;

/// The locked parts of the service's state. Its fields are private to this
/// module: [`State::locks`] is the only way in.
pub(super) struct State {
    kernel: RwLock<Box<dyn KernelMaps>>,
    scope: Mutex<Scope>,
    registry: Mutex<Registry>,
    control: Mutex<TracingControl>,
    store: Mutex<SnapshotStore>,
}

/// A lock not taken.
#[derive(Debug)]
pub(super) struct Free;

/// The guard of one of the state's mutexes.
pub(super) type Held<'a, T> = MutexGuard<'a, T>;

/// The kernel lock held alone ([`Locks::kernel`]).
pub(super) type HeldKernel<'a> = RwLockWriteGuard<'a, Box<dyn KernelMaps>>;

/// The kernel lock shared with other readers ([`Locks::kernel_shared`]).
pub(super) type SharedKernel<'a> = RwLockReadGuard<'a, Box<dyn KernelMaps>>;

/// Locks taken so far, in order; each field is [`Free`] or a guard.
pub(super) struct Locks<'a, K, S, R, C, T> {
    state: &'a State,
    /// The kernel maps (`Box<dyn KernelMaps>`).
    pub kernel: K,
    /// The scope in force.
    pub scope: S,
    /// The process images.
    pub registry: R,
    /// tracemalloc's start/stop/clear state.
    pub control: C,
    /// The stored snapshots.
    pub store: T,
}

/// Locks a mutex; a panic while it was held does not take the daemon down
/// with it: every update of this state is complete or not started.
pub(super) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl State {
    /// The state over a kernel side, with empty registry, control and store.
    pub(super) fn new(
        kernel: Box<dyn KernelMaps>,
        registry: Registry,
        control: TracingControl,
        store: SnapshotStore,
    ) -> Self {
        Self {
            kernel: RwLock::new(kernel),
            scope: Mutex::new(Scope::default()),
            registry: Mutex::new(registry),
            control: Mutex::new(control),
            store: Mutex::new(store),
        }
    }

    /// Nothing locked yet: take what is needed, in order.
    pub(super) fn locks(&self) -> Locks<'_, Free, Free, Free, Free, Free> {
        Locks {
            state: self,
            kernel: Free,
            scope: Free,
            registry: Free,
            control: Free,
            store: Free,
        }
    }
}

impl<'a> Locks<'a, Free, Free, Free, Free, Free> {
    /// The store lock alone if no one holds it now; None while another
    /// does (storing a snapshot holds it while the file is written).
    pub(super) fn try_store(
        self,
    ) -> Option<Locks<'a, Free, Free, Free, Free, Held<'a, SnapshotStore>>> {
        let store = match self.state.store.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(Locks {
            state: self.state,
            kernel: Free,
            scope: Free,
            registry: Free,
            control: Free,
            store,
        })
    }

    /// The kernel lock shared if no writer holds or waits for it now; None
    /// otherwise (for a check that must not wait: an exec's fast path).
    pub(super) fn try_kernel_shared(
        self,
    ) -> Option<Locks<'a, SharedKernel<'a>, Free, Free, Free, Free>> {
        let kernel = match self.state.kernel.try_read() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(Locks {
            state: self.state,
            kernel,
            scope: Free,
            registry: Free,
            control: Free,
            store: Free,
        })
    }

    /// Takes the kernel lock alone (first of all): to change the kernel
    /// side, or to read it consistently with such changes.
    pub(super) fn kernel(self) -> Locks<'a, HeldKernel<'a>, Free, Free, Free, Free> {
        Locks {
            state: self.state,
            kernel: self
                .state
                .kernel
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            scope: Free,
            registry: Free,
            control: Free,
            store: Free,
        }
    }

    /// Takes the kernel lock shared (first of all): a read of the kernel
    /// side that only needs nothing to change it meanwhile (the live
    /// blocks of an image, which its end's handling removes), beside other
    /// such reads.
    pub(super) fn kernel_shared(self) -> Locks<'a, SharedKernel<'a>, Free, Free, Free, Free> {
        Locks {
            state: self.state,
            kernel: self
                .state
                .kernel
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            scope: Free,
            registry: Free,
            control: Free,
            store: Free,
        }
    }
}

impl<'a, K> Locks<'a, K, Free, Free, Free, Free> {
    /// Takes the scope lock (after the kernel's).
    pub(super) fn scope(self) -> Locks<'a, K, Held<'a, Scope>, Free, Free, Free> {
        Locks {
            state: self.state,
            kernel: self.kernel,
            scope: lock(&self.state.scope),
            registry: Free,
            control: Free,
            store: Free,
        }
    }
}

impl<'a, K, S> Locks<'a, K, S, Free, Free, Free> {
    /// Takes the registry lock (after kernel and scope).
    pub(super) fn registry(self) -> Locks<'a, K, S, Held<'a, Registry>, Free, Free> {
        Locks {
            state: self.state,
            kernel: self.kernel,
            scope: self.scope,
            registry: lock(&self.state.registry),
            control: Free,
            store: Free,
        }
    }
}

impl<'a, K, S, R> Locks<'a, K, S, R, Free, Free> {
    /// Takes the control lock (after kernel, scope and registry).
    pub(super) fn control(self) -> Locks<'a, K, S, R, Held<'a, TracingControl>, Free> {
        Locks {
            state: self.state,
            kernel: self.kernel,
            scope: self.scope,
            registry: self.registry,
            control: lock(&self.state.control),
            store: Free,
        }
    }
}

impl<'a, K, S, R, C> Locks<'a, K, S, R, C, Free> {
    /// Takes the store lock (last of all).
    pub(super) fn store(self) -> Locks<'a, K, S, R, C, Held<'a, SnapshotStore>> {
        Locks {
            state: self.state,
            kernel: self.kernel,
            scope: self.scope,
            registry: self.registry,
            control: self.control,
            store: lock(&self.state.store),
        }
    }
}
