//! The process lifecycle tracepoints (`tracer_common::TRACEPOINTS`): exec
//! and exit end a process image's generation ([`crate::procs`]); exec is
//! also reported for every process on the host, so that tracerd can find
//! the allocators of its new image (and, when scoped, attach to the ones
//! that match), and in scoped mode fork too.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{ProcEventKind, ProcStats};

use crate::{
    globals::{current, current_in_scope, filtered, scoped, starts_images},
    inflight::forget_thread,
    maps::SCOPE_TGIDS,
    procs::{end_generation, find_proc, forget_mappings, send_event, start_image},
    stack::inherit_mappings,
};

/// The exec tracepoint: the image that called exec ends (its blocks are
/// gone), and the new program's image starts at once, traced from its
/// first instruction (its mappings are the kernel's until tracerd writes
/// them: `crate::vma`).
#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let Some((_, tgid)) = current() else { return 0 };
    end_generation(ProcEventKind::Exec, tgid);
    // The old program's mappings are gone with it (also when it had no
    // image: an entry another image left).
    forget_mappings(tgid);
    send_event(ProcEventKind::ExecAny, tgid, 0, &ProcStats::default());
    if starts_images() {
        let _ = start_image(tgid, 0);
    }
    0
}

/// Offsets of `pid` and `clone_flags` in the task_newtask record
/// (/sys/kernel/tracing/events/task/task_newtask/format).
const NEWTASK_PID_OFFSET: usize = 8;
const NEWTASK_FLAGS_OFFSET: usize = 32;

/// `CLONE_THREAD` of clone(2): the new task is a thread of the caller.
const CLONE_THREAD: u64 = 0x0001_0000;
/// `CLONE_VM | CLONE_UNTRACED`: what the kernel's own `kernel_thread` and
/// `user_mode_thread` add to every task they create (a kernel thread, or
/// the start of a usermode helper, which gets an image at its exec).
const KERNEL_THREAD: u64 = 0x0000_0100 | 0x0080_0000;

/// `tracer_common::NEWTASK_TRACEPOINT`: a new process (not a thread)
/// starts an image of its own at once, in the parent's context and before
/// it runs: traced from its first instruction, allocation or not, with
/// nothing of its parent's (a fork child's live set starts empty), and its
/// stacks walked with its parent's mappings, which are its own until it
/// execs or maps more.
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    // SAFETY: the offsets are within the record (see its format file).
    let flags: u64 = unsafe { ctx.read_at(NEWTASK_FLAGS_OFFSET) }.unwrap_or(CLONE_THREAD);
    if flags & CLONE_THREAD != 0 || flags & KERNEL_THREAD == KERNEL_THREAD || !starts_images() {
        return 0;
    }
    // SAFETY: as above.
    let child: i32 = unsafe { ctx.read_at(NEWTASK_PID_OFFSET) }.unwrap_or(0);
    let Some((_, parent)) = current() else {
        return 0;
    };
    if child <= 0 {
        return 0;
    }
    let child = child as u32;
    let parent_gen = find_proc(parent).map(|(_, generation)| generation);
    if let (Some(parent_gen), Some(child_gen)) = (parent_gen, start_image(child, parent)) {
        inherit_mappings(parent, parent_gen, child, child_gen);
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

/// `tracer_common::MAPPING_TRACEPOINT`: a process that mapped a file's
/// code (the dynamic loader's `mmap` of a library's text, at start or at
/// `dlopen`) sends a `Mapped` event once the mapping exists, so that
/// tracerd reads `/proc/PID/maps` with it at once (a program that lives
/// 50 ms is gone before a later read, and its stacks could not be
/// symbolized), probes the allocator it may define and gives the unwinder
/// the new mapping before the library runs for long (generation 0: a
/// process not traced yet). Anonymous and non-executable mappings, and
/// failed calls, send nothing.
#[tracepoint]
pub fn sys_exit_mmap_code(ctx: TracePointContext) -> u32 {
    if !crate::mmap::mapped_code(super::mappings::ret(&ctx)) {
        return 0;
    }
    let Some((_, tgid)) = current() else { return 0 };
    let generation = find_proc(tgid).map_or(0, |(_, generation)| generation);
    send_event(
        ProcEventKind::Mapped,
        tgid,
        generation,
        &ProcStats::default(),
    );
    0
}
