//! Totals per (image, stack) from `STACK_TOTALS`: what statistics of a live
//! image read instead of its blocks (see `tracer_common::stack_totals`).
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::os::fd::AsFd as _;

use tracer_common::{StackTotals, StackTotalsKey};

use super::Capture;
use crate::sys::bpf as bpf_sys;

impl Capture {
    /// Every entry of `STACK_TOTALS` whose generation is in `generations`
    /// (None: every entry), in one pass of batch lookups over the map
    /// (its entries are per distinct stack of each image, not per block).
    /// Only some of them once tracerd's stop is raised.
    pub fn stack_totals(
        &self,
        generations: Option<&HashSet<u32>>,
    ) -> Vec<(StackTotalsKey, StackTotals)> {
        let mut out = Vec::new();
        let stopping = &self.stopping;
        let mut keep = |key: &StackTotalsKey, totals: &StackTotals| {
            if stopping.is_raised() {
                return ControlFlow::Break(());
            }
            if generations.is_none_or(|want| want.contains(&key.gen_)) {
                out.push((*key, *totals));
            }
            ControlFlow::Continue(())
        };
        let fd = aya::maps::IterableMap::map(&self.stack_totals).fd().as_fd();
        if bpf_sys::lookup_batch(fd, &mut keep).is_err() {
            for (key, totals) in self.stack_totals.iter().flatten() {
                if keep(&key, &totals).is_break() {
                    break;
                }
            }
        }
        out
    }

    /// Deletes entries of `STACK_TOTALS` (those of ended images: the
    /// programs never write them again); returns how many were there.
    pub fn remove_stack_totals(&mut self, keys: &[StackTotalsKey]) -> usize {
        let fd = aya::maps::IterableMap::map(&self.stack_totals).fd().as_fd();
        bpf_sys::delete_batch(fd, keys, |_| {})
    }
}
