//! The process lifecycle tracepoints (`tracer_common::TRACEPOINTS`): exec
//! and exit end a process image's generation ([`crate::procs`]); in scoped
//! mode exec and fork are also reported for every process on the host, so
//! that tracerd can attach to the ones that match.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{ProcEventKind, ProcStats};

use crate::{
    globals::{current, scoped},
    inflight::forget_thread,
    procs::{end_generation, send_event},
};

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let Some((_, tgid)) = current() else { return 0 };
    end_generation(ProcEventKind::Exec, tgid);
    if scoped() {
        send_event(ProcEventKind::ExecAny, tgid, 0, &ProcStats::default());
    }
    0
}

/// Offset of `child_pid` in the sched_process_fork record.
const FORK_CHILD_PID_OFFSET: usize = 20;

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    if !scoped() {
        return 0;
    }
    // SAFETY: the offset is within the record (see its format file).
    let child: i32 = unsafe { ctx.read_at(FORK_CHILD_PID_OFFSET) }.unwrap_or(0);
    if child > 0 {
        send_event(ProcEventKind::Fork, child as u32, 0, &ProcStats::default());
    }
    0
}

/// Offset of `group_dead` in the sched_process_exit record
/// (/sys/kernel/tracing/events/sched/sched_process_exit/format).
const EXIT_GROUP_DEAD_OFFSET: usize = 32;

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let Some((id, tgid)) = current() else {
        return 0;
    };
    // A thread that dies inside a probed call leaves its state behind.
    forget_thread(id);
    // SAFETY: the offset is within the record (see the format file).
    let group_dead: u8 = unsafe { ctx.read_at(EXIT_GROUP_DEAD_OFFSET) }.unwrap_or(0);
    if group_dead != 0 {
        end_generation(ProcEventKind::Exit, tgid);
    }
    0
}
