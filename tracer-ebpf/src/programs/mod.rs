//! The programs: entry points only, one file per kind of hook. Each decodes
//! its context (arguments, return value, tracepoint record) and calls into
//! the modules that own the data; no map is touched here.
//!
//! Program names are the ones `tracer_common::PROBES`, `TRACEPOINTS`,
//! `MMAP_TRACEPOINTS` and `FLOOR_PROGRAMS` list: tracerd finds each by its function name.

mod alloc;
mod floor;
mod lifecycle;
mod mappings;
