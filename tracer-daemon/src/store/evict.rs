//! Room under the quotas: which automatic snapshots are evicted for a new
//! one, expiry of automatic snapshots, and the counts of both.
use std::{
    collections::HashSet,
    fs,
    time::{Duration, SystemTime},
};

use crate::capture::ImageId;

use super::{Body, Entry, Quota, SnapshotKind, SnapshotStore, StoreError, StoreStats, file_of};

const KINDS: [SnapshotKind; 3] = [
    SnapshotKind::Taken,
    SnapshotKind::Auto,
    SnapshotKind::Loaded,
];

impl SnapshotStore {
    /// The ids of the automatic snapshots to evict, oldest first, so that
    /// `entry` fits the quotas (replacing the entry `replacing`, if any).
    ///
    /// # Errors
    /// [`StoreError::QuotaFull`]: the first quota it does not fit even with
    /// every automatic snapshot other than itself evicted.
    pub(super) fn room_for(
        &self,
        entry: &Entry,
        replacing: Option<u64>,
    ) -> Result<Vec<u64>, StoreError> {
        let quotas = self.quotas;
        let full = |quota: Quota, held: u64, need: u64, owner: Option<u32>| StoreError::QuotaFull {
            quota,
            limit: quota.of(&quotas),
            held,
            need,
            owner,
        };
        let others = || {
            self.entries
                .values()
                .filter(move |e| Some(e.head.id) != replacing)
        };
        if let Some(uid) = entry.info.owner {
            let (count, bytes) = others()
                .filter(|e| e.info.owner == Some(uid))
                .fold((0u64, 0u64), |(c, b), e| (c + 1, b.saturating_add(e.bytes)));
            if count + 1 > quotas.snapshots_per_owner {
                return Err(full(Quota::SnapshotsPerOwner, count, 1, Some(uid)));
            }
            if bytes.saturating_add(entry.bytes) > quotas.bytes_per_owner {
                return Err(full(Quota::BytesPerOwner, bytes, entry.bytes, Some(uid)));
            }
        }
        let (mut count, mut bytes) = others().fold((1u64, entry.bytes), |(c, b), e| {
            (c + 1, b.saturating_add(e.bytes))
        });
        let mut evict = Vec::new();
        for victim in others().filter(|e| e.evictable()) {
            if count <= quotas.snapshots && bytes <= quotas.bytes {
                break;
            }
            evict.push(victim.head.id);
            count -= 1;
            bytes = bytes.saturating_sub(victim.bytes);
        }
        if count > quotas.snapshots {
            return Err(full(Quota::Snapshots, count - 1, 1, None));
        }
        if bytes > quotas.bytes {
            return Err(full(
                Quota::Bytes,
                bytes.saturating_sub(entry.bytes),
                entry.bytes,
                None,
            ));
        }
        Ok(evict)
    }

    /// Drops the automatic snapshots `ids` (their files too, if any: an
    /// unlabelled automatic snapshot read back from an earlier run),
    /// counted as evictions.
    pub(super) fn evict(&mut self, ids: &[u64]) {
        for id in ids {
            if let Some(entry) = self.entries.remove(id) {
                self.cache.forget(*id);
                self.evicted += 1;
                tracing::debug!(
                    id,
                    pid = entry.head.pid,
                    bytes = entry.bytes,
                    "automatic snapshot evicted for the quotas"
                );
                self.remove_file_of(&entry);
            }
        }
        if !ids.is_empty() {
            self.forget_unused_interners();
        }
    }

    /// Removes the file of a dropped entry, if it has one (best effort:
    /// logged on failure).
    pub(super) fn remove_file_of(&self, entry: &Entry) {
        if entry.persisted
            && let Some(dir) = &self.dir
        {
            let path = file_of(dir, entry.head.id);
            if let Err(err) = fs::remove_file(&path)
                && err.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(target = %path.display(), %err, "cannot remove the file of a dropped snapshot");
            }
        }
    }

    /// Drops the interners of images that have no compact snapshot left.
    pub(super) fn forget_unused_interners(&mut self) {
        let used: HashSet<ImageId> = self
            .entries
            .values()
            .filter(|e| matches!(e.body, Body::Compact(_)))
            .filter_map(|e| e.info.image)
            .collect();
        self.interners.retain(|image, _| used.contains(image));
    }

    /// Drops automatic snapshots (unlabelled) taken more than `retention`
    /// before `now`; returns how many.
    pub fn expire_auto(&mut self, now: SystemTime, retention: Duration) -> usize {
        let expired: Vec<u64> = self
            .entries
            .values()
            .filter(|e| {
                e.evictable() && now.duration_since(e.head.taken_at).unwrap_or_default() > retention
            })
            .map(|e| e.head.id)
            .collect();
        for id in &expired {
            if let Some(entry) = self.entries.remove(id) {
                self.cache.forget(*id);
                self.remove_file_of(&entry);
            }
        }
        if !expired.is_empty() {
            self.forget_unused_interners();
        }
        expired.len()
    }

    /// Counts and bytes per kind, evictions and refusals.
    pub fn stats(&self) -> StoreStats {
        let by_kind = KINDS
            .iter()
            .map(|kind| {
                let (count, bytes) = self
                    .entries
                    .values()
                    .filter(|e| e.info.kind == *kind)
                    .fold((0u64, 0u64), |(c, b), e| (c + 1, b.saturating_add(e.bytes)));
                (*kind, count, bytes)
            })
            .collect();
        let refused = KINDS
            .iter()
            .map(|kind| (*kind, self.refused.get(kind.as_str()).copied().unwrap_or(0)))
            .collect();
        StoreStats {
            by_kind,
            evicted: self.evicted,
            refused,
            quotas: self.quotas,
        }
    }
}
