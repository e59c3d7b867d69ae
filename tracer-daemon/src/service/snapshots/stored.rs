//! Stored snapshots as resources: a snapshot taken now and stored, found
//! by id or label, listed, counted, labelled and deleted, as the viewer
//! may see them.
use super::{SnapshotRef, Target};
use crate::service::{Service, ServiceError, Viewer};
use crate::snapshot::AllocatorFrames;
use crate::store::{
    SnapshotInfo, SnapshotKind, SnapshotSummary, StoreError, StoredSnapshot, Unreadable,
    check_label,
};

impl Service {
    /// `take_snapshot()` of a target for `viewer`, stored under the next id
    /// with `label` and owned by `viewer` ([`Viewer::owner`]); `frames`
    /// (dropped or kept, recorded with it) as
    /// [`Service::snapshot_now_with`].
    ///
    /// # Errors
    /// As [`Service::snapshot_now`]; [`StoreError`] for the label or file.
    pub fn store_now(
        &self,
        viewer: Viewer,
        target: Target,
        label: Option<String>,
        frames: AllocatorFrames,
    ) -> Result<SnapshotSummary, ServiceError> {
        if let Some(label) = &label {
            check_label(label)?;
        }
        let now = self.snapshot_now_with(viewer, target, frames)?;
        let (image, start_time) = now.image.unwrap_or_default();
        let stored = StoredSnapshot {
            id: 0,
            pid: image.pid,
            start_time,
            generation: image.generation,
            taken_at: now.at,
            traced_memory: now.traced_memory,
            completeness: now.completeness,
            snapshot: now.snapshot,
        };
        let mut info = SnapshotInfo::new(SnapshotKind::Taken, now.image.map(|(id, _)| id));
        info.label = label;
        info.comm = now.process.map(|p| p.view.comm);
        info.allocator_frames = Some(now.allocator_frames);
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

    /// The id a reference names, among the snapshots `viewer` may see
    /// (one they may not see is answered as one that does not exist).
    ///
    /// # Errors
    /// [`ServiceError::SnapshotNotFound`], [`StoreError::LabelNotFound`].
    pub fn resolve(&self, viewer: Viewer, reference: &SnapshotRef) -> Result<u64, ServiceError> {
        let held = self.state.locks().store();
        let seen = |id: u64| {
            held.store
                .info(id)
                .is_some_and(|info| viewer.sees(info.owner))
        };
        match reference {
            SnapshotRef::Id(id) => Some(*id)
                .filter(|id| seen(*id))
                .ok_or(ServiceError::SnapshotNotFound { id: *id }),
            SnapshotRef::Label(label) => held
                .store
                .id_of_label(label)
                .filter(|id| seen(*id))
                .ok_or_else(|| {
                    StoreError::LabelNotFound {
                        label: label.clone(),
                    }
                    .into()
                }),
        }
    }

    /// A stored snapshot `viewer` may see, its summary and what the store
    /// knows of it.
    ///
    /// # Errors
    /// As [`Service::resolve`]; for a snapshot kept in its file,
    /// [`StoreError::FileGone`], [`StoreError::FileChanged`] or
    /// [`StoreError::Io`] when the file was removed, changed or cannot be
    /// read.
    pub fn stored(
        &self,
        viewer: Viewer,
        reference: &SnapshotRef,
    ) -> Result<(StoredSnapshot, SnapshotSummary, SnapshotInfo), ServiceError> {
        let id = self.resolve(viewer, reference)?;
        let held = self.state.locks().store();
        let missing = || ServiceError::SnapshotNotFound { id };
        let loader = held.store.loader(id).ok_or_else(missing)?;
        let summary = held.store.summary(id).ok_or_else(missing)?;
        let info = held.store.info(id).cloned().ok_or_else(missing)?;
        drop(held);
        // An automatic snapshot, or one kept in its file, is decoded here,
        // without the store's lock.
        Ok((loader.load()?, summary, info))
    }

    /// The summary of the stored snapshot `reference` names (what the store
    /// keeps in RAM: no file is read, no snapshot decoded).
    ///
    /// # Errors
    /// As [`Service::resolve`]; [`ServiceError::SnapshotNotFound`].
    pub fn stored_summary(
        &self,
        viewer: Viewer,
        reference: &SnapshotRef,
    ) -> Result<SnapshotSummary, ServiceError> {
        let id = self.resolve(viewer, reference)?;
        self.state
            .locks()
            .store()
            .store
            .summary(id)
            .ok_or(ServiceError::SnapshotNotFound { id })
    }

    /// Summaries of the stored snapshots `viewer` may see, oldest first:
    /// all, or those of `pid`'s current image.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`] for an unknown pid.
    pub fn list_snapshots(
        &self,
        viewer: Viewer,
        pid: Option<u32>,
    ) -> Result<Vec<SnapshotSummary>, ServiceError> {
        match pid {
            None => {
                let held = self.state.locks().store();
                Ok(held
                    .store
                    .iter()
                    .filter(|(_, info)| viewer.sees(info.owner))
                    .filter_map(|(s, _)| held.store.summary(s.id))
                    .collect())
            }
            Some(pid) => {
                let (image, _) = self.image_of(pid)?;
                let held = self.state.locks().store();
                let ids: Vec<u64> = held
                    .store
                    .of_image_all(image)
                    .filter(|(_, info)| viewer.sees(info.owner))
                    .map(|(s, _)| s.id)
                    .collect();
                Ok(ids
                    .into_iter()
                    .filter_map(|id| held.store.summary(id))
                    .collect())
            }
        }
    }

    /// Files of the state directory that were refused at start.
    pub fn unreadable_snapshots(&self) -> Vec<Unreadable> {
        self.state.locks().store().store.unreadable().to_vec()
    }

    /// Snapshots held by the store.
    pub fn stored_count(&self) -> usize {
        self.state.locks().store().store.len()
    }

    /// The store's counts and bytes per kind, evictions and refusals, and
    /// the size in bytes of the state directory's files (None without a
    /// state directory). The directory is walked without the store's lock;
    /// while another holds that lock (a snapshot's file being written,
    /// 0.1 to 0.3 s for 4 M blocks), the counts are those last read, so
    /// that `/metrics` never waits for a store.
    pub fn store_stats(&self) -> (crate::store::StoreStats, Option<u64>) {
        let seen = || {
            self.store_stats_seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let read = |held: &crate::store::SnapshotStore| {
            let read = (
                held.stats(),
                held.state_dir().map(std::path::Path::to_path_buf),
            );
            *seen() = Some(read.clone());
            read
        };
        // While a snapshot is being stored (its file written under the
        // store's lock), the reading of the last store change.
        let (stats, dir) = match self.state.locks().try_store() {
            Some(held) => read(&held.store),
            None => {
                let last = seen().clone();
                last.unwrap_or_else(|| read(&self.state.locks().store().store))
            }
        };
        (stats, dir.map(|dir| crate::store::dir_bytes(&dir)))
    }

    /// Sets or removes a label of a snapshot `viewer` may see.
    ///
    /// # Errors
    /// As [`Service::resolve`] and
    /// [`crate::store::SnapshotStore::set_label`].
    pub fn label_snapshot(
        &self,
        viewer: Viewer,
        reference: &SnapshotRef,
        label: Option<String>,
    ) -> Result<SnapshotSummary, ServiceError> {
        let id = self.resolve(viewer, reference)?;
        let mut held = self.state.locks().store();
        let labelled = held.store.set_label(id, label);
        Ok(labelled.map_err(|err| crate::service::access::as_seen(viewer, &held.store, err))?)
    }

    /// Deletes a stored snapshot `viewer` may see, and its file.
    ///
    /// # Errors
    /// As [`Service::resolve`] and [`crate::store::SnapshotStore::remove`].
    pub fn delete_snapshot(
        &self,
        viewer: Viewer,
        reference: &SnapshotRef,
    ) -> Result<SnapshotSummary, ServiceError> {
        let id = self.resolve(viewer, reference)?;
        Ok(self.state.locks().store().store.remove(id)?)
    }
}
