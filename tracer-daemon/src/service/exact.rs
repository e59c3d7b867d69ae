//! Exact tracing on demand, tracerd's default (`exact = "demand"`): every
//! process is watched cheaply ([`crate::lifecycle::watch`], its memory
//! read from `/proc/PID/statm` at each interval) and traced exactly (every
//! allocation, its probes registered for that process alone) when asked:
//! by the first query of its pid (as `tracemalloc.start()` would: what it
//! allocated from then on), by the scope, or by the watch when it grows
//! steadily (at most `auto_exact_max` processes, each let go after
//! `auto_exact_for` unless it still grows). Processes not traced exactly
//! pay nothing per allocation.
//!
//! The pids traced on demand are added to the scope in force (the
//! *effective* scope, which the kernel side, the exec holds and the
//! discovery read), while `GET /scope` shows the scope the user chose
//! beside them.
use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant, SystemTime},
};

use super::{Service, ServiceError, Viewer, state::lock};
use crate::config::{Config, ExactMode};
use crate::lifecycle::{
    Scope, scope,
    watch::{Reading, Watch, WatchFigures},
};
use crate::sys::unix_ms;

/// How long a query that started exact tracing waits for the process's
/// first allocation, so that its answer already has the process.
const FIRST_ALLOCATION_WAIT: Duration = Duration::from_millis(300);

/// The settings of exact tracing and of the watch (the `processes`
/// section: `exact`, `watch_interval`, `auto_exact*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactPolicy {
    /// `exact`.
    pub mode: ExactMode,
    /// Between two reads of every process's memory; zero: no watch.
    pub watch_interval: Duration,
    /// Whether the watch traces steadily growing processes exactly.
    pub auto: bool,
    /// Anonymous bytes gained over `window` that make growth steady.
    pub growth: u64,
    /// The watch's window.
    pub window: Duration,
    /// Processes the watch traces exactly at once.
    pub max: u32,
    /// How long a process the watch picked stays traced exactly before it
    /// is let go, unless it still grows.
    pub hold_for: Duration,
}

impl From<&Config> for ExactPolicy {
    fn from(config: &Config) -> Self {
        let p = &config.processes;
        Self {
            mode: p.exact,
            watch_interval: Duration::from_secs(p.watch_interval),
            auto: p.auto_exact,
            growth: p.auto_exact_growth,
            window: Duration::from_secs(p.auto_exact_window),
            max: p.auto_exact_max,
            hold_for: Duration::from_secs(p.auto_exact_for),
        }
    }
}

impl Default for ExactPolicy {
    fn default() -> Self {
        Self::from(&Config::default())
    }
}

/// Why a process is traced exactly.
pub use tracer_api::ExactReason;

/// A process traced exactly on demand: since when and why.
#[derive(Clone, Copy, Debug)]
struct OnDemand {
    since_ms: u64,
    reason: ExactReason,
    /// When the watch lets it go unless it still grows (its picks only).
    until: Option<Instant>,
    /// Its descendants too (`tracing/start?descendants=true`).
    descendants: bool,
}

/// The scope the user chose and the pids traced on demand besides it.
#[derive(Debug, Default)]
struct Demand {
    user: Scope,
    entries: BTreeMap<u32, OnDemand>,
}

impl Demand {
    /// The scope in force: the user's, with the pids traced on demand.
    fn effective(&self) -> Scope {
        let mut scope = self.user.clone();
        for (pid, entry) in &self.entries {
            if entry.descendants {
                scope.trees.insert(*pid);
            } else {
                scope.pids.insert(*pid);
            }
        }
        scope
    }
}

/// Exact tracing on demand and the watch: their settings and state, owned
/// by the service.
pub(super) struct ExactState {
    policy: ExactPolicy,
    demand: Mutex<Demand>,
    watch: Mutex<Watch>,
}

impl ExactState {
    /// Nothing traced on demand, nothing watched yet.
    pub(super) fn new(policy: ExactPolicy) -> Self {
        Self {
            watch: Mutex::new(Watch::new(
                u64::try_from(policy.window.as_millis()).unwrap_or(u64::MAX),
                policy.growth,
            )),
            policy,
            demand: Mutex::default(),
        }
    }
}

/// One process as the watch shows it (`GET /processes`' `watched`).
pub use tracer_api::{ExactTracing, WatchedProcess};

impl Service {
    /// `exact`: which processes are traced exactly outside a scope.
    pub fn exact_mode(&self) -> ExactMode {
        self.exact.policy.mode
    }

    /// The settings of exact tracing and the watch.
    pub fn exact_policy(&self) -> ExactPolicy {
        self.exact.policy
    }

    /// The scope the user chose (configuration or `PUT /scope`), without
    /// the pids traced on demand.
    pub(super) fn user_scope(&self) -> Scope {
        lock(&self.exact.demand).user.clone()
    }

    /// Stores `user` as the user's scope and returns the scope in force
    /// with it (the pids traced on demand added).
    pub(super) fn effective_scope_with(&self, user: Scope) -> Scope {
        let mut demand = lock(&self.exact.demand);
        demand.user = user;
        demand.effective()
    }

    /// Whether, since when and why `pid` is traced exactly: on demand (its
    /// start), or by the scope or `exact = "all"` (since tracerd started);
    /// None when it is watched only.
    pub fn exact_of(&self, pid: u32) -> Option<ExactTracing> {
        if let Some(entry) = lock(&self.exact.demand).entries.get(&pid) {
            return Some(ExactTracing {
                since_ms: entry.since_ms,
                reason: entry.reason,
            });
        }
        let scope = self
            .scope_published
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let since_ms = unix_ms(self.started_at);
        if scope.is_all() {
            Some(ExactTracing {
                since_ms,
                reason: ExactReason::All,
            })
        } else if scope.matches(pid) {
            Some(ExactTracing {
                since_ms,
                reason: ExactReason::Scope,
            })
        } else {
            None
        }
    }

    /// The first query of `pid` (any `/pid/{pid}` route but
    /// `tracing/stop`), under `exact = "demand"`: a live process that is
    /// not traced exactly is from now on ([`Service::start_exact`]), and
    /// the query waits a moment for its first allocation so that it
    /// answers with the process. Nothing for a process traced already,
    /// tracerd itself, or a pid no process has (the route answers why).
    pub fn trace_on_query(&self, pid: u32) {
        if self.exact.policy.mode == ExactMode::All
            || pid == std::process::id()
            || !crate::sys::procfs::exists(pid)
            || crate::sys::procfs::is_zombie(pid)
            || self
                .scope_published
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .matches(pid)
        {
            return;
        }
        if let Err(err) = self.start_exact(pid, ExactReason::Query) {
            tracing::debug!(pid, %err, "exact tracing could not start");
            return;
        }
        let started = Instant::now();
        while started.elapsed() < FIRST_ALLOCATION_WAIT && self.totals.proc_stats(pid).is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Traces `pid` exactly from now on, for `reason`: its files' unwind
    /// tables first (so its first walks are whole), then its probes,
    /// registered for it alone (or it joins the kernel's scope filter
    /// under a scope of executables or cgroups), then its objects'
    /// allocators found. Returns since when it is traced (Unix ms); a
    /// process traced already keeps its start.
    ///
    /// # Errors
    /// [`ServiceError::Scope`] when its probes cannot be attached (it
    /// ended meanwhile); nothing of it stays then.
    pub fn start_exact(&self, pid: u32, reason: ExactReason) -> Result<u64, ServiceError> {
        self.start_exact_with(pid, reason, false)
    }

    /// `POST /pid/{pid}/tracing/start`: under `exact = "demand"`, traces
    /// `pid` exactly from now on (as a query does), and with `descendants`
    /// every process it forks from now on too, from their first
    /// allocation (the kernel's scope filter adds each child at its fork:
    /// while such a tree is traced, the probes are registered for every
    /// process, as for a scope of executables). Nothing under `exact =
    /// "all"`.
    ///
    /// # Errors
    /// As [`Service::start_exact`]; [`ServiceError::NotTraced`] for a pid
    /// no live process has.
    pub fn start_exact_for(&self, pid: u32, descendants: bool) -> Result<(), ServiceError> {
        if self.exact.policy.mode == ExactMode::All {
            return Ok(());
        }
        if pid == std::process::id()
            || !crate::sys::procfs::exists(pid)
            || crate::sys::procfs::is_zombie(pid)
        {
            return Err(self.not_traced(pid));
        }
        self.start_exact_with(pid, ExactReason::Query, descendants)
            .map(|_| ())
    }

    /// [`Service::start_exact`], with its descendants when `descendants`
    /// (a process traced already without them gains them).
    fn start_exact_with(
        &self,
        pid: u32,
        reason: ExactReason,
        descendants: bool,
    ) -> Result<u64, ServiceError> {
        let known = lock(&self.exact.demand)
            .entries
            .get(&pid)
            .map(|e| (e.since_ms, e.descendants));
        match known {
            Some((since_ms, had)) if had || !descendants => return Ok(since_ms),
            Some(_) => {}
            None => {
                if let Some(exact) = self.exact_of(pid)
                    && !descendants
                {
                    return Ok(exact.since_ms);
                }
            }
        }
        super::Unwinder::new(self).tables_of(&[pid]);
        let since_ms = unix_ms(SystemTime::now());
        let until =
            (reason == ExactReason::Watch).then(|| Instant::now() + self.exact.policy.hold_for);
        {
            let mut held = self.state.locks().kernel().scope();
            let effective = {
                let mut demand = lock(&self.exact.demand);
                // A start of the same process meanwhile (two first
                // queries at once) keeps its own start and reason.
                let entry = demand.entries.entry(pid).or_insert(OnDemand {
                    since_ms: known.map_or(since_ms, |(since, _)| since),
                    reason,
                    until,
                    descendants,
                });
                entry.descendants |= descendants;
                demand.effective()
            };
            if let Err(reason) = scope::apply(&mut **held.kernel, &effective) {
                let effective = {
                    let mut demand = lock(&self.exact.demand);
                    demand.entries.remove(&pid);
                    demand.effective()
                };
                let _ = scope::apply(&mut **held.kernel, &effective);
                return Err(ServiceError::Scope { reason });
            }
            self.publish_scope(&mut held.scope, effective);
        }
        let discoverer = super::Discoverer::new(self);
        discoverer.queue_discovery(pid, false);
        discoverer.discover_pending();
        tracing::info!(
            pid,
            reason = reason.as_str(),
            descendants,
            "traced exactly from now on"
        );
        Ok(known.map_or(since_ms, |(since, _)| since))
    }

    /// Stops tracing `pid` exactly if it was on demand: its probes are
    /// detached (or it leaves the kernel's scope filter) and its traces
    /// cleared, as `tracemalloc.stop()` clears them. Returns whether it
    /// was traced on demand. A process the user's scope names stays.
    pub fn release_exact(&self, pid: u32) -> bool {
        let (before, after) = {
            let mut held = self.state.locks().kernel().scope();
            let (before, effective) = {
                let mut demand = lock(&self.exact.demand);
                let before = demand.effective();
                if demand.entries.remove(&pid).is_none() {
                    return false;
                }
                (before, demand.effective())
            };
            if let Err(reason) = scope::apply(&mut **held.kernel, &effective) {
                tracing::warn!(pid, %reason, "could not detach a process traced on demand");
            }
            self.publish_scope(&mut held.scope, effective.clone());
            (before, effective)
        };
        // The live images it took out of the scope (it, and its
        // descendants when it was traced with them).
        let candidates: Vec<crate::capture::ImageId> = {
            let held = self.state.locks().registry();
            held.registry.live().map(|image| image.id).collect()
        };
        let left: std::collections::HashSet<_> = candidates
            .into_iter()
            .filter(|image| before.matches(image.pid) && !after.matches(image.pid))
            .collect();
        self.clear_images(&left);
        tracing::info!(pid, processes = left.len(), "no longer traced exactly");
        true
    }

    /// Stores `effective` as the scope in force (the scope lock held by
    /// the caller, as `held`) and publishes it for the readers that do not
    /// take the lock.
    pub(super) fn publish_scope(&self, held: &mut Scope, effective: Scope) {
        self.exec_holds
            .scope_is_all
            .store(effective.is_all(), std::sync::atomic::Ordering::Release);
        self.exec_holds
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        *self
            .scope_published
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            std::sync::Arc::new(effective.clone());
        *held = effective;
    }

    /// One pass of the watch: every user process's memory read
    /// (`/proc/PID/statm`) and kept for the window; under `exact =
    /// "demand"` with `auto_exact`, the steadily growing processes traced
    /// exactly (at most `auto_exact_max` at once, the fastest first), and
    /// those picked before whose time is up let go unless they still grow.
    /// Processes gone are dropped from the on-demand set.
    pub fn watch_tick(&self) {
        let own = std::process::id();
        let readings: Vec<Reading> = crate::sys::procfs::all_pids()
            .into_iter()
            .filter(|&pid| pid != own)
            .filter_map(|pid| {
                let (rss, anon) = crate::sys::procfs::read_memory(pid)?;
                Some(Reading { pid, rss, anon })
            })
            .collect();
        let (growing, expired, gone) = {
            let mut watch = lock(&self.exact.watch);
            watch.observe(unix_ms(SystemTime::now()), &readings);
            let demand = lock(&self.exact.demand);
            let now = Instant::now();
            let expired: Vec<(u32, bool)> = demand
                .entries
                .iter()
                .filter(|(_, e)| e.until.is_some_and(|until| until <= now))
                .map(|(pid, _)| (*pid, watch.grows_steadily(*pid)))
                .collect();
            let gone: Vec<u32> = demand
                .entries
                .keys()
                .filter(|pid| !crate::sys::procfs::exists(**pid))
                .copied()
                .collect();
            (watch.growing(), expired, gone)
        };
        for pid in gone {
            self.release_exact(pid);
        }
        for (pid, still_growing) in expired {
            if still_growing {
                if let Some(entry) = lock(&self.exact.demand).entries.get_mut(&pid) {
                    entry.until = Some(Instant::now() + self.exact.policy.hold_for);
                }
                tracing::info!(pid, "still growing: traced exactly for another period");
            } else {
                tracing::info!(pid, "no longer growing: let go by the watch");
                self.release_exact(pid);
            }
        }
        if self.exact.policy.mode != ExactMode::Demand || !self.exact.policy.auto {
            return;
        }
        for pid in growing {
            let picked = lock(&self.exact.demand)
                .entries
                .values()
                .filter(|e| e.reason == ExactReason::Watch)
                .count();
            if picked >= self.exact.policy.max as usize {
                break;
            }
            if self.exact_of(pid).is_some() || !crate::sys::procfs::is_process(pid) {
                continue;
            }
            let figures = lock(&self.exact.watch).figures(pid);
            if let Err(err) = self.start_exact(pid, ExactReason::Watch) {
                tracing::debug!(pid, %err, "a growing process could not be traced");
            } else if let Some(f) = figures {
                tracing::info!(
                    pid,
                    anon_growth = f.anon_growth,
                    over_ms = f.growth_over_ms,
                    "growing steadily: traced exactly by the watch"
                );
            }
        }
    }

    /// The watch's figures of `pid`, if it is watched.
    pub fn watch_of(&self, pid: u32) -> Option<WatchFigures> {
        lock(&self.exact.watch).figures(pid)
    }

    /// Every watched process `viewer` may see, by pid: its memory, its
    /// growth over the window, and whether and since when it is traced
    /// exactly.
    pub fn watched(&self, viewer: Viewer) -> Vec<WatchedProcess> {
        let pids: Vec<(u32, WatchFigures)> = {
            let watch = lock(&self.exact.watch);
            let mut pids: Vec<u32> = watch.pids().collect();
            pids.sort_unstable();
            pids.into_iter()
                .filter_map(|pid| Some((pid, watch.figures(pid)?)))
                .collect()
        };
        pids.into_iter()
            .filter(|(pid, _)| self.visible(viewer, *pid))
            .map(|(pid, figures)| WatchedProcess {
                pid,
                comm: crate::sys::procfs::read_comm(pid).unwrap_or_default(),
                watch: figures,
                exact: self.exact_of(pid),
            })
            .collect()
    }
}

impl Service {
    /// The processes traced exactly on demand, by pid (`GET /scope`).
    pub(super) fn on_demand(&self) -> Vec<tracer_api::OnDemandProcess> {
        lock(&self.exact.demand)
            .entries
            .iter()
            .map(|(pid, entry)| tracer_api::OnDemandProcess {
                pid: *pid,
                since_ms: entry.since_ms,
                reason: entry.reason,
            })
            .collect()
    }
}

impl Service {
    /// How many processes the watch reads, and how many are traced
    /// exactly on demand for each reason (`query`, `watch`), for
    /// `/metrics`.
    pub fn exact_counts(&self) -> (usize, [(&'static str, usize); 2]) {
        let watched = lock(&self.exact.watch).pids().count();
        let demand = lock(&self.exact.demand);
        let count = |reason| {
            demand
                .entries
                .values()
                .filter(|e| e.reason == reason)
                .count()
        };
        (
            watched,
            [
                ("query", count(ExactReason::Query)),
                ("watch", count(ExactReason::Watch)),
            ],
        )
    }
}
