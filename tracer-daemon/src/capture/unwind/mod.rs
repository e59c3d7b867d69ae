//! The unwinder's tables on tracerd's side: each mapped file's `.eh_frame`
//! (or `.debug_frame`) compiled into rows (`crate::elf::unwind`), the rows and pages
//! written into the kernel maps once per file and shared by every process
//! that maps it, and each process's executable mappings (`PROC_MAPS`). The
//! rules the rows encode and the walk that reads them are in
//! `tracer_common::unwind`.
pub mod maps;
pub mod tables;
