//! `statistics()`, `compare_to()` and the traces, of a process now, of
//! every process now (one domain per pid), and of stored snapshots, each
//! with the filters of `Snapshot.filter_traces()`. The views of now take
//! `allocator_frames` (drop or keep the allocation machinery's leading
//! frames); those of stored snapshots refuse it, saying why.
use std::sync::Arc;

use axum::{
    extract::{Path, RawQuery, State},
    response::Response,
};
use serde_json::json;

use crate::http::params::{
    ALLOCATOR_FRAMES, Params, compare_specs, parse_pid, parse_ref, refuse_allocator_frames, spec,
    stored_allocator_frames,
};
use crate::http::render::{
    compare_response, object, statistics_response, stats_query, write_traces,
};
use crate::http::{ApiError, blocking, streamed};
use crate::service::{Service, Side, Target, Viewer};

/// `allocator_frames` of a compare, refused when `new` is a stored
/// snapshot (only now is taken here).
fn compare_frames(
    params: &Params,
    new: Option<&crate::service::SnapshotRef>,
) -> Result<crate::snapshot::AllocatorFrames, ApiError> {
    if new.is_some() && params.get(ALLOCATOR_FRAMES).is_some() {
        return Err(stored_allocator_frames(
            "new is a stored snapshot (allocator_frames goes with new=now)",
        ));
    }
    params.allocator_frames()
}

/// `GET /pid/{pid}/statistics`.
pub async fn pid_statistics(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(query.as_deref(), spec::STATISTICS_NOW)?;
    let query = stats_query(&params)?;
    let frames = params.allocator_frames()?;
    blocking(move || {
        let now = service.grouped_now(viewer, Target::Process(pid), frames)?;
        let totals = if now.snapshot.is_totals() {
            "per_stack"
        } else {
            "per_block"
        };
        statistics_response(
            &now.snapshot,
            &now.completeness,
            &query,
            object(json!({"pid": pid, "process": now.process.map(|p| p.view),
                          "allocator_frames": now.allocator_frames, "totals": totals})),
        )
    })
    .await
}

/// `GET /statistics`: every traced process now.
pub async fn system_statistics(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), spec::STATISTICS_NOW)?;
    let query = stats_query(&params)?;
    let frames = params.allocator_frames()?;
    blocking(move || {
        let now = service.snapshot_now_with(viewer, Target::System, frames)?;
        let head = object(
            json!({"pids": now.pids, "current": now.traced_memory.0, "peak": now.traced_memory.1,
                   "allocator_frames": now.allocator_frames}),
        );
        statistics_response(&now.snapshot, &now.completeness, &query, head)
    })
    .await
}

/// `GET /snapshots/{id}/statistics`.
pub async fn snapshot_statistics(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    refuse_allocator_frames(query.as_deref())?;
    let params = Params::parse(query.as_deref(), spec::STATISTICS_STORED)?;
    let query = stats_query(&params)?;
    blocking(move || {
        let (stored, summary, _) = service.stored(viewer, &reference)?;
        statistics_response(
            &stored.snapshot,
            &stored.completeness,
            &query,
            object(json!({"snapshot": summary})),
        )
    })
    .await
}

/// `GET /pid/{pid}/compare`.
pub async fn pid_compare(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(query.as_deref(), spec::COMPARE_NOW)?;
    let query = stats_query(&params)?;
    let (base, new) = compare_specs(&params)?;
    let frames = compare_frames(&params, new.as_ref())?;
    blocking(move || {
        let (base, new) =
            service.compare_sides(viewer, Target::Process(pid), &base, new.as_ref(), frames)?;
        compare_response(&base, &new, &query, object(json!({"pid": pid})))
    })
    .await
}

/// `GET /compare`: every traced process.
pub async fn system_compare(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), spec::COMPARE_NOW)?;
    let query = stats_query(&params)?;
    let (base, new) = compare_specs(&params)?;
    let frames = compare_frames(&params, new.as_ref())?;
    blocking(move || {
        let (base, new) =
            service.compare_sides(viewer, Target::System, &base, new.as_ref(), frames)?;
        compare_response(&base, &new, &query, serde_json::Map::new())
    })
    .await
}

/// `GET /snapshots/{id}/compare?base=`: any two stored snapshots.
pub async fn snapshot_compare(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let new = parse_ref("id", &id)?;
    refuse_allocator_frames(query.as_deref())?;
    let params = Params::parse(query.as_deref(), spec::COMPARE_STORED)?;
    let query = stats_query(&params)?;
    let base = params.snapshot_ref("base")?.ok_or_else(|| {
        ApiError::bad(
            "base is missing",
            "give base=ID or base=LABEL of the older snapshot (GET /snapshots lists them)",
        )
    })?;
    blocking(move || {
        let (new_stored, _, new_info) = service.stored(viewer, &new)?;
        let (base_stored, _, base_info) = service.stored(viewer, &base)?;
        let (base, new) = (
            Side::stored(&base_stored, &base_info),
            Side::stored(&new_stored, &new_info),
        );
        Side::check_alike(&base, &new)?;
        compare_response(&base, &new, &query, serde_json::Map::new())
    })
    .await
}

/// `GET /pid/{pid}/traces`.
pub async fn pid_traces(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(query.as_deref(), spec::TRACES_NOW)?;
    params.text_options(params.text()?)?;
    let frames = params.allocator_frames()?;
    streamed(move |sink| {
        let now = service.snapshot_now_with(viewer, Target::Process(pid), frames)?;
        write_traces(
            sink,
            &now.snapshot,
            &now.completeness,
            &params,
            object(json!({"pid": pid, "allocator_frames": now.allocator_frames})),
        )
    })
    .await
}

/// `GET /traces`: every traced process.
pub async fn system_traces(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), spec::TRACES_NOW)?;
    params.text_options(params.text()?)?;
    let frames = params.allocator_frames()?;
    streamed(move |sink| {
        let now = service.snapshot_now_with(viewer, Target::System, frames)?;
        write_traces(
            sink,
            &now.snapshot,
            &now.completeness,
            &params,
            object(json!({"pids": now.pids, "allocator_frames": now.allocator_frames})),
        )
    })
    .await
}

/// `GET /snapshots/{id}/traces`.
pub async fn snapshot_traces(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    refuse_allocator_frames(query.as_deref())?;
    let params = Params::parse(query.as_deref(), spec::TRACES_STORED)?;
    params.text_options(params.text()?)?;
    streamed(move |sink| {
        let (stored, summary, _) = service.stored(viewer, &reference)?;
        write_traces(
            sink,
            &stored.snapshot,
            &stored.completeness,
            &params,
            object(json!({"snapshot": summary})),
        )
    })
    .await
}
