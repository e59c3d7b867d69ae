//! Cheap routes about processes and tracerd itself: `/health`,
//! `/processes`, `/pid/{pid}`, `get_traced_memory()` per process and
//! system-wide, `/maps` and `get_tracemalloc_memory()`.
use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, RawQuery, State},
    response::{IntoResponse, Response},
};
use tracer_api::{ProcessList, SourceMemory, TracedMemory};

use crate::http::{ApiError, blocking, params::Params, params::parse_pid, params::spec, wire};
use crate::service::{Service, Viewer};

/// `GET /health`: readiness, what is probed.
pub async fn health(
    State(service): State<Arc<Service>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let health = blocking(move || Ok::<_, ApiError>(service.health())).await?;
    Ok(Json(health).into_response())
}

/// `GET /processes`: every traced process, with traced memory as
/// tracemalloc reports it and its tracing state; and every watched
/// process, traced exactly or not.
pub async fn processes(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let list = blocking(move || {
        Ok::<_, ApiError>(ProcessList {
            processes: service.processes(viewer),
            exact: service.exact_mode().as_str().to_string(),
            watched: service.watched(viewer),
        })
    })
    .await?;
    wire(&list)
}

/// `GET /maps`: the kernel maps' use and the programs' counters.
pub async fn kernel_maps(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let maps = blocking(move || Ok::<_, ApiError>(service.kernel_maps(viewer))).await?;
    Ok(Json(maps).into_response())
}

/// `GET /pid/{pid}`: one process (its last state once it ended).
pub async fn process(
    State(service): State<Arc<Service>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let status = blocking(move || service.process(pid)).await?;
    Ok(Json(ProcessAnswer {
        view: status.view,
        exact: status.exact,
        watch: status.watch,
    })
    .into_response())
}

/// `GET /pid/{pid}`: the process's view, then since when and why it is
/// traced exactly and what the watch reads of it (each absent when none).
#[derive(serde::Serialize)]
struct ProcessAnswer {
    #[serde(flatten)]
    view: tracer_api::ProcessView,
    #[serde(skip_serializing_if = "Option::is_none")]
    exact: Option<tracer_api::ExactTracing>,
    #[serde(skip_serializing_if = "Option::is_none")]
    watch: Option<tracer_api::WatchFigures>,
}

/// `GET /pid/{pid}/traced-memory`: `get_traced_memory()`, and the same
/// current and peak bytes by source (`by_source`: allocator family, of a
/// live image only).
pub async fn pid_traced_memory(
    State(service): State<Arc<Service>>,
    Path(pid): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let pid = parse_pid(&pid)?;
    Params::parse(query.as_deref(), spec::NONE)?;
    let (status, sources) = blocking(move || service.process_with_sources(pid)).await?;
    let view = status.view;
    let by_source = sources
        .into_iter()
        .map(|(name, current, peak)| (name.into(), SourceMemory { current, peak }))
        .collect();
    wire(&TracedMemory {
        blocks: view.blocks,
        by_source,
        current: view.current,
        peak: view.peak,
        pid,
        state: view.state,
    })
}

/// `GET /traced-memory`: `get_traced_memory()` summed over live processes.
pub async fn system_traced_memory(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let memory = blocking(move || Ok::<_, ApiError>(service.system_memory(viewer))).await?;
    Ok(Json(memory).into_response())
}

/// `GET /tracing/memory`: `get_tracemalloc_memory()`.
pub async fn tracing_memory(
    State(service): State<Arc<Service>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(query.as_deref(), spec::NONE)?;
    let memory = blocking(move || Ok::<_, ApiError>(service.tracer_memory())).await?;
    Ok(Json(memory).into_response())
}
