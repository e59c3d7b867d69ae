//! Triggered snapshots: when tracerd takes and keeps a snapshot on its own,
//! and what it keeps. Today's one policy: every interval, of every traced
//! process, kept for its retention ([`AutoPolicy`], set by
//! `snapshot_interval` and `snapshot_retention`); its loop is
//! `tasks::automatic_snapshots`.
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use serde::Serialize;
use tracer_model::Completeness;

use crate::config::Config;
use crate::service::{Service, Viewer};
use crate::snapshot::AllocatorFrames;
use crate::store::{SnapshotInfo, SnapshotKind, StoreError, StoredSnapshot};

/// How automatic snapshots are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AutoPolicy {
    /// Seconds between two; 0 turns them off.
    pub interval_secs: u64,
    /// Seconds each is kept.
    pub retention_secs: u64,
}

impl From<&Config> for AutoPolicy {
    fn from(config: &Config) -> Self {
        AutoPolicy {
            interval_secs: config.snapshots.snapshot_interval,
            retention_secs: config.snapshots.snapshot_retention,
        }
    }
}

/// The triggered snapshots, driven from `tasks.rs` ([`AutoPolicy`]): takes
/// and keeps them through the service.
pub struct Triggers<'a> {
    service: &'a Service,
}

impl<'a> Triggers<'a> {
    /// The triggered snapshots over `service`'s state.
    #[must_use]
    pub fn new(service: &'a Service) -> Self {
        Self { service }
    }

    /// Takes one automatic snapshot of every traced live image (one pass
    /// over the kernel maps) and drops those past `retention`. Returns how
    /// many were taken: none once tracerd is stopping (what was read may be
    /// partial, and is never stored).
    pub fn auto_snapshots(&self, retention: Duration) -> usize {
        let Ok(images) = self
            .service
            .images_now(Viewer::Operator, AllocatorFrames::Drop)
        else {
            return 0;
        };
        let at = SystemTime::now();
        let mut held = self.service.state.locks().store();
        let mut taken = 0;
        let (mut refused, mut last_refusal) = (0usize, None);
        for image in images {
            let stored = StoredSnapshot {
                id: 0,
                pid: image.id.pid,
                start_time: image.start_time,
                generation: image.id.generation,
                taken_at: at,
                traced_memory: image.traced_memory,
                completeness: Completeness::of_process(image.id.pid, image.drops, image.cut),
                snapshot: Arc::new(image.snapshot),
            };
            let mut info = SnapshotInfo::new(SnapshotKind::Auto, Some(image.id));
            info.comm = Some(image.comm);
            info.allocator_frames = Some(AllocatorFrames::Drop);
            match held.store.add(stored, info) {
                Ok(_) => taken += 1,
                Err(err @ StoreError::QuotaFull { .. }) => {
                    refused += 1;
                    last_refusal = Some(err);
                }
                Err(err) => {
                    ::tracing::warn!(pid = image.id.pid, err = %err, "automatic snapshot not stored")
                }
            }
        }
        if let Some(err) = last_refusal {
            // One line per pass, not one per process.
            ::tracing::warn!(refused, err = %err, "automatic snapshots not stored: the snapshots users stored fill the quotas");
        }
        let expired = held.store.expire_auto(at, retention);
        ::tracing::debug!(taken, expired, "automatic snapshots");
        taken
    }
}
