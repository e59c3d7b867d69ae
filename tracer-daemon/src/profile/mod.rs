//! Profiles of statistics and compares, built from snapshots and
//! consumed by whoever asks: an HTTP answer (`http::render`), a push
//! exporter or a file. Nothing here knows HTTP.
//!
//! - [`select`]: the statistics call behind a profile: a snapshot's traces
//!   filtered, grouped (`statistics` or `compare_to`) and cut to a limit;
//! - [`stacks`]: statistics or diffs as rows of frames ([`Stacks`]);
//! - [`ProfileFormat`]: one encoding of [`Stacks`] into bytes, with
//!   [`Pprof`] (`pprof`), [`Collapsed`] (folded stacks) and [`Svg`] (a
//!   flame graph).
use tracer_model::{GroupBy, Statistic, StatisticDiff};

pub mod flame;
pub mod pprof;
pub mod select;
pub mod stacks;

pub use select::{Grouped, Selection};
pub use stacks::Row;

/// What a profile shows: one row per statistic (group), whether it is a
/// compare (`diff`: each row with the base side's values too), and a
/// title naming what it is of (`tracer: pid 1234 (comm): bytes in use`).
#[derive(Clone, Debug)]
pub struct Stacks<'a> {
    /// One row per group, in the statistics' order.
    pub rows: Vec<Row<'a>>,
    /// A compare: rows carry the base side's values.
    pub diff: bool,
    /// What the profile is of; a pprof comment, the flame graph's title.
    pub title: String,
}

impl<'a> Stacks<'a> {
    /// The stacks of `statistics`, grouped by `group_by`.
    pub fn of_statistics(statistics: &'a [Statistic], group_by: GroupBy, title: String) -> Self {
        Stacks {
            rows: stacks::of_statistics(statistics, group_by),
            diff: false,
            title,
        }
    }

    /// The stacks of a compare's `diffs`, grouped by `group_by`.
    pub fn of_diffs(diffs: &'a [StatisticDiff], group_by: GroupBy, title: String) -> Self {
        Stacks {
            rows: stacks::of_diffs(diffs, group_by),
            diff: true,
            title,
        }
    }
}

/// One encoding of a profile: what an HTTP answer, an exporter or a file
/// writes.
pub trait ProfileFormat {
    /// Its name, as `format=` names it (`pprof`, `collapsed`, `svg`).
    fn name(&self) -> &'static str;

    /// `stacks` encoded.
    ///
    /// # Errors
    /// When encoding fails (it writes into memory: never in practice).
    fn encode(&self, stacks: &Stacks<'_>) -> std::io::Result<Vec<u8>>;
}

/// A gzipped `profile.proto` ([`pprof`]), the title its one comment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pprof;

impl ProfileFormat for Pprof {
    fn name(&self) -> &'static str {
        "pprof"
    }

    fn encode(&self, stacks: &Stacks<'_>) -> std::io::Result<Vec<u8>> {
        pprof::gzipped(&pprof::profile(
            &stacks.rows,
            stacks.diff,
            std::slice::from_ref(&stacks.title),
        ))
    }
}

/// Folded stacks, one line per group ([`flame::collapsed`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Collapsed;

impl ProfileFormat for Collapsed {
    fn name(&self) -> &'static str {
        "collapsed"
    }

    fn encode(&self, stacks: &Stacks<'_>) -> std::io::Result<Vec<u8>> {
        Ok(flame::collapsed(&stacks.rows, stacks.diff).into_bytes())
    }
}

/// A flame graph drawn by inferno from the folded stacks ([`flame::svg`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Svg;

impl ProfileFormat for Svg {
    fn name(&self) -> &'static str {
        "svg"
    }

    fn encode(&self, stacks: &Stacks<'_>) -> std::io::Result<Vec<u8>> {
        flame::svg(&flame::collapsed(&stacks.rows, stacks.diff), &stacks.title)
    }
}
