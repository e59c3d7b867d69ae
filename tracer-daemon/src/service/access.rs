//! Who a request is for ([`Viewer`]) and what they may see: the kernel's
//! own rule for the same data (a user may look into the processes they
//! could ptrace, and no others) over tracerd's processes and stored
//! snapshots.
//!
//! A process is an unprivileged user's when all its uids are that user's
//! and it is dumpable (`ProcessImage::owner`, read from `/proc/PID` when
//! tracerd first saw the image); a stored snapshot is the user's who took
//! it (`SnapshotInfo::owner`). Operators see everything. What a viewer may
//! not see is answered as what does not exist: the same error, the same
//! list without it.
use super::Service;
use crate::lifecycle::ProcessImage;
use crate::lifecycle::image::EndReason;
use crate::store::{SnapshotStore, StoreError};

/// Who a request is for. Decided by the HTTP layer from the peer's
/// credentials (`SO_PEERCRED`, `NETLINK_SOCK_DIAG`) and the bearer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Viewer {
    /// Root, a member of the operators' group, a holder of tracerd's
    /// token, or tracerd itself: every process and snapshot.
    Operator,
    /// An unprivileged local user (uid): their own processes and the
    /// snapshots they stored.
    User(u32),
    /// A peer tracerd could not identify: no process, no snapshot.
    Nobody,
}

impl Viewer {
    /// Whether this viewer sees everything.
    #[must_use]
    pub fn is_operator(self) -> bool {
        self == Self::Operator
    }

    /// Whether this viewer sees what `owner` owns (None: only operators).
    #[must_use]
    pub fn sees(self, owner: Option<u32>) -> bool {
        match self {
            Self::Operator => true,
            Self::User(uid) => owner == Some(uid),
            Self::Nobody => false,
        }
    }

    /// Whether this viewer sees process image `image`: its owner when first
    /// seen, and for a live image also the owner `/proc/PID` gives now (a
    /// process that made itself non-dumpable since, or changed its uids,
    /// is no longer its user's, as for ptrace). An image that ended by an
    /// exec is the operators' only: `/proc` may have been read after the
    /// exec, and so tell the next image's owner (a `setpriv` or `su` that ran
    /// as root, then exec'd a user's program).
    #[must_use]
    pub fn sees_image(self, image: &ProcessImage) -> bool {
        match (self, &image.ended) {
            (Self::Operator, _) => true,
            _ if !self.sees(image.owner) => false,
            (_, Some(ended)) => ended.reason != EndReason::Exec,
            (_, None) => crate::sys::procfs::read_owner(image.pid()) == image.owner,
        }
    }

    /// The owner recorded for a snapshot this viewer stores: a user's uid;
    /// None for an operator's (it belongs to the operators).
    #[must_use]
    pub fn owner(self) -> Option<u32> {
        match self {
            Self::User(uid) => Some(uid),
            Self::Operator | Self::Nobody => None,
        }
    }
}

/// A store error as `viewer` may see it: the snapshot that holds a taken
/// label is named only to who may see that snapshot.
pub(super) fn as_seen(viewer: Viewer, store: &SnapshotStore, err: StoreError) -> StoreError {
    match err {
        StoreError::LabelTaken {
            label,
            id: Some(id),
        } if !store.info(id).is_some_and(|info| viewer.sees(info.owner)) => {
            StoreError::LabelTaken { label, id: None }
        }
        other => other,
    }
}

impl Service {
    /// Whether `viewer` may see process `pid`: the owner of the image a
    /// query for it means (live, else its last ended one); for a pid
    /// tracerd has no image of, the owner of the process now
    /// (`/proc/PID`), so that a user is told why their own process is not
    /// traced. A viewer who may not see it is answered as if no process had
    /// this pid.
    pub fn visible(&self, viewer: Viewer, pid: u32) -> bool {
        if viewer.is_operator() {
            return true;
        }
        let recorded = {
            let held = self.state.locks().registry();
            super::processes::current_image(&held.registry, pid)
                .map(|image| viewer.sees_image(image))
        };
        recorded.unwrap_or_else(|| viewer.sees(crate::sys::procfs::read_owner(pid)))
    }

    /// The pids of the images (live and retained ended ones) `viewer` may
    /// see; None for an operator (every pid).
    pub(super) fn visible_pids(&self, viewer: Viewer) -> Option<std::collections::HashSet<u32>> {
        if viewer.is_operator() {
            return None;
        }
        let held = self.state.locks().registry();
        Some(
            held.registry
                .live()
                .chain(held.registry.ended())
                .filter(|image| viewer.sees_image(image))
                .map(|image| image.pid())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_sees_all_a_user_their_own_and_nobody_nothing() {
        assert!(Viewer::Operator.sees(None));
        assert!(Viewer::Operator.sees(Some(1000)));
        assert!(Viewer::User(1000).sees(Some(1000)));
        assert!(!Viewer::User(1000).sees(Some(1001)));
        assert!(!Viewer::User(1000).sees(None));
        assert!(!Viewer::User(0).sees(None));
        assert!(!Viewer::Nobody.sees(None));
        assert!(!Viewer::Nobody.sees(Some(65534)));
        assert_eq!(Viewer::User(7).owner(), Some(7));
        assert_eq!(Viewer::Operator.owner(), None);
    }
}
