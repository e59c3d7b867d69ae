//! The physical floor (`tracer_common::FLOOR_PROGRAMS`): empty programs
//! that `tracer-floor` attaches at tracerd's own entry points to measure
//! what the probes cost before any program body runs.

use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};

/// Does nothing: attached by `tracer-floor` at tracerd's own entry points to
/// measure what the probes cost before any program body runs.
#[uprobe]
pub fn floor_enter(_ctx: ProbeContext) -> u32 {
    0
}

/// Does nothing: the return-probe counterpart of [`floor_enter`].
#[uretprobe]
pub fn floor_exit(_ctx: RetProbeContext) -> u32 {
    0
}
