//! The table itself: every route of the API with its methods, what each
//! takes and answers, and its cost (its handlers are `http::router`'s).
use super::Cost::{Cheap, Expensive};
use super::{METRICS_PATH, OPENAPI_PATH, Op, Route, Verb, media};
use crate::http::params::spec;

/// What a statistics or compare route answers: JSON, text (tracemalloc's
/// lines, folded stacks), pprof, a flame graph.
const PROFILES: &[&str] = &[media::JSON, media::TEXT, media::OCTETS, media::SVG];
/// What a traces or object route answers: JSON or tracemalloc's text.
const JSON_OR_TEXT: &[&str] = &[media::JSON, media::TEXT];
/// Conflicts of a view of now: tracing stopped, the process ended.
const CONFLICT: &[u16] = &[409];
/// A snapshot being stored: a conflict (tracing stopped, a label in use),
/// or no room (507).
const STORING: &[u16] = &[409, 507];

/// Every route of the API (`/metrics` too, served beside it), in the order
/// `docs/api.md` lists them.
pub static ROUTES: &[Route] = &[
    Route {
        path: "/health",
        cost: Cheap,
        ops: &[Op::get("readiness: probes attached")],
    },
    Route {
        path: "/processes",
        cost: Cheap,
        ops: &[Op::get("the traced processes the caller may see")],
    },
    Route {
        path: "/maps",
        cost: Expensive,
        ops: &[Op::get("the kernel maps' use, the eBPF counters, the unwind tables")],
    },
    Route {
        path: "/pid/{pid}",
        cost: Cheap,
        ops: &[Op::get("one process (live, or its last state once it exited)")],
    },
    Route {
        path: "/pid/{pid}/statistics",
        cost: Expensive,
        ops: &[Op::get("take_snapshot().filter_traces(f).statistics(group_by, cumulative)")
            .query(spec::STATISTICS_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/pid/{pid}/compare",
        cost: Expensive,
        ops: &[Op::get("new.compare_to(base, group_by, cumulative)")
            .query(spec::COMPARE_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/pid/{pid}/traces",
        cost: Expensive,
        ops: &[Op::get("take_snapshot().traces, paged")
            .query(spec::TRACES_NOW)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/pid/{pid}/snapshots",
        cost: Expensive,
        ops: &[
            Op::get("stored snapshots of the process's current image"),
            Op::post("take_snapshot(), stored")
                .query(spec::TAKE)
                .creates()
                .refuses(STORING),
        ],
    },
    Route {
        path: "/pid/{pid}/traced-memory",
        cost: Cheap,
        ops: &[Op::get("get_traced_memory(), and by source")],
    },
    Route {
        path: "/pid/{pid}/clear-traces",
        cost: Cheap,
        ops: &[Op::post("clear_traces()").operators_only().refuses(CONFLICT)],
    },
    Route {
        path: "/pid/{pid}/reset-peak",
        cost: Cheap,
        ops: &[Op::post("reset_peak()").refuses(CONFLICT)],
    },
    Route {
        path: "/pid/{pid}/tracing",
        cost: Cheap,
        ops: &[Op::get("is_tracing(), get_traceback_limit()")],
    },
    Route {
        path: "/pid/{pid}/tracing/start",
        cost: Cheap,
        ops: &[Op::post("start(nframe)")
            .query(spec::PID_START)
            .operators_only()
            .refuses(CONFLICT)],
    },
    Route {
        path: "/pid/{pid}/tracing/stop",
        cost: Cheap,
        ops: &[Op::post("stop()").operators_only().refuses(CONFLICT)],
    },
    Route {
        path: "/pid/{pid}/object/{address}",
        cost: Expensive,
        ops: &[Op::get("get_object_traceback()")
            .query(spec::OBJECT)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/statistics",
        cost: Expensive,
        ops: &[Op::get("statistics of every traced process at once (one domain per pid)")
            .query(spec::STATISTICS_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/compare",
        cost: Expensive,
        ops: &[Op::get("compare, system-wide")
            .query(spec::COMPARE_NOW)
            .answers(PROFILES)
            .refuses(&[404, 409])],
    },
    Route {
        path: "/traces",
        cost: Expensive,
        ops: &[Op::get("every trace of every traced process, paged")
            .query(spec::TRACES_NOW)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/traced-memory",
        cost: Cheap,
        ops: &[Op::get("get_traced_memory() summed over live processes")],
    },
    Route {
        path: "/snapshots",
        cost: Expensive,
        ops: &[
            Op::get("every stored snapshot the caller may see").query(spec::LIST),
            Op::post(
                "an empty body: take_snapshot() of every traced process, stored; a file: Snapshot.load() (operators only)",
            )
            .query(spec::TAKE_OR_LOAD)
            .takes_file()
            .creates()
            .operators_only()
            .refuses(STORING),
        ],
    },
    Route {
        path: "/snapshots/{id}",
        cost: Expensive,
        ops: &[
            Op::get("the snapshot's summary").refuses(CONFLICT),
            Op::new(Verb::Patch, "set the label (label= empty removes it)")
                .query(spec::RELABEL)
                .refuses(STORING),
            Op::new(Verb::Delete, "forget the snapshot and its file").refuses(CONFLICT),
        ],
    },
    Route {
        path: "/snapshots/{id}/statistics",
        cost: Expensive,
        ops: &[Op::get("snapshot.filter_traces(f).statistics(group_by, cumulative)")
            .query(spec::STATISTICS_STORED)
            .answers(PROFILES)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/snapshots/{id}/compare",
        cost: Expensive,
        ops: &[Op::get("snapshot.compare_to(base, group_by, cumulative)")
            .query(spec::COMPARE_STORED)
            .answers(PROFILES)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/snapshots/{id}/traces",
        cost: Expensive,
        ops: &[Op::get("snapshot.traces, paged")
            .query(spec::TRACES_STORED)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
    },
    Route {
        path: "/snapshots/{id}/dump",
        cost: Expensive,
        ops: &[Op::get("Snapshot.dump()")
            .query(spec::DUMP)
            .answers(&[media::OCTETS])
            .refuses(CONFLICT)],
    },
    Route {
        path: "/tracing",
        cost: Cheap,
        ops: &[Op::get("is_tracing(), get_traceback_limit() system-wide, and per-process exceptions")],
    },
    Route {
        path: "/tracing/start",
        cost: Cheap,
        ops: &[Op::post("start(nframe) for every process")
            .query(spec::START)
            .operators_only()
            .refuses(CONFLICT)],
    },
    Route {
        path: "/tracing/stop",
        cost: Cheap,
        ops: &[Op::post("stop() for every process")
            .operators_only()
            .refuses(CONFLICT)],
    },
    Route {
        path: "/tracing/memory",
        cost: Cheap,
        ops: &[Op::get("get_tracemalloc_memory()")],
    },
    Route {
        path: "/scope",
        cost: Cheap,
        ops: &[
            Op::get("which processes are traced"),
            Op::new(Verb::Put, "trace only these processes (none given: every process)")
                .query(spec::SET_SCOPE)
                .operators_only()
                .refuses(CONFLICT),
        ],
    },
    Route {
        path: METRICS_PATH,
        cost: Cheap,
        ops: &[Op::get("Prometheus metrics, OpenMetrics text (docs/metrics.md)")
            .answers(&[media::OPENMETRICS])],
    },
    Route {
        path: "/ui",
        cost: Cheap,
        ops: &[Op::get("the web page").answers(&[media::HTML])],
    },
    Route {
        path: "/ui/{asset}",
        cost: Cheap,
        ops: &[Op::get("the web page's files").answers(&[media::HTML, media::JS, media::CSS])],
    },
    Route {
        path: OPENAPI_PATH,
        cost: Cheap,
        ops: &[Op::get("this description of the API, OpenAPI 3.1")],
    },
];
