//! tracer's eBPF programs.
//!
//! Uprobes on glibc's allocator functions keep, per traced process, the set of
//! live blocks (`LIVE_ALLOCS`: (tgid, address) → size, stack id, generation)
//! and running totals (`PROCS`). Everything is aggregated here in the kernel:
//! userspace is woken only once per process image (first allocation, exec,
//! exit), never per allocation.
//!
//! The stack is taken at the allocator's *return* (uretprobe). There the
//! kernel has already restored the instruction pointer to the return address
//! in the caller, and the caller's frame pointer is intact, so the
//! frame-pointer walk starts at the call site in the allocator's caller
//! (frame 0) and skips nothing. (At the uprobe on entry the walk would skip
//! the immediate caller, because glibc's `malloc` does not begin with
//! `push %rbp`.)
//!
//! Nesting: glibc's `realloc` calls `malloc` for mmapped chunks,
//! `reallocarray` calls `realloc`, the memalign family calls `malloc`. Those
//! inner calls hit our probes too; a per-thread depth in the thread's
//! in-flight record (`INFLIGHT_SLOTS`, or `INFLIGHT` when its slot is taken)
//! makes the outermost call the only one recorded. An inner `free` (realloc(p, 0)) is
//! recorded as a free: it has the same effect as the outer call.
#![no_std]
#![no_main]
// Atomic read-modify-write on map values: the BPF target has no `Atomic*`
// types, but LLVM lowers these intrinsics to BPF atomic instructions (see
// `atomic`).
#![allow(internal_features)]
#![feature(asm_experimental_arch)]

mod atomic;
mod counters;
mod globals;
mod inflight;
mod live;
mod maps;
mod procs;
mod sample;
mod stack;

use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::{tracepoint, uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use tracer_common::{Counter, INFLIGHT_OVERFLOW, INFLIGHT_UNSAMPLED, ProcEventKind, ProcStats};

use crate::{
    counters::count,
    globals::{current, page_size, sample_mean, scoped},
    inflight::{forget_thread, record_entry, take_inflight},
    live::{record_alloc, remove_block},
    procs::{end_generation, send_event},
};

/// Entry of an allocator that returns a new block: see [`record_entry`].
#[inline(always)]
fn alloc_entry(size: u64, ptr: u64, overflow: bool) -> u32 {
    let _ = record_entry(size, ptr, overflow);
    0
}

/// Entry of `realloc(old, size)` and `reallocarray`. When the call cannot be
/// recorded, `old` leaves the live set at once: its return will not be seen,
/// and glibc frees or moves the block (or it stays if the call fails: an
/// untraced live block only undercounts), so keeping it would leave a
/// phantom leak.
#[inline(always)]
fn realloc_entry(size: u64, old: u64, overflow: bool) -> u32 {
    if let Some(tgid) = record_entry(size, old, overflow)
        && old != 0
    {
        remove_block(tgid, old, false);
    }
    0
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// `n * m` and whether it overflowed, without 128-bit multiplication (which
/// the BPF target lacks).
#[inline(always)]
fn mul(n: u64, m: u64) -> (u64, bool) {
    if n == 0 {
        return (0, false);
    }
    // black_box keeps LLVM from turning the division back into a widening
    // multiplication.
    let limit = core::hint::black_box(u64::MAX / n);
    (n.wrapping_mul(m), m > limit)
}

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 0), 0, false)
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    let (size, overflow) = mul(arg(&ctx, 0), arg(&ctx, 1));
    alloc_entry(size, 0, overflow)
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    realloc_entry(arg(&ctx, 1), arg(&ctx, 0), false)
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    let (size, overflow) = mul(arg(&ctx, 1), arg(&ctx, 2));
    realloc_entry(size, arg(&ctx, 0), overflow)
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 2), arg(&ctx, 0), false)
}

#[uprobe]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 1), 0, false)
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 1), 0, false)
}

#[uprobe]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    alloc_entry(arg(&ctx, 0), 0, false)
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    let page = page_size();
    let n = arg(&ctx, 0);
    let (sum, overflow) = n.overflowing_add(page.wrapping_sub(1));
    alloc_entry(sum & !(page.wrapping_sub(1)), 0, overflow)
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    let Some((_, tgid)) = current() else { return 0 };
    let ptr = arg(&ctx, 0);
    if ptr == 0 {
        count(Counter::NullFrees);
        return 0;
    }
    // Sampled: most freed pointers were never recorded, and that is fine.
    remove_block(tgid, ptr, sample_mean() == 0);
    0
}

/// Return of malloc, calloc, aligned_alloc, memalign, valloc, pvalloc.
#[inline(always)]
fn alloc_exit(ctx: &RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight() else {
        return 0;
    };
    let addr: u64 = ctx.ret();
    if addr == 0 {
        count(Counter::FailedAllocs);
        return 0;
    }
    if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
        count(Counter::Unsampled);
        return 0;
    }
    record_alloc(ctx, tgid, addr, inflight.size);
    0
}

#[uretprobe]
pub fn malloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn calloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn aligned_alloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn memalign_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn valloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

#[uretprobe]
pub fn pvalloc_exit(ctx: RetProbeContext) -> u32 {
    alloc_exit(&ctx)
}

/// Return of realloc and reallocarray: see DESIGN.md's capture table.
#[inline(always)]
fn realloc_exit_common(ctx: &RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight() else {
        return 0;
    };
    let addr: u64 = ctx.ret();
    let old = inflight.ptr;
    let exact = sample_mean() == 0;
    if addr != 0 {
        if old != 0 {
            remove_block(tgid, old, exact);
        }
        if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
            count(Counter::Unsampled);
        } else {
            record_alloc(ctx, tgid, addr, inflight.size);
        }
    } else if inflight.size == 0 && inflight.overflow & INFLIGHT_OVERFLOW == 0 && old != 0 {
        // realloc(p, 0) frees p; glibc's inner free() may have removed it
        // already, which is not an unknown free.
        remove_block(tgid, old, false);
    } else {
        count(Counter::FailedAllocs);
    }
    0
}

#[uretprobe]
pub fn realloc_exit(ctx: RetProbeContext) -> u32 {
    realloc_exit_common(&ctx)
}

#[uretprobe]
pub fn reallocarray_exit(ctx: RetProbeContext) -> u32 {
    realloc_exit_common(&ctx)
}

#[uretprobe]
pub fn posix_memalign_exit(ctx: RetProbeContext) -> u32 {
    let Some((tgid, inflight)) = take_inflight() else {
        return 0;
    };
    let ret: i32 = ctx.ret();
    if ret != 0 || inflight.ptr == 0 {
        count(Counter::FailedAllocs);
        return 0;
    }
    if inflight.overflow & INFLIGHT_UNSAMPLED != 0 {
        count(Counter::Unsampled);
        return 0;
    }
    // SAFETY: bpf_probe_read_user checks the user address itself.
    let Ok(addr) = (unsafe { bpf_probe_read_user(inflight.ptr as *const u64) }) else {
        count(Counter::FailedAllocs);
        return 0;
    };
    record_alloc(&ctx, tgid, addr, inflight.size);
    0
}

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

// ------------------------------------------------------------ physical floor

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

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
