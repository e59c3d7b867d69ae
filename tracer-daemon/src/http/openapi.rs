//! The API's OpenAPI 3.1 description (`GET /openapi.json`), made from the
//! route table ([`ROUTES`]) and the parameters each handler accepts
//! ([`spec`]): every route and method, its path and query parameters with
//! the values they take, the body it reads, and every status it can answer
//! ([`Op::statuses`]) with its media types; errors are `{"error", "hint"}`.
//! Nothing here is written twice: a route, a parameter or a status added
//! to the table is in the description.
use std::sync::LazyLock;

use serde_json::Value;
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, HeaderBuilder, HttpMethod, InfoBuilder, ObjectBuilder,
    OpenApi, OpenApiBuilder, PathItem, PathsBuilder, Ref, RefOr, Required, ResponseBuilder, Schema,
    Type,
    path::{OperationBuilder, Parameter, ParameterBuilder, ParameterIn},
    request_body::RequestBodyBuilder,
    schema::{AdditionalProperties, ArrayBuilder},
};

use super::params::spec::{self, Kind, Param};
use super::routes::{Op, ROUTES, Route, Verb, media};
use tracer_model::AllocatorFamily;

/// The name of the error body's schema under `components/schemas`.
const ERROR_SCHEMA: &str = "Error";

/// A label: 1 to 64 of `A-Z a-z 0-9 . _ : -`, not all digits (and, in a
/// path, not only dots). The pattern asks for a character other than a
/// digit or a dot, a little less than tracerd takes.
const LABEL_PATTERN: &str = "[A-Za-z0-9._:-]*[A-Za-z_:-][A-Za-z0-9._:-]*";

/// The description, built once.
pub fn document() -> &'static OpenApi {
    static DOCUMENT: LazyLock<OpenApi> = LazyLock::new(build);
    &DOCUMENT
}

/// The description as JSON text, serialized once.
///
/// # Errors
/// What serde_json said (never, for this document).
pub fn json() -> Result<&'static str, &'static str> {
    static TEXT: LazyLock<Result<String, String>> = LazyLock::new(|| {
        let mut doc = serde_json::to_value(document()).map_err(|e| e.to_string())?;
        add_answer_schemas(&mut doc);
        serde_json::to_string(&doc).map_err(|e| e.to_string())
    });
    TEXT.as_deref().map_err(String::as_str)
}

/// The JSON schema of what `method path` answers with its success status,
/// from the API's types (`tracer_api::schema`); None where the answer has
/// no type there (`/maps`, `/tracing/memory`: free-form objects).
fn answer_schema(path: &str, method: Verb) -> Option<Value> {
    use tracer_api::schema::Schema as _;
    use tracer_api::{
        ClearedTraces, CompareAnswer, Health, ObjectTraceback, PeakReset, ProcessList, ProcessView,
        ScopeView, SnapshotDeleted, SnapshotList, SnapshotSummary, StatisticsAnswer, SystemMemory,
        TracedMemory, TracesAnswer, TracingState,
    };
    let view = path
        .strip_prefix("/pid/{pid}")
        .or_else(|| path.strip_prefix("/snapshots/{id}"))
        .unwrap_or(path);
    Some(match (method, path, view) {
        (Verb::Get, "/health", _) => Health::schema(),
        (Verb::Get, "/processes", _) => ProcessList::schema(),
        (Verb::Get, "/pid/{pid}", _) => ProcessView::schema(),
        (Verb::Get, "/pid/{pid}/traced-memory", _) => TracedMemory::schema(),
        (Verb::Get, "/traced-memory", _) => SystemMemory::schema(),
        (Verb::Post, "/pid/{pid}/clear-traces", _) => ClearedTraces::schema(),
        (Verb::Post, "/pid/{pid}/reset-peak", _) => PeakReset::schema(),
        (Verb::Get, "/pid/{pid}/object/{address}", _) => ObjectTraceback::<()>::schema(),
        (Verb::Get, "/pid/{pid}/snapshots" | "/snapshots", _) => SnapshotList::schema(),
        (Verb::Post, "/pid/{pid}/snapshots" | "/snapshots", _) => SnapshotSummary::schema(),
        (Verb::Get | Verb::Patch, "/snapshots/{id}", _) => SnapshotSummary::schema(),
        (Verb::Delete, "/snapshots/{id}", _) => SnapshotDeleted::schema(),
        (Verb::Get | Verb::Put, "/scope", _) => ScopeView::schema(),
        (_, _, "/tracing" | "/tracing/start" | "/tracing/stop") => TracingState::schema(),
        (Verb::Get, _, "/statistics") => StatisticsAnswer::<()>::schema(),
        (Verb::Get, _, "/compare") => CompareAnswer::<()>::schema(),
        (Verb::Get, _, "/traces") => TracesAnswer::<()>::schema(),
        _ => return None,
    })
}

/// Puts each route's answer schema ([`answer_schema`]) in its JSON
/// success responses of `doc`, and the error body's in the components.
fn add_answer_schemas(doc: &mut Value) {
    use tracer_api::schema::Schema as _;
    for route in ROUTES {
        for op in route.ops {
            let Some(schema) = answer_schema(route.path, op.method) else {
                continue;
            };
            let method = op.method.as_str().to_ascii_lowercase();
            let responses = &mut doc["paths"][route.path][method.as_str()]["responses"];
            for status in op.statuses(route).into_iter().filter(|s| *s < 300) {
                let content = &mut responses[status.to_string()]["content"];
                if let Some(json) = content.get_mut(media::JSON) {
                    json["schema"] = schema.clone();
                }
            }
        }
    }
    doc["components"]["schemas"][ERROR_SCHEMA] = tracer_api::ErrorBody::schema();
}

fn build() -> OpenApi {
    let mut paths = PathsBuilder::new();
    for route in ROUTES {
        let mut item: Option<PathItem> = None;
        for op in route.ops {
            let next = PathItem::new(method(op.method), operation(route, op));
            match item.as_mut() {
                Some(item) => item.merge_operations(next),
                None => item = Some(next),
            }
        }
        if let Some(item) = item {
            paths = paths.path(route.path, item);
        }
    }
    let error = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(
            "Every error's body: what is wrong, and what would be right",
        ))
        .property("error", ObjectBuilder::new().schema_type(Type::String))
        .property("hint", ObjectBuilder::new().schema_type(Type::String))
        .required("error")
        .required("hint")
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)));
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("tracerd")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Python's tracemalloc for every native process, over HTTP (docs/api.md). Sizes are bytes, times Unix milliseconds, a domain is a pid.",
                ))
                .build(),
        )
        .paths(paths.build())
        .components(Some(
            ComponentsBuilder::new()
                .schema(ERROR_SCHEMA, error)
                .build(),
        ))
        .build()
}

fn method(verb: Verb) -> HttpMethod {
    match verb {
        Verb::Get => HttpMethod::Get,
        Verb::Post => HttpMethod::Post,
        Verb::Put => HttpMethod::Put,
        Verb::Patch => HttpMethod::Patch,
        Verb::Delete => HttpMethod::Delete,
    }
}

/// `get_pid_statistics` for `GET /pid/{pid}/statistics`.
fn operation_id(route: &Route, op: &Op) -> String {
    let mut id = op.method.as_str().to_ascii_lowercase();
    for segment in route.path.split('/').filter(|s| !s.is_empty()) {
        if segment.starts_with('{') {
            continue;
        }
        id.push('_');
        id.extend(
            segment
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
        );
    }
    id
}

fn operation(route: &Route, op: &Op) -> utoipa::openapi::path::Operation {
    let mut builder = OperationBuilder::new()
        .summary(Some(op.summary))
        .operation_id(Some(operation_id(route, op)));
    for name in path_names(route.path) {
        if let Some(param) = spec::PATH.iter().find(|p| p.name == name) {
            builder = builder.parameter(parameter(param, ParameterIn::Path));
        }
    }
    for group in op.query {
        for param in *group {
            builder = builder.parameter(parameter(param, ParameterIn::Query));
        }
    }
    if op.body {
        builder = builder.request_body(Some(
            RequestBodyBuilder::new()
                .description(Some(
                    "a snapshot file to load (GET /snapshots/{id}/dump's, or with format=tracemalloc a pickle of Python's Snapshot.dump()); empty: take a snapshot",
                ))
                .required(Some(Required::False))
                .content(
                    media::OCTETS,
                    ContentBuilder::new()
                        .schema(Some(
                            ObjectBuilder::new()
                                .schema_type(Type::String)
                                .content_media_type(media::OCTETS),
                        ))
                        .build(),
                )
                .build(),
        ));
    }
    for status in op.statuses(route) {
        builder = builder.response(status.to_string(), response(status, op));
    }
    builder.build()
}

/// The `{name}`s of a path template.
pub fn path_names(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
}

fn parameter(param: &Param, place: ParameterIn) -> Parameter {
    let one = schema(param.kind);
    let schema: RefOr<Schema> = if param.repeat {
        ArrayBuilder::new().items(one).into()
    } else {
        one
    };
    ParameterBuilder::new()
        .name(param.name)
        .parameter_in(place)
        .required(if param.required {
            Required::True
        } else {
            Required::False
        })
        .description(Some(param.doc))
        .schema(Some(schema))
        .build()
}

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

fn words<'a>(words: impl IntoIterator<Item = &'a str>) -> RefOr<Schema> {
    string()
        .enum_values(Some(words.into_iter().map(|w| Value::from(w.to_string()))))
        .into()
}

fn pattern(regex: String) -> RefOr<Schema> {
    string().pattern(Some(regex)).into()
}

/// The JSON schema of the values `kind` takes.
fn schema(kind: Kind) -> RefOr<Schema> {
    match kind {
        Kind::Words(list) => words(list.iter().copied()),
        Kind::Flag => words(["true", "false", "1", "0"]),
        Kind::Whole { min, max } => ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(utoipa::Number::Int(
                isize::try_from(min).unwrap_or(isize::MIN),
            )))
            .maximum(Some(utoipa::Number::UInt(
                usize::try_from(max).unwrap_or(usize::MAX),
            )))
            .into(),
        Kind::Pid => ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(utoipa::Number::UInt(1)))
            .maximum(Some(utoipa::Number::UInt(u32::MAX as usize)))
            .into(),
        // An id (1 or more, within 64 bits) or a label; the pattern of a
        // label takes `now` too (of `new=`; elsewhere a 400).
        Kind::Snapshot { .. } => string()
            .pattern(Some(format!("^([1-9][0-9]{{0,18}}|{LABEL_PATTERN})$")))
            .max_length(Some(64))
            .into(),
        Kind::Label { empty } => {
            let regex = if empty {
                format!("^({LABEL_PATTERN})?$")
            } else {
                format!("^{LABEL_PATTERN}$")
            };
            string().pattern(Some(regex)).max_length(Some(64)).into()
        }
        Kind::Duration => pattern("^([0-9]{1,12}|([0-9]{1,9}[smhd]){1,4})$".into()),
        Kind::Filter => string().into(),
        Kind::AllocatorFamily => words(AllocatorFamily::all().iter().copied()),
        Kind::Absolute => pattern("^/".into()),
        Kind::Address => pattern("^(0[xX][0-9a-fA-F]{1,16}|[0-9]{1,19})$".into()),
    }
}

/// What a status means, from docs/api.md's table of statuses.
fn meaning(status: u16) -> &'static str {
    match status {
        200 => "the answer",
        201 => "stored: the snapshot's summary",
        400 => "a bad parameter or file; the hint names the valid values",
        401 => {
            "tracerd has a token (auth_token_file) and the request is from a peer it cannot identify without it, or has a wrong one"
        }
        403 => {
            "a change only an operator may make (root, a member of operators_group, or a holder of the token)"
        }
        404 => {
            "an unknown pid, snapshot id, label, block address or file; a pid that is not traced says why"
        }
        408 => "the request body paused longer than request_read_timeout_secs",
        409 => {
            "a state conflict: tracing stopped, a process that ended, a snapshot of another scope, a label in use, a stored snapshot whose file changed"
        }
        413 => {
            "a request body over body_limit_bytes, or work over request_memory_budget, or a file that would expand past 24 bytes per byte plus 64 MiB"
        }
        429 => "max_expensive_requests run already (Retry-After: 1)",
        500 => "a failure inside tracerd (never bad input); see its log",
        503 => "past request_timeout_secs, tracerd stopping, or interrupted work",
        507 => "the state directory's filesystem or a snapshot quota is full: nothing was stored",
        _ => "see docs/api.md",
    }
}

fn response(status: u16, op: &Op) -> utoipa::openapi::Response {
    let mut builder = ResponseBuilder::new().description(meaning(status));
    if status < 400 {
        for kind in op.content {
            let schema = if *kind == media::JSON {
                ObjectBuilder::new().schema_type(Type::Object)
            } else {
                string()
            };
            builder = builder.content(*kind, ContentBuilder::new().schema(Some(schema)).build());
        }
        return builder.build();
    }
    builder = builder.content(
        media::JSON,
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(ERROR_SCHEMA)))
            .build(),
    );
    let header = match status {
        429 => Some(("Retry-After", "seconds to wait: 1")),
        401 => Some(("WWW-Authenticate", "Bearer")),
        _ => None,
    };
    if let Some((name, doc)) = header {
        builder = builder.header(
            name,
            HeaderBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                .description(Some(doc))
                .build(),
        );
    }
    builder.build()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // Tests may (CONTRIBUTING.md).
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::http::routes::{METRICS_PATH, OPENAPI_PATH};

    fn doc() -> Value {
        serde_json::from_str(json().unwrap()).unwrap()
    }

    #[test]
    fn every_route_is_in_the_document_with_its_methods_parameters_and_statuses() {
        let doc = doc();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        let listed: BTreeSet<&str> = paths.keys().map(String::as_str).collect();
        let table: BTreeSet<&str> = ROUTES.iter().map(|r| r.path).collect();
        assert_eq!(listed, table);
        assert!(listed.contains(METRICS_PATH) && listed.contains(OPENAPI_PATH));
        for route in ROUTES {
            let item = paths[route.path].as_object().unwrap();
            let methods: BTreeSet<String> = item.keys().cloned().collect();
            let ops: BTreeSet<String> = route
                .ops
                .iter()
                .map(|op| op.method.as_str().to_ascii_lowercase())
                .collect();
            assert_eq!(methods, ops, "{}", route.path);
            for op in route.ops {
                let what = format!("{} {}", op.method.as_str(), route.path);
                let operation = &item[&op.method.as_str().to_ascii_lowercase()];
                let params = operation["parameters"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let named = |place: &str| -> Vec<String> {
                    params
                        .iter()
                        .filter(|p| p["in"] == place)
                        .map(|p| p["name"].as_str().unwrap().to_string())
                        .collect()
                };
                assert_eq!(named("query"), spec::names(op.query), "{what}");
                assert_eq!(
                    named("path"),
                    path_names(route.path).collect::<Vec<_>>(),
                    "{what}"
                );
                for param in params.iter().filter(|p| p["in"] == "path") {
                    assert_eq!(param["required"], true, "{what}");
                }
                let statuses: Vec<u16> = operation["responses"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .map(|k| k.parse().unwrap())
                    .collect();
                assert_eq!(statuses, op.statuses(route), "{what}");
                for (status, response) in operation["responses"].as_object().unwrap() {
                    let content: BTreeSet<&str> = response["content"]
                        .as_object()
                        .unwrap()
                        .keys()
                        .map(String::as_str)
                        .collect();
                    if status.starts_with('2') {
                        assert_eq!(content, op.content.iter().copied().collect(), "{what}");
                    } else {
                        assert_eq!(content, BTreeSet::from([media::JSON]), "{what} {status}");
                        assert_eq!(
                            response["content"][media::JSON]["schema"]["$ref"],
                            "#/components/schemas/Error"
                        );
                    }
                }
                assert_eq!(operation["requestBody"].is_object(), op.body, "{what}");
            }
        }
        let error = &doc["components"]["schemas"]["Error"];
        assert_eq!(error["required"], serde_json::json!(["error", "hint"]));
        assert_eq!(error["additionalProperties"], false);
    }

    #[test]
    fn json_answers_have_the_schemas_of_their_types() {
        let doc = doc();
        let schema = |path: &str, method: &str, status: &str| {
            doc["paths"][path][method]["responses"][status]["content"][media::JSON]["schema"]
                .clone()
        };
        let required = |schema: &Value| -> BTreeSet<String> {
            schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        for path in [
            "/pid/{pid}/statistics",
            "/statistics",
            "/snapshots/{id}/statistics",
        ] {
            let stats = schema(path, "get", "200");
            assert!(required(&stats).contains("statistics"), "{path}");
            assert!(!required(&stats).contains("pid"), "{path}");
        }
        assert_eq!(
            schema("/health", "get", "200")["properties"]["status"]["type"],
            "string"
        );
        assert!(required(&schema("/snapshots", "post", "201")).contains("id"));
        assert_eq!(
            schema("/pid/{pid}", "get", "200")["properties"]["ppid"]["type"],
            serde_json::json!(["integer", "null"])
        );
        // No type: any object.
        assert_eq!(schema("/maps", "get", "200")["type"], "object");
        assert!(schema("/maps", "get", "200").get("required").is_none());
    }

    #[test]
    fn the_statuses_of_each_route_are_those_docs_api_md_gives() {
        // docs/api.md's statuses by route: what every route can answer
        // (400 401 413 500 503), and each route's own.
        let common = [400, 401, 413, 500, 503];
        let expected: &[(&str, &str, &[u16])] = &[
            ("GET", "/health", &[200]),
            ("GET", "/pid/{pid}", &[200, 404]),
            ("GET", "/pid/{pid}/statistics", &[200, 404, 409, 429]),
            ("GET", "/compare", &[200, 404, 409, 429]),
            ("POST", "/pid/{pid}/snapshots", &[201, 404, 409, 429, 507]),
            ("POST", "/pid/{pid}/clear-traces", &[200, 403, 404, 409]),
            ("POST", "/pid/{pid}/reset-peak", &[200, 404, 409]),
            ("POST", "/snapshots", &[201, 403, 408, 409, 429, 507]),
            ("PATCH", "/snapshots/{id}", &[200, 404, 409, 429, 507]),
            ("DELETE", "/snapshots/{id}", &[200, 404, 409, 429]),
            ("GET", "/snapshots/{id}/dump", &[200, 404, 409, 429]),
            ("PUT", "/scope", &[200, 403, 409]),
            ("POST", "/tracing/stop", &[200, 403, 409]),
            ("GET", "/ui/{asset}", &[200, 404]),
            ("GET", "/metrics", &[200]),
            ("GET", "/openapi.json", &[200]),
        ];
        for (method, path, own) in expected {
            let route = ROUTES.iter().find(|r| r.path == *path).unwrap();
            let op = route
                .ops
                .iter()
                .find(|o| o.method.as_str() == *method)
                .unwrap();
            let mut want: Vec<u16> = own.iter().chain(common.iter()).copied().collect();
            want.sort_unstable();
            assert_eq!(op.statuses(route), want, "{method} {path}");
        }
    }
}
