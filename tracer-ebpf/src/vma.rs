//! The kernel's own mappings of the current process, for a return address
//! that `PROC_MAPS` does not hold: the process's image is new (an exec a
//! moment ago, before tracerd wrote its mappings), or the address is in a
//! library mapped since (`dlopen`), or in JIT code written since. The walk
//! then asks the kernel which VMA holds the address (`bpf_find_vma`) and
//! names the file's table by its device and inode in `FILE_TABLES`
//! (`tracer_common::vma` has the protocol).
//!
//! Every field is read inside `bpf_find_vma`'s callback, where the
//! process's mmap lock is held, so the VMA and its file stay as they are
//! meanwhile. The field offsets are the running kernel's, from its BTF
//! ([`VMA_OFFSETS`], set by tracerd at load); with `enabled` 0 (no BTF, or
//! the unwinder off) the walk never asks.

use core::ffi::c_void;

use aya_ebpf::helpers::{
    bpf_probe_read_kernel,
    generated::{bpf_find_vma, bpf_get_current_task_btf},
};
use tracer_common::{
    FileTableKey, ProcMapping, UNWIND_FILE_NONE, UNWIND_FILE_PENDING, VM_EXEC, VmaOffsets,
};

use crate::{globals, maps::FILE_TABLES};

/// Field offsets of the running kernel's `vm_area_struct`, `file`, `inode`
/// and `super_block` (`tracer_common::GLOBAL_VMA_OFFSETS`). Set at load
/// time.
#[unsafe(no_mangle)]
static VMA_OFFSETS: VmaOffsets = VmaOffsets {
    enabled: 0,
    vm_start: 0,
    vm_end: 0,
    vm_flags: 0,
    vm_pgoff: 0,
    vm_file: 0,
    f_inode: 0,
    i_ino: 0,
    i_sb: 0,
    s_dev: 0,
};

/// The offsets tracerd set ([`VMA_OFFSETS`]).
#[inline(always)]
fn offsets() -> VmaOffsets {
    // SAFETY: a global set once at load time; volatile so the compiler does
    // not fold the zeros it was compiled with.
    unsafe { core::ptr::read_volatile(&VMA_OFFSETS) }
}

/// Whether the walk may look addresses up in the kernel's VMAs.
#[inline(always)]
pub(crate) fn enabled() -> bool {
    // SAFETY: as in offsets.
    unsafe { core::ptr::read_volatile(&raw const VMA_OFFSETS.enabled) != 0 }
}

/// What [`vma_found`] read of the VMA, on the caller's stack.
#[repr(C)]
#[derive(Default)]
struct Found {
    start: u64,
    end: u64,
    flags: u64,
    pgoff: u64,
    /// The file's key in FILE_TABLES; `ino` 0: no file (anonymous).
    key: FileTableKey,
}

/// A kernel word at `base + offset`, 0 when it cannot be read.
#[inline(always)]
fn read_u64(base: u64, offset: u32) -> u64 {
    // SAFETY: bpf_probe_read_kernel checks the address itself.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const u64) }.unwrap_or(0)
}

/// `bpf_find_vma`'s callback: reads the VMA's bounds, flags, page offset
/// and its file's device and inode into the [`Found`] at `ctx`, while the
/// mmap lock keeps the VMA and its file.
extern "C" fn vma_found(_task: *mut c_void, vma: *mut c_void, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the Found that `lookup` passed, on its stack.
    let found = unsafe { &mut *(ctx as *mut Found) };
    let off = offsets();
    let vma = vma as u64;
    found.start = read_u64(vma, off.vm_start);
    found.end = read_u64(vma, off.vm_end);
    found.flags = read_u64(vma, off.vm_flags);
    found.pgoff = read_u64(vma, off.vm_pgoff);
    let file = read_u64(vma, off.vm_file);
    if file != 0 {
        let inode = read_u64(file, off.f_inode);
        if inode != 0 {
            found.key.ino = read_u64(inode, off.i_ino);
            let sb = read_u64(inode, off.i_sb);
            if sb != 0 {
                found.key.dev = read_u64(sb, off.s_dev) as u32;
            }
        }
    }
    0
}

/// The executable mapping of the current process that holds `ip`, from the
/// kernel's VMAs, into `out`: its bounds, file offset and the file's table
/// (`UNWIND_FILE_NONE` when tracerd has none for it, or it is anonymous).
/// False when no VMA holds `ip`, the VMA is not executable, or the lookup
/// could not take the mmap lock (another thread holds it to change the
/// mappings).
///
/// A BPF function of its own, not inlined: its locals stay out of the
/// walk's frame.
#[inline(never)]
pub(crate) fn lookup(ip: u64, out: *mut ProcMapping) -> bool {
    let mut found = Found::default();
    // SAFETY: the helper has no preconditions; bpf_find_vma calls
    // vma_found with `found`, on this stack, at most once.
    let ret = unsafe {
        bpf_find_vma(
            bpf_get_current_task_btf(),
            ip,
            vma_found as *mut c_void,
            &raw mut found as *mut c_void,
            0,
        )
    };
    if ret != 0 || found.flags & VM_EXEC == 0 || ip < found.start || ip >= found.end {
        return false;
    }
    let file = if found.key.ino == 0 {
        UNWIND_FILE_NONE
    } else {
        // SAFETY: a FILE_TABLES value, copied out at once.
        unsafe { FILE_TABLES.get(&found.key) }
            .copied()
            .unwrap_or(UNWIND_FILE_PENDING)
    };
    // SAFETY: out is the caller's ProcMapping (a WALK_SCRATCH field).
    unsafe {
        *out = ProcMapping {
            start: found.start,
            end: found.end,
            file_offset: found.pgoff.wrapping_mul(globals::page_size()),
            file,
            _pad: 0,
        };
    }
    true
}
