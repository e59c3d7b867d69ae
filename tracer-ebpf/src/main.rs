//! tracer's eBPF programs.
//!
//! Uprobes on glibc's allocator functions keep, per traced process, the set of
//! live blocks ((tgid, address) → size, stack id, frame 0, generation: the
//! fast table `LIVE_KEYS`/`LIVE_VALUES`, spilling to the hash `LIVE_ALLOCS`)
//! and running totals (`PROC_SLOTS`, spilling to `PROCS`). Everything is
//! aggregated here in the kernel: userspace is woken only once per process
//! image (first allocation, exec, exit), never per allocation.
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
//! inner calls hit our probes too; the stack pointer at the entry kept in
//! the thread's in-flight record (`INFLIGHT_SLOTS`, or `INFLIGHT` when its
//! slot is taken) makes the outermost call the only one recorded. An inner `free` (realloc(p, 0)) is
//! recorded as a free: it has the same effect as the outer call.
//!
//! # Layout
//!
//! Imports point down this list; every function below `programs` is
//! `#[inline(always)]` (but the steps of the stack walk and of the `mmap`
//! source's loops, `bpf_loop` callbacks), so each program is one straight
//! body, whatever the file of its parts.
//!
//! - [`programs`]: the entry points only, one file per kind of hook
//!   (allocator uprobes and uretprobes, lifecycle and mapping tracepoints,
//!   the floor);
//! - [`calls`]: what each allocator call does to the live set (the capture
//!   table of docs/architecture.md);
//! - [`mmap`]: a traced process's own anonymous mappings as blocks;
//! - [`live`]: live blocks: insert, find, remove (fast table and spill);
//! - [`stack`]: the stack walk and the store of stacks;
//! - [`vma`]: the kernel's own mappings, for an address `PROC_MAPS` lacks;
//! - [`inflight`]: calls between entry and return (slots and spill);
//! - [`sample`]: which allocations sampling records;
//! - [`procs`]: per-process totals, generations and lifecycle events;
//! - [`counters`], [`atomic`], [`globals`]: counting, atomic
//!   read-modify-write, and what tracerd sets (load-time globals, switches);
//! - [`maps`]: every map, in one place.
#![no_std]
#![no_main]
// Atomic read-modify-write on map values: the BPF target has no `Atomic*`
// types, but LLVM lowers these intrinsics to BPF atomic instructions (see
// `atomic`).
#![allow(internal_features)]
#![feature(asm_experimental_arch)]

mod atomic;
mod calls;
mod counters;
mod globals;
mod inflight;
mod live;
mod maps;
mod mmap;
mod procs;
mod programs;
mod sample;
mod stack;
mod vma;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
