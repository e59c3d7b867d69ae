//! The table itself: every route of the API with its methods, what each
//! takes and answers, its handlers and its cost.
use axum::{
    extract::DefaultBodyLimit,
    routing::{get, post},
};

use super::Cost::{Cheap, Expensive};
use super::{METRICS_PATH, OPENAPI_PATH, Op, Route, Verb, media};
use crate::http::handlers::{control, openapi, scope, snapshots, status, ui, views};
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
        handlers: Some(|| get(status::health)),
    },
    Route {
        path: "/processes",
        cost: Cheap,
        ops: &[Op::get("the traced processes the caller may see")],
        handlers: Some(|| get(status::processes)),
    },
    Route {
        path: "/maps",
        cost: Expensive,
        ops: &[Op::get("the kernel maps' use, the eBPF counters, the unwind tables")],
        handlers: Some(|| get(status::kernel_maps)),
    },
    Route {
        path: "/pid/{pid}",
        cost: Cheap,
        ops: &[Op::get("one process (live, or its last state once it exited)")],
        handlers: Some(|| get(status::process)),
    },
    Route {
        path: "/pid/{pid}/statistics",
        cost: Expensive,
        ops: &[Op::get("take_snapshot().filter_traces(f).statistics(group_by, cumulative)")
            .query(spec::STATISTICS_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::statistics)),
    },
    Route {
        path: "/pid/{pid}/compare",
        cost: Expensive,
        ops: &[Op::get("new.compare_to(base, group_by, cumulative)")
            .query(spec::COMPARE_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::compare)),
    },
    Route {
        path: "/pid/{pid}/traces",
        cost: Expensive,
        ops: &[Op::get("take_snapshot().traces, paged")
            .query(spec::TRACES_NOW)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::traces)),
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
        handlers: Some(|| get(snapshots::pid_snapshots).post(snapshots::pid_take_snapshot)),
    },
    Route {
        path: "/pid/{pid}/traced-memory",
        cost: Cheap,
        ops: &[Op::get("get_traced_memory(), and by source")],
        handlers: Some(|| get(status::pid_traced_memory)),
    },
    Route {
        path: "/pid/{pid}/clear-traces",
        cost: Cheap,
        ops: &[Op::post("clear_traces()").operators_only().refuses(CONFLICT)],
        handlers: Some(|| post(control::pid_clear_traces)),
    },
    Route {
        path: "/pid/{pid}/reset-peak",
        cost: Cheap,
        ops: &[Op::post("reset_peak()").refuses(CONFLICT)],
        handlers: Some(|| post(control::pid_reset_peak)),
    },
    Route {
        path: "/pid/{pid}/tracing",
        cost: Cheap,
        ops: &[Op::get("is_tracing(), get_traceback_limit()")],
        handlers: Some(|| get(control::pid_tracing)),
    },
    Route {
        path: "/pid/{pid}/tracing/start",
        cost: Cheap,
        ops: &[Op::post("start(nframe)")
            .query(spec::START)
            .operators_only()
            .refuses(CONFLICT)],
        handlers: Some(|| post(control::pid_tracing_start)),
    },
    Route {
        path: "/pid/{pid}/tracing/stop",
        cost: Cheap,
        ops: &[Op::post("stop()").operators_only().refuses(CONFLICT)],
        handlers: Some(|| post(control::pid_tracing_stop)),
    },
    Route {
        path: "/pid/{pid}/object/{address}",
        cost: Expensive,
        ops: &[Op::get("get_object_traceback()")
            .query(spec::OBJECT)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
        handlers: Some(|| get(control::pid_object)),
    },
    Route {
        path: "/statistics",
        cost: Expensive,
        ops: &[Op::get("statistics of every traced process at once (one domain per pid)")
            .query(spec::STATISTICS_NOW)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::statistics)),
    },
    Route {
        path: "/compare",
        cost: Expensive,
        ops: &[Op::get("compare, system-wide")
            .query(spec::COMPARE_NOW)
            .answers(PROFILES)
            .refuses(&[404, 409])],
        handlers: Some(|| get(views::compare)),
    },
    Route {
        path: "/traces",
        cost: Expensive,
        ops: &[Op::get("every trace of every traced process, paged")
            .query(spec::TRACES_NOW)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::traces)),
    },
    Route {
        path: "/traced-memory",
        cost: Cheap,
        ops: &[Op::get("get_traced_memory() summed over live processes")],
        handlers: Some(|| get(status::system_traced_memory)),
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
        handlers: Some(|| {
            get(snapshots::list_snapshots)
                .post(snapshots::post_snapshots)
                .layer(DefaultBodyLimit::max(snapshots::MAX_UPLOAD_BYTES))
        }),
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
        handlers: Some(|| {
            get(snapshots::snapshot_summary)
                .delete(snapshots::delete_snapshot)
                .patch(snapshots::label_snapshot)
        }),
    },
    Route {
        path: "/snapshots/{id}/statistics",
        cost: Expensive,
        ops: &[Op::get("snapshot.filter_traces(f).statistics(group_by, cumulative)")
            .query(spec::STATISTICS_STORED)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::statistics)),
    },
    Route {
        path: "/snapshots/{id}/compare",
        cost: Expensive,
        ops: &[Op::get("snapshot.compare_to(base, group_by, cumulative)")
            .query(spec::COMPARE_STORED)
            .answers(PROFILES)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::compare)),
    },
    Route {
        path: "/snapshots/{id}/traces",
        cost: Expensive,
        ops: &[Op::get("snapshot.traces, paged")
            .query(spec::TRACES_STORED)
            .answers(JSON_OR_TEXT)
            .refuses(CONFLICT)],
        handlers: Some(|| get(views::traces)),
    },
    Route {
        path: "/snapshots/{id}/dump",
        cost: Expensive,
        ops: &[Op::get("Snapshot.dump()")
            .query(spec::DUMP)
            .answers(&[media::OCTETS])
            .refuses(CONFLICT)],
        handlers: Some(|| get(snapshots::snapshot_dump)),
    },
    Route {
        path: "/tracing",
        cost: Cheap,
        ops: &[Op::get("is_tracing(), get_traceback_limit() system-wide, and per-process exceptions")],
        handlers: Some(|| get(control::system_tracing)),
    },
    Route {
        path: "/tracing/start",
        cost: Cheap,
        ops: &[Op::post("start(nframe) for every process")
            .query(spec::START)
            .operators_only()
            .refuses(CONFLICT)],
        handlers: Some(|| post(control::system_tracing_start)),
    },
    Route {
        path: "/tracing/stop",
        cost: Cheap,
        ops: &[Op::post("stop() for every process")
            .operators_only()
            .refuses(CONFLICT)],
        handlers: Some(|| post(control::system_tracing_stop)),
    },
    Route {
        path: "/tracing/memory",
        cost: Cheap,
        ops: &[Op::get("get_tracemalloc_memory()")],
        handlers: Some(|| get(status::tracing_memory)),
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
        handlers: Some(|| get(scope::get_scope).put(scope::put_scope)),
    },
    Route {
        path: METRICS_PATH,
        cost: Cheap,
        ops: &[Op::get("Prometheus metrics, OpenMetrics text (docs/metrics.md)")
            .answers(&[media::OPENMETRICS])],
        handlers: None,
    },
    Route {
        path: "/ui",
        cost: Cheap,
        ops: &[Op::get("the web page").answers(&[media::HTML])],
        handlers: Some(|| get(ui::page)),
    },
    Route {
        path: "/ui/{asset}",
        cost: Cheap,
        ops: &[Op::get("the web page's files").answers(&[media::HTML, media::JS, media::CSS])],
        handlers: Some(|| get(ui::asset)),
    },
    Route {
        path: OPENAPI_PATH,
        cost: Cheap,
        ops: &[Op::get("this description of the API, OpenAPI 3.1")],
        handlers: Some(|| get(openapi::document)),
    },
];
