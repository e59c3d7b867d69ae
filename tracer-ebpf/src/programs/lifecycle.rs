//! The process lifecycle tracepoints (`tracer_common::TRACEPOINTS`): exec
//! and exit end a process image's generation ([`crate::procs`]); exec is
//! also reported for every process on the host, so that tracerd can find
//! the allocators of its new image (and, when scoped, attach to the ones
//! that match), and in scoped mode fork too.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{ProcEventKind, ProcStats};

use crate::{
    globals::{current, current_in_scope, filtered, scoped},
    inflight::forget_thread,
    maps::SCOPE_TGIDS,
    procs::{end_generation, find_proc, send_event},
};

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let Some((_, tgid)) = current() else { return 0 };
    end_generation(ProcEventKind::Exec, tgid);
    send_event(ProcEventKind::ExecAny, tgid, 0, &ProcStats::default());
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
    if child <= 0 {
        return 0;
    }
    // A child of a process in scope is in scope from its first
    // instruction (a thread's id too: the exit tracepoint removes it).
    if filtered() && current_in_scope().is_some() {
        let _ = SCOPE_TGIDS.insert(&(child as u32), &1, 0);
    }
    send_event(ProcEventKind::Fork, child as u32, 0, &ProcStats::default());
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
    if filtered() && id as u32 != tgid {
        // A thread's id, added at its fork; the process's goes at its end.
        let _ = SCOPE_TGIDS.remove(&(id as u32));
    }
    // SAFETY: the offset is within the record (see the format file).
    let group_dead: u8 = unsafe { ctx.read_at(EXIT_GROUP_DEAD_OFFSET) }.unwrap_or(0);
    if group_dead != 0 {
        end_generation(ProcEventKind::Exit, tgid);
        if filtered() {
            let _ = SCOPE_TGIDS.remove(&tgid);
        }
    }
    0
}

/// Offsets of `prot` and `fd` in the sys_enter_mmap record
/// (/sys/kernel/tracing/events/syscalls/sys_enter_mmap/format).
const MMAP_PROT_OFFSET: usize = 32;
const MMAP_FD_OFFSET: usize = 48;

/// `PROT_EXEC` of mmap(2).
const PROT_EXEC: u64 = 4;

/// `tracer_common::MAPPING_TRACEPOINT`: a process mapping a file's code
/// (the dynamic loader's `mmap` of a library's text, at start or at
/// `dlopen`) sends a `Mapped` event, so that tracerd probes the allocator
/// it may define and gives the unwinder the new mapping before the library
/// runs for long (generation 0: a process not traced yet). Anonymous and
/// non-executable mappings send nothing.
#[tracepoint]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    // SAFETY: the offsets are within the record (see the format file).
    let prot: u64 = unsafe { ctx.read_at(MMAP_PROT_OFFSET) }.unwrap_or(0);
    if prot & PROT_EXEC == 0 {
        return 0;
    }
    // SAFETY: as above.
    let fd: u64 = unsafe { ctx.read_at(MMAP_FD_OFFSET) }.unwrap_or(u64::MAX);
    // An anonymous mapping's fd is -1 (as an unsigned long).
    if (fd as i64) < 0 {
        return 0;
    }
    let Some((_, tgid)) = current() else { return 0 };
    let gen_ = find_proc(tgid).map_or(0, |(_, gen_)| gen_);
    send_event(ProcEventKind::Mapped, tgid, gen_, &ProcStats::default());
    0
}
