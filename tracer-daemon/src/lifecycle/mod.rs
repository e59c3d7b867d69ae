//! Lifecycle: which process images exist and what happens to them, from the
//! kernel's events to their expiry.
//!
//! - [`image`]: [`ProcessImage`] with its [`ImageId`] and [`ImageState`].
//! - [`registry`]: the live image of each pid, and ended ones for a while.
//! - [`blocks`]: an image's blocks and totals as read from the kernel.
//! - [`events`]: the kernel's process events, decoded and applied.
//! - [`orphans`]: the sweep for blocks whose end event was lost.
//! - [`scope`]: which processes are traced, and attaching accordingly.
//! - [`control`]: tracemalloc's `start`/`stop`/`clear_traces` state.
//! - [`unwind`]: each live image's unwind tables and mappings in the kernel.
//! - [`watch`]: every process's memory over time, and steady growth.
//!
//! Everything here works through [`KernelMaps`](crate::capture::KernelMaps),
//! so it is tested with a fake kernel.
pub mod allocators;
pub mod blocks;
pub mod control;
pub mod events;
pub mod image;
pub mod orphans;
pub mod registry;
pub mod scope;
pub mod unwind;
pub mod watch;

pub use crate::capture::ImageId;
pub use blocks::RawBlock;
pub use control::{Tracing, TracingControl};
pub use image::{EndReason, ImageState, ProcessImage};
pub use registry::Registry;
pub use scope::Scope;
