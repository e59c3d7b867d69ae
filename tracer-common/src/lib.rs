//! Types and names shared by tracer's eBPF programs (`tracer-ebpf`) and the
//! daemon (`tracerd`).
//!
//! Every type here is `#[repr(C)]`, `Copy`, integers only, with explicit
//! padding, and its size is pinned by a `const` assertion so that the kernel
//! and user side can never disagree on a layout. Every map and program name is
//! a `pub const` used by both sides: no string literal names a map twice.
//!
//! One module per shared structure, each re-exported here so that every item
//! is `tracer_common::X`:
//!
//! - [`maps`]: the names of every map and load-time global, and the
//!   capacities of the maps that have no structure of their own;
//! - [`probes`]: the probed allocator functions and the names of their
//!   programs, the floor programs, the lifecycle tracepoints;
//! - [`alloc`]: a live block's key and value ([`AllocKey`], [`AllocInfo`]);
//! - [`live_table`]: the fast live-block table ([`LiveBucket`], [`live_key`]);
//! - [`procs`]: per-process totals ([`ProcStats`]) and their direct-mapped
//!   slots ([`ProcSlot`] and its word);
//! - [`own_spill`]: the per-image spill maps ([`OwnLevelMaps`]);
//! - [`stack_totals`]: totals per (image, stack) ([`StackTotalsKey`],
//!   [`StackTotals`]);
//! - [`inflight`]: allocator calls between entry and return;
//! - [`event`]: the process lifecycle events of the ring buffer;
//! - [`counter`]: the slots of the per-CPU counters;
//! - [`unwind`]: the unwinder's tables (rows, pages, process mappings);
//! - [`vma`]: the kernel's own mappings, for addresses `PROC_MAPS` lacks.
#![cfg_attr(not(test), no_std)]

pub mod alloc;
pub mod counter;
pub mod event;
pub mod inflight;
pub mod live_table;
pub mod maps;
pub mod own_spill;
pub mod probes;
pub mod procs;
pub mod stack_totals;
pub mod unwind;
pub mod vma;

pub use alloc::*;
pub use counter::*;
pub use event::*;
pub use inflight::*;
pub use live_table::*;
pub use maps::*;
pub use own_spill::*;
pub use probes::*;
pub use procs::*;
pub use stack_totals::*;
pub use unwind::*;
pub use vma::*;
