//! Stored snapshots as resources: take one (`POST /pid/{pid}/snapshots`,
//! `POST /snapshots` with no body), load a file (`POST /snapshots` with a
//! body), list, show, label, delete and dump them.
use std::sync::Arc;

use axum::{
    Json,
    body::Bytes,
    extract::{Path, RawQuery, State, rejection::BytesRejection},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use tracer_api::{SnapshotDeleted, SnapshotHeader, SnapshotList};
use tracer_model::{dump_tracemalloc, encode};

use crate::http::params::{
    Params, parse_pid, parse_ref, refuse_allocator_frames, spec, stored_allocator_frames,
};
use crate::http::{ApiError, blocking, wire};
use crate::service::{Service, Target, Viewer};
use crate::store::{wire_completeness, wire_frames, wire_kind};

/// `format=tracer` (the default) or `format=tracemalloc`: true for the
/// latter.
fn file_format(params: &Params) -> Result<bool, ApiError> {
    match params.get("format") {
        None => Ok(false),
        Some(v) => match spec::FILE_FORMATS.iter().position(|f| *f == v) {
            Some(at) => Ok(at == 1),
            None => Err(ApiError::bad(
                format!("invalid format {v:?}"),
                format!("format is one of: {}", spec::FILE_FORMATS.join(", ")),
            )),
        },
    }
}

/// `POST /pid/{pid}/snapshots?label=&allocator_frames=`: `take_snapshot()`,
/// stored with how it treated the allocation machinery's frames.
pub async fn pid_take_snapshot(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(query.as_deref(), spec::TAKE)?;
    let label = params.label()?.flatten();
    let frames = params.allocator_frames()?;
    let summary =
        blocking(move || service.store_now(viewer, Target::Process(pid), label, frames)).await?;
    Ok((StatusCode::CREATED, Json(summary.wire())).into_response())
}

/// `GET /pid/{pid}/snapshots`: the stored snapshots of its current image.
pub async fn pid_snapshots(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let list = blocking(move || service.list_snapshots(viewer, Some(pid))).await?;
    wire(&SnapshotList {
        pid: Some(pid),
        snapshots: list.iter().map(|s| s.wire()).collect(),
        unreadable: None,
    })
}

/// `GET /snapshots?pid=&kind=`: every stored snapshot, and the files that
/// were refused at start.
pub async fn list_snapshots(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), spec::LIST)?;
    let pid = params.get("pid").map(parse_pid).transpose()?;
    let kind = match params.get("kind") {
        None => None,
        Some(k) if spec::KINDS.contains(&k) => Some(k.to_string()),
        Some(k) => {
            return Err(ApiError::bad(
                format!("invalid kind {k:?}"),
                format!("kind is one of: {}", spec::KINDS.join(", ")),
            ));
        }
    };
    let (list, unreadable) = blocking(move || {
        let list = service.list_snapshots(viewer, None)?;
        // The refused files are the operators' to see (paths in tracerd's
        // state directory).
        let unreadable = if viewer.is_operator() {
            service.unreadable_snapshots()
        } else {
            Vec::new()
        };
        Ok::<_, ApiError>((list, unreadable))
    })
    .await?;
    let list: Vec<_> = list
        .into_iter()
        .filter(|s| pid.is_none_or(|p| s.pid == Some(p)))
        .filter(|s| kind.as_deref().is_none_or(|k| s.kind.as_str() == k))
        .collect();
    let unreadable = unreadable
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()
        .map_err(|err| ApiError::internal(format!("encoding the answer: {err}")))?;
    wire(&SnapshotList {
        pid: None,
        snapshots: list.iter().map(|s| s.wire()).collect(),
        unreadable: Some(unreadable),
    })
}

/// `POST /snapshots`: with no body, takes a system-wide snapshot
/// (`allocator_frames` as a view of now); with a body, loads that file
/// (`format=tracer`, the default, or `tracemalloc`).
pub async fn post_snapshots(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // Its own error (413, 408, 400) rather than axum's text.
    let body = body?;
    let params = Params::parse(query.as_deref(), spec::TAKE_OR_LOAD)?;
    let label = params.label()?.flatten();
    let tracemalloc = file_format(&params)?;
    let frames = params.allocator_frames()?;
    let summary = if body.is_empty() {
        if params.get("format").is_some() {
            return Err(ApiError::bad(
                "format is given but the body is empty",
                "send the snapshot file as the body to load it; an empty body takes a system-wide snapshot",
            ));
        }
        blocking(move || service.store_now(viewer, Target::System, label, frames)).await?
    } else if params.get(spec::ALLOCATOR_FRAMES).is_some() {
        return Err(stored_allocator_frames(
            "a loaded file keeps what it records (send an empty body to take a snapshot)",
        ));
    } else {
        blocking(move || service.load_snapshot(viewer, &body, tracemalloc, label)).await?
    };
    Ok((StatusCode::CREATED, Json(summary.wire())).into_response())
}

/// `GET /snapshots/{id}`: one stored snapshot's summary.
pub async fn snapshot_summary(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    refuse_allocator_frames(query.as_deref())?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let summary = blocking(move || service.stored_summary(viewer, &reference)).await?;
    Ok(Json(summary.wire()).into_response())
}

/// `DELETE /snapshots/{id}`.
pub async fn delete_snapshot(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let summary = blocking(move || service.delete_snapshot(viewer, &reference)).await?;
    wire(&SnapshotDeleted {
        deleted: summary.wire(),
    })
}

/// `PATCH /snapshots/{id}?label=`: sets (or with an empty value removes) a
/// label.
pub async fn label_snapshot(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    let params = Params::parse(query.as_deref(), spec::RELABEL)?;
    let label = params.label()?.ok_or_else(|| {
        ApiError::bad(
            "label is missing",
            "PATCH /snapshots/{id}?label=NAME sets a label; label= (empty) removes it",
        )
    })?;
    let summary = blocking(move || service.label_snapshot(viewer, &reference, label)).await?;
    Ok(Json(summary.wire()).into_response())
}

/// `GET /snapshots/{id}/dump?format=`: the snapshot as a file, tracer's
/// format or a tracemalloc pickle.
pub async fn snapshot_dump(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let reference = parse_ref("id", &id)?;
    refuse_allocator_frames(query.as_deref())?;
    let params = Params::parse(query.as_deref(), spec::DUMP)?;
    let tracemalloc = file_format(&params)?;
    let (bytes, name) = blocking(move || {
        let (stored, summary, _) = service.stored(viewer, &reference)?;
        let bytes = if tracemalloc {
            dump_tracemalloc(&stored.snapshot)
        } else {
            // The store's header without its own fields (generation,
            // start time, owner, source format).
            let header = SnapshotHeader {
                allocator_frames: summary.allocator_frames.map(wire_frames),
                comm: summary.comm.clone(),
                id: Some(summary.id),
                kind: Some(wire_kind(summary.kind)),
                label: summary.label.clone(),
                pid: summary.pid,
                taken_at_ms: Some(summary.taken_at_ms),
                traced_memory: Some([summary.current, summary.peak]),
                store: None,
                completeness: wire_completeness(&stored.completeness),
            };
            encode(&stored.snapshot, &header.to_meta())
        };
        let name = format!(
            "snapshot-{}.{}",
            summary.id,
            if tracemalloc { "pickle" } else { "tsnap" }
        );
        Ok::<_, ApiError>((bytes, name))
    })
    .await?;
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    Ok(response)
}
