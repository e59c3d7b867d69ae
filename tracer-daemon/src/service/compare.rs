//! The two sides of `compare_to()`: `new` (now, or a stored snapshot)
//! against a base (a stored snapshot, the latest one a user stored, the
//! state some time ago from automatic snapshots, or the empty state when
//! tracing began). Each side says what it is, whether its data is
//! complete, and whether its tracebacks dropped the allocation machinery's
//! leading frames: sides that differ there do not compare.
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use tracer_api::{SideKind, SincePart};
use tracer_model::{Completeness, Snapshot};

use super::snapshots::{SnapshotRef, Target};
use super::{Service, ServiceError, Viewer};
use crate::capture::ImageId;
use crate::snapshot::AllocatorFrames;
use crate::store::{SnapshotInfo, SnapshotKind, StoredSnapshot, wire_frames, wire_kind};
use crate::sys::unix_ms;

/// The base or new side of a compare: its traces and what to say about it.
#[derive(Clone, Debug)]
pub struct Side {
    /// The traces.
    pub snapshot: Arc<Snapshot>,
    /// What it is, as the answer describes it (`kind`: `now`,
    /// `snapshot`, `tracing_start`, `since`, and what each says).
    pub info: SideKind,
    /// Events its processes lost before it was taken.
    pub completeness: Completeness,
    /// Whether its tracebacks dropped the allocation machinery's leading
    /// frames; None when unknown or when it has no traces to say (the
    /// empty state at tracing start): it compares with either.
    pub allocator_frames: Option<AllocatorFrames>,
}

impl Side {
    /// A stored snapshot as a compare side.
    #[must_use]
    pub fn stored(stored: &StoredSnapshot, info: &SnapshotInfo) -> Self {
        Self {
            snapshot: Arc::clone(&stored.snapshot),
            info: SideKind::Snapshot {
                id: stored.id,
                snapshot_kind: wire_kind(info.kind),
                label: Some(info.label.clone()),
                taken_at_ms: unix_ms(stored.taken_at),
                allocator_frames: Some(info.allocator_frames.map(wire_frames)),
                since_ms: None,
            },
            completeness: stored.completeness.clone(),
            allocator_frames: info.allocator_frames,
        }
    }

    /// The empty state when tracing began: nothing lost yet.
    fn empty(limit: u32, at_ms: u64) -> Self {
        Self {
            snapshot: Arc::new(Snapshot::new(Vec::new(), limit)),
            info: SideKind::TracingStart {
                at_ms,
                since_ms: None,
            },
            completeness: Completeness::complete(),
            allocator_frames: None,
        }
    }

    /// Refuses a compare of `new` against `base` when one dropped the
    /// allocation machinery's frames and the other kept them: no traceback
    /// of one would be found in the other.
    ///
    /// # Errors
    /// [`ServiceError::AllocatorFramesDiffer`].
    pub fn check_alike(base: &Side, new: &Side) -> Result<(), ServiceError> {
        match (base.allocator_frames, new.allocator_frames) {
            (Some(base), Some(new)) if base != new => {
                Err(ServiceError::AllocatorFramesDiffer { base, new })
            }
            _ => Ok(()),
        }
    }
}

/// Whether a snapshot taken with `have` compares with a side taken with
/// `want` (unknown compares with anything).
fn alike(have: Option<AllocatorFrames>, want: Option<AllocatorFrames>) -> bool {
    match (have, want) {
        (Some(have), Some(want)) => have == want,
        _ => true,
    }
}

/// Where a compare's base comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BaseSpec {
    /// The latest snapshot a user stored of the target, else the empty
    /// snapshot at tracing start.
    Default,
    /// A stored snapshot.
    Snapshot(SnapshotRef),
    /// The state this long ago, from automatic snapshots.
    Since(Duration),
}

impl Service {
    /// A stored snapshot that must be of `pid`'s current image (for
    /// `/pid/{pid}/compare`).
    fn stored_of_image(
        &self,
        viewer: Viewer,
        pid: u32,
        reference: &SnapshotRef,
    ) -> Result<Side, ServiceError> {
        let (image, _) = self.image_of(pid)?;
        let (stored, _, info) = self.stored(viewer, reference)?;
        if info.image != Some(image) {
            let reason = match (info.image, stored.pid) {
                (Some(other), _) if other.pid == pid => {
                    "an earlier image of this pid (exec or pid reuse)".to_string()
                }
                (Some(other), _) => format!("it is of pid {}", other.pid),
                (None, 0) => format!(
                    "it is {}",
                    if info.kind == SnapshotKind::Loaded {
                        "loaded from a file"
                    } else {
                        "system-wide"
                    }
                ),
                (None, p) => format!("it is of pid {p} in an earlier run of tracerd"),
            };
            return Err(ServiceError::WrongScope {
                id: stored.id,
                pid,
                reason,
            });
        }
        Ok(Side::stored(&stored, &info))
    }

    /// A stored snapshot `viewer` may see as a side, for any target.
    fn side_of(
        &self,
        viewer: Viewer,
        target: Target,
        reference: &SnapshotRef,
    ) -> Result<Side, ServiceError> {
        match target {
            Target::Process(pid) => self.stored_of_image(viewer, pid, reference),
            Target::System => {
                let (stored, _, info) = self.stored(viewer, reference)?;
                Ok(Side::stored(&stored, &info))
            }
        }
    }

    /// The two sides of `/pid/{pid}/compare` or `/compare` for `viewer`
    /// (system-wide: the processes they may see; stored snapshots: those
    /// they may see): `new` (None: now, its machinery frames dropped or
    /// kept as `frames` says) against the base `base` says. A default or `since` base is made only of
    /// snapshots taken as the new side was (dropped or kept); an explicit
    /// one taken otherwise is refused.
    ///
    /// # Errors
    /// Unknown pid or snapshot, a snapshot of another target, tracing
    /// stopped, [`ServiceError::AllocatorFramesDiffer`].
    pub fn compare_sides(
        &self,
        viewer: Viewer,
        target: Target,
        base: &BaseSpec,
        new: Option<&SnapshotRef>,
        frames: AllocatorFrames,
    ) -> Result<(Side, Side), ServiceError> {
        let new_side = match new {
            Some(reference) => self.side_of(viewer, target, reference)?,
            None => {
                let now = self.grouped_now(viewer, target, frames)?;
                Side {
                    snapshot: now.snapshot,
                    info: SideKind::Now {
                        at_ms: unix_ms(now.at),
                        allocator_frames: wire_frames(now.allocator_frames),
                    },
                    completeness: now.completeness,
                    allocator_frames: Some(now.allocator_frames),
                }
            }
        };
        let want = new_side.allocator_frames;
        let limit = new_side.snapshot.traceback_limit();
        let base_side = match (target, base) {
            (target, BaseSpec::Snapshot(reference)) => self.side_of(viewer, target, reference)?,
            (Target::Process(pid), BaseSpec::Default) => {
                let (image, _) = self.image_of(pid)?;
                let latest = {
                    let held = self.state.locks().store();
                    let latest = held
                        .store
                        .of_image(image)
                        .filter(|s| {
                            held.store.info(s.id).is_some_and(|i| {
                                viewer.sees(i.owner) && alike(i.allocator_frames, want)
                            })
                        })
                        .last()
                        .map(|s| s.id);
                    latest
                        .and_then(|id| Some((held.store.loader(id)?, held.store.info(id)?.clone())))
                };
                // Decoded (if compact or on disk) without the store's lock.
                match latest {
                    Some((loader, info)) => Side::stored(&loader.load()?, &info),
                    None => Side::empty(limit, self.process(pid)?.view.first_seen_ms),
                }
            }
            (Target::System, BaseSpec::Default) => {
                let held = self.state.locks().store();
                let latest = held
                    .store
                    .iter()
                    .filter(|(s, i)| {
                        s.pid == 0
                            && i.kind == SnapshotKind::Taken
                            && i.image.is_none()
                            && viewer.sees(i.owner)
                            && alike(i.allocator_frames, want)
                    })
                    .filter(|(s, _)| s.taken_at >= self.started_at)
                    .last()
                    .and_then(|(s, i)| Some((held.store.loader(s.id)?, i.clone())));
                drop(held);
                match latest {
                    Some((loader, info)) => Side::stored(&loader.load()?, &info),
                    None => Side::empty(limit, unix_ms(self.started_at)),
                }
            }
            (target, BaseSpec::Since(ago)) => self.since_side(viewer, target, *ago, limit, want)?,
        };
        Side::check_alike(&base_side, &new_side)?;
        Ok((base_side, new_side))
    }

    /// The state `ago` before now, from stored snapshots (automatic ones
    /// included) taken as `want` says (machinery frames dropped or kept):
    /// per image (system-wide: those `viewer` may see), the latest one
    /// taken at or before then, else the empty state when tracing of the
    /// image began.
    fn since_side(
        &self,
        viewer: Viewer,
        target: Target,
        ago: Duration,
        limit: u32,
        want: Option<AllocatorFrames>,
    ) -> Result<Side, ServiceError> {
        let now = SystemTime::now();
        let cutoff = now.checked_sub(ago).unwrap_or(SystemTime::UNIX_EPOCH);
        let images: Vec<(ImageId, u64)> = match target {
            Target::Process(pid) => {
                let (image, _) = self.image_of(pid)?;
                vec![(image, self.process(pid)?.view.first_seen_ms)]
            }
            Target::System => {
                let held = self.state.locks().registry().control();
                let cutoff_ms = unix_ms(cutoff);
                held.registry
                    .live()
                    .filter(|i| viewer.sees_image(i) && held.control.of(i.id).is_tracing)
                    .map(|i| (i.id, unix_ms(i.first_seen)))
                    .chain(
                        // Images alive at the cutoff that have ended since.
                        held.registry
                            .ended()
                            .filter(|i| viewer.sees_image(i))
                            .filter(|i| i.ended.as_ref().is_some_and(|e| unix_ms(e.at) > cutoff_ms))
                            .map(|i| (i.id, unix_ms(i.first_seen))),
                    )
                    .collect()
            }
        };
        let held = self.state.locks().store();
        let mut loaders = Vec::new();
        let mut parts = Vec::new();
        let mut completeness = Completeness::complete();
        for (image, first_seen_ms) in images {
            let found = held
                .store
                .of_image_all(image)
                .filter(|(s, i)| s.taken_at <= cutoff && alike(i.allocator_frames, want))
                .last();
            match found {
                Some((stored, info)) => {
                    completeness.merge(&stored.completeness);
                    parts.push(SincePart {
                        pid: image.pid,
                        kind: SideKind::Snapshot {
                            id: stored.id,
                            snapshot_kind: wire_kind(info.kind),
                            label: None,
                            taken_at_ms: unix_ms(stored.taken_at),
                            allocator_frames: None,
                            since_ms: None,
                        },
                    });
                    loaders.extend(held.store.loader(stored.id));
                }
                None => parts.push(SincePart {
                    pid: image.pid,
                    kind: SideKind::TracingStart {
                        at_ms: first_seen_ms,
                        since_ms: None,
                    },
                }),
            }
        }
        drop(held);
        // Automatic snapshots are kept compactly, labelled ones in their
        // files: decoded here, without the store's lock.
        let mut traces = Vec::new();
        for loader in loaders {
            traces.extend(loader.load()?.snapshot.traces().iter().cloned());
        }
        let since = unix_ms(cutoff);
        let info = match (target, parts.as_slice()) {
            // One process's side, its pid left out, the moment put in.
            (Target::Process(_), [part]) => match part.kind.clone() {
                SideKind::Snapshot {
                    id,
                    snapshot_kind,
                    label,
                    taken_at_ms,
                    allocator_frames,
                    ..
                } => SideKind::Snapshot {
                    id,
                    snapshot_kind,
                    label,
                    taken_at_ms,
                    allocator_frames,
                    since_ms: Some(since),
                },
                SideKind::TracingStart { at_ms, .. } => SideKind::TracingStart {
                    at_ms,
                    since_ms: Some(since),
                },
                other => other,
            },
            _ => SideKind::Since {
                since_ms: since,
                processes: parts,
            },
        };
        Ok(Side {
            snapshot: Arc::new(Snapshot::new(traces, limit)),
            info,
            completeness,
            allocator_frames: want,
        })
    }
}
