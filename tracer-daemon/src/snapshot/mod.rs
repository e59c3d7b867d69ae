//! Snapshot: where kernel blocks become a tracemalloc [`Snapshot`]
//! ([`build`]: symbolized, the allocation machinery's leading frames
//! dropped ([`machinery`], by the patterns of [`frame_patterns`]), cut to
//! nframe, domain = pid, sampling estimates), and where a snapshot is cut to a smaller traceback limit
//! ([`truncate`]).
//!
//! [`Snapshot`]: tracer_model::Snapshot
pub mod build;
pub mod frame_patterns;
pub mod machinery;
pub mod truncate;

pub use build::SnapshotBuilder;
pub use frame_patterns::FramePatterns;
pub use machinery::AllocatorFrames;
pub use truncate::truncate;
