//! tracemalloc's module functions that change or ask the tracing state:
//! `is_tracing()`/`get_traceback_limit()`, `start(nframe)`, `stop()`,
//! `clear_traces()`, `reset_peak()`, and `get_object_traceback()`.
use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, RawQuery, State},
    response::{IntoResponse, Response},
};
use tracer_api::{AllocatorFrames, ClearedTraces, ObjectTraceback, PeakReset};

use crate::http::params::{Params, nframe_param, parse_address, parse_pid, spec};
use crate::http::render::text_response;
use crate::http::{ApiError, blocking, wire};
use crate::service::{Service, Viewer};
use crate::symbolize::LineCache;

/// `GET /pid/{pid}/tracing`.
pub async fn pid_tracing(
    State(service): State<Arc<Service>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let state = blocking(move || service.tracing_state(Viewer::Operator, Some(pid))).await?;
    Ok(Json(state).into_response())
}

/// `GET /tracing`.
pub async fn system_tracing(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let state = blocking(move || service.tracing_state(viewer, None)).await?;
    Ok(Json(state).into_response())
}

/// `POST /pid/{pid}/tracing/start?nframe=`.
pub async fn pid_tracing_start(
    State(service): State<Arc<Service>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let params = Params::parse(query.as_deref(), spec::PID_START)?;
    let nframe = nframe_param(&params)?;
    let descendants = params.flag("descendants")?;
    let state = blocking(move || {
        service.start_exact_for(pid, descendants)?;
        service.start_tracing(Some(pid), nframe)
    })
    .await?;
    Ok(Json(state).into_response())
}

/// `POST /pid/{pid}/tracing/stop`.
pub async fn pid_tracing_stop(
    State(service): State<Arc<Service>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let state = blocking(move || {
        let state = service.stop_tracing(Some(pid));
        // Traced on demand: its probes go too (and its descendants'), so
        // it costs nothing again; even when it had no image to stop.
        service.release_exact(pid);
        state
    })
    .await?;
    Ok(Json(state).into_response())
}

/// `POST /tracing/start?nframe=`.
pub async fn system_tracing_start(
    State(service): State<Arc<Service>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(query.as_deref(), spec::START)?;
    let nframe = nframe_param(&params)?;
    let state = blocking(move || service.start_tracing(None, nframe)).await?;
    Ok(Json(state).into_response())
}

/// `POST /tracing/stop`.
pub async fn system_tracing_stop(
    State(service): State<Arc<Service>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let state = blocking(move || service.stop_tracing(None)).await?;
    Ok(Json(state).into_response())
}

/// `POST /pid/{pid}/clear-traces`.
pub async fn pid_clear_traces(
    State(service): State<Arc<Service>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let (cleared, status) = blocking(move || service.clear_traces(pid)).await?;
    let view = status.view;
    wire(&ClearedTraces {
        blocks: view.blocks,
        cleared_blocks: cleared,
        current: view.current,
        peak: view.peak,
        pid,
    })
}

/// `POST /pid/{pid}/reset-peak`.
pub async fn pid_reset_peak(
    State(service): State<Arc<Service>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let status = blocking(move || service.reset_peak(pid)).await?;
    wire(&PeakReset {
        current: status.view.current,
        peak: status.view.peak,
        pid,
    })
}

/// `GET /pid/{pid}/object/{address}`: `get_object_traceback()`.
pub async fn pid_object(
    State(service): State<Arc<Service>>,
    Path((pid, address)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    let address = parse_address(&address)?;
    let params = Params::parse(query.as_deref(), spec::OBJECT)?;
    let text = params.text()?;
    let mut options = params.text_options(text)?;
    let frames = params.allocator_frames()?;
    let trace = blocking(move || service.object_traceback(pid, address, frames)).await?;
    if text {
        // get_object_traceback() returns a Traceback: its format() lines.
        options.tracebacks = true;
        let mut lines = Vec::new();
        let mut cache = LineCache::new();
        options.lines(String::new(), &trace.traceback, &mut cache, &mut lines);
        return Ok(text_response(lines.get(1..).unwrap_or_default(), &[]));
    }
    wire(&ObjectTraceback {
        address,
        allocator_frames: match frames {
            crate::snapshot::AllocatorFrames::Drop => AllocatorFrames::Drop,
            crate::snapshot::AllocatorFrames::Keep => AllocatorFrames::Keep,
        },
        pid,
        size: trace.size,
        text: trace.to_string(),
        total_nframe: trace.traceback.total_nframe(),
        traceback: trace.traceback.frames().iter().collect(),
    })
}
