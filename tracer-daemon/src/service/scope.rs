//! Which processes are traced: the scope in force, and changing it (see
//! [`crate::lifecycle::scope`]).
use std::collections::HashSet;

use serde::Serialize;

use super::{Service, ServiceError, Viewer};
use crate::lifecycle::{ImageId, Scope, scope};

/// The scope in force and what is attached for it (`GET /scope`).
#[derive(Clone, Debug, Serialize)]
pub struct ScopeView {
    /// The scope.
    pub scope: Scope,
    /// True when the probes are attached for every process.
    pub all_processes: bool,
    /// Processes with probes of their own (a scope of pids alone).
    pub attached_pids: Vec<u32>,
    /// True when the kernel records only the processes in scope, the
    /// probes attached for every process (a scope with executables or
    /// cgroups).
    pub filtered: bool,
    /// The processes the kernel records while `filtered` (`SCOPE_TGIDS`:
    /// with the threads forked in scope that live).
    pub filter_pids: Vec<u32>,
    /// `exact`: `demand` or `all`.
    pub exact: crate::config::ExactMode,
    /// The processes traced exactly on demand (query, watch), by pid.
    pub on_demand: Vec<tracer_api::OnDemandProcess>,
}

impl ScopeView {
    /// As the API sends it.
    #[must_use]
    pub fn wire(&self) -> tracer_api::ScopeView {
        let path = |p: &std::path::PathBuf| p.to_string_lossy().into_owned();
        tracer_api::ScopeView {
            scope: tracer_api::Scope {
                pids: self.scope.pids.clone(),
                exes: self.scope.exes.iter().map(path).collect(),
                cgroups: self.scope.cgroups.clone(),
            },
            all_processes: self.all_processes,
            attached_pids: self.attached_pids.clone(),
            filtered: self.filtered,
            filter_pids: self.filter_pids.clone(),
            exact: self.exact.as_str().to_string(),
            on_demand: self.on_demand.clone(),
        }
    }
}

impl Service {
    /// The scope in force and what is attached; the processes listed
    /// (attached, in the filter) are those `viewer` may see.
    pub fn scope(&self, viewer: Viewer) -> ScopeView {
        let mut view = {
            let held = self.state.locks().kernel().scope();
            let attached = held.kernel.attached();
            let filtered = held.scope.is_filtered();
            ScopeView {
                scope: self.user_scope(),
                exact: self.exact_mode(),
                on_demand: self.on_demand(),
                all_processes: attached.contains(&None) && !filtered,
                attached_pids: attached.into_iter().flatten().collect(),
                filtered,
                filter_pids: if filtered {
                    held.kernel.in_scope()
                } else {
                    Vec::new()
                },
            }
        };
        if !viewer.is_operator() {
            view.attached_pids.retain(|pid| self.visible(viewer, *pid));
            view.filter_pids.retain(|pid| self.visible(viewer, *pid));
            view.on_demand.retain(|p| self.visible(viewer, p.pid));
        }
        view
    }

    /// Sets which processes are traced and attaches accordingly. Returns
    /// the processes now attached one by one (empty when every process is
    /// traced).
    ///
    /// A process the new scope leaves out loses its traces, as
    /// `tracemalloc.stop()` clears them: its probes are gone, so its frees
    /// from then on are not seen, and blocks kept would become leaks that
    /// are not there. Back in scope, it is traced afresh, its totals exact
    /// from then on.
    ///
    /// # Errors
    /// [`ServiceError::Scope`] when the scope is invalid or the system-wide
    /// probes cannot be attached again.
    pub fn set_scope(&self, new: Scope) -> Result<Vec<u32>, ServiceError> {
        // A scope is chosen on top of `exact`: with none chosen, `demand`
        // traces no process exactly but those on demand.
        let new = Scope {
            on_demand: self.exact_mode() == crate::config::ExactMode::Demand,
            ..new
        };
        let (attached, new) = {
            let mut held = self.state.locks().kernel().scope();
            let previous = self.user_scope();
            let effective = self.effective_scope_with(new.clone());
            let attached = match scope::apply(&mut **held.kernel, &effective) {
                Ok(attached) => attached,
                Err(reason) => {
                    self.effective_scope_with(previous);
                    return Err(ServiceError::Scope { reason });
                }
            };
            self.publish_scope(&mut held.scope, effective.clone());
            (attached, effective)
        };
        // The allocators of the processes now in scope (redis's own
        // jemalloc), as for a process that enters it at its exec.
        let discoverer = super::Discoverer::new(self);
        for pid in &attached {
            discoverer.queue_discovery(*pid, false);
        }
        discoverer.discover_pending();
        if !new.is_all() {
            let left: HashSet<ImageId> = {
                let held = self.state.locks().registry();
                held.registry
                    .live()
                    .filter(|image| !attached.contains(&image.id.pid) && !new.matches(image.id.pid))
                    .map(|image| image.id)
                    .collect()
            };
            let cleared = self.clear_images(&left);
            if cleared > 0 {
                tracing::info!(
                    processes = left.len(),
                    blocks = cleared,
                    "traces of the processes out of scope cleared"
                );
            }
        }
        Ok(attached)
    }
}
