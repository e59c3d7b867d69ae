//! The snapshot engine: tracemalloc's `Snapshot`, `Trace`, `Traceback`,
//! `Frame`, `Statistic`, `StatisticDiff`, `Filter` and `DomainFilter`, with
//! `statistics()`, `compare_to()` and `filter_traces()` matching CPython
//! 3.11's `tracemalloc` exactly (sort orders and their ties, `str()` texts,
//! `Traceback.format()`, `fnmatch`), grouping by `function` and `module`
//! beyond tracemalloc, and the snapshot file formats as byte codecs:
//! tracer's own ([`encode`]/[`decode`]) and tracemalloc's pickle
//! ([`load_tracemalloc`]/[`dump_tracemalloc`]).
//!
//! Plain data and pure functions: no I/O, no aya, nothing that needs root.
//! Sizes are in bytes, requested sizes as the traced program asked for them.
//!
//! # Layout
//!
//! Layers, lowest first; a module imports only its own layer and those
//! below (the unit test in `layering.rs` checks it):
//!
//! - `text/` (`format`: `_format_size`, `repr()`, `int / int`;
//!   `source`: a file's bytes as linecache's lines), `hash` (the model's hasher) and `interrupt` (checks
//!   that stop long work);
//! - `error` ([`ModelError`]) and `completeness` ([`Completeness`]);
//! - `trace` ([`Frame`], [`Traceback`], [`Trace`]);
//! - `statistic` ([`GroupBy`], [`Statistic`], [`StatisticDiff`], their
//!   `str()` and sort orders);
//! - `engine/`: the index of a snapshot and the groupings that
//!   `statistics()` and `compare_to()` run on it;
//! - `filter/` ([`Filter`], [`DomainFilter`], `fnmatch`'s [`Pattern`]);
//! - `snapshot` ([`Snapshot`]): the top of the engine, calling into
//!   `engine` and `filter`;
//! - `codec/`: the snapshot files, ours (`dump`) and tracemalloc's
//!   (`pickle`).
//!
//! Where the data comes from: `capture` records each live block (pid as
//! `domain`, size, stack addresses), `symbolize` turns addresses into
//! [`Frame`]s, and the store assembles them into a [`Snapshot`].
//!
//! ```
//! use std::sync::Arc;
//! use tracer_model::{Frame, GroupBy, Snapshot, AllocatorFamily, Trace, Traceback};
//!
//! let stack = Arc::new(Traceback::new(
//!     vec![Frame::new("src/cache.c", 88), Frame::new("src/main.c", 12)],
//!     Some(2),
//! ));
//! let traces = (0..4)
//!     .map(|_| Trace {
//!         domain: 1234,
//!         size: 256,
//!         traceback: Arc::clone(&stack),
//!         source: AllocatorFamily::UNKNOWN,
//!     })
//!     .collect();
//! let snapshot = Snapshot::new(traces, 25);
//! let stats = snapshot.statistics(GroupBy::Lineno, false).unwrap();
//! assert_eq!(
//!     stats[0].to_string(),
//!     "src/cache.c:88: size=1024 B, count=4, average=256 B"
//! );
//! let diff = snapshot.compare_to(&Snapshot::default(), GroupBy::Lineno, false).unwrap();
//! assert_eq!(
//!     diff[0].to_string(),
//!     "src/cache.c:88: size=1024 B (+1024 B), count=4 (+4), average=256 B"
//! );
//! ```

mod codec;
mod completeness;
mod engine;
mod error;
mod filter;
mod hash;
pub mod interrupt;
#[cfg(test)]
mod layering;
mod snapshot;
mod statistic;
mod text;
mod trace;

pub use codec::budget::{LOAD_BASE_BYTES, LOAD_BYTES_PER_INPUT_BYTE, OverBudget};
pub use codec::dump::{
    DUMP_MAGIC, DUMP_OLDEST_VERSION, DUMP_VERSION, Decoded, DumpError, crc32, decode, encode,
};
pub use codec::pickle::{PickleError, dump_tracemalloc, load_tracemalloc};
pub use completeness::Completeness;
pub use engine::on_helper_thread_start;
pub use error::ModelError;
pub use filter::{
    AllocatorFamilyFilter, DomainFilter, Filter, Pattern, TraceFilter, normalize_filename,
};
pub use snapshot::Snapshot;
pub use statistic::{GroupBy, Statistic, StatisticDiff};
pub use text::format::{format_size, format_size_f64, py_repr_str, true_div};
pub use text::source::{has_source, line_of, source_lines};
pub use trace::{
    AllocatorFamily, FAMILY_NAMES, Frame, FrameExtra, SITE_FUNCTION_MARK, SITE_OFFSET_MARK, Trace,
    Traceback, TracebackTotals, UNKNOWN_FILENAME, is_python_space, parse_site, site_name,
};

/// Helpers shared by the model's unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;

    use super::{Trace, Traceback};

    /// A deterministic pseudo-random sequence from `seed`: each call returns
    /// the next state of a 64-bit linear congruential generator (Knuth's
    /// MMIX constants). Its high bits are the random ones.
    pub(crate) fn lcg(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed
        }
    }

    /// A trace of `size` bytes in domain 1 with `traceback`.
    pub(crate) fn trace(size: u64, traceback: &Arc<Traceback>) -> Trace {
        Trace {
            source: crate::trace::AllocatorFamily::UNKNOWN,
            domain: 1,
            size,
            traceback: Arc::clone(traceback),
        }
    }
}
