//! tracemalloc's `start(nframe)`, `stop()`, `is_tracing()`,
//! `get_traceback_limit()`, `clear_traces()` and `reset_peak()`, per process
//! image and system-wide: the state only (pure; [`crate::service`] applies
//! it to the kernel maps).
//!
//! The kernel records every process all the time (it has no per-process
//! switch yet), so tracing is turned off in userspace: a stopped image's
//! blocks are removed from `LIVE_ALLOCS` when it stops and again when it
//! starts (so it starts from nothing, as `tracemalloc.start()` does), and
//! its data is not reported in between. Removing blocks behind the kernel's
//! back leaves its per-process totals (`PROCS.current`) counting them: the
//! bytes and blocks removed are kept here as an [`Offset`] and subtracted
//! from what is reported. `reset_peak()` uses the kernel's own reset.
//!
//! State of images that are gone is forgotten by [`TracingControl::retain`]
//! at each housekeeping pass.
use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::capture::ImageId;
use tracer_common::StackTotalsKey;

/// Tracing state of one image, or the system-wide default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Tracing {
    /// `is_tracing()`.
    pub is_tracing: bool,
    /// `get_traceback_limit()`: frames kept per traceback, 1 to the
    /// kernel's nframe.
    pub traceback_limit: u32,
}

/// Bytes and blocks removed from `LIVE_ALLOCS` behind the kernel's back for
/// one image: subtracted from its kernel totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offset {
    /// Bytes.
    pub bytes: u64,
    /// Blocks.
    pub blocks: u64,
}

/// The tracing switches and the offsets of cleared images.
#[derive(Clone, Debug)]
pub struct TracingControl {
    kernel_nframe: u32,
    system: Tracing,
    /// Images whose state differs from the system-wide one.
    images: HashMap<ImageId, Tracing>,
    offsets: HashMap<ImageId, Offset>,
    /// The same blocks by their key of `STACK_TOTALS` (the kernel's totals
    /// per stack still count them), shared by clones.
    stack_offsets: HashMap<ImageId, Arc<HashMap<StackTotalsKey, Offset>>>,
}

impl TracingControl {
    /// Everything traced with the kernel's `nframe` frames.
    #[must_use]
    pub fn new(kernel_nframe: u32) -> Self {
        Self {
            kernel_nframe,
            system: Tracing {
                is_tracing: true,
                traceback_limit: kernel_nframe,
            },
            images: HashMap::new(),
            offsets: HashMap::new(),
            stack_offsets: HashMap::new(),
        }
    }

    /// The most frames any traceback can have (tracerd's `nframe`).
    #[must_use]
    pub fn kernel_nframe(&self) -> u32 {
        self.kernel_nframe
    }

    /// The system-wide state (the default of every image).
    #[must_use]
    pub fn system(&self) -> Tracing {
        self.system
    }

    /// The state of image (pid, gen).
    #[must_use]
    pub fn of(&self, image: ImageId) -> Tracing {
        self.images.get(&image).copied().unwrap_or(self.system)
    }

    /// Images whose state differs from the system-wide one.
    pub fn overrides(&self) -> impl Iterator<Item = (ImageId, Tracing)> + '_ {
        self.images.iter().map(|(k, v)| (*k, *v))
    }

    /// `start(nframe)` system-wide. Returns false (and changes nothing) when
    /// already tracing, as tracemalloc does; else every image traces from
    /// now on with `nframe` frames, and per-image states are dropped.
    pub fn start_system(&mut self, nframe: u32) -> bool {
        if self.system.is_tracing && self.images.values().all(|t| t.is_tracing) {
            return false;
        }
        self.system = Tracing {
            is_tracing: true,
            traceback_limit: nframe,
        };
        self.images.clear();
        true
    }

    /// `stop()` system-wide: nothing is traced until a start.
    pub fn stop_system(&mut self) {
        self.system.is_tracing = false;
        self.images.clear();
    }

    /// `start(nframe)` of one image; false (no change) if it traces already.
    pub fn start_image(&mut self, image: ImageId, nframe: u32) -> bool {
        if self.of(image).is_tracing {
            return false;
        }
        self.set(
            image,
            Tracing {
                is_tracing: true,
                traceback_limit: nframe,
            },
        );
        true
    }

    /// `stop()` of one image (its traceback limit is kept).
    pub fn stop_image(&mut self, image: ImageId) {
        let limit = self.of(image).traceback_limit;
        self.set(
            image,
            Tracing {
                is_tracing: false,
                traceback_limit: limit,
            },
        );
    }

    fn set(&mut self, image: ImageId, state: Tracing) {
        if state == self.system {
            self.images.remove(&image);
        } else {
            self.images.insert(image, state);
        }
    }

    /// Records blocks removed from `LIVE_ALLOCS` for `image`.
    pub fn add_offset(&mut self, image: ImageId, bytes: u64, blocks: u64) {
        let offset = self.offsets.entry(image).or_default();
        offset.bytes = offset.bytes.saturating_add(bytes);
        offset.blocks = offset.blocks.saturating_add(blocks);
    }

    /// Records a block of `bytes` removed from the live maps for `image`
    /// by its key of `STACK_TOTALS` (besides [`TracingControl::add_offset`]
    /// of the image's whole).
    pub fn add_stack_offset(&mut self, image: ImageId, key: StackTotalsKey, bytes: u64) {
        let map = Arc::make_mut(self.stack_offsets.entry(image).or_default());
        let offset = map.entry(key).or_default();
        offset.bytes = offset.bytes.saturating_add(bytes);
        offset.blocks = offset.blocks.saturating_add(1);
    }

    /// What was removed behind the kernel's back for `image`, by key of
    /// `STACK_TOTALS`.
    #[must_use]
    pub fn stack_offsets(&self, image: ImageId) -> Option<Arc<HashMap<StackTotalsKey, Offset>>> {
        self.stack_offsets.get(&image).cloned()
    }

    /// What was removed behind the kernel's back for `image`.
    #[must_use]
    pub fn offset(&self, image: ImageId) -> Offset {
        self.offsets.get(&image).copied().unwrap_or_default()
    }

    /// `(current, peak, blocks)` as tracemalloc reports them, from the
    /// kernel's totals of `image`: minus what was cleared, and `(0, 0, 0)`
    /// while the image is not traced (`get_traced_memory()` of a stopped
    /// tracemalloc).
    #[must_use]
    pub fn adjust(&self, image: ImageId, current: u64, peak: u64, blocks: u64) -> (u64, u64, u64) {
        if !self.of(image).is_tracing {
            return (0, 0, 0);
        }
        let offset = self.offset(image);
        (
            current.saturating_sub(offset.bytes),
            peak.saturating_sub(offset.bytes),
            blocks.saturating_sub(offset.blocks),
        )
    }

    /// Forgets images that are gone (keeps those `keep` accepts).
    pub fn retain(&mut self, mut keep: impl FnMut(ImageId) -> bool) {
        self.images.retain(|k, _| keep(*k));
        self.offsets.retain(|k, _| keep(*k));
        self.stack_offsets.retain(|k, _| keep(*k));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    #[test]
    fn start_when_tracing_changes_nothing_like_tracemalloc() {
        let mut control = TracingControl::new(16);
        assert!(!control.start_system(4));
        assert_eq!(
            control.system(),
            Tracing {
                is_tracing: true,
                traceback_limit: 16
            }
        );
        control.stop_system();
        assert!(!control.of(ImageId::new(7, 1)).is_tracing);
        assert!(control.start_system(4));
        assert_eq!(
            control.of(ImageId::new(7, 1)),
            Tracing {
                is_tracing: true,
                traceback_limit: 4
            }
        );
    }

    #[test]
    fn per_image_states_override_the_system_one() {
        let mut control = TracingControl::new(16);
        control.stop_image(ImageId::new(7, 1));
        assert!(!control.of(ImageId::new(7, 1)).is_tracing);
        assert!(
            control.of(ImageId::new(7, 2)).is_tracing,
            "another image of the pid is not stopped"
        );
        assert!(control.start_image(ImageId::new(7, 1), 3));
        assert_eq!(control.of(ImageId::new(7, 1)).traceback_limit, 3);
        assert!(
            !control.start_image(ImageId::new(7, 1), 5),
            "already tracing"
        );
        assert_eq!(control.overrides().count(), 1);
        control.stop_system();
        assert_eq!(control.overrides().count(), 0);
        // Any image stopped: a system start starts them all.
        assert!(control.start_system(16));
        control.stop_image(ImageId::new(8, 1));
        assert!(control.start_system(16));
    }

    #[test]
    fn offsets_are_subtracted_and_stopped_images_report_zero() {
        let mut control = TracingControl::new(16);
        control.add_offset(ImageId::new(7, 1), 1000, 10);
        control.add_offset(ImageId::new(7, 1), 24, 1);
        assert_eq!(
            control.adjust(ImageId::new(7, 1), 1500, 1600, 12),
            (476, 576, 1)
        );
        assert_eq!(
            control.adjust(ImageId::new(7, 1), 10, 10, 0),
            (0, 0, 0),
            "saturates"
        );
        assert_eq!(control.adjust(ImageId::new(8, 1), 10, 20, 1), (10, 20, 1));
        control.stop_image(ImageId::new(8, 1));
        assert_eq!(control.adjust(ImageId::new(8, 1), 10, 20, 1), (0, 0, 0));
        control.retain(|image| image.pid != 7);
        assert_eq!(control.offset(ImageId::new(7, 1)), Offset::default());
    }
}
