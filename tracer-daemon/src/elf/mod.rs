//! ELF, DWARF and loader analysis of files' bytes, with no kernel and no
//! root: what the fuzz targets and unit tests drive directly.
//!
//! - [`unwind`]: a file's call frame information (`.eh_frame`,
//!   `.debug_frame`) compiled into the unwinder's rows;
//! - [`probes`]: the allocator entry points an object defines, its family,
//!   and where their probes go;
//! - [`ldso`]: the shared objects the dynamic loader of a process's root
//!   would load for an executable, and `/etc/ld.so.cache`.
pub mod ldso;
pub mod probes;
pub mod unwind;
