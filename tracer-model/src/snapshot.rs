//! `Snapshot`: tracemalloc's snapshot of the live blocks, and the entry
//! points of its methods `statistics()`, `compare_to()` and
//! `filter_traces()`: the top of the engine. Each constructor indexes the
//! traces (`engine::index`); the methods check their arguments and call
//! down: into the grouping (`engine::group` for tracemalloc's key types,
//! `engine::labels` for `function` and `module`), which returns the
//! `statistic` types sorted, or into `filter` for the traces to keep.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use crate::engine::cells::Cells;
use crate::engine::index::{FrameHints, Index, Interned};
use crate::engine::totals::arc_totals;
use crate::engine::{group, labels};
use crate::error::ModelError;
use crate::filter::{self, TraceFilter};
use crate::statistic::{GroupBy, Statistic, StatisticDiff};
use crate::trace::{Block, Trace, Traceback, TracebackTotals};

/// The live blocks of one process at one moment: tracemalloc's `Snapshot`.
///
/// Two kinds, which answer `statistics()`, `compare_to()` (against either
/// kind, both ways) and `filter_traces()` alike:
/// - a snapshot of traces ([`Snapshot::new`], the loaders), one per live
///   block;
/// - a snapshot of totals ([`Snapshot::from_totals`]): per traceback,
///   domain and source, `count` blocks of `size` bytes together, as the
///   kernel keeps them for a live process. It answers exactly as a
///   snapshot of `count` traces per group whose sizes sum to `size`
///   would; it has no individual traces ([`Snapshot::traces`] is empty,
///   [`Snapshot::is_totals`] tells).
///
/// Every constructor indexes the items once (as `_tracemalloc` interns
/// tracebacks and frames): the distinct tracebacks, frames and file names,
/// numbered in tracemalloc's sort orders, with the bytes and blocks of
/// each distinct traceback, so that `statistics()` and `compare_to()`
/// cost O(distinct tracebacks), not O(traces). The index takes 4 bytes
/// per trace, about 80 per distinct traceback plus 4 per frame of it, and
/// about 80 per distinct frame. `filter_traces()` decides once per
/// distinct (traceback, domain, source) and copies no trace: the
/// filtered snapshot's traces are copied out the first time
/// [`Snapshot::traces`] asks for them. Clones share the items and the
/// index. Equality compares the traces, the groups of a snapshot of
/// totals, and the limit only.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The live blocks.
    items: Items,
    /// Most frames a traceback may hold: the `nframe` tracing was started
    /// with.
    pub traceback_limit: u32,
    /// The index of the items, shared by clones.
    index: Arc<Index>,
}

/// What a snapshot holds: the items its index is over.
#[derive(Clone, Debug)]
enum Items {
    /// One trace per live block.
    Traces(Arc<Vec<Trace>>),
    /// Totals per traceback, domain and source (no trace with a count of
    /// 0).
    Totals(Arc<Vec<TracebackTotals>>),
    /// Traces kept by `filter_traces()`, as the cells (totals) they are in.
    Filtered(Arc<Filtered>),
}

/// The traces of a snapshot of traces (the parent) that filters kept,
/// decided per cell: the index is over the kept cells; the traces are
/// copied out of the parent when first asked for.
#[derive(Debug)]
struct Filtered {
    /// The kept cells: the items of the index.
    cells: Vec<TracebackTotals>,
    /// Per kept cell: its number among the parent's cells.
    parent_cells: Vec<u32>,
    /// The parent's traces.
    parent_traces: Arc<Vec<Trace>>,
    /// The parent's index (its cells say which cell each trace is in).
    parent_index: Arc<Index>,
    /// Per parent cell: kept.
    keep: Vec<bool>,
    /// The kept traces, in the parent's order, once asked for.
    traces: OnceLock<Vec<Trace>>,
}

impl Filtered {
    /// The kept traces, copied out of the parent's the first time.
    fn traces(&self) -> &[Trace] {
        self.traces.get_or_init(|| {
            let cells = parent_cells(&self.parent_index, &self.parent_traces);
            self.parent_traces
                .iter()
                .zip(&cells.of_trace)
                .filter(|(_, cell)| self.keep.get(**cell as usize).copied().unwrap_or(false))
                .map(|(trace, _)| trace.clone())
                .collect()
        })
    }
}

/// The cells of a snapshot of traces, made the first time.
fn parent_cells<'a>(index: &'a Index, traces: &[Trace]) -> &'a Cells {
    index
        .cells
        .get_or_init(|| Cells::of(&index.interned, traces))
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot::new(Vec::new(), 0)
    }
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.traceback_limit == other.traceback_limit
            && self.traces() == other.traces()
            && self.given_totals() == other.given_totals()
    }
}

impl Eq for Snapshot {}

impl Snapshot {
    /// A snapshot of `traces` taken with at most `traceback_limit` frames
    /// per traceback.
    #[must_use]
    pub fn new(traces: Vec<Trace>, traceback_limit: u32) -> Self {
        let interned = Interned::of(&traces);
        Snapshot::indexed(traces, traceback_limit, interned, None)
    }

    /// A snapshot of totals: per group, `count` live blocks of
    /// `traceback` in `domain` from `source`, `size` bytes together. Its
    /// `statistics()`, `compare_to()` (against either kind of snapshot)
    /// and `filter_traces()` are exactly those of a snapshot holding
    /// `count` traces per group whose sizes sum to `size`, the groups'
    /// traces in the order of the groups. Groups with a count of 0 hold no
    /// block and are dropped; groups may repeat a key (their totals add
    /// up).
    ///
    /// It has no individual traces: [`Snapshot::traces`] and
    /// [`Snapshot::into_traces`] are empty, [`Snapshot::is_totals`] is
    /// true, [`Snapshot::traceback_totals`] gives the groups and
    /// [`Snapshot::blocks`] their count. The dump writers
    /// ([`encode`](crate::encode), [`dump_tracemalloc`](crate::dump_tracemalloc))
    /// write, per group, `count` traces whose sizes sum to `size` (the
    /// remainder of `size / count` spread one byte each over the first
    /// ones): a file that loads into the same statistics.
    #[must_use]
    pub fn from_totals(groups: Vec<TracebackTotals>, traceback_limit: u32) -> Self {
        let groups: Vec<TracebackTotals> = groups.into_iter().filter(|g| g.count > 0).collect();
        let interned = Interned::of(&groups);
        let index = index_of(interned, None, &groups);
        Snapshot {
            items: Items::Totals(Arc::new(groups)),
            traceback_limit,
            index,
        }
    }

    /// The snapshot of `traces` interned as `interned`, indexed (with the
    /// frame numbers `hints`, if any).
    fn indexed(
        traces: Vec<Trace>,
        traceback_limit: u32,
        interned: Interned,
        hints: Option<FrameHints>,
    ) -> Self {
        let index = index_of(interned, hints, &traces);
        Snapshot {
            items: Items::Traces(Arc::new(traces)),
            traceback_limit,
            index,
        }
    }

    /// A snapshot whose tracebacks a loader interned already: `ids[i]` is
    /// the index in `tracebacks` of trace `i`'s `Arc`, numbered in order
    /// of first appearance; `hints` number the frames of each of
    /// `tracebacks`. Anything else is ignored (and computed anew).
    #[must_use]
    pub(crate) fn with_interned(
        traces: Vec<Trace>,
        traceback_limit: u32,
        tracebacks: Vec<Arc<Traceback>>,
        ids: Vec<u32>,
        hints: FrameHints,
    ) -> Self {
        match Interned::checked(&traces, tracebacks, ids) {
            Some(interned) => Snapshot::indexed(traces, traceback_limit, interned, Some(hints)),
            None => {
                let interned = Interned::of(&traces);
                Snapshot::indexed(traces, traceback_limit, interned, None)
            }
        }
    }

    /// The interned tracebacks.
    pub(crate) fn interned(&self) -> &Interned {
        &self.index.interned
    }

    /// The traces, by value (copied if a clone shares them). Empty for a
    /// snapshot of totals ([`Snapshot::is_totals`]).
    #[must_use]
    pub fn into_traces(self) -> Vec<Trace> {
        match self.items {
            Items::Traces(traces) => Arc::try_unwrap(traces).unwrap_or_else(|arc| (*arc).clone()),
            Items::Filtered(filtered) => match Arc::try_unwrap(filtered) {
                Ok(filtered) => {
                    filtered.traces();
                    filtered.traces.into_inner().unwrap_or_default()
                }
                Err(filtered) => filtered.traces().to_vec(),
            },
            Items::Totals(_) => Vec::new(),
        }
    }

    /// Every live block, in no particular order. Empty for a snapshot of
    /// totals ([`Snapshot::is_totals`]): see
    /// [`Snapshot::traceback_totals`]. The first call on a snapshot that
    /// `filter_traces()` made copies the kept traces out of the original
    /// (O(traces) once).
    #[must_use]
    pub fn traces(&self) -> &[Trace] {
        match &self.items {
            Items::Traces(traces) => traces,
            Items::Filtered(filtered) => filtered.traces(),
            Items::Totals(_) => &[],
        }
    }

    /// Whether this is a snapshot of totals ([`Snapshot::from_totals`], or
    /// filtered from one): it has no individual traces.
    #[must_use]
    pub fn is_totals(&self) -> bool {
        matches!(self.items, Items::Totals(_))
    }

    /// The live blocks as totals per distinct traceback (`Arc`), domain and
    /// source, in order of first appearance: a snapshot of totals' groups
    /// (as given, without those of count 0); for a snapshot of traces,
    /// its traces added up per (traceback `Arc`, domain, source) the first
    /// time (O(traces) once, then kept). `Snapshot::from_totals` of these
    /// answers exactly as this snapshot.
    #[must_use]
    pub fn traceback_totals(&self) -> &[TracebackTotals] {
        match &self.items {
            Items::Traces(traces) => &parent_cells(&self.index, traces).groups,
            Items::Filtered(filtered) => &filtered.cells,
            Items::Totals(groups) => groups,
        }
    }

    /// How many live blocks: the traces, or the counts of a snapshot of
    /// totals added up (saturating). O(distinct tracebacks).
    #[must_use]
    pub fn blocks(&self) -> u64 {
        self.index
            .arc_totals
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.count))
    }

    /// The groups of a snapshot of totals, none for traces.
    fn given_totals(&self) -> &[TracebackTotals] {
        match &self.items {
            Items::Totals(groups) => groups,
            _ => &[],
        }
    }

    /// The traces the dump writers write: the traces, or for a snapshot of
    /// totals, per group `count` traces whose sizes sum to `size` (the
    /// remainder of `size / count` one byte each on the first ones).
    pub(crate) fn dump_traces(&self) -> Cow<'_, [Trace]> {
        let Items::Totals(groups) = &self.items else {
            return Cow::Borrowed(self.traces());
        };
        let mut traces = Vec::new();
        for group in groups.iter() {
            let count = group.count.max(1);
            let (each, remainder) = (group.size / count, group.size % count);
            for i in 0..count {
                traces.push(Trace {
                    domain: group.domain,
                    size: each + u64::from(i < remainder),
                    traceback: Arc::clone(&group.traceback),
                    source: group.source,
                });
            }
        }
        Cow::Owned(traces)
    }

    /// Most frames a traceback may hold.
    #[must_use]
    pub fn traceback_limit(&self) -> u32 {
        self.traceback_limit
    }

    /// `Snapshot.statistics(key_type, cumulative)`: one [`Statistic`] per
    /// group, biggest first by `size`, then `count`, then traceback (the
    /// label for `function` and `module` groups).
    ///
    /// With `cumulative`, every frame of a traceback (not only the most
    /// recent) adds the trace's size and 1 to its group, once per
    /// occurrence. Cumulative grouping by traceback is
    /// [`ModelError::CumulativeTraceback`].
    pub fn statistics(
        &self,
        group_by: GroupBy,
        cumulative: bool,
    ) -> Result<Vec<Statistic>, ModelError> {
        check_cumulative(group_by, cumulative)?;
        if group_by.is_labelled() {
            return Ok(labels::statistics(&self.index, group_by, cumulative));
        }
        Ok(group::statistics(&self.index, group_by, cumulative))
    }

    /// `Snapshot.compare_to(old, key_type, cumulative)`: one
    /// [`StatisticDiff`] per group of either snapshot (groups only in `old`
    /// have `size` and `count` 0), biggest first by `|size_diff|`, `size`,
    /// `|count_diff|`, `count`, then traceback (or label).
    ///
    /// Same grouping and errors as [`Snapshot::statistics`].
    pub fn compare_to(
        &self,
        old: &Snapshot,
        group_by: GroupBy,
        cumulative: bool,
    ) -> Result<Vec<StatisticDiff>, ModelError> {
        check_cumulative(group_by, cumulative)?;
        if group_by.is_labelled() {
            return Ok(labels::compare_to(
                &self.index,
                &old.index,
                group_by,
                cumulative,
            ));
        }
        Ok(group::compare_to(
            &self.index,
            &old.index,
            group_by,
            cumulative,
        ))
    }

    /// `Snapshot.filter_traces(filters)`: a new snapshot (same
    /// `traceback_limit`, same kind) of the traces that match at least one
    /// inclusive filter (if there is any) and that no exclusive filter
    /// excludes, in their original order. No filters: a clone (sharing
    /// the items). For a snapshot of totals, the groups so kept.
    ///
    /// Filters look at a trace's traceback, domain and source only, so
    /// they decide once per distinct (traceback, domain, source) (the
    /// first call on a snapshot of traces adds its traces up so, once),
    /// and the new snapshot is indexed from those: O(distinct tracebacks).
    /// Its traces are copied out the first time [`Snapshot::traces`] asks.
    #[must_use]
    pub fn filter_traces(&self, filters: &[TraceFilter]) -> Snapshot {
        if filters.is_empty() {
            return self.clone();
        }
        match &self.items {
            Items::Totals(groups) => {
                let keep = filter::kept(filters, groups, self.interned());
                let (kept, _) = self.kept_items(groups, &keep);
                let index = self.subset_index(&keep, &kept);
                Snapshot {
                    items: Items::Totals(Arc::new(kept)),
                    traceback_limit: self.traceback_limit,
                    index,
                }
            }
            Items::Traces(traces) => {
                let cells = parent_cells(&self.index, traces);
                let keep = filter::kept(filters, &cells.groups, &cells.interned);
                let (kept, parent_cells) = self.kept_items(&cells.groups, &keep);
                let (interned, parents) = cells.interned.subset(&keep);
                let hints = self.index.hints_for(&parents);
                let index = index_of(interned, Some(hints), &kept);
                self.filtered(kept, parent_cells, keep, traces, &self.index, index)
            }
            Items::Filtered(filtered) => {
                let keep = filter::kept(filters, &filtered.cells, self.interned());
                let (kept, positions) = self.kept_items(&filtered.cells, &keep);
                let parent_cells: Vec<u32> = positions
                    .iter()
                    .filter_map(|&i| filtered.parent_cells.get(i as usize).copied())
                    .collect();
                let mut parent_keep = vec![false; filtered.keep.len()];
                for &cell in &parent_cells {
                    if let Some(slot) = parent_keep.get_mut(cell as usize) {
                        *slot = true;
                    }
                }
                let index = self.subset_index(&keep, &kept);
                self.filtered(
                    kept,
                    parent_cells,
                    parent_keep,
                    &filtered.parent_traces,
                    &filtered.parent_index,
                    index,
                )
            }
        }
    }

    /// The items `keep` accepts (one flag per item), and their positions.
    fn kept_items(
        &self,
        items: &[TracebackTotals],
        keep: &[bool],
    ) -> (Vec<TracebackTotals>, Vec<u32>) {
        items
            .iter()
            .zip(keep)
            .enumerate()
            .filter(|(_, (_, kept))| **kept)
            .map(|(i, (item, _))| (item.clone(), u32::try_from(i).unwrap_or(u32::MAX)))
            .unzip()
    }

    /// The index of the items of this snapshot that `keep` accepts
    /// (`kept`), numbered from this one's.
    fn subset_index(&self, keep: &[bool], kept: &[TracebackTotals]) -> Arc<Index> {
        let (interned, parents) = self.index.interned.subset(keep);
        let hints = self.index.hints_for(&parents);
        index_of(interned, Some(hints), kept)
    }

    /// A snapshot of the traces of `parent_traces` in the cells `keep`
    /// accepts (`kept`, numbered `parent_cells` there), indexed as `index`.
    fn filtered(
        &self,
        kept: Vec<TracebackTotals>,
        parent_cells: Vec<u32>,
        keep: Vec<bool>,
        parent_traces: &Arc<Vec<Trace>>,
        parent_index: &Arc<Index>,
        index: Arc<Index>,
    ) -> Snapshot {
        Snapshot {
            items: Items::Filtered(Arc::new(Filtered {
                cells: kept,
                parent_cells,
                parent_traces: Arc::clone(parent_traces),
                parent_index: Arc::clone(parent_index),
                keep,
                traces: OnceLock::new(),
            })),
            traceback_limit: self.traceback_limit,
            index,
        }
    }
}

/// The index of `items`, interned as `interned` (with the frame numbers
/// `hints`, if any), with each arc's totals.
fn index_of<B: Block + Sync>(
    interned: Interned,
    hints: Option<FrameHints>,
    items: &[B],
) -> Arc<Index> {
    let mut index = Index::build(interned, hints);
    index.arc_totals = arc_totals(&index.interned, items);
    Arc::new(index)
}

fn check_cumulative(group_by: GroupBy, cumulative: bool) -> Result<(), ModelError> {
    if cumulative && group_by == GroupBy::Traceback {
        Err(ModelError::CumulativeTraceback)
    } else {
        Ok(())
    }
}

#[path = "snapshot/sites/tests.rs"]
#[cfg(test)]
mod site_tests;
#[cfg(test)]
mod tests;
#[path = "snapshot/totals/tests.rs"]
#[cfg(test)]
mod totals_tests;
