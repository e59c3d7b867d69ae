//! tracerd: Python's `tracemalloc` for every native process on the host.
//!
//! The modules follow the data's path: [`capture`] (load the eBPF programs,
//! attach the probes, read the kernel maps) → [`process`] (`/proc/PID/...`)
//! and [`registry`] (process images and their lifecycle) → [`symbolize`]
//! (addresses to `file:line` with DWARF) → [`model`] (the snapshot engine:
//! statistics, compare_to; pure, no I/O) → [`store`] (stored snapshots) →
//! [`api`] (HTTP routes) and [`metrics`] (Prometheus), served by [`server`]
//! (listeners, authentication, limits). [`daemon`] holds the shared state
//! that ties them; [`config`] reads tracerd's settings.
pub mod api;
pub mod capture;
pub mod config;
pub mod control;
pub mod daemon;
pub mod live_table;
pub mod metrics;
pub mod proc_slots;
pub mod registry;
pub mod scope;
pub mod server;
pub mod store;
pub mod symbolize;
pub mod sys;
pub mod views;
