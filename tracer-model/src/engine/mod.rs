//! The engine under `Snapshot`: how `statistics()` and `compare_to()` are
//! computed, fast and exactly as tracemalloc orders them.
//!
//! - [`index`]: built once per snapshot, it numbers the distinct
//!   tracebacks, frames and files in tracemalloc's sort orders, so that
//!   grouping adds into dense arrays and sorts integers;
//! - [`group`]: tracemalloc's groupings (`filename`, `lineno`,
//!   `traceback`) over the index: stages 1 and 2 in `totals`, the packed
//!   sort in `keys`, the matching of two snapshots' groups in `merge`;
//! - [`labels`]: the `function` and `module` groupings;
//! - `parallel` (threads for large snapshots) and `table` (a prefetching
//!   hash table for the index's hot loops) serve the others.
//!
//! - [`cells`]: a snapshot's traces aggregated per (traceback, domain,
//!   source), on which filters decide.
//!
//! Everything here takes the traces and their index and returns
//! `statistic` values; nothing here knows `Snapshot`.

pub(crate) mod cells;
pub(crate) mod group;
pub(crate) mod index;
pub(crate) mod labels;

mod keys;
mod merge;
mod parallel;

pub use parallel::on_helper_thread_start;
mod table;
pub(crate) mod totals;
