//! Room in the stack map (`STACKS`) on a busy host: every second, while it
//! is at least half full, the stacks no live block names are removed. A
//! host that starts processes all the time (a package install, a build)
//! fills it with the stacks of processes that have ended: each image's
//! stacks are its own, for address space layouts differ. The orphan
//! sweep's collection (every 10 s, over every live block) let the map
//! fill in seconds, and the blocks that came next lost their tracebacks
//! (measured in `docs/design/0011-measured-figures.md`).
//!
//! Which stacks are named comes from the kernel's totals per stack
//! (`STACK_TOTALS`: every live block is counted under its stack id) rather
//! than from a pass over the blocks, so a collection costs the host's
//! distinct stacks, not its blocks. While an image's totals are not exact
//! (`stack_totals_lost`) the sweep's pass over the blocks is left to do it.
//!
//! A stack is removed only when it was unnamed at this collection and at
//! the one before (a second apart): a program stores a block's stack a
//! moment before it counts the block under it, and a stack stored just
//! before a collection must not go because its block was counted just
//! after.
use std::collections::HashSet;

use tracer_common::MAP_STACKS;

use super::Housekeeping;
use super::state::lock;

/// The stacks seen unnamed at the last collection ([`Housekeeping::collect_stacks`]).
#[derive(Debug, Default)]
pub(super) struct Unnamed {
    ids: HashSet<u64>,
}

impl Housekeeping<'_> {
    /// Removes the stacks of `STACKS` that no live block named at this
    /// collection nor at the last one, when the map is at least half full
    /// and every image's totals per stack are exact (see the module doc).
    /// Returns how many were removed.
    pub fn collect_stacks(&self) -> usize {
        let held = self.service.state.locks().kernel_shared();
        let capacity = u64::from(held.kernel.config().max_stacks);
        if held.kernel.stacks_stored() * 2 < capacity || self.service.stopping() {
            lock(&self.service.upkeep.unnamed_stacks).ids.clear();
            return 0;
        }
        let inexact = held.kernel.all_proc_stats().into_iter().any(|(tgid, _)| {
            held.kernel
                .proc_totals(tgid)
                .is_some_and(|totals| totals.stack_totals_lost > 0)
        });
        if inexact {
            return 0;
        }
        // Listed before the totals are read: a stack stored after the list
        // is not a candidate, whatever the totals say of it.
        let listed = held.kernel.stack_ids();
        let named: HashSet<u64> = held
            .kernel
            .stack_totals(None)
            .into_iter()
            .filter(|(_, totals)| totals.count > 0)
            .map(|(key, _)| key.stack_id)
            .collect();
        drop(held);
        let unnamed: HashSet<u64> = listed
            .into_iter()
            .filter(|id| !named.contains(id))
            .collect();
        let doomed: Vec<u64> = {
            let mut last = lock(&self.service.upkeep.unnamed_stacks);
            let doomed = unnamed.intersection(&last.ids).copied().collect();
            last.ids = unnamed;
            doomed
        };
        if doomed.is_empty() || self.service.stopping() {
            return 0;
        }
        let removed = self
            .service
            .state
            .locks()
            .kernel()
            .kernel
            .remove_stacks(&doomed);
        tracing::debug!(
            removed,
            map = MAP_STACKS,
            "collected stacks no live block names"
        );
        removed
    }
}
