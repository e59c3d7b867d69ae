//! `statistics()`, `compare_to()` and the traces of a [`Target`]: a
//! process now (`/pid/{pid}/...`), every process now (`/...`, one domain
//! per pid), or a stored snapshot (`/snapshots/{id}/...`), each with the
//! filters of `Snapshot.filter_traces()`. One handler per view serves the
//! three targets. The views of now take `allocator_frames` (drop or keep
//! the allocation machinery's leading frames); those of stored snapshots
//! refuse it, saying why.
use std::sync::Arc;

use axum::{
    extract::{FromRequestParts, MatchedPath, Path, RawQuery, State},
    http::request::Parts,
    response::{IntoResponse, Response},
};
use tracer_api::{StatisticsTarget, Totals, TracesTarget};

use crate::http::params::{
    Params, compare_specs, parse_pid, parse_ref, refuse_allocator_frames, spec,
    stored_allocator_frames,
};
use crate::http::render::{compare_response, statistics_response, stats_query, write_traces};
use crate::http::{ApiError, blocking, streamed};
use crate::service::{Now, Service, Side, SnapshotRef, Viewer};
use crate::snapshot::AllocatorFrames;
use crate::store::wire_frames;

/// What a view is of, from its route: `/pid/{pid}/...`, `/snapshots/{id}/...`
/// or the system-wide `/...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One process now (its current image, or its last one if it ended).
    Process(u32),
    /// Every traced process now that the viewer may see.
    System,
    /// A stored snapshot, by id or label.
    Stored(SnapshotRef),
}

impl Target {
    /// The target of now it is (None: a stored snapshot).
    fn now(&self) -> Option<crate::service::Target> {
        match self {
            Target::Process(pid) => Some(crate::service::Target::Process(*pid)),
            Target::System => Some(crate::service::Target::System),
            Target::Stored(_) => None,
        }
    }

    /// The query of the view: `now`'s spec for a target of now, `stored`'s
    /// (`allocator_frames` refused) for a stored snapshot.
    fn params(
        &self,
        query: Option<&str>,
        now: spec::Query,
        stored: spec::Query,
    ) -> Result<Params, ApiError> {
        if matches!(self, Target::Stored(_)) {
            refuse_allocator_frames(query)?;
            return Params::parse(query, stored);
        }
        Params::parse(query, now)
    }
}

/// The target of the route matched: its `{pid}` or `{id}` parsed as the
/// handlers of each did (400 naming what is wrong).
impl<S: Send + Sync> FromRequestParts<S> for Target {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let route = parts
            .extensions
            .get::<MatchedPath>()
            .map(|path| path.as_str().to_string())
            .unwrap_or_default();
        let is = |prefix: &str| route.starts_with(prefix);
        if !is("/pid/") && !is("/snapshots/") {
            return Ok(Target::System);
        }
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let parsed = if is("/pid/") {
            parse_pid(&raw).map(Target::Process)
        } else {
            parse_ref("id", &raw).map(Target::Stored)
        };
        parsed.map_err(IntoResponse::into_response)
    }
}

/// `allocator_frames` of a compare, refused when `new` is a stored
/// snapshot (only now is taken here).
fn compare_frames(params: &Params, new: Option<&SnapshotRef>) -> Result<AllocatorFrames, ApiError> {
    if new.is_some() && params.get(spec::ALLOCATOR_FRAMES).is_some() {
        return Err(stored_allocator_frames(
            "new is a stored snapshot (allocator_frames goes with new=now)",
        ));
    }
    params.allocator_frames()
}

/// Where the statistics of `now` come from.
fn totals(now: &Now) -> Totals {
    if now.snapshot.is_totals() {
        Totals::PerStack
    } else {
        Totals::PerBlock
    }
}

/// `GET /pid/{pid}/statistics`, `/statistics`, `/snapshots/{id}/statistics`.
pub async fn statistics(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    target: Target,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = target.params(
        query.as_deref(),
        spec::STATISTICS_NOW,
        spec::STATISTICS_STORED,
    )?;
    let query = stats_query(&params)?;
    let frames = match target {
        Target::Stored(_) => AllocatorFrames::default(),
        _ => params.allocator_frames()?,
    };
    blocking(move || match target {
        Target::Process(pid) => {
            let now = service.grouped_now(viewer, crate::service::Target::Process(pid), frames)?;
            let target = StatisticsTarget::Process {
                allocator_frames: wire_frames(now.allocator_frames),
                pid,
                process: now.process.as_ref().map(|p| p.view.clone()),
                totals: totals(&now),
            };
            statistics_response(&now.snapshot, &now.completeness, &query, target)
        }
        Target::System => {
            let now = service.snapshot_now_with(viewer, crate::service::Target::System, frames)?;
            let target = StatisticsTarget::System {
                allocator_frames: wire_frames(now.allocator_frames),
                current: now.traced_memory.0,
                peak: now.traced_memory.1,
                pids: now.pids.clone(),
                totals: totals(&now),
            };
            statistics_response(&now.snapshot, &now.completeness, &query, target)
        }
        Target::Stored(reference) => {
            let (stored, summary, _) = service.stored(viewer, &reference)?;
            let target = StatisticsTarget::Stored {
                snapshot: summary.wire(),
            };
            statistics_response(&stored.snapshot, &stored.completeness, &query, target)
        }
    })
    .await
}

/// `GET /pid/{pid}/compare`, `/compare` (every traced process), and
/// `/snapshots/{id}/compare?base=` (any two stored snapshots).
pub async fn compare(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    target: Target,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = target.params(query.as_deref(), spec::COMPARE_NOW, spec::COMPARE_STORED)?;
    let query = stats_query(&params)?;
    // The compare of a process names it.
    let pid = match target {
        Target::Process(pid) => Some(pid),
        _ => None,
    };
    if let Target::Stored(new) = target {
        let base = params.snapshot_ref("base")?.ok_or_else(|| {
            ApiError::bad(
                "base is missing",
                "give base=ID or base=LABEL of the older snapshot (GET /snapshots lists them)",
            )
        })?;
        return blocking(move || {
            let (new_stored, _, new_info) = service.stored(viewer, &new)?;
            let (base_stored, _, base_info) = service.stored(viewer, &base)?;
            let (base, new) = (
                Side::stored(&base_stored, &base_info),
                Side::stored(&new_stored, &new_info),
            );
            Side::check_alike(&base, &new)?;
            compare_response(&base, &new, &query, pid)
        })
        .await;
    }
    let (base, new) = compare_specs(&params)?;
    let frames = compare_frames(&params, new.as_ref())?;
    let now = target.now().unwrap_or(crate::service::Target::System);
    blocking(move || {
        let (base, new) = service.compare_sides(viewer, now, &base, new.as_ref(), frames)?;
        compare_response(&base, &new, &query, pid)
    })
    .await
}

/// `GET /pid/{pid}/traces`, `/traces` (every traced process),
/// `/snapshots/{id}/traces`.
pub async fn traces(
    State(service): State<Arc<Service>>,
    viewer: Viewer,
    target: Target,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = target.params(query.as_deref(), spec::TRACES_NOW, spec::TRACES_STORED)?;
    params.text_options(params.text()?)?;
    let frames = match target {
        Target::Stored(_) => AllocatorFrames::default(),
        _ => params.allocator_frames()?,
    };
    streamed(move |sink| {
        let (snapshot, completeness, head) = match target {
            Target::Process(pid) => {
                let now = service.snapshot_now_with(
                    viewer,
                    crate::service::Target::Process(pid),
                    frames,
                )?;
                let head = TracesTarget::Process {
                    allocator_frames: wire_frames(now.allocator_frames),
                    pid,
                };
                (now.snapshot, now.completeness, head)
            }
            Target::System => {
                let now =
                    service.snapshot_now_with(viewer, crate::service::Target::System, frames)?;
                let head = TracesTarget::System {
                    allocator_frames: wire_frames(now.allocator_frames),
                    pids: now.pids.clone(),
                };
                (now.snapshot, now.completeness, head)
            }
            Target::Stored(reference) => {
                let (stored, summary, _) = service.stored(viewer, &reference)?;
                let head = TracesTarget::Stored {
                    snapshot: summary.wire(),
                };
                (stored.snapshot, stored.completeness, head)
            }
        };
        write_traces(sink, &snapshot, &completeness, &params, head)
    })
    .await
}
