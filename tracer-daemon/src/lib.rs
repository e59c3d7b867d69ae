//! tracerd: Python's `tracemalloc` for every native process on the host.
//!
//! One module per stage of the data's path; each imports only earlier
//! stages (a test, `tests/layering.rs`, fails otherwise):
//!
//! 1. [`sys`]: facts of the OS: `/proc` readers, held-open module files,
//!    raw `bpf(2)` calls, atomic file writes.
//! 2. [`elf`]: ELF, DWARF and loader analysis of files' bytes (unwind rows,
//!    probe points, the loader's search), needing no root.
//! 3. [`config`]: tracerd's settings (flags, environment, TOML, defaults).
//! 4. [`capture`]: the eBPF programs in the kernel and their maps, behind
//!    the [`capture::KernelMaps`] trait.
//! 5. [`lifecycle`]: process images (id, state, registry), kernel events,
//!    scope, tracemalloc's start/stop state.
//! 6. [`symbolize`]: return addresses to `file:line` with DWARF; the source
//!    lines `Traceback.format()` shows.
//! 7. [`snapshot`]: kernel blocks and frames into a model `Snapshot`.
//! 8. [`store`]: stored snapshots and their files.
//! 9. [`profile`]: statistics and compares as profiles (pprof, folded
//!    stacks, flame graphs), for an HTTP answer, an exporter or a file.
//! 10. [`service`]: one façade over the state; the only way to a process's
//!     numbers.
//! 11. [`metrics`] (Prometheus) and [`http`] (the API, the only user of
//!     axum).
//! 12. [`tasks`] (background loops) and [`app`] (start-up and shutdown).
//!
//! The snapshot engine itself (statistics, compare_to, filters, formats,
//! file codecs) is the `tracer-model` crate: pure, no I/O, no root.
pub mod app;
pub mod capture;
pub mod config;
pub mod elf;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod profile;
pub mod service;
pub mod snapshot;
pub mod store;
pub mod symbolize;
pub mod sys;
pub mod tasks;
pub mod work;

/// The lib's tests run on the allocator tracerd runs on (its `main`):
/// counted per thread, so that memory budgets are tested as they work.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: sys::alloc::Counting<std::alloc::System> =
    sys::alloc::Counting(std::alloc::System);
