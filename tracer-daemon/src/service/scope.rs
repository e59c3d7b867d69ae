//! Which processes are traced: the scope in force, and changing it (see
//! [`crate::lifecycle::scope`]).
use serde::Serialize;

use super::{Service, ServiceError};
use crate::lifecycle::{Scope, scope};

/// The scope in force and what is attached for it (`GET /scope`).
#[derive(Clone, Debug, Serialize)]
pub struct ScopeView {
    /// The scope.
    pub scope: Scope,
    /// True when the probes are attached for every process.
    pub all_processes: bool,
    /// Processes with probes of their own.
    pub attached_pids: Vec<u32>,
}

impl Service {
    /// The scope in force and what is attached.
    pub fn scope(&self) -> ScopeView {
        let held = self.state.locks().kernel().scope();
        let attached = held.kernel.attached();
        ScopeView {
            scope: held.scope.clone(),
            all_processes: attached.contains(&None),
            attached_pids: attached.into_iter().flatten().collect(),
        }
    }

    /// Sets which processes are traced and attaches accordingly. Returns
    /// the processes now attached one by one (empty when every process is
    /// traced).
    ///
    /// # Errors
    /// [`ServiceError::Scope`] when the scope is invalid or the system-wide
    /// probes cannot be attached again.
    pub fn set_scope(&self, new: Scope) -> Result<Vec<u32>, ServiceError> {
        let mut held = self.state.locks().kernel().scope();
        let attached = scope::apply(&mut **held.kernel, &new)
            .map_err(|reason| ServiceError::Scope { reason })?;
        *held.scope = new;
        Ok(attached)
    }
}
