//! Snapshot files loaded from users (tracer's dump format, or a pickled
//! `tracemalloc` snapshot) into the store.
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use serde_json::json;
use tracer_model::{Completeness, decode, load_tracemalloc};

use crate::service::{Service, ServiceError, Viewer};
use crate::store::{
    SnapshotInfo, SnapshotKind, SnapshotSummary, StoredSnapshot, check_label, store_frames,
};

impl Service {
    /// Loads a snapshot file (tracer's format, or a tracemalloc pickle when
    /// `tracemalloc`) into the store with `label`, owned by `viewer`
    /// ([`Viewer::owner`]). Nothing of the file is executed; a refused file
    /// changes nothing.
    ///
    /// # Errors
    /// [`ServiceError::Dump`] / [`ServiceError::Pickle`] for a refused file,
    /// [`StoreError`] for the label or the file write.
    pub fn load_snapshot(
        &self,
        viewer: Viewer,
        bytes: &[u8],
        tracemalloc: bool,
        label: Option<String>,
    ) -> Result<SnapshotSummary, ServiceError> {
        if let Some(label) = &label {
            check_label(label)?;
        }
        // A tracemalloc file has no notion of loss: it is complete.
        let (snapshot, meta, format) = if tracemalloc {
            (load_tracemalloc(bytes)?, json!({}), "tracemalloc")
        } else {
            let decoded = decode(bytes)?;
            (decoded.snapshot, decoded.meta, "tracer")
        };
        let header = tracer_api::SnapshotHeader::from_meta(&meta);
        let traced_memory = header.traced_memory.map(|[current, peak]| (current, peak));
        let size = snapshot
            .traces()
            .iter()
            .fold(0u64, |acc, t| acc.saturating_add(t.size));
        let stored = StoredSnapshot {
            id: 0,
            pid: 0,
            start_time: 0,
            generation: 0,
            taken_at: header.taken_at_ms.map_or_else(SystemTime::now, |ms| {
                SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
            }),
            traced_memory: traced_memory.unwrap_or((size, size)),
            completeness: Completeness::from_meta(&meta),
            snapshot: Arc::new(snapshot),
        };
        let mut info = SnapshotInfo::new(SnapshotKind::Loaded, None);
        info.label = label;
        info.comm = header.comm;
        info.source_format = Some(format);
        info.allocator_frames = header.allocator_frames.map(store_frames);
        info.owner = viewer.owner();
        let mut held = self.state.locks().store();
        let id = held
            .store
            .add(stored, info)
            .map_err(|err| crate::service::access::as_seen(viewer, &held.store, err))?;
        held.store
            .summary(id)
            .ok_or(ServiceError::SnapshotNotFound { id })
    }
}
