//! Rendering answers: tracemalloc's text (`str()` lines, with
//! `Traceback.format()` lines and source when asked) or JSON with the query
//! and the data's completeness; statistics and compares also as profiles
//! (`format=pprof`, `collapsed`, `svg`, built by `crate::profile`; here
//! only their content types and headers). The statistics, compare and
//! traces answers of every target (a process, the system, a stored
//! snapshot) are made here.
use std::collections::BTreeMap;
use std::io::Write as _;

use axum::{
    http::{HeaderName, HeaderValue, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use serde_json::Value;
use tracer_api::{
    CompareAnswer, CompareSide, SideKind, StatisticsAnswer, StatisticsTarget, TracesAnswer,
    TracesTarget,
};
use tracer_model::{
    Completeness, GroupBy, ModelError, Snapshot, Statistic, StatisticDiff, Trace, Traceback,
};

use super::error::ApiError;
use super::params::spec::FILTERS;
use super::params::{Format, Params, TextOptions};
use super::wire;
use super::work::Sink;
use crate::profile::{Collapsed, Pprof, ProfileFormat, Selection, Stacks, Svg};
use crate::service::{ServiceError, Side};
use crate::store::wire_completeness;
use crate::symbolize::LineCache;

/// Text output as the query's options ask.
impl TextOptions {
    /// The lines for one item: its `str()`, then its traceback's
    /// `format()` lines if asked.
    pub fn lines(
        &self,
        head: String,
        traceback: &Traceback,
        cache: &mut LineCache,
        out: &mut Vec<String>,
    ) {
        out.push(head);
        if self.tracebacks {
            let source = self.source;
            out.extend(
                traceback.format_with(self.tb_limit, self.most_recent_first, |f, l| {
                    if source {
                        cache.getline(f, l)
                    } else {
                        String::new()
                    }
                }),
            );
        }
    }

    /// The lines of every item of `items` (see [`TextOptions::lines`]).
    fn all_lines<T: std::fmt::Display>(
        &self,
        items: &[T],
        traceback: impl Fn(&T) -> &Traceback,
    ) -> Vec<String> {
        let mut cache = LineCache::new();
        let mut lines = Vec::new();
        for item in items {
            self.lines(item.to_string(), traceback(item), &mut cache, &mut lines);
        }
        lines
    }
}

pub fn text_response(lines: &[String], headers: &[(&'static str, String)]) -> Response {
    let mut body = String::new();
    for line in lines {
        body.push_str(line);
        body.push('\n');
    }
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(*name, value);
        }
    }
    response
}

#[derive(Serialize)]
struct StatisticOut<'a> {
    #[serde(flatten)]
    statistic: &'a Statistic,
    text: String,
}

#[derive(Serialize)]
struct StatisticDiffOut<'a> {
    #[serde(flatten)]
    diff: &'a StatisticDiff,
    text: String,
}

#[derive(Serialize)]
struct TraceOut<'a> {
    #[serde(flatten)]
    trace: &'a Trace,
    text: String,
}

/// What every statistics-like route parses.
#[derive(Clone, Debug)]
pub struct StatsQuery {
    selection: Selection,
    format: Format,
    options: TextOptions,
    filters: BTreeMap<String, Vec<String>>,
}

/// The filters as asked, by parameter name (the answers' `filters`).
pub fn filters_asked(params: &Params) -> BTreeMap<String, Vec<String>> {
    FILTERS
        .iter()
        .map(|p| (p.name.to_string(), params.all(p.name).to_vec()))
        .filter(|(_, values)| !values.is_empty())
        .collect()
}

/// The query of a statistics or compare route. The profile formats
/// (`pprof`, `collapsed`, `svg`) default to `group_by=traceback` and
/// `limit=0` (every group), and refuse `cumulative=true` (a profile's
/// readers sum the stacks themselves).
///
/// # Errors
/// 400 naming the valid values.
pub fn stats_query(params: &Params) -> Result<StatsQuery, ApiError> {
    let format = params.format()?;
    let profile = format.is_profile();
    let selection = Selection {
        group_by: match params.get("group_by") {
            None if profile => GroupBy::Traceback,
            _ => params.group_by()?,
        },
        cumulative: params.flag("cumulative")?,
        limit: match params.get("limit") {
            None if profile => 0,
            _ => params.limit()?,
        },
        filters: Vec::new(),
    };
    let options = params.text_options(format == Format::Text)?;
    let query = StatsQuery {
        selection: Selection {
            filters: params.filters()?,
            ..selection
        },
        format,
        options,
        filters: filters_asked(params),
    };
    let selection = &query.selection;
    if selection.cumulative && profile {
        return Err(ApiError::bad(
            "cumulative=true does not apply to format=pprof, collapsed or svg",
            "leave cumulative out: a profile's stacks give the cumulative sizes (pprof's cum column, a flame graph's widths)",
        ));
    }
    if selection.cumulative && selection.group_by == GroupBy::Traceback {
        return Err(ModelError::CumulativeTraceback.into());
    }
    Ok(query)
}

/// The text headers that say whether the data is complete (text has no
/// room for it in its lines, which are tracemalloc's own).
fn completeness_headers(completeness: &Completeness) -> [(&'static str, String); 3] {
    [
        ("x-tracer-complete", completeness.is_complete().to_string()),
        ("x-tracer-drops", completeness.drops().to_string()),
        (
            "x-tracer-cut-tracebacks",
            completeness.cut_tracebacks().to_string(),
        ),
    ]
}

/// Statistics of `snapshot` (filtered) as JSON of `target` with its
/// completeness, or text.
pub fn statistics_response(
    snapshot: &Snapshot,
    completeness: &Completeness,
    query: &StatsQuery,
    target: StatisticsTarget,
) -> Result<Response, ApiError> {
    let filtered = query.selection.filter(snapshot);
    let grouped = query.selection.statistics(&filtered)?;
    let (stats, total) = (grouped.groups, grouped.total);
    if query.format == Format::Text {
        let lines = query.options.all_lines(&stats, |s| &s.traceback);
        return Ok(text_response(&lines, &completeness_headers(completeness)));
    }
    if query.format.is_profile() {
        let title = format!("tracer: {}: bytes in use", target_name(&target));
        let stacks = Stacks::of_statistics(&stats, query.selection.group_by, title);
        return profile_response(query.format, &stacks, &completeness_headers(completeness));
    }
    let statistics = stats
        .iter()
        .map(|s| StatisticOut {
            statistic: s,
            text: s.to_string(),
        })
        .collect();
    wire(&StatisticsAnswer {
        target,
        completeness: wire_completeness(completeness),
        cumulative: query.selection.cumulative,
        filters: query.filters.clone(),
        group_by: query.selection.group_by.as_str().to_string(),
        limit: query.selection.limit,
        statistics,
        total,
        traceback_limit: filtered.traceback_limit(),
        traces: filtered.blocks(),
    })
}

/// `new.compare_to(base)` of the filtered sides, as JSON or text; `pid`:
/// the process of `/pid/{pid}/compare`. Each side says its completeness;
/// the answer is complete when both are.
pub fn compare_response(
    base: &Side,
    new: &Side,
    query: &StatsQuery,
    pid: Option<u32>,
) -> Result<Response, ApiError> {
    let grouped = query.selection.compare(&base.snapshot, &new.snapshot)?;
    let (diffs, total) = (grouped.groups, grouped.total);
    let complete = base.completeness.is_complete() && new.completeness.is_complete();
    let base_header = match &base.info {
        SideKind::Snapshot { id, .. } => format!("snapshot {id}"),
        SideKind::Since { .. } => "since".to_string(),
        SideKind::TracingStart { .. } | SideKind::Now { .. } => "tracing-start".to_string(),
    };
    let headers = [
        ("x-tracer-base", base_header),
        ("x-tracer-complete", complete.to_string()),
        ("x-tracer-base-drops", base.completeness.drops().to_string()),
        ("x-tracer-new-drops", new.completeness.drops().to_string()),
        (
            "x-tracer-new-cut-tracebacks",
            new.completeness.cut_tracebacks().to_string(),
        ),
    ];
    if query.format == Format::Text {
        let lines = query.options.all_lines(&diffs, |d| &d.traceback);
        return Ok(text_response(&lines, &headers));
    }
    if query.format.is_profile() {
        let target = match pid {
            Some(pid) => format!("pid {pid}, "),
            None => String::new(),
        };
        let title = format!(
            "tracer: compare, {target}{} (base) to {} (new): bytes in use",
            side_name(&base.info),
            side_name(&new.info)
        );
        let stacks = Stacks::of_diffs(&diffs, query.selection.group_by, title);
        return profile_response(query.format, &stacks, &headers);
    }
    let statistics = diffs
        .iter()
        .map(|d| StatisticDiffOut {
            diff: d,
            text: d.to_string(),
        })
        .collect();
    let side = |side: &Side| CompareSide {
        kind: side.info.clone(),
        completeness: wire_completeness(&side.completeness),
    };
    wire(&CompareAnswer {
        base: side(base),
        complete,
        cumulative: query.selection.cumulative,
        filters: query.filters.clone(),
        group_by: query.selection.group_by.as_str().to_string(),
        limit: query.selection.limit,
        new: side(new),
        pid,
        statistics,
        total,
    })
}

/// What a statistics answer is of: `pid 1234 (comm)`, `snapshot 3 "label"
/// of pid 1234`, or every traced process.
fn target_name(target: &StatisticsTarget) -> String {
    match target {
        StatisticsTarget::Process { pid, process, .. } => match process {
            Some(process) => format!("pid {pid} ({})", process.comm),
            None => format!("pid {pid}"),
        },
        StatisticsTarget::Stored { snapshot } => {
            snapshot_name(snapshot.id, snapshot.label.as_deref(), snapshot.pid)
        }
        StatisticsTarget::System { .. } => "every traced process".to_string(),
    }
}

/// `snapshot 3 "label" of pid 1234`: a snapshot's id, its label and its
/// process when it has them.
fn snapshot_name(id: u64, label: Option<&str>, pid: Option<u32>) -> String {
    let mut name = format!("snapshot {id}");
    if let Some(label) = label {
        name.push_str(&format!(" {label:?}"));
    }
    if let Some(pid) = pid {
        name.push_str(&format!(" of pid {pid}"));
    }
    name
}

/// A compare side's name: a snapshot, `now`, `tracing start`, `since`.
fn side_name(side: &SideKind) -> String {
    match side {
        SideKind::Snapshot { id, .. } => snapshot_name(*id, side.label(), None),
        SideKind::TracingStart { .. } => "tracing start".to_string(),
        SideKind::Now { .. } => "now".to_string(),
        SideKind::Since { .. } => "since".to_string(),
    }
}

/// `stacks` as a profile answer in `format` (pprof, collapsed or svg),
/// with its content type and `headers`.
///
/// # Errors
/// 500 when encoding fails (it writes into memory: never in practice).
fn profile_response(
    format: Format,
    stacks: &Stacks<'_>,
    headers: &[(&'static str, String)],
) -> Result<Response, ApiError> {
    let (encoder, content_type): (&dyn ProfileFormat, _) = match format {
        Format::Pprof => (&Pprof, "application/octet-stream"),
        Format::Collapsed => (&Collapsed, "text/plain; charset=utf-8"),
        Format::Svg | Format::Json | Format::Text => (&Svg, "image/svg+xml"),
    };
    let body = encoder
        .encode(stacks)
        .map_err(|err| ApiError::internal(format!("encoding the profile: {err}")))?;
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(*name, value);
        }
    }
    Ok(response)
}

/// The traces of `snapshot` (filtered), `offset`/`limit` paged, as JSON
/// of `target` (with its completeness) or text (`str(Trace)` per line), written into
/// `sink` trace by trace: the answer holds a chunk at a time whatever the
/// number of traces. The JSON is what `Json(head + {"traces": [...]})`
/// would be, byte for byte: the answer's keys sorted (it is sent as
/// through a Value), `traces` at its place among them, each trace
/// `{...Trace, "text": str(trace)}`.
///
/// # Errors
/// 400 for a bad parameter (before anything is written); the sink's error
/// (nobody reads, the budget) once writing.
pub fn write_traces(
    sink: &mut Sink,
    snapshot: &Snapshot,
    completeness: &Completeness,
    params: &Params,
    target: TracesTarget,
) -> Result<(), ApiError> {
    let text = params.text()?;
    let options = params.text_options(text)?;
    let filters = params.filters()?;
    let offset = params.count(
        "offset",
        0,
        "offset is a whole number >= 0 (the first trace is 0)",
    )?;
    let limit = params.limit()?;
    let filtered = snapshot.filter_traces(&filters);
    tracer_model::interrupt::check().map_err(ServiceError::from)?;
    let total = filtered.traces().len();
    let end = if limit == 0 {
        total
    } else {
        offset.saturating_add(limit).min(total)
    };
    let page = filtered.traces().get(offset.min(total)..end).unwrap_or(&[]);
    let written = if text {
        let mut headers = vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )];
        for (name, value) in completeness_headers(completeness) {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.push((HeaderName::from_static(name), value));
            }
        }
        sink.begin(headers);
        write_text_lines(sink, &options, page)
    } else {
        // The answer without its traces: `traces` at its place among the
        // keys, as the map orders them.
        let answer = TracesAnswer::<()> {
            target,
            completeness: wire_completeness(completeness),
            filters: filters_asked(params),
            limit,
            offset,
            total,
            traceback_limit: filtered.traceback_limit(),
            traces: Vec::new(),
        };
        let head = match tracer_api::to_wire(&answer) {
            Ok(Value::Object(head)) => head,
            Ok(_) => serde_json::Map::new(),
            Err(err) => return Err(ApiError::internal(format!("encoding the answer: {err}"))),
        };
        sink.begin(vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )]);
        write_json_traces(sink, &head, page)
    };
    written.map_err(|err| ApiError::internal(format!("writing the answer: {err}")))
}

/// `str(trace)` per line, with its traceback's lines if asked.
fn write_text_lines(sink: &mut Sink, options: &TextOptions, page: &[Trace]) -> std::io::Result<()> {
    let mut cache = LineCache::new();
    let mut lines = Vec::new();
    for trace in page {
        options.lines(trace.to_string(), &trace.traceback, &mut cache, &mut lines);
        for line in lines.drain(..) {
            sink.write_all(line.as_bytes())?;
            sink.write_all(b"\n")?;
        }
    }
    Ok(())
}

/// `head` as compact JSON, its `traces` key's value the `page`'s traces.
fn write_json_traces(
    sink: &mut Sink,
    head: &serde_json::Map<String, Value>,
    page: &[Trace],
) -> std::io::Result<()> {
    sink.write_all(b"{")?;
    for (at, (key, value)) in head.iter().enumerate() {
        if at > 0 {
            sink.write_all(b",")?;
        }
        serde_json::to_writer(&mut *sink, key)?;
        sink.write_all(b":")?;
        if key != "traces" {
            serde_json::to_writer(&mut *sink, value)?;
            continue;
        }
        sink.write_all(b"[")?;
        for (i, trace) in page.iter().enumerate() {
            if i > 0 {
                sink.write_all(b",")?;
            }
            let out = TraceOut {
                trace,
                text: trace.to_string(),
            };
            // Through a Value, as the whole answer was: its keys sorted
            // as the map sorts them.
            serde_json::to_writer(&mut *sink, &serde_json::to_value(&out)?)?;
        }
        sink.write_all(b"]")?;
    }
    sink.write_all(b"}")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tracer_model::{AllocatorFamily, Frame};

    use super::*;
    use crate::http::params::spec;

    /// The JSON body of `response`.
    fn body(response: Response) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let bytes = runtime
            .block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
            .expect("a body");
        String::from_utf8(bytes.to_vec()).expect("UTF-8")
    }

    fn snapshot(size: u64) -> Arc<Snapshot> {
        let trace = Trace {
            domain: 42,
            size,
            traceback: Arc::new(Traceback::new(vec![Frame::new("a.c", 3)], Some(1))),
            source: AllocatorFamily::default(),
        };
        Arc::new(Snapshot::new(vec![trace], 1))
    }

    #[test]
    fn a_compare_answer_is_the_json_it_was() {
        let params =
            Params::parse(Some("limit=5&include=a.c"), spec::COMPARE_NOW).expect("a query");
        let query = stats_query(&params).expect("a query");
        let base = Side {
            snapshot: snapshot(8),
            info: SideKind::Snapshot {
                id: 3,
                snapshot_kind: tracer_api::SnapshotKind::Taken,
                label: Some(Some("before".into())),
                taken_at_ms: 5,
                allocator_frames: Some(None),
                since_ms: None,
            },
            completeness: Completeness::of_process(42, 2, 0),
            allocator_frames: None,
        };
        let new = Side {
            snapshot: snapshot(24),
            info: SideKind::Now {
                at_ms: 9,
                allocator_frames: tracer_api::AllocatorFrames::Drop,
            },
            completeness: Completeness::complete(),
            allocator_frames: None,
        };
        let response = compare_response(&base, &new, &query, Some(42)).expect("an answer");
        assert_eq!(
            body(response),
            concat!(
                r#"{"base":{"allocator_frames":null,"complete":false,"cut_tracebacks":0,"cut_tracebacks_by_pid":{},"drops":2,"drops_by_pid":{"42":2},"id":3,"kind":"snapshot","label":"before","snapshot_kind":"taken","taken_at_ms":5},"#,
                r#""complete":false,"cumulative":false,"filters":{"include":["a.c"]},"group_by":"lineno","limit":5,"#,
                r#""new":{"allocator_frames":"drop","at_ms":9,"complete":true,"cut_tracebacks":0,"cut_tracebacks_by_pid":{},"drops":0,"drops_by_pid":{},"kind":"now"},"#,
                r#""pid":42,"statistics":[{"count":1,"count_diff":0,"size":24,"size_diff":16,"text":"a.c:3: size=24 B (+16 B), count=1 (+0), average=24 B","traceback":[{"filename":"a.c","lineno":3}]}],"total":1}"#,
            )
        );
    }

    #[test]
    fn a_statistics_answer_is_the_json_it_was() {
        let params = Params::parse(None, spec::STATISTICS_NOW).expect("a query");
        let query = stats_query(&params).expect("a query");
        let target = tracer_api::StatisticsTarget::System {
            allocator_frames: tracer_api::AllocatorFrames::Drop,
            current: 8,
            peak: 9,
            pids: vec![42],
            totals: tracer_api::Totals::PerBlock,
        };
        let response = statistics_response(&snapshot(8), &Completeness::complete(), &query, target)
            .expect("an answer");
        assert_eq!(
            body(response),
            concat!(
                r#"{"allocator_frames":"drop","complete":true,"cumulative":false,"current":8,"cut_tracebacks":0,"cut_tracebacks_by_pid":{},"drops":0,"drops_by_pid":{},"#,
                r#""filters":{},"group_by":"lineno","limit":50,"peak":9,"pids":[42],"#,
                r#""statistics":[{"count":1,"size":8,"text":"a.c:3: size=8 B, count=1, average=8 B","traceback":[{"filename":"a.c","lineno":3}]}],"#,
                r#""total":1,"totals":"per_block","traceback_limit":1,"traces":1}"#,
            )
        );
    }
}
