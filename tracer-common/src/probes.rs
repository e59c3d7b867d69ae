//! What tracer attaches, by name: the probed allocator functions with their
//! entry and exit programs ([`PROBES`], in attach order), the empty floor
//! programs ([`FLOOR_PROGRAMS`]) and the process lifecycle tracepoints
//! ([`TRACEPOINTS`]). The eBPF crate names its programs exactly so; tracerd
//! finds them in the object by these names.

/// The allocator functions tracer probes, with the names of their programs.
///
/// `entry` is the uprobe on the function's first instruction; `exit`, where
/// present, the uretprobe that sees the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The glibc symbol.
    pub symbol: &'static str,
    /// The uprobe program run at entry.
    pub entry: &'static str,
    /// The uretprobe program run at return, if the result is needed.
    pub exit: Option<&'static str>,
}

/// The program pair of each shape of allocator call: (entry, exit). The
/// entries differ in where they read the size and what they tell the
/// return about its result (`Inflight::shape`); every call shares one
/// exit, `malloc_exit`. The kernel verifies each program once, and the
/// exit is the costly one (it holds the stack walk): one exit for every
/// call, not one per shape of result, is a shorter start of tracerd.
const MALLOC: (&str, Option<&str>) = ("malloc_enter", Some("malloc_exit"));
const CALLOC: (&str, Option<&str>) = ("calloc_enter", Some("malloc_exit"));
const REALLOC: (&str, Option<&str>) = ("realloc_enter", Some("malloc_exit"));
const REALLOCARRAY: (&str, Option<&str>) = ("reallocarray_enter", Some("malloc_exit"));
const FREE: (&str, Option<&str>) = ("free_enter", None);
/// The block is written through the first argument.
const POSIX_MEMALIGN: (&str, Option<&str>) = ("posix_memalign_enter", Some("malloc_exit"));
/// `(alignment, size)`: the size is the second argument.
const ALIGNED_ALLOC: (&str, Option<&str>) = ("aligned_alloc_enter", Some("malloc_exit"));
const MEMALIGN: (&str, Option<&str>) = ("memalign_enter", Some("malloc_exit"));
const VALLOC: (&str, Option<&str>) = ("valloc_enter", Some("malloc_exit"));
const PVALLOC: (&str, Option<&str>) = ("pvalloc_enter", Some("malloc_exit"));

const fn spec(
    symbol: &'static str,
    (entry, exit): (&'static str, Option<&'static str>),
) -> ProbeSpec {
    ProbeSpec {
        symbol,
        entry,
        exit,
    }
}

/// Every allocator entry point tracer probes where an object defines it,
/// in the order aliases are resolved (of functions at one address, the
/// first here is probed). Exits are attached before entries so that no
/// entry is ever recorded without its return being seen.
///
/// Each call has the shape of one of the C API's and shares its programs:
/// the size argument is where that program reads it; extra arguments
/// (alignment, flags, a nothrow tag) change nothing traced.
/// - The C API (glibc, musl, any libc or static allocator), with C23's
///   `free_sized(ptr, size)` and `free_aligned_sized(ptr, align, size)`.
/// - jemalloc, unprefixed (Debian's `libjemalloc.so.2`), `je_` or `_rjem_`
///   (the tikv-jemallocator crate): `mallocx(size, flags)` is malloc's
///   shape, `rallocx(ptr, size, flags)` realloc's (NULL leaves `ptr`
///   live), `sdallocx(ptr, size, flags)` and `dallocx(ptr, flags)` free's.
///   (`xallocx`, which resizes in place to a size it chooses, is not
///   probed.)
/// - tcmalloc's `tc_*`.
/// - mimalloc's `mi_*` with its zeroing and aligned variants
///   (`mi_malloc_aligned(size, align)`: size first).
/// - C++ `operator new` and `delete` in every form ([`is_operator`]):
///   probed only in an allocator library's own object, whose `new` does not
///   reach its `malloc` (jemalloc and tcmalloc inline their fast path).
pub const PROBES: &[ProbeSpec] = &[
    spec("malloc", MALLOC),
    spec("calloc", CALLOC),
    spec("realloc", REALLOC),
    spec("reallocarray", REALLOCARRAY),
    spec("free", FREE),
    spec("posix_memalign", POSIX_MEMALIGN),
    spec("aligned_alloc", ALIGNED_ALLOC),
    spec("memalign", MEMALIGN),
    spec("valloc", VALLOC),
    spec("pvalloc", PVALLOC),
    spec("free_sized", FREE),
    spec("free_aligned_sized", FREE),
    // jemalloc, unprefixed.
    spec("mallocx", MALLOC),
    spec("rallocx", REALLOC),
    spec("sdallocx", FREE),
    spec("dallocx", FREE),
    // jemalloc, `je_`.
    spec("je_malloc", MALLOC),
    spec("je_calloc", CALLOC),
    spec("je_realloc", REALLOC),
    spec("je_free", FREE),
    spec("je_posix_memalign", POSIX_MEMALIGN),
    spec("je_aligned_alloc", ALIGNED_ALLOC),
    spec("je_memalign", MEMALIGN),
    spec("je_valloc", VALLOC),
    spec("je_mallocx", MALLOC),
    spec("je_rallocx", REALLOC),
    spec("je_sdallocx", FREE),
    spec("je_dallocx", FREE),
    // jemalloc, `_rjem_` (Rust's tikv-jemalloc-sys).
    spec("_rjem_malloc", MALLOC),
    spec("_rjem_calloc", CALLOC),
    spec("_rjem_realloc", REALLOC),
    spec("_rjem_free", FREE),
    spec("_rjem_posix_memalign", POSIX_MEMALIGN),
    spec("_rjem_aligned_alloc", ALIGNED_ALLOC),
    spec("_rjem_memalign", MEMALIGN),
    spec("_rjem_valloc", VALLOC),
    spec("_rjem_mallocx", MALLOC),
    spec("_rjem_rallocx", REALLOC),
    spec("_rjem_sdallocx", FREE),
    spec("_rjem_dallocx", FREE),
    // tcmalloc (gperftools).
    spec("tc_malloc", MALLOC),
    spec("tc_calloc", CALLOC),
    spec("tc_realloc", REALLOC),
    spec("tc_free", FREE),
    spec("tc_free_sized", FREE),
    spec("tc_cfree", FREE),
    spec("tc_posix_memalign", POSIX_MEMALIGN),
    spec("tc_memalign", MEMALIGN),
    spec("tc_valloc", VALLOC),
    spec("tc_pvalloc", PVALLOC),
    spec("tc_malloc_skip_new_handler", MALLOC),
    spec("tc_new", MALLOC),
    spec("tc_new_nothrow", MALLOC),
    spec("tc_newarray", MALLOC),
    spec("tc_newarray_nothrow", MALLOC),
    spec("tc_new_aligned", MALLOC),
    spec("tc_new_aligned_nothrow", MALLOC),
    spec("tc_newarray_aligned", MALLOC),
    spec("tc_newarray_aligned_nothrow", MALLOC),
    spec("tc_delete", FREE),
    spec("tc_delete_sized", FREE),
    spec("tc_delete_nothrow", FREE),
    spec("tc_deletearray", FREE),
    spec("tc_deletearray_sized", FREE),
    spec("tc_deletearray_nothrow", FREE),
    spec("tc_delete_aligned", FREE),
    spec("tc_delete_sized_aligned", FREE),
    spec("tc_delete_aligned_nothrow", FREE),
    spec("tc_deletearray_aligned", FREE),
    spec("tc_deletearray_sized_aligned", FREE),
    spec("tc_deletearray_aligned_nothrow", FREE),
    // mimalloc.
    spec("mi_malloc", MALLOC),
    spec("mi_zalloc", MALLOC),
    spec("mi_calloc", CALLOC),
    spec("mi_mallocn", CALLOC),
    spec("mi_realloc", REALLOC),
    spec("mi_reallocn", REALLOCARRAY),
    spec("mi_reallocf", REALLOC),
    spec("mi_free", FREE),
    spec("mi_free_size", FREE),
    spec("mi_free_aligned", FREE),
    spec("mi_free_size_aligned", FREE),
    spec("mi_malloc_small", MALLOC),
    spec("mi_zalloc_small", MALLOC),
    spec("mi_malloc_aligned", MALLOC),
    spec("mi_zalloc_aligned", MALLOC),
    spec("mi_calloc_aligned", CALLOC),
    spec("mi_realloc_aligned", REALLOC),
    spec("mi_new", MALLOC),
    spec("mi_new_nothrow", MALLOC),
    spec("mi_new_aligned", MALLOC),
    spec("mi_new_aligned_nothrow", MALLOC),
    spec("mi_new_n", CALLOC),
    spec("mi_posix_memalign", POSIX_MEMALIGN),
    spec("mi_memalign", MEMALIGN),
    spec("mi_aligned_alloc", ALIGNED_ALLOC),
    spec("mi_valloc", VALLOC),
    spec("mi_pvalloc", PVALLOC),
    // C++ (Itanium ABI names): new(size[, align][, nothrow]).
    spec("_Znwm", MALLOC),
    spec("_Znam", MALLOC),
    spec("_ZnwmRKSt9nothrow_t", MALLOC),
    spec("_ZnamRKSt9nothrow_t", MALLOC),
    spec("_ZnwmSt11align_val_t", MALLOC),
    spec("_ZnamSt11align_val_t", MALLOC),
    spec("_ZnwmSt11align_val_tRKSt9nothrow_t", MALLOC),
    spec("_ZnamSt11align_val_tRKSt9nothrow_t", MALLOC),
    // delete(ptr[, size][, align][, nothrow]).
    spec("_ZdlPv", FREE),
    spec("_ZdaPv", FREE),
    spec("_ZdlPvm", FREE),
    spec("_ZdaPvm", FREE),
    spec("_ZdlPvRKSt9nothrow_t", FREE),
    spec("_ZdaPvRKSt9nothrow_t", FREE),
    spec("_ZdlPvSt11align_val_t", FREE),
    spec("_ZdaPvSt11align_val_t", FREE),
    spec("_ZdlPvmSt11align_val_t", FREE),
    spec("_ZdaPvmSt11align_val_t", FREE),
    spec("_ZdlPvSt11align_val_tRKSt9nothrow_t", FREE),
    spec("_ZdaPvSt11align_val_tRKSt9nothrow_t", FREE),
];

/// Whether `symbol` is a C++ `operator new` or `operator delete` (an
/// Itanium ABI name `_Znw*`, `_Zna*`, `_Zdl*`, `_Zda*`).
pub fn is_operator(symbol: &str) -> bool {
    ["_Znw", "_Zna", "_Zdl", "_Zda"]
        .iter()
        .any(|prefix| symbol.starts_with(prefix))
}

/// The uprobe session program (Linux 6.13+, attach type
/// `BPF_TRACE_UPROBE_SESSION`) that tracerd attaches, when it samples, in
/// place of every entry of [`SESSION_ENTRIES`] and of their exit
/// (`malloc_exit`): the kernel runs it at the call's entry and, unless
/// that run returned 1, again at its return. A call sampling passes over
/// returns 1, so that its return costs nothing (no trap, no program).
pub const SESSION_PROGRAM: &str = "alloc_session";

/// The entry programs whose calls [`SESSION_PROGRAM`] runs, by kind: a
/// probe's kind is its index here, in its attach cookie's bits from
/// [`SESSION_KIND_SHIFT`] up (the bits below are the allocator family's
/// source, as every probe's cookie has it).
pub const SESSION_ENTRIES: [&str; 9] = [
    MALLOC.0,
    CALLOC.0,
    REALLOC.0,
    REALLOCARRAY.0,
    POSIX_MEMALIGN.0,
    ALIGNED_ALLOC.0,
    MEMALIGN.0,
    VALLOC.0,
    PVALLOC.0,
];

/// The kinds of call [`SESSION_PROGRAM`] runs: each is the index in
/// [`SESSION_ENTRIES`] of the entry program whose arguments it decodes.
#[repr(u64)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionKind {
    /// `malloc(size)`'s shape.
    Malloc = 0,
    /// `calloc(n, m)`'s.
    Calloc = 1,
    /// `realloc(ptr, size)`'s.
    Realloc = 2,
    /// `reallocarray(ptr, n, m)`'s.
    Reallocarray = 3,
    /// `posix_memalign(memptr, align, size)`'s.
    PosixMemalign = 4,
    /// `aligned_alloc(align, size)`'s.
    AlignedAlloc = 5,
    /// `memalign(align, size)`'s.
    Memalign = 6,
    /// `valloc(size)`'s.
    Valloc = 7,
    /// `pvalloc(size)`'s.
    Pvalloc = 8,
}

const _: () = assert!(SESSION_ENTRIES.len() == SessionKind::Pvalloc as usize + 1);

/// The first bit of a session probe's attach cookie that holds its kind
/// (an index of [`SESSION_ENTRIES`]).
pub const SESSION_KIND_SHIFT: u32 = 32;

/// The kind (index in [`SESSION_ENTRIES`]) of the entry program `entry`,
/// None for one the session does not run (`free_enter`).
pub fn session_kind(entry: &str) -> Option<u64> {
    SESSION_ENTRIES
        .iter()
        .position(|name| *name == entry)
        .map(|kind| kind as u64)
}

/// Empty uprobe and uretprobe programs, attached in place of every entry and
/// exit program to measure the physical floor of the probes themselves.
pub const FLOOR_PROGRAMS: (&str, &str) = ("floor_enter", "floor_exit");

/// The tracepoint that reports a process that mapped a file's code (its
/// libraries at start, a `dlopen`), at the call's exit, so that tracerd
/// reads its mappings while it lives and the unwinder learns the new
/// mapping within milliseconds rather than at its next periodic refresh:
/// (program, category, name). Optional: a kernel without syscall tracepoints
/// (`CONFIG_FTRACE_SYSCALLS`) has only the periodic refresh.
pub const MAPPING_TRACEPOINT: (&str, &str, &str) =
    ("sys_exit_mmap_code", "syscalls", "sys_exit_mmap");

/// The tracepoints that record a traced image's own anonymous mappings as
/// blocks of source `mmap` (at each call's exit, where the result is
/// known and the task's saved user registers still hold the arguments):
/// (program, category, name). Two programs: one records new mappings
/// (the stack walk), the other takes out what a call unmapped (the loops
/// over a process's mappings); each tail-calls the other where a call does
/// both (`MAP_FIXED`, `mremap`), through the prog array `MMAP_PROGRAMS`
/// ([`MMAP_TAIL_UNMAP`], [`MMAP_TAIL_ADD`]).
pub const MMAP_TRACEPOINTS: [(&str, &str, &str); 3] = [
    (MMAP_ADD_PROGRAM, "syscalls", "sys_exit_mmap"),
    (MMAP_UNMAP_PROGRAM, "syscalls", "sys_exit_munmap"),
    (MMAP_UNMAP_PROGRAM, "syscalls", "sys_exit_mremap"),
];

/// The program of [`MMAP_TRACEPOINTS`] that records a new mapping.
pub const MMAP_ADD_PROGRAM: &str = "sys_exit_mmap";
/// The program of [`MMAP_TRACEPOINTS`] that takes out an unmapped range.
pub const MMAP_UNMAP_PROGRAM: &str = "sys_exit_unmap";
/// The prog array of the anonymous-mapping programs.
pub const MAP_MMAP_PROGRAMS: &str = "MMAP_PROGRAMS";
/// Slot of [`MMAP_UNMAP_PROGRAM`] in [`MAP_MMAP_PROGRAMS`].
pub const MMAP_TAIL_UNMAP: u32 = 0;
/// Slot of [`MMAP_ADD_PROGRAM`] in [`MAP_MMAP_PROGRAMS`].
pub const MMAP_TAIL_ADD: u32 = 1;
/// Slots of [`MAP_MMAP_PROGRAMS`].
pub const MMAP_TAIL_SLOTS: u32 = 2;

/// The tracepoint programs for process lifecycle: (program, category, name).
/// `task_newtask` starts a new process's image at its fork (its record has
/// the clone flags, which tell a process from a thread).
pub const TRACEPOINTS: [(&str, &str, &str); 4] = [
    ("sched_process_exec", "sched", "sched_process_exec"),
    ("sched_process_exit", "sched", "sched_process_exit"),
    ("sched_process_fork", "sched", "sched_process_fork"),
    ("task_newtask", "task", "task_newtask"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_kinds_name_the_entries_whose_arguments_they_decode() {
        let kinds = [
            (SessionKind::Malloc, "malloc_enter"),
            (SessionKind::Calloc, "calloc_enter"),
            (SessionKind::Realloc, "realloc_enter"),
            (SessionKind::Reallocarray, "reallocarray_enter"),
            (SessionKind::PosixMemalign, "posix_memalign_enter"),
            (SessionKind::AlignedAlloc, "aligned_alloc_enter"),
            (SessionKind::Memalign, "memalign_enter"),
            (SessionKind::Valloc, "valloc_enter"),
            (SessionKind::Pvalloc, "pvalloc_enter"),
        ];
        for (kind, entry) in kinds {
            assert_eq!(session_kind(entry), Some(kind as u64), "{entry}");
        }
        assert_eq!(session_kind("free_enter"), None);
        // Every probed function but the frees is a session's call.
        for spec in PROBES {
            assert_eq!(
                session_kind(spec.entry).is_some(),
                spec.exit.is_some(),
                "{}",
                spec.symbol
            );
        }
    }
}
