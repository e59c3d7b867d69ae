//! What each route accepts, named once: every query parameter ([`Param`]:
//! its name, the values it takes, whether it repeats or is required) and
//! each route's query ([`Query`]: groups of them). A handler passes its
//! query to [`Params::parse`](super::Params::parse), which refuses any
//! other name; the route table (`http/routes.rs`) names the same query for
//! the route, and `GET /openapi.json` describes it from there, so the
//! parser, the 400's hint and the description cannot disagree.

/// The values a parameter (or path segment) takes, as its parser reads
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One of these words.
    Words(&'static [&'static str]),
    /// `true`, `false`, `1` or `0`.
    Flag,
    /// A whole number from `min` to `max`.
    Whole {
        /// The least value.
        min: i64,
        /// The greatest value.
        max: u64,
    },
    /// A pid: `[1-9][0-9]*`, at most 4294967295.
    Pid,
    /// A stored snapshot: its id (1 or more) or its label; `now` too
    /// when `now` is set.
    Snapshot {
        /// Whether `now` (the live state) is a value.
        now: bool,
    },
    /// A label (1 to 64 of `A-Z a-z 0-9 . _ : -`, not all digits); the
    /// empty value too when `empty` is set (it removes the label).
    Label {
        /// Whether the empty value is taken.
        empty: bool,
    },
    /// A duration: whole numbers with units `s`, `m`, `h`, `d`, or seconds.
    Duration,
    /// `PATTERN[:LINENO][@DOMAIN]` of a `Filter`.
    Filter,
    /// A block's source (the allocator family): `tracer_model::AllocatorFamily`'s
    /// names.
    AllocatorFamily,
    /// An absolute path.
    Absolute,
    /// An address: `0x` hexadecimal or decimal.
    Address,
}

/// One query parameter (or path segment) of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    /// Its name.
    pub name: &'static str,
    /// What it means, for the description.
    pub doc: &'static str,
    /// The values it takes.
    pub kind: Kind,
    /// Whether it may be given more than once.
    pub repeat: bool,
    /// Whether the route refuses a request without it.
    pub required: bool,
}

impl Param {
    const fn new(name: &'static str, kind: Kind, doc: &'static str) -> Self {
        Self {
            name,
            doc,
            kind,
            repeat: false,
            required: false,
        }
    }

    const fn repeated(self) -> Self {
        Self {
            repeat: true,
            ..self
        }
    }

    const fn required(self) -> Self {
        Self {
            required: true,
            ..self
        }
    }
}

/// A route's query: the groups of parameters it accepts, in the order
/// the 400's hint lists them.
pub type Query = &'static [&'static [Param]];

/// Every name of `query`, in order.
pub fn names(query: Query) -> Vec<&'static str> {
    query
        .iter()
        .flat_map(|g| g.iter().map(|p| p.name))
        .collect()
}

/// The parameter `name` of `query`.
pub fn find(query: Query, name: &str) -> Option<&'static Param> {
    query.iter().flat_map(|g| g.iter()).find(|p| p.name == name)
}

/// `group_by` values, as the model parses them.
pub const GROUP_BY: [&str; 5] = ["filename", "lineno", "traceback", "function", "module"];
/// `format` of statistics and compare.
pub const STATS_FORMATS: [&str; 5] = ["json", "text", "pprof", "collapsed", "svg"];
/// `format` of traces and object tracebacks.
pub const TEXT_FORMATS: [&str; 2] = ["json", "text"];
/// `format` of a snapshot file (dump, load).
pub const FILE_FORMATS: [&str; 2] = ["tracer", "tracemalloc"];
/// `kind` of `GET /snapshots`.
pub const KINDS: [&str; 3] = ["taken", "auto", "loaded"];
/// Whether a snapshot taken now drops the allocation machinery's leading
/// frames (`drop`, the default) or keeps them (`keep`).
pub const ALLOCATOR_FRAMES: &str = "allocator_frames";
/// `allocator_frames`.
pub const ALLOCATOR_FRAMES_VALUES: [&str; 2] = ["keep", "drop"];
/// `{asset}` of `/ui/{asset}`: the files of the web page.
pub const ASSET_NAMES: [&str; 3] = ["index.html", "app.js", "style.css"];

const U32: u64 = u32::MAX as u64;

/// `statistics(group_by, cumulative)` and how many groups.
pub const STATS: &[Param] = &[
    Param::new(
        "group_by",
        Kind::Words(&GROUP_BY),
        "statistics' key_type (default lineno; traceback for the profile formats)",
    ),
    Param::new(
        "cumulative",
        Kind::Flag,
        "statistics' cumulative (default false; a 400 with the profile formats)",
    ),
    Param::new(
        "limit",
        Kind::Whole {
            min: 0,
            max: u64::MAX,
        },
        "how many groups, largest first (default 50, 0 for all; profiles: 0)",
    ),
];
/// The sides of a compare of now: `base` or `since`, and `new`.
pub const SIDES: &[Param] = &[
    Param::new(
        "base",
        Kind::Snapshot { now: false },
        "the base snapshot (id or label; default: the latest one taken alike)",
    ),
    Param::new(
        "new",
        Kind::Snapshot { now: true },
        "the new side: now (default) or a stored snapshot",
    ),
    Param::new(
        "since",
        Kind::Duration,
        "base: the state that long ago, from the stored snapshots (not with base)",
    ),
];
/// The base of a compare of stored snapshots.
pub const BASE: &[Param] = &[Param::new(
    "base",
    Kind::Snapshot { now: false },
    "the base snapshot (id or label)",
)
.required()];
/// `format` of statistics and compare.
pub const STATS_FORMAT: &[Param] = &[Param::new(
    "format",
    Kind::Words(&STATS_FORMATS),
    "json (default), tracemalloc's text, or a profile: pprof, collapsed (folded stacks), svg (flame graph)",
)];
/// `format` of traces and object tracebacks.
pub const TEXT_FORMAT: &[Param] = &[Param::new(
    "format",
    Kind::Words(&TEXT_FORMATS),
    "json (default) or tracemalloc's text",
)];
/// `Traceback.format()` options of text output (with `format=text` only).
pub const TEXT_OPTIONS: &[Param] = &[
    Param::new("source", Kind::Flag, "show source lines (format=text)"),
    Param::new(
        "tb_limit",
        Kind::Whole {
            min: i64::MIN,
            max: i64::MAX as u64,
        },
        "Traceback.format()'s limit (format=text)",
    ),
    Param::new(
        "most_recent_first",
        Kind::Flag,
        "Traceback.format()'s most_recent_first (format=text)",
    ),
];
/// The filters of `Snapshot.filter_traces()`.
pub const FILTERS: &[Param] = &[
    Param::new(
        "include",
        Kind::Filter,
        "an inclusive Filter: PATTERN[:LINENO][@DOMAIN]",
    )
    .repeated(),
    Param::new(
        "exclude",
        Kind::Filter,
        "an exclusive Filter: PATTERN[:LINENO][@DOMAIN]",
    )
    .repeated(),
    Param::new("all_frames", Kind::Flag, "the filters' all_frames"),
    Param::new(
        "domain",
        Kind::Whole { min: 0, max: U32 },
        "an inclusive DomainFilter (a pid)",
    )
    .repeated(),
    Param::new(
        "exclude_domain",
        Kind::Whole { min: 0, max: U32 },
        "an exclusive DomainFilter (a pid)",
    )
    .repeated(),
    Param::new(
        "allocator",
        Kind::AllocatorFamily,
        "only blocks of this source",
    )
    .repeated(),
    Param::new(
        "exclude_allocator",
        Kind::AllocatorFamily,
        "no blocks of this source",
    )
    .repeated(),
];
/// Whether a snapshot taken now drops the allocation machinery's leading
/// frames.
pub const NOW: &[Param] = &[Param::new(
    ALLOCATOR_FRAMES,
    Kind::Words(&ALLOCATOR_FRAMES_VALUES),
    "drop (default) or keep the allocators' and their wrappers' leading frames",
)];
/// A page of traces.
pub const PAGE: &[Param] = &[
    Param::new(
        "offset",
        Kind::Whole {
            min: 0,
            max: u64::MAX,
        },
        "traces to skip (default 0)",
    ),
    Param::new(
        "limit",
        Kind::Whole {
            min: 0,
            max: u64::MAX,
        },
        "how many traces (default 50, 0 for all)",
    ),
];
/// The label of a snapshot being stored.
pub const LABEL: &[Param] = &[Param::new(
    "label",
    Kind::Label { empty: true },
    "a label for the snapshot (empty: none)",
)];
/// The label `PATCH /snapshots/{id}` sets.
pub const SET_LABEL: &[Param] = &[Param::new(
    "label",
    Kind::Label { empty: true },
    "the new label; empty removes it",
)
.required()];
/// The format of a snapshot file.
pub const FILE_FORMAT: &[Param] = &[Param::new(
    "format",
    Kind::Words(&FILE_FORMATS),
    "tracer's own format (default) or a tracemalloc pickle",
)];
/// The filters of `GET /snapshots`.
pub const SNAPSHOT_FILTERS: &[Param] = &[
    Param::new("pid", Kind::Pid, "only the snapshots of this process"),
    Param::new("kind", Kind::Words(&KINDS), "only snapshots of this kind"),
];
/// `start(nframe)`.
pub const NFRAME: &[Param] = &[Param::new(
    "nframe",
    Kind::Whole { min: 1, max: U32 },
    "frames per traceback, 1 to tracerd's --nframe (default that)",
)];
/// The scope: processes to trace.
pub const SCOPE: &[Param] = &[
    Param::new("pid", Kind::Pid, "a process to trace").repeated(),
    Param::new(
        "exe",
        Kind::Absolute,
        "an executable to trace (absolute path)",
    )
    .repeated(),
    Param::new(
        "cgroup",
        Kind::Absolute,
        "a cgroup v2 path to trace (absolute)",
    )
    .repeated(),
];

/// No parameter.
pub const NONE: Query = &[];
/// A statistics route of now (a process, the system).
pub const STATISTICS_NOW: Query = &[STATS, STATS_FORMAT, TEXT_OPTIONS, FILTERS, NOW];
/// A stored snapshot's statistics.
pub const STATISTICS_STORED: Query = &[STATS, STATS_FORMAT, TEXT_OPTIONS, FILTERS];
/// A compare route of now (a process, the system).
pub const COMPARE_NOW: Query = &[STATS, SIDES, STATS_FORMAT, TEXT_OPTIONS, FILTERS, NOW];
/// A stored snapshot's compare.
pub const COMPARE_STORED: Query = &[STATS, BASE, STATS_FORMAT, TEXT_OPTIONS, FILTERS];
/// A traces route of now (a process, the system).
pub const TRACES_NOW: Query = &[PAGE, TEXT_FORMAT, TEXT_OPTIONS, FILTERS, NOW];
/// A stored snapshot's traces.
pub const TRACES_STORED: Query = &[PAGE, TEXT_FORMAT, TEXT_OPTIONS, FILTERS];
/// `get_object_traceback()`.
pub const OBJECT: Query = &[TEXT_FORMAT, TEXT_OPTIONS, NOW];
/// `POST /pid/{pid}/snapshots`.
pub const TAKE: Query = &[LABEL, NOW];
/// `POST /snapshots`: take (empty body) or load (a file).
pub const TAKE_OR_LOAD: Query = &[LABEL, FILE_FORMAT, NOW];
/// `GET /snapshots`.
pub const LIST: Query = &[SNAPSHOT_FILTERS];
/// `PATCH /snapshots/{id}`.
pub const RELABEL: Query = &[SET_LABEL];
/// `GET /snapshots/{id}/dump`.
pub const DUMP: Query = &[FILE_FORMAT];
/// `start(nframe)`.
pub const START: Query = &[NFRAME];
/// `POST /pid/{pid}/tracing/start`: also `descendants`.
pub const PID_START: Query = &[NFRAME, DESCENDANTS];
/// Exact tracing of a process's descendants too.
pub const DESCENDANTS: &[Param] = &[Param::new(
    "descendants",
    Kind::Flag,
    "also trace exactly every process it forks from now on, and theirs, from their first allocation (default false)",
)];
/// `PUT /scope`.
pub const SET_SCOPE: Query = &[SCOPE];

/// The path segments of the route templates (`{pid}`, `{id}`,
/// `{address}`, `{asset}`).
pub const PATH: &[Param] = &[
    Param::new("pid", Kind::Pid, "a process id, as the kernel writes it").required(),
    Param::new(
        "id",
        Kind::Snapshot { now: false },
        "a stored snapshot's id or label",
    )
    .required(),
    Param::new(
        "address",
        Kind::Address,
        "where a block starts: 0x-prefixed hexadecimal or decimal",
    )
    .required(),
    Param::new("asset", Kind::Words(&ASSET_NAMES), "a file of the web page").required(),
];
