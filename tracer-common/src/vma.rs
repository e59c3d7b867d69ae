//! The kernel's own view of a process's mappings, for the unwinder's walk of
//! an address that `PROC_MAPS` does not hold (yet): a process tracerd has
//! not read (the first milliseconds after an exec, a library `dlopen`ed a
//! moment ago, JIT code written since).
//!
//! Protocol. The walk asks the kernel for the VMA that holds the address
//! (`bpf_find_vma` on the current task), reads its bounds, flags, page
//! offset and file through the field offsets tracerd found in the running
//! kernel's BTF ([`VmaOffsets`], the load-time global
//! [`GLOBAL_VMA_OFFSETS`]), and names the file's table by its device and
//! inode in [`MAP_FILE_TABLES`], which tracerd writes for every table it
//! loads, and names [`crate::UNWIND_FILE_NONE`] for every file it gave
//! no table (it clears an entry before it drops a table). A VMA that is
//! not executable is not a frame's (the walk stops, cut); one of no file
//! (JIT code) or of a file named [`crate::UNWIND_FILE_NONE`] is stepped
//! with frame pointers, as a `PROC_MAPS` mapping of that table is; one of
//! a file `FILE_TABLES` does not name is [`crate::UNWIND_FILE_PENDING`]:
//! stepped with frame pointers too, but a chain that ends there is cut.

use core::mem::size_of;

/// Table ids of the files tracerd compiled: [`FileTableKey`] → the file's
/// table id (a `u32`, never [`crate::UNWIND_FILE_NONE`]).
pub const MAP_FILE_TABLES: &str = "FILE_TABLES";
/// Entries of [`MAP_FILE_TABLES`]: files with a table at once.
pub const FILE_TABLES_ENTRIES: u32 = 1 << 14;

/// The name of the global holding the [`VmaOffsets`] of the running kernel
/// (all zero, [`VmaOffsets::enabled`] 0: the walk never asks the kernel).
pub const GLOBAL_VMA_OFFSETS: &str = "VMA_OFFSETS";

/// Key of [`MAP_FILE_TABLES`]: a file as the kernel names it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileTableKey {
    /// The file's device as the kernel encodes a `dev_t` inside
    /// (`super_block.s_dev`: major << 20 | minor; [`kernel_dev`]).
    pub dev: u32,
    /// Explicit padding, always 0.
    pub _pad: u32,
    /// The file's inode number (`inode.i_ino`).
    pub ino: u64,
}
const _: () = assert!(size_of::<FileTableKey>() == 16);

/// The kernel's internal encoding of device `major:minor` (as
/// `/proc/PID/maps` prints it): `MKDEV(major, minor)`.
#[inline(always)]
#[must_use]
pub const fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & ((1 << 20) - 1))
}

/// Byte offsets of the fields the walk reads, in the running kernel's
/// structures (from its BTF, `/sys/kernel/btf/vmlinux`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmaOffsets {
    /// 1 when every offset below was found: the walk may ask the kernel.
    pub enabled: u32,
    /// `vm_area_struct.vm_start` (u64).
    pub vm_start: u32,
    /// `vm_area_struct.vm_end` (u64).
    pub vm_end: u32,
    /// `vm_area_struct.vm_flags` (u64; `VM_EXEC` is bit 2).
    pub vm_flags: u32,
    /// `vm_area_struct.vm_pgoff` (u64, in pages).
    pub vm_pgoff: u32,
    /// `vm_area_struct.vm_file` (a pointer, 0 for an anonymous mapping).
    pub vm_file: u32,
    /// `file.f_inode` (a pointer).
    pub f_inode: u32,
    /// `inode.i_ino` (u64).
    pub i_ino: u32,
    /// `inode.i_sb` (a pointer).
    pub i_sb: u32,
    /// `super_block.s_dev` (u32).
    pub s_dev: u32,
}
const _: () = assert!(size_of::<VmaOffsets>() == 40);

/// `VM_EXEC` of `vm_area_struct.vm_flags`.
pub const VM_EXEC: u64 = 0x4;

// SAFETY: integers only, with explicit padding; no invalid bit patterns.
#[cfg(feature = "user")]
unsafe impl aya::Pod for FileTableKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for VmaOffsets {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_encoded_as_the_kernel_keeps_them() {
        // /proc/PID/maps "fd:01" is major 253, minor 1.
        assert_eq!(kernel_dev(253, 1), (253 << 20) | 1);
        assert_eq!(kernel_dev(0, 0x1f), 0x1f);
        assert_eq!(kernel_dev(8, 0x10_0001), (8 << 20) | 1);
    }
}
