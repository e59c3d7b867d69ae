//! `Snapshot.filter_traces()` with tracemalloc's `Filter` and
//! `DomainFilter`, matching CPython 3.11 exactly:
//!
//! - file names and patterns go through `_normalize_filename` (POSIX
//!   `normcase` is the identity; a trailing `.pyc` loses its `c`), then
//!   `fnmatch` ([`Pattern`]);
//! - a `Filter` looks at the most recent frame only, or at every frame with
//!   `all_frames`; `lineno` None matches any line;
//! - a `Filter` with a `domain` matches (inclusive) only traces of that
//!   domain, or (exclusive) drops only traces of that domain;
//! - a trace is kept if it matches at least one inclusive filter (when there
//!   is any) and no exclusive filter excludes it.
//!
//! Per-trace work is a table lookup: each filter's verdict on a traceback is
//! computed once per distinct `Arc<Traceback>`, and its verdict on a file
//! name once per distinct name.

use std::collections::hash_map::Entry;
use std::sync::Arc;

use super::fnmatch::Pattern;
use super::hash::FxHashMap;
use super::snapshot::Snapshot;
use crate::trace::{Frame, Traceback};

/// tracemalloc's `_normalize_filename`: `os.path.normcase` (nothing on
/// POSIX), and `x.pyc` becomes `x.py`.
#[must_use]
pub fn normalize_filename(filename: &str) -> &str {
    match filename.strip_suffix(".pyc") {
        Some(stem) => filename.get(..stem.len() + 3).unwrap_or(filename),
        None => filename,
    }
}

/// tracemalloc's `Filter(inclusive, filename_pattern, lineno, all_frames,
/// domain)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    /// Keep only matching traces (true) or drop matching traces (false).
    pub inclusive: bool,
    /// The normalized pattern.
    pattern: Pattern,
    /// Line number to match; None matches every line.
    pub lineno: Option<u32>,
    /// Look at every frame of the traceback, not only the most recent.
    pub all_frames: bool,
    /// Only traces of this domain (pid); None for every domain.
    pub domain: Option<u32>,
}

impl Filter {
    /// `Filter(inclusive, filename_pattern, lineno, all_frames, domain)`;
    /// the pattern is normalized as tracemalloc does.
    #[must_use]
    pub fn new(
        inclusive: bool,
        filename_pattern: &str,
        lineno: Option<u32>,
        all_frames: bool,
        domain: Option<u32>,
    ) -> Self {
        Filter {
            inclusive,
            pattern: Pattern::new(normalize_filename(filename_pattern)),
            lineno,
            all_frames,
            domain,
        }
    }

    /// The normalized pattern (`Filter.filename_pattern`).
    #[must_use]
    pub fn filename_pattern(&self) -> &str {
        self.pattern.as_str()
    }

    /// `_match_frame_impl`: does one frame match the pattern and line?
    fn frame_matches(&self, frame: &Frame, names: &mut NameCache) -> bool {
        if let Some(lineno) = self.lineno
            && lineno != frame.lineno
        {
            return false;
        }
        names.matches(&self.pattern, &frame.filename)
    }

    /// `_match_traceback`: the filter's verdict on a traceback, before the
    /// domain (true keeps the trace).
    fn traceback_verdict(&self, traceback: &Traceback, names: &mut NameCache) -> bool {
        if self.all_frames {
            let any = traceback
                .frames()
                .iter()
                .any(|frame| self.frame_matches(frame, names));
            if any { self.inclusive } else { !self.inclusive }
        } else {
            let first = traceback
                .frames()
                .first()
                .is_some_and(|frame| self.frame_matches(frame, names));
            first == self.inclusive
        }
    }

    /// `_match`: the verdict on a trace given the traceback's verdict.
    fn verdict(&self, traceback_verdict: bool, domain: u32) -> bool {
        match self.domain {
            None => traceback_verdict,
            Some(wanted) if self.inclusive => traceback_verdict && domain == wanted,
            Some(wanted) => traceback_verdict || domain != wanted,
        }
    }
}

/// tracemalloc's `DomainFilter(inclusive, domain)`: keep only (inclusive)
/// or drop (exclusive) the traces of one domain (pid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DomainFilter {
    /// Keep only this domain (true) or drop it (false).
    pub inclusive: bool,
    /// The domain (pid).
    pub domain: u32,
}

/// Any filter `filter_traces` accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceFilter {
    /// A file name pattern filter.
    Filter(Filter),
    /// A domain filter.
    Domain(DomainFilter),
}

impl TraceFilter {
    /// Whether the filter is inclusive.
    #[must_use]
    pub fn inclusive(&self) -> bool {
        match self {
            TraceFilter::Filter(f) => f.inclusive,
            TraceFilter::Domain(d) => d.inclusive,
        }
    }
}

impl From<Filter> for TraceFilter {
    fn from(filter: Filter) -> Self {
        TraceFilter::Filter(filter)
    }
}

impl From<DomainFilter> for TraceFilter {
    fn from(filter: DomainFilter) -> Self {
        TraceFilter::Domain(filter)
    }
}

/// Pattern verdicts by file name: by the name's address first (names are
/// shared `Arc<str>`s), then by its text.
#[derive(Default)]
struct NameCache {
    by_address: FxHashMap<(*const u8, usize, usize), bool>,
}

impl NameCache {
    fn matches(&mut self, pattern: &Pattern, name: &Arc<str>) -> bool {
        // The pattern's address tells the filters apart.
        let key = (
            name.as_ptr(),
            name.len(),
            std::ptr::from_ref(pattern) as usize,
        );
        match self.by_address.entry(key) {
            Entry::Occupied(entry) => *entry.get(),
            Entry::Vacant(entry) => *entry.insert(pattern.matches(normalize_filename(name))),
        }
    }
}

impl Snapshot {
    /// `Snapshot.filter_traces(filters)`: a new snapshot (same
    /// `traceback_limit`) of the traces that match at least one inclusive
    /// filter (if there is any) and that no exclusive filter excludes, in
    /// their original order. No filters: a copy of every trace.
    #[must_use]
    pub fn filter_traces(&self, filters: &[TraceFilter]) -> Snapshot {
        if filters.is_empty() {
            return self.clone();
        }
        // The pattern filters, each with its slot in a traceback's verdicts.
        let patterns: Vec<&Filter> = filters
            .iter()
            .filter_map(|f| match f {
                TraceFilter::Filter(f) => Some(f),
                TraceFilter::Domain(_) => None,
            })
            .collect();
        let mut checks: Vec<(bool, Check)> = Vec::with_capacity(filters.len());
        let mut slot = 0;
        for filter in filters {
            let check = match filter {
                TraceFilter::Domain(d) => Check::Domain(*d),
                TraceFilter::Filter(_) => {
                    slot += 1;
                    Check::Pattern(slot - 1)
                }
            };
            checks.push((filter.inclusive(), check));
        }
        let any_inclusive = checks.iter().any(|(inclusive, _)| *inclusive);
        let mut names = NameCache::default();
        // The filters' verdicts on each interned traceback, computed once.
        let interned = self.interned();
        let mut verdicts: Vec<Option<Vec<bool>>> = vec![None; interned.len()];
        let mut kept = Vec::with_capacity(self.traces.len());
        for (trace, &id) in self.traces.iter().zip(interned.ids()) {
            let Some(slot) = verdicts.get_mut(id as usize) else {
                kept.push(false);
                continue;
            };
            let tb_verdicts = slot.get_or_insert_with(|| {
                patterns
                    .iter()
                    .map(|f| f.traceback_verdict(&trace.traceback, &mut names))
                    .collect()
            });
            let matches = |check: &Check| -> bool {
                match *check {
                    Check::Domain(d) => (trace.domain == d.domain) == d.inclusive,
                    Check::Pattern(slot) => match (patterns.get(slot), tb_verdicts.get(slot)) {
                        (Some(filter), Some(&verdict)) => filter.verdict(verdict, trace.domain),
                        _ => false,
                    },
                }
            };
            // _filter_trace: one inclusive match is enough; one exclusive
            // filter that does not match drops the trace.
            let included = !any_inclusive
                || checks
                    .iter()
                    .any(|(inclusive, check)| *inclusive && matches(check));
            let excluded = checks
                .iter()
                .any(|(inclusive, check)| !*inclusive && !matches(check));
            let keep = included && !excluded;
            kept.push(keep);
        }
        self.subset(&kept)
    }
}

/// One filter of `filter_traces`, ready to apply.
#[derive(Clone, Copy)]
enum Check {
    Domain(DomainFilter),
    /// The pattern filter in this slot of a traceback's verdicts.
    Pattern(usize),
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (STYLE.md).
mod tests {
    use super::*;
    use crate::Trace;

    fn tb(frames: &[(&str, u32)]) -> Arc<Traceback> {
        Arc::new(Traceback::new(
            frames.iter().map(|&(f, l)| Frame::new(f, l)).collect(),
            None,
        ))
    }

    fn snapshot() -> Snapshot {
        let a = tb(&[("a.c", 1), ("main.c", 9)]);
        let b = tb(&[("b.c", 2), ("a.c", 5)]);
        let py = tb(&[("x.pyc", 3)]);
        Snapshot::new(
            vec![
                Trace {
                    domain: 1,
                    size: 10,
                    traceback: a.clone(),
                },
                Trace {
                    domain: 2,
                    size: 20,
                    traceback: b.clone(),
                },
                Trace {
                    domain: 1,
                    size: 40,
                    traceback: b,
                },
                Trace {
                    domain: 3,
                    size: 80,
                    traceback: py,
                },
                Trace {
                    domain: 2,
                    size: 160,
                    traceback: a,
                },
            ],
            4,
        )
    }

    fn sizes(snapshot: &Snapshot) -> Vec<u64> {
        snapshot.traces().iter().map(|t| t.size).collect()
    }

    #[test]
    fn normalize_strips_the_c_of_pyc_only() {
        assert_eq!(normalize_filename("x.pyc"), "x.py");
        assert_eq!(normalize_filename("x.py"), "x.py");
        assert_eq!(normalize_filename("x.c"), "x.c");
        assert_eq!(normalize_filename(".pyc"), ".py");
    }

    #[test]
    fn include_looks_at_the_most_recent_frame_unless_all_frames() {
        let s = snapshot();
        let include = |p, all| vec![TraceFilter::from(Filter::new(true, p, None, all, None))];
        assert_eq!(sizes(&s.filter_traces(&include("a.c", false))), [10, 160]);
        assert_eq!(
            sizes(&s.filter_traces(&include("a.c", true))),
            [10, 20, 40, 160]
        );
        assert_eq!(sizes(&s.filter_traces(&include("x.py", false))), [80]);
        assert_eq!(sizes(&s.filter_traces(&include("x.pyc", false))), [80]);
    }

    #[test]
    fn exclude_with_lineno_and_domain() {
        let s = snapshot();
        let f = [TraceFilter::from(Filter::new(
            false,
            "a.c",
            Some(5),
            true,
            None,
        ))];
        assert_eq!(sizes(&s.filter_traces(&f)), [10, 80, 160]);
        let f = [TraceFilter::from(Filter::new(
            false,
            "*",
            None,
            false,
            Some(2),
        ))];
        assert_eq!(sizes(&s.filter_traces(&f)), [10, 40, 80]);
        let f = [TraceFilter::from(Filter::new(
            true,
            "*.c",
            None,
            false,
            Some(1),
        ))];
        assert_eq!(sizes(&s.filter_traces(&f)), [10, 40]);
    }

    #[test]
    fn domain_filters_and_combinations() {
        let s = snapshot();
        let keep = |d| {
            TraceFilter::from(DomainFilter {
                inclusive: true,
                domain: d,
            })
        };
        let drop = |d| {
            TraceFilter::from(DomainFilter {
                inclusive: false,
                domain: d,
            })
        };
        assert_eq!(sizes(&s.filter_traces(&[keep(1), keep(3)])), [10, 40, 80]);
        assert_eq!(sizes(&s.filter_traces(&[drop(1), drop(3)])), [20, 160]);
        assert_eq!(
            sizes(&s.filter_traces(&[keep(2), drop(2)])),
            Vec::<u64>::new()
        );
        assert_eq!(sizes(&s.filter_traces(&[])), [10, 20, 40, 80, 160]);
    }
}
