//! tracerd: Python's `tracemalloc` for every native process on the host.
//!
//! The modules follow the data's path: [`capture`] (load the eBPF programs,
//! attach the probes, read the kernel maps) → [`process`] (`/proc/PID/...`)
//! and [`registry`] (process images and their lifecycle) → [`symbolize`]
//! (addresses to `file:line` with DWARF) → [`model`] (the snapshot engine:
//! statistics, compare_to; pure, no I/O) → [`store`] (stored snapshots) →
//! [`api`] (HTTP routes). [`daemon`] holds the shared state that ties them.
pub mod api;
pub mod capture;
pub mod config;
pub mod daemon;
pub mod model;
pub mod process;
pub mod registry;
pub mod store;
pub mod symbolize;
