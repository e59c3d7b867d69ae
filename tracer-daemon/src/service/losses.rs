//! What was lost, said in the log: each live process that lost blocks
//! (its kernel `drops`) or had tracebacks cut (its kernel `cut`) since it
//! was last logged, and the host-wide stack map when it is full. Each at
//! most once per [`DROPS_LOG_EVERY`]; the counters (`/metrics`, `/maps`,
//! the API's `complete`) say it at every moment.
use std::time::{Duration, Instant};

use tracer_common::{MAP_LIVE_ALLOCS, MAP_STACKS};

use super::Housekeeping;
use super::state::lock;
use crate::capture::ImageId;
use crate::lifecycle::blocks::live_stats;

/// How often one process's losses (or the full stack map) are logged at
/// most.
pub const DROPS_LOG_EVERY: Duration = Duration::from_secs(60);

/// What was last logged of one image, and when.
#[derive(Clone, Copy, Debug)]
pub(super) struct Logged {
    drops: u64,
    cut: u64,
    at: Instant,
}

/// What was last logged: per live image, and of the stack map.
#[derive(Debug, Default)]
pub(super) struct LossLog {
    images: std::collections::HashMap<ImageId, Logged>,
    /// `drop_stack` (`tracer_drops_total{reason="stack_store_full"}`) when
    /// the full stack map was last logged, and when.
    stack_store_full: Option<(u64, Instant)>,
}

impl Housekeeping<'_> {
    /// Logs the losses since they were last logged (see the module doc):
    /// per live process, its pid and command, what it lost and why when the
    /// kernel tells (past its share of the live-block maps, or of the stack
    /// map; else a full map, which `tracer_drops_total{reason}` names), and
    /// its cut tracebacks; host-wide, a full stack map with what to raise.
    pub fn log_drops(&self) {
        let (max, config, stored) = {
            let held = self.service.state.locks().kernel_shared();
            let config = held.kernel.config().clone();
            (
                config.process_max_blocks(),
                config,
                held.kernel.stacks_stored(),
            )
        };
        let (max_stacks, stacks_capacity) = (config.process_max_stacks(), config.max_stacks);
        let now = Instant::now();
        let store_full = self
            .service
            .counters()
            .into_iter()
            .find_map(|(name, value)| (name == "drop_stack").then_some(value))
            .unwrap_or(0);
        let mut log = lock(&self.service.upkeep.drops_logged);
        let (last_full, full_at) = log.stack_store_full.unwrap_or((0, now - DROPS_LOG_EVERY));
        if store_full > last_full && now.duration_since(full_at) >= DROPS_LOG_EVERY {
            log.stack_store_full = Some((store_full, now));
            tracing::warn!(
                map = MAP_STACKS,
                max_stacks = stacks_capacity,
                lost = store_full - last_full,
                "the stack map is full: new stacks are not stored, and their blocks keep their call site alone (cut tracebacks); raise max_stacks"
            );
        }
        // The totals through the shared reader: the registry's lock only,
        // not held behind a pass over the kernel maps.
        let held = self.service.state.locks().registry();
        let mut seen = std::collections::HashSet::new();
        for image in held.registry.live() {
            seen.insert(image.id);
            let stats = live_stats(&*self.service.totals, image.id);
            let last = log.images.get(&image.id).copied().unwrap_or(Logged {
                drops: 0,
                cut: 0,
                at: now - DROPS_LOG_EVERY,
            });
            let grew = stats.drops > last.drops || stats.cut > last.cut;
            if !grew || now.duration_since(last.at) < DROPS_LOG_EVERY {
                continue;
            }
            log.images.insert(
                image.id,
                Logged {
                    drops: stats.drops,
                    cut: stats.cut,
                    at: now,
                },
            );
            let (lost, cut) = (stats.drops - last.drops, stats.cut - last.cut);
            if lost == 0 {
                tracing::warn!(
                    pid = image.pid(),
                    comm = %image.comm,
                    cut,
                    "a process had tracebacks cut: blocks keep a part of their stack (tracer_drops_total's stack reasons and unwind counters say why)"
                );
            } else if max != 0 && stats.blocks >= max {
                tracing::warn!(
                    pid = image.pid(),
                    comm = %image.comm,
                    lost,
                    cut,
                    blocks = stats.blocks,
                    map = MAP_LIVE_ALLOCS,
                    share_blocks = max,
                    "a process is past its share of the live-block maps: its new blocks are not traced (process_share)"
                );
            } else if let Some(stacks) = self
                .service
                .totals
                .proc_totals(image.pid())
                .filter(|t| t.stats.generation == image.id.generation)
                .map(|t| t.stacks)
                .filter(|&stacks| config.past_stack_share(stacks, stored))
            {
                tracing::warn!(
                    pid = image.pid(),
                    comm = %image.comm,
                    lost,
                    cut,
                    stacks,
                    map = MAP_STACKS,
                    share_stacks = max_stacks,
                    stored,
                    "a process is past its share of the stack map (half of it, or once three quarters are taken a quarter of the room left): its new stacks are not stored, their blocks keep their call site only (process_share, max_stacks)"
                );
            } else {
                tracing::warn!(
                    pid = image.pid(),
                    comm = %image.comm,
                    lost,
                    cut,
                    "a process lost blocks: a kernel map was full (tracer_drops_total says which)"
                );
            }
        }
        log.images.retain(|id, _| seen.contains(id));
    }
}
