//! JSON Schemas (OpenAPI 3.1's dialect) of the answers, written by hand
//! beside their types: tracerd's OpenAPI description gives them as the
//! response schemas of its routes. Conservative on purpose: a key is
//! required only where every answer has it, extra keys are allowed, and a
//! nested value of the model (a frame) is only checked for its type; a
//! compare side names every key its kinds may have, requiring its `kind`
//! and its completeness.
use serde_json::{Value, json};

/// A type with a JSON Schema of its wire form.
pub trait Schema {
    /// The schema.
    fn schema() -> Value;
}

fn int() -> Value {
    json!({"type": "integer", "minimum": 0})
}

fn signed() -> Value {
    json!({"type": "integer"})
}

fn string() -> Value {
    json!({"type": "string"})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

fn nullable(types: &str) -> Value {
    json!({"type": [types, "null"]})
}

fn words(words: &[&str]) -> Value {
    json!({"type": "string", "enum": words})
}

fn array(items: Value) -> Value {
    json!({"type": "array", "items": items})
}

fn map_of(values: Value) -> Value {
    json!({"type": "object", "additionalProperties": values})
}

/// An object of `properties`, the first `required` of them required.
fn object(properties: &[(&str, Value)], required: &[&str]) -> Value {
    let props: serde_json::Map<String, Value> = properties
        .iter()
        .map(|(name, schema)| ((*name).to_string(), schema.clone()))
        .collect();
    json!({"type": "object", "properties": props, "required": required})
}

/// The keys of [`crate::Completeness`].
fn completeness() -> Vec<(&'static str, Value)> {
    vec![
        ("complete", boolean()),
        ("drops", int()),
        ("drops_by_pid", map_of(int())),
        ("cut_tracebacks", int()),
        ("cut_tracebacks_by_pid", map_of(int())),
    ]
}

const COMPLETENESS: [&str; 5] = [
    "complete",
    "drops",
    "drops_by_pid",
    "cut_tracebacks",
    "cut_tracebacks_by_pid",
];

fn allocator_frames() -> Value {
    words(&["drop", "keep"])
}

fn frame() -> Value {
    object(
        &[("filename", string()), ("lineno", int())],
        &["filename", "lineno"],
    )
}

fn state() -> Value {
    words(&["alive", "exited", "exec"])
}

impl Schema for crate::ErrorBody {
    fn schema() -> Value {
        let mut schema = object(
            &[("error", string()), ("hint", string())],
            &["error", "hint"],
        );
        schema["additionalProperties"] = json!(false);
        schema["description"] = json!("Every error's body: what is wrong, and what would be right");
        schema
    }
}

fn process_view_properties() -> Vec<(&'static str, Value)> {
    vec![
        ("pid", int()),
        ("generation", int()),
        ("ppid", nullable("integer")),
        ("comm", string()),
        ("exe", nullable("string")),
        ("nspid", nullable("integer")),
        ("cgroup", nullable("string")),
        ("container_id", nullable("string")),
        ("owner_uid", nullable("integer")),
        ("state", state()),
        ("first_seen_ms", int()),
        ("ended_ms", nullable("integer")),
        ("current", int()),
        ("peak", int()),
        ("blocks", int()),
        ("allocs", int()),
        ("frees", int()),
        ("unknown_frees", int()),
        ("drops", int()),
        ("cut_tracebacks", int()),
        ("complete", boolean()),
    ]
}

const PROCESS_VIEW: [&str; 7] = [
    "pid",
    "generation",
    "comm",
    "state",
    "current",
    "peak",
    "blocks",
];

impl Schema for crate::ProcessView {
    fn schema() -> Value {
        object(&process_view_properties(), &PROCESS_VIEW)
    }
}

impl Schema for crate::ProcessList {
    fn schema() -> Value {
        let mut entry = process_view_properties();
        entry.push(("is_tracing", boolean()));
        entry.push(("traceback_limit", int()));
        entry.push(("exact", exact_tracing(true)));
        entry.push(("watch", watch_figures(true)));
        let mut required = PROCESS_VIEW.to_vec();
        required.extend(["is_tracing", "traceback_limit"]);
        let watched = object(
            &[
                ("pid", int()),
                ("comm", string()),
                ("watch", watch_figures(false)),
                ("exact", exact_tracing(true)),
            ],
            &["pid", "comm", "watch", "exact"],
        );
        object(
            &[
                ("processes", array(object(&entry, &required))),
                ("exact", words(&["demand", "all"])),
                ("watched", array(watched)),
            ],
            &["processes", "exact", "watched"],
        )
    }
}

/// [`crate::ExactTracing`] (or null, when `or_null`).
fn exact_tracing(or_null: bool) -> Value {
    let mut schema = object(
        &[
            ("since_ms", int()),
            ("reason", words(&["all", "scope", "query", "watch"])),
        ],
        &["since_ms", "reason"],
    );
    if or_null {
        schema["type"] = json!(["object", "null"]);
    }
    schema
}

/// [`crate::WatchFigures`] (or null, when `or_null`).
fn watch_figures(or_null: bool) -> Value {
    let keys = [
        "rss",
        "anon",
        "anon_growth",
        "growth_over_ms",
        "read_at_ms",
        "watched_since_ms",
    ];
    let properties: Vec<(&str, Value)> = keys
        .iter()
        .map(|k| (*k, if *k == "anon_growth" { signed() } else { int() }))
        .collect();
    let mut schema = object(&properties, &keys);
    if or_null {
        schema["type"] = json!(["object", "null"]);
    }
    schema
}

impl Schema for crate::TracedMemory {
    fn schema() -> Value {
        let source = object(&[("current", int()), ("peak", int())], &["current", "peak"]);
        object(
            &[
                ("blocks", int()),
                ("by_source", map_of(source)),
                ("current", int()),
                ("peak", int()),
                ("pid", int()),
                ("state", state()),
            ],
            &["blocks", "by_source", "current", "peak", "pid", "state"],
        )
    }
}

impl Schema for crate::SystemMemory {
    fn schema() -> Value {
        let names = ["current", "peak", "blocks", "processes"];
        object(&names.map(|n| (n, int())), &names)
    }
}

impl Schema for crate::ClearedTraces {
    fn schema() -> Value {
        let names = ["blocks", "cleared_blocks", "current", "peak", "pid"];
        object(&names.map(|n| (n, int())), &names)
    }
}

impl Schema for crate::PeakReset {
    fn schema() -> Value {
        let names = ["current", "peak", "pid"];
        object(&names.map(|n| (n, int())), &names)
    }
}

impl<F> Schema for crate::ObjectTraceback<F> {
    fn schema() -> Value {
        object(
            &[
                ("address", int()),
                ("allocator_frames", allocator_frames()),
                ("pid", int()),
                ("size", int()),
                ("text", string()),
                ("total_nframe", nullable("integer")),
                ("traceback", array(frame())),
            ],
            &["address", "pid", "size", "text", "traceback"],
        )
    }
}

impl Schema for crate::Health {
    fn schema() -> Value {
        let library = object(
            &[
                ("path", string()),
                ("family", string()),
                ("found_in", nullable("integer")),
                ("probes", array(string())),
            ],
            &["path", "family", "probes"],
        );
        object(
            &[
                ("status", string()),
                ("nframe", int()),
                ("libraries", array(library)),
                ("started_at_ms", int()),
            ],
            &["status", "nframe", "libraries", "started_at_ms"],
        )
    }
}

impl Schema for crate::TracingState {
    fn schema() -> Value {
        let process = object(
            &[
                ("pid", int()),
                ("is_tracing", boolean()),
                ("traceback_limit", int()),
            ],
            &["pid", "is_tracing", "traceback_limit"],
        );
        object(
            &[
                ("pid", int()),
                ("is_tracing", boolean()),
                ("traceback_limit", int()),
                ("max_nframe", int()),
                ("processes", array(process)),
                ("started", boolean()),
            ],
            &["is_tracing", "traceback_limit", "max_nframe"],
        )
    }
}

impl Schema for crate::ScopeView {
    fn schema() -> Value {
        let scope = object(
            &[
                ("pids", array(int())),
                ("exes", array(string())),
                ("cgroups", array(string())),
            ],
            &[],
        );
        object(
            &[
                ("scope", scope),
                ("all_processes", boolean()),
                ("attached_pids", array(int())),
                ("filtered", boolean()),
                ("filter_pids", array(int())),
                ("exact", words(&["demand", "all"])),
                (
                    "on_demand",
                    array(object(
                        &[
                            ("pid", int()),
                            ("since_ms", int()),
                            ("reason", words(&["query", "watch"])),
                        ],
                        &["pid", "since_ms", "reason"],
                    )),
                ),
            ],
            &[
                "scope",
                "all_processes",
                "attached_pids",
                "filtered",
                "filter_pids",
                "exact",
                "on_demand",
            ],
        )
    }
}

impl Schema for crate::SnapshotSummary {
    fn schema() -> Value {
        let mut properties = vec![
            ("id", int()),
            ("pid", nullable("integer")),
            ("kind", words(&["taken", "auto", "loaded"])),
            ("label", nullable("string")),
            ("taken_at_ms", int()),
            ("traces", int()),
            ("size", int()),
            ("current", int()),
            ("peak", int()),
            ("traceback_limit", int()),
            ("comm", nullable("string")),
            ("allocator_frames", json!({"enum": ["drop", "keep", null]})),
            ("owner_uid", nullable("integer")),
            ("this_run", boolean()),
            ("persisted", boolean()),
            ("bytes", int()),
        ];
        properties.extend(completeness());
        let mut required = vec![
            "id",
            "kind",
            "taken_at_ms",
            "traces",
            "size",
            "current",
            "peak",
            "traceback_limit",
            "this_run",
            "persisted",
            "bytes",
        ];
        required.extend(COMPLETENESS);
        object(&properties, &required)
    }
}

impl Schema for crate::SnapshotList {
    fn schema() -> Value {
        object(
            &[
                ("pid", int()),
                ("snapshots", array(crate::SnapshotSummary::schema())),
                ("unreadable", array(json!({}))),
            ],
            &["snapshots"],
        )
    }
}

/// The keys every statistics-like answer echoes of its query.
fn query() -> Vec<(&'static str, Value)> {
    vec![
        ("cumulative", boolean()),
        ("filters", map_of(array(string()))),
        ("group_by", string()),
        ("limit", int()),
        ("total", int()),
    ]
}

const QUERY: [&str; 5] = ["cumulative", "filters", "group_by", "limit", "total"];

impl<S> Schema for crate::StatisticsAnswer<S> {
    fn schema() -> Value {
        let statistic = object(
            &[
                ("count", int()),
                ("label", string()),
                ("size", int()),
                ("text", string()),
                ("traceback", array(frame())),
            ],
            &["count", "size", "text", "traceback"],
        );
        let mut properties = query();
        properties.extend(completeness());
        properties.extend([
            ("statistics", array(statistic)),
            ("traceback_limit", int()),
            ("traces", int()),
            ("pid", int()),
            ("pids", array(int())),
            ("current", int()),
            ("peak", int()),
            ("allocator_frames", allocator_frames()),
            ("totals", words(&["per_stack", "per_block"])),
            ("snapshot", crate::SnapshotSummary::schema()),
        ]);
        let mut required = QUERY.to_vec();
        required.extend(COMPLETENESS);
        required.extend(["statistics", "traceback_limit", "traces"]);
        object(&properties, &required)
    }
}

impl<D> Schema for crate::CompareAnswer<D> {
    fn schema() -> Value {
        let diff = object(
            &[
                ("count", int()),
                ("count_diff", signed()),
                ("label", string()),
                ("size", int()),
                ("size_diff", signed()),
                ("text", string()),
                ("traceback", array(frame())),
            ],
            &[
                "count",
                "count_diff",
                "size",
                "size_diff",
                "text",
                "traceback",
            ],
        );
        let kinds = || words(&["snapshot", "tracing_start", "now", "since"]);
        let snapshot_kind = || words(&["taken", "auto", "loaded"]);
        let part = object(
            &[
                ("pid", int()),
                ("kind", kinds()),
                ("id", int()),
                ("snapshot_kind", snapshot_kind()),
                ("taken_at_ms", int()),
                ("at_ms", int()),
            ],
            &["pid", "kind"],
        );
        let mut side = vec![
            ("kind", kinds()),
            ("id", int()),
            ("snapshot_kind", snapshot_kind()),
            ("label", nullable("string")),
            ("taken_at_ms", int()),
            ("allocator_frames", json!({"enum": ["drop", "keep", null]})),
            ("at_ms", int()),
            ("since_ms", int()),
            ("processes", array(part)),
        ];
        side.extend(completeness());
        let mut side_required = vec!["kind"];
        side_required.extend(COMPLETENESS);
        let side = object(&side, &side_required);
        let mut properties = query();
        properties.extend([
            ("base", side.clone()),
            ("new", side),
            ("complete", boolean()),
            ("pid", int()),
            ("statistics", array(diff)),
        ]);
        let mut required = QUERY.to_vec();
        required.extend(["base", "new", "complete", "statistics"]);
        object(&properties, &required)
    }
}

impl<T> Schema for crate::TracesAnswer<T> {
    fn schema() -> Value {
        let trace = object(
            &[
                ("domain", int()),
                ("size", int()),
                ("source", string()),
                ("text", string()),
                ("traceback", array(frame())),
            ],
            &["domain", "size", "text", "traceback"],
        );
        let mut properties = completeness();
        properties.extend([
            ("filters", map_of(array(string()))),
            ("limit", int()),
            ("offset", int()),
            ("total", int()),
            ("traceback_limit", int()),
            ("traces", array(trace)),
            ("pid", int()),
            ("pids", array(int())),
            ("allocator_frames", allocator_frames()),
            ("snapshot", crate::SnapshotSummary::schema()),
        ]);
        let mut required = COMPLETENESS.to_vec();
        required.extend([
            "filters",
            "limit",
            "offset",
            "total",
            "traceback_limit",
            "traces",
        ]);
        object(&properties, &required)
    }
}

impl Schema for crate::SnapshotDeleted {
    fn schema() -> Value {
        object(
            &[("deleted", crate::SnapshotSummary::schema())],
            &["deleted"],
        )
    }
}
