//! tracemalloc's `start(nframe)`, `stop()`, `is_tracing()`,
//! `get_traceback_limit()`, `clear_traces()` and `reset_peak()`, per
//! process image and system-wide, applied to the kernel maps.
//!
//! The kernel records every process all the time, so tracing is turned off
//! here: a stopped image's blocks are removed from the kernel maps when it
//! stops and again when it starts (so it starts from nothing, as
//! `tracemalloc.start()` does), and its data is not reported in between.
//! What is removed behind the kernel's back is kept as an offset by
//! [`TracingControl`](crate::lifecycle::TracingControl).
use std::collections::{HashMap, HashSet};

use super::processes::ProcessStatus;
use super::{Service, ServiceError, Viewer};
use crate::capture::ImageId;
use tracer_common::{AllocInfo, AllocKey, StackTotalsKey};

/// Blocks `clear-traces` removes at a time: a stop waits for one batch at
/// most (a few milliseconds).
const CLEAR_BATCH: usize = 65_536;

/// `is_tracing()` and `get_traceback_limit()` of a process image or of the
/// whole host, as the API shows them.
pub use tracer_api::{ProcessTracing, TracingState};

impl Service {
    /// `tracemalloc.is_tracing()` and `get_traceback_limit()`: system-wide
    /// (None: with the images whose state differs that `viewer` may see)
    /// or of `pid`'s image.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`].
    pub fn tracing_state(
        &self,
        viewer: Viewer,
        pid: Option<u32>,
    ) -> Result<TracingState, ServiceError> {
        let visible = self.visible_pids(viewer);
        let image = pid.map(|pid| self.image_of(pid)).transpose()?;
        let control = self.state.locks().control().control.clone();
        Ok(match (pid, image) {
            (Some(pid), Some((image, _))) => {
                let state = control.of(image);
                TracingState {
                    pid: Some(pid),
                    is_tracing: state.is_tracing,
                    traceback_limit: state.traceback_limit,
                    max_nframe: control.kernel_nframe(),
                    processes: None,
                    started: None,
                }
            }
            _ => {
                let system = control.system();
                let mut overrides: Vec<ProcessTracing> = control
                    .overrides()
                    .filter(|(image, _)| visible.as_ref().is_none_or(|v| v.contains(&image.pid)))
                    .map(|(image, t)| ProcessTracing {
                        pid: image.pid,
                        is_tracing: t.is_tracing,
                        traceback_limit: t.traceback_limit,
                    })
                    .collect();
                overrides.sort_by_key(|t| t.pid);
                TracingState {
                    pid: None,
                    is_tracing: system.is_tracing,
                    traceback_limit: system.traceback_limit,
                    max_nframe: control.kernel_nframe(),
                    processes: Some(overrides),
                    started: None,
                }
            }
        })
    }

    /// `tracemalloc.start(nframe)`: system-wide or of `pid`'s image. When
    /// tracing already, nothing changes (as in tracemalloc); else what the
    /// kernel recorded while stopped is cleared first, so tracing starts
    /// from nothing. Returns the state after, with whether it started.
    ///
    /// # Errors
    /// [`ServiceError::BadNframe`], [`ServiceError::NotTraced`],
    /// [`ServiceError::Ended`].
    pub fn start_tracing(
        &self,
        pid: Option<u32>,
        nframe: Option<u64>,
    ) -> Result<TracingState, ServiceError> {
        let max = self.state.locks().control().control.kernel_nframe();
        let nframe = match nframe {
            None => max,
            Some(n) => match u32::try_from(n) {
                Ok(n) if (1..=max).contains(&n) => n,
                _ => return Err(ServiceError::BadNframe { nframe: n, max }),
            },
        };
        let started = match pid {
            Some(pid) => {
                let image = self.live_image_of(pid)?;
                if self.state.locks().control().control.of(image).is_tracing {
                    false
                } else {
                    self.clear_images(&HashSet::from([image]));
                    self.state
                        .locks()
                        .control()
                        .control
                        .start_image(image, nframe)
                }
            }
            None => {
                let stopped: HashSet<ImageId> = {
                    let held = self.state.locks().registry().control();
                    let system = held.control.system();
                    if system.is_tracing && held.control.overrides().all(|(_, t)| t.is_tracing) {
                        HashSet::new()
                    } else {
                        // Clear every image that is not tracing now.
                        held.registry
                            .live()
                            .map(|i| i.id)
                            .filter(|id| !held.control.of(*id).is_tracing)
                            .collect()
                    }
                };
                self.clear_images(&stopped);
                self.state.locks().control().control.start_system(nframe)
            }
        };
        let mut state = self.tracing_state(Viewer::Operator, pid)?;
        state.started = Some(started);
        Ok(state)
    }

    /// `tracemalloc.stop()`: system-wide or of `pid`'s image; clears its
    /// traces, as tracemalloc does. Returns the state after.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`], [`ServiceError::Ended`].
    pub fn stop_tracing(&self, pid: Option<u32>) -> Result<TracingState, ServiceError> {
        match pid {
            Some(pid) => {
                let image = self.live_image_of(pid)?;
                self.state.locks().control().control.stop_image(image);
                self.clear_images(&HashSet::from([image]));
            }
            None => {
                self.state.locks().control().control.stop_system();
                let all: HashSet<ImageId> = self
                    .state
                    .locks()
                    .registry()
                    .registry
                    .live()
                    .map(|i| i.id)
                    .collect();
                self.clear_images(&all);
            }
        }
        self.tracing_state(Viewer::Operator, pid)
    }

    /// `tracemalloc.clear_traces()` of `pid`: its blocks leave the kernel
    /// maps, its traced memory (current and peak) restarts from 0. Returns
    /// the number of blocks cleared and the process after.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`], [`ServiceError::Ended`].
    pub fn clear_traces(&self, pid: u32) -> Result<(u64, ProcessStatus), ServiceError> {
        let image = self.live_image_of(pid)?;
        let cleared = self.clear_images(&HashSet::from([image]));
        Ok((cleared, self.process(pid)?))
    }

    /// Removes the blocks of `images` from the kernel maps (one key at a
    /// time, so that only blocks really removed, not freed meanwhile, are
    /// counted in the offsets), and resets their kernel peak.
    pub(super) fn clear_images(&self, images: &HashSet<ImageId>) -> u64 {
        if images.is_empty() {
            return 0;
        }
        // The kernel lock for the scan and the removals; the control lock
        // (which the cheap routes need) only for the peaks and offsets at
        // the end, together, so that a reader sees the clear whole or not
        // at all (the kernel's totals keep counting the blocks removed
        // until their offset is added).
        let mut held = self.state.locks().kernel();
        let mut by_image: HashMap<ImageId, Vec<(AllocKey, AllocInfo)>> = HashMap::new();
        for (key, info) in held.kernel.live_blocks(Some(images)) {
            by_image
                .entry(ImageId::of_block(&key, &info))
                .or_default()
                .push((key, info));
        }
        let mut removed: HashMap<ImageId, (u64, u64)> = HashMap::new();
        let mut by_stack: Vec<(ImageId, StackTotalsKey, u64)> = Vec::new();
        for (image, entries) in by_image {
            // A batch at a time: a stop does not wait for millions.
            for batch in entries.chunks(CLEAR_BATCH) {
                if self.stopping() {
                    break;
                }
                let keys: Vec<AllocKey> = batch.iter().map(|(key, _)| *key).collect();
                let infos: HashMap<u64, &AllocInfo> =
                    batch.iter().map(|(key, info)| (key.addr, info)).collect();
                let slot = removed.entry(image).or_default();
                held.kernel.remove_image_blocks(image, &keys, &mut |key| {
                    if let Some(info) = infos.get(&key.addr) {
                        slot.0 = slot.0.saturating_add(info.size);
                        slot.1 += 1;
                        by_stack.push((image, StackTotalsKey::of(info), info.size));
                    }
                });
            }
        }
        let mut held = held.control();
        for image in images {
            held.kernel.reset_peak(image.pid);
        }
        let mut total = 0;
        for (image, (bytes, blocks)) in removed {
            held.control.add_offset(image, bytes, blocks);
            total += blocks;
        }
        for (image, key, bytes) in by_stack {
            held.control.add_stack_offset(image, key, bytes);
        }
        total
    }

    /// `tracemalloc.reset_peak()` of `pid`: its peak becomes its current
    /// traced memory. Returns the process after.
    ///
    /// # Errors
    /// [`ServiceError::NotTraced`], [`ServiceError::Ended`].
    pub fn reset_peak(&self, pid: u32) -> Result<ProcessStatus, ServiceError> {
        self.live_image_of(pid)?;
        self.state.locks().kernel().kernel.reset_peak(pid);
        self.process(pid)
    }
}
