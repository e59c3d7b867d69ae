//! tracemalloc's `Filter` and `DomainFilter`, and the verdicts of
//! `Snapshot.filter_traces()` (which `snapshot.rs` turns into a new
//! snapshot), matching CPython 3.11 exactly:
//!
//! - file names and patterns go through `_normalize_filename` (POSIX
//!   `normcase` is the identity; a trailing `.pyc` loses its `c`), then
//!   `fnmatch` ([`Pattern`]);
//! - a `Filter` looks at the most recent frame only, or at every frame with
//!   `all_frames`; `lineno` None matches any line;
//! - a frame with no line info, named by its site
//!   (`FILE!FUNCTION+0xOFFSET`, `FILE+0xOFFSET`, line 0), matches a
//!   pattern that matches its file (the module's path: `/usr/bin/node`,
//!   `*/node`) or its whole name (`*!NodeArrayBufferAllocator::*`,
//!   `/usr/bin/node+0x1a2b30`): a pattern can select such frames by module
//!   or by function. Every other frame matches on its filename only, as in
//!   tracemalloc;
//! - a `Filter` with a `domain` matches (inclusive) only traces of that
//!   domain, or (exclusive) drops only traces of that domain;
//! - a trace is kept if it matches at least one inclusive filter (when there
//!   is any) and no exclusive filter excludes it.
//!
//! Per-trace work is a table lookup: each filter's verdict on a traceback is
//! computed once per distinct `Arc<Traceback>`, and its verdict on a file
//! name once per distinct name.

use std::collections::hash_map::Entry;

mod fnmatch;
#[cfg(test)]
mod tests;

use crate::engine::index::Interned;
use crate::hash::FxHashMap;
use crate::trace::{AllocatorFamily, Block, Frame, Traceback};

pub use fnmatch::Pattern;

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

    /// `_match_frame_impl`: does one frame match the pattern and line? A
    /// frame with a site matches on its file or its whole name.
    fn frame_matches(&self, frame: &Frame, names: &mut NameCache) -> bool {
        if let Some(lineno) = self.lineno
            && lineno != frame.lineno
        {
            return false;
        }
        names.matches(&self.pattern, &frame.filename)
            || (frame.site_start().is_some() && names.matches(&self.pattern, frame.file()))
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

/// tracer's filter on a trace's [`AllocatorFamily`], built like `DomainFilter`: keep
/// only (inclusive) or drop (exclusive) the traces of one source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorFamilyFilter {
    /// Keep only this source (true) or drop it (false).
    pub inclusive: bool,
    /// The source.
    pub source: AllocatorFamily,
}

/// Any filter `filter_traces` accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceFilter {
    /// A file name pattern filter.
    Filter(Filter),
    /// A domain filter.
    Domain(DomainFilter),
    /// A source filter (tracer's own).
    AllocatorFamily(AllocatorFamilyFilter),
}

impl TraceFilter {
    /// Whether the filter is inclusive.
    #[must_use]
    pub fn inclusive(&self) -> bool {
        match self {
            TraceFilter::Filter(f) => f.inclusive,
            TraceFilter::Domain(d) => d.inclusive,
            TraceFilter::AllocatorFamily(s) => s.inclusive,
        }
    }
}

impl From<AllocatorFamilyFilter> for TraceFilter {
    fn from(filter: AllocatorFamilyFilter) -> Self {
        TraceFilter::AllocatorFamily(filter)
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

/// Pattern verdicts by file name: by the name's address and length
/// (names are shared `Arc<str>`s, and a file is the start of its name).
#[derive(Default)]
struct NameCache {
    by_address: FxHashMap<(*const u8, usize, usize), bool>,
}

impl NameCache {
    fn matches(&mut self, pattern: &Pattern, name: &str) -> bool {
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

/// `Snapshot.filter_traces(filters)`'s verdicts: one flag per item of
/// `traces` (traces, or the totals of the traces of one traceback, domain
/// and source: filters decide alike on all of them), interned as
/// `interned`, true for an item that matches at least one inclusive
/// filter (if there is any) and that no exclusive filter excludes.
/// `filters` is not empty (no filters keep everything).
pub(crate) fn kept<B: Block>(
    filters: &[TraceFilter],
    traces: &[B],
    interned: &Interned,
) -> Vec<bool> {
    // The pattern filters, each with its slot in a traceback's verdicts.
    let patterns: Vec<&Filter> = filters
        .iter()
        .filter_map(|f| match f {
            TraceFilter::Filter(f) => Some(f),
            TraceFilter::Domain(_) | TraceFilter::AllocatorFamily(_) => None,
        })
        .collect();
    let mut checks: Vec<(bool, Check)> = Vec::with_capacity(filters.len());
    let mut slot = 0;
    for filter in filters {
        let check = match filter {
            TraceFilter::Domain(d) => Check::Domain(*d),
            TraceFilter::AllocatorFamily(s) => Check::AllocatorFamily(*s),
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
    let mut verdicts: Vec<Option<Vec<bool>>> = vec![None; interned.len()];
    let mut kept = Vec::with_capacity(traces.len());
    for (trace, &id) in traces.iter().zip(interned.ids()) {
        let Some(slot) = verdicts.get_mut(id as usize) else {
            kept.push(false);
            continue;
        };
        let tb_verdicts = slot.get_or_insert_with(|| {
            patterns
                .iter()
                .map(|f| f.traceback_verdict(trace.traceback(), &mut names))
                .collect()
        });
        let matches = |check: &Check| -> bool {
            match *check {
                Check::Domain(d) => (trace.domain() == d.domain) == d.inclusive,
                Check::AllocatorFamily(s) => (trace.source() == s.source) == s.inclusive,
                Check::Pattern(slot) => match (patterns.get(slot), tb_verdicts.get(slot)) {
                    (Some(filter), Some(&verdict)) => filter.verdict(verdict, trace.domain()),
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
    kept
}

/// One filter of `filter_traces`, ready to apply.
#[derive(Clone, Copy)]
enum Check {
    Domain(DomainFilter),
    AllocatorFamily(AllocatorFamilyFilter),
    /// The pattern filter in this slot of a traceback's verdicts.
    Pattern(usize),
}
