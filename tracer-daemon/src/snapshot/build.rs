//! Kernel blocks and frames into a tracemalloc [`Snapshot`]: one
//! symbolization per distinct stack, each traceback cut to `nframe` frames
//! with its `total_nframe`, domain = pid. With sampling on, the sampled
//! blocks become unbiased estimates (see [`SnapshotBuilder::build`]).
use std::{collections::HashMap, sync::Arc};

use tracer_model::{Frame, FrameExtra, Snapshot, Trace, Traceback};

use crate::lifecycle::RawBlock;
use crate::symbolize::Symbolizer;
use crate::sys::modules::ModuleMaps;

/// A traceback's sampled blocks: its stack, estimated count and bytes.
type EstimatedGroup = (Option<Arc<[u64]>>, f64, f64);

/// Builds snapshots of traced processes; one per daemon.
pub struct SnapshotBuilder {
    /// Turns return addresses into frames (its caches are shared by every
    /// snapshot).
    pub symbolizer: Symbolizer,
    /// The traceback limit in frames (tracerd's `nframe`).
    pub nframe: u32,
    /// Mean sampling interval in bytes; 0: exact.
    pub sample_interval: u64,
}

impl SnapshotBuilder {
    /// Turns raw blocks into a [`Snapshot`]: one symbolization per distinct
    /// stack, tracebacks truncated to `nframe` frames, domain = pid.
    pub fn build(&self, pid: u32, blocks: &[RawBlock], maps: Option<&ModuleMaps>) -> Snapshot {
        let mut tracebacks: HashMap<*const u64, Arc<Traceback>> = HashMap::new();
        let unknown = Arc::new(Traceback::new(vec![Frame::unknown()], Some(1)));
        let mean = self.sample_interval;
        if mean > 0 {
            return Snapshot::new(self.estimated_traces(pid, blocks, maps, mean), self.nframe);
        }
        let mut traces = Vec::with_capacity(blocks.len());
        for block in blocks {
            let traceback = match &block.stack {
                None => unknown.clone(),
                Some(stack) => tracebacks
                    .entry(stack.as_ptr())
                    .or_insert_with(|| Arc::new(self.traceback(stack, maps)))
                    .clone(),
            };
            traces.push(Trace {
                domain: pid,
                size: block.size,
                traceback,
            });
        }
        Snapshot::new(traces, self.nframe)
    }

    /// Sampled blocks to traces with unbiased estimates. A block of `s`
    /// bytes was sampled with probability p = 1 - exp(-s/mean), so it stands
    /// for 1/p blocks and s/p bytes (Horvitz-Thompson). Per traceback the
    /// estimates are summed, and the group is rebuilt as round(count)
    /// traces (at least 1) whose sizes add up to round(bytes): statistics
    /// and compare_to then report the estimated count and size.
    fn estimated_traces(
        &self,
        pid: u32,
        blocks: &[RawBlock],
        maps: Option<&ModuleMaps>,
        mean: u64,
    ) -> Vec<Trace> {
        let mut groups: HashMap<Option<*const u64>, EstimatedGroup> = HashMap::new();
        for block in blocks {
            let s = block.size as f64;
            let p = -(-s / mean as f64).exp_m1();
            let (count, bytes) = if p > 0.0 {
                (1.0 / p, s / p)
            } else {
                (mean as f64, 0.0)
            };
            let key = block.stack.as_ref().map(|stack| stack.as_ptr());
            let entry = groups
                .entry(key)
                .or_insert_with(|| (block.stack.clone(), 0.0, 0.0));
            entry.1 += count;
            entry.2 += bytes;
        }
        let mut traces = Vec::new();
        for (_, (stack, count, bytes)) in groups {
            let traceback = match &stack {
                Some(stack) => Arc::new(self.traceback(stack, maps)),
                None => Arc::new(Traceback::new(vec![Frame::unknown()], Some(1))),
            };
            let n = (count.round() as u64).max(1);
            let total = bytes.round() as u64;
            let (each, extra) = (total / n, total % n);
            for i in 0..n {
                let size = each + u64::from(i < extra);
                traces.push(Trace {
                    domain: pid,
                    size,
                    traceback: traceback.clone(),
                });
            }
        }
        traces
    }

    fn traceback(&self, stack: &[u64], maps: Option<&ModuleMaps>) -> Traceback {
        let limit = self.nframe as usize;
        let mut frames = Vec::new();
        if let Some(maps) = maps {
            for per_address in self.symbolizer.symbolize(maps, stack) {
                for sym in per_address {
                    frames.push(Frame {
                        filename: sym.filename,
                        lineno: sym.lineno,
                        extra: Some(Arc::new(FrameExtra {
                            function: sym.function,
                            module: sym.module,
                            address: Some(sym.address),
                        })),
                    });
                }
            }
        } else {
            frames.extend(stack.iter().map(|&address| Frame {
                extra: Some(Arc::new(FrameExtra {
                    function: None,
                    module: None,
                    address: Some(address),
                })),
                ..Frame::unknown()
            }));
        }
        if frames.is_empty() {
            frames.push(Frame::unknown());
        }
        let total = u32::try_from(frames.len()).unwrap_or(u32::MAX);
        frames.truncate(limit);
        Traceback::new(frames, Some(total))
    }
}
