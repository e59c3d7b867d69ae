//! The request and response types of tracerd's HTTP API (docs/api.md):
//! tracerd builds them ([`Serialize`](serde::Serialize)), `tracer` and the
//! tests read them ([`Deserialize`](serde::Deserialize)), and tracerd's
//! OpenAPI description takes its response schemas from them ([`schema`]).
//!
//! Sizes are bytes, times Unix milliseconds, a domain is a pid.
//!
//! # Key order on the wire
//! serde_json's map (no `preserve_order`) sorts its keys. The answers that
//! were built as `json!` objects are sent through a [`serde_json::Value`]
//! ([`to_wire`]), so their keys are in that order at every level, nested
//! objects included; their fields are declared in that order here too.
//! The answers sent as a struct ([`ProcessView`], [`TracingState`],
//! [`SystemMemory`], [`Health`], [`ScopeView`]) keep their declaration
//! order. Either way a reader must not depend on the order.
//!
//! Nothing here depends on tracerd: the model's values an answer carries
//! (frames, statistics, traces) are wire types of their own ([`Frame`],
//! [`Statistic`], [`StatisticDiff`], [`Trace`]), and the answers that hold
//! them are generic over them, so that tracerd can put the model's own
//! values in (serialized the same) and a reader gets these.

mod control;
mod process;
pub mod schema;
mod snapshot;
mod views;

pub use control::{
    ErrorBody, Health, Library, OnDemandProcess, ProcessTracing, Scope, ScopeView, TracingState,
};
pub use process::{
    ClearedTraces, ExactReason, ExactTracing, ObjectTraceback, PeakReset, ProcessList,
    ProcessState, ProcessStatus, ProcessView, SourceMemory, SystemMemory, TracedMemory,
    WatchFigures, WatchedProcess,
};
pub use snapshot::{
    AllocatorFrames, Completeness, SnapshotDeleted, SnapshotHeader, SnapshotKind, SnapshotList,
    SnapshotSummary, StoreHeader,
};
pub use views::{
    CompareAnswer, CompareSide, Frame, SideKind, SincePart, Statistic, StatisticDiff,
    StatisticsAnswer, StatisticsTarget, Totals, Trace, TracesAnswer, TracesTarget,
};

/// `value` as tracerd sends the answers that were `json!` objects: through
/// a [`serde_json::Value`], whose maps sort their keys.
///
/// # Errors
/// What serde_json says (a map with keys that are not strings; a path
/// that is not UTF-8).
pub fn to_wire<T: serde::Serialize>(value: &T) -> serde_json::Result<serde_json::Value> {
    serde_json::to_value(value)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may (CONTRIBUTING.md).
mod tests;
