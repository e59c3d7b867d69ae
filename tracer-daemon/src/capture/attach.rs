//! Attaching: the allocator probes for every process, or one process at a
//! time (a scoped tracerd), and the programs' runtime switches.
use aya::programs::{UProbe, uprobe::UProbeScope};
use tracer_common::MAP_SWITCHES;

use super::load::program_mut;
use super::{Capture, CaptureError};

impl Capture {
    /// Attaches the allocator probes for every process (`pid` None) or for
    /// one process only: its probes are registered with the kernel for that
    /// process (a perf event with a pid), so the breakpoints are placed in
    /// its memory only and other processes pay nothing. Uretprobes first,
    /// then uprobes, so no entry is recorded whose return would be missed.
    /// Attaching what is attached already does nothing.
    ///
    /// # Errors
    /// [`CaptureError::Attach`] (e.g. the process is gone); nothing of this
    /// attach stays attached then.
    pub fn attach(&mut self, pid: Option<u32>) -> Result<(), CaptureError> {
        if self.links.contains_key(&pid) {
            return Ok(());
        }
        let scope = match pid.and_then(std::num::NonZeroU32::new) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        let mut links = Vec::new();
        let mut result = Ok(());
        'targets: for (path, points) in &self.targets {
            for exit_pass in [true, false] {
                for point in points {
                    let spec = &point.spec;
                    let (name, offset) = if exit_pass {
                        match spec.exit {
                            Some(exit) => (exit, point.function),
                            None => continue,
                        }
                    } else {
                        (spec.entry, point.entry)
                    };
                    let name = self.programs.program_for(name, exit_pass);
                    // Loaded by load_programs already.
                    let attached =
                        program_mut::<UProbe>(&mut self.ebpf, name).and_then(|program| {
                            program.attach(offset, path, scope).map_err(|source| {
                                CaptureError::Attach {
                                    program: name.into(),
                                    target: format!("{}:{}", path.display(), spec.symbol),
                                    source: Box::new(source),
                                }
                            })
                        });
                    match attached {
                        Ok(link) => links.push((name, link)),
                        Err(err) => {
                            result = Err(err);
                            break 'targets;
                        }
                    }
                }
            }
        }
        if let Err(err) = result {
            self.detach_links(links);
            return Err(err);
        }
        self.links.insert(pid, links);
        Ok(())
    }

    /// Detaches what [`Capture::attach`] attached for `pid` (None: the
    /// system-wide probes). Detaching what is not attached does nothing.
    pub fn detach(&mut self, pid: Option<u32>) {
        if let Some(links) = self.links.remove(&pid) {
            self.detach_links(links);
        }
    }

    fn detach_links(&mut self, links: Vec<(&'static str, aya::programs::uprobe::UProbeLinkId)>) {
        for (name, link) in links {
            if let Ok(program) = program_mut::<UProbe>(&mut self.ebpf, name) {
                let _ = program.detach(link);
            }
        }
    }

    /// What is attached: None for system-wide, else the pids.
    pub fn attached(&self) -> Vec<Option<u32>> {
        let mut keys: Vec<Option<u32>> = self.links.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    /// Sets the programs' runtime switches (`SWITCH_*` bits of tracer-common).
    pub fn set_switches(&mut self, bits: u64) {
        if let Err(err) = self.switches.set(0, bits, 0) {
            tracing::warn!(map = MAP_SWITCHES, %err, "cannot set the switches");
        }
    }
}
