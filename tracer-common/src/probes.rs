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

/// Every probe tracer attaches, in attach order. Exits are attached before
/// entries so that no entry is ever recorded without its return being seen.
///
/// The C allocation API, then jemalloc's own (`libjemalloc.so.2`), whose
/// calls have the shape of one of the C API's and share its programs:
/// `mallocx(size, flags)` is malloc's (flags ask for alignment or zeroes,
/// not another size), `rallocx(ptr, size, flags)` realloc's (NULL leaves
/// `ptr` live), `sdallocx(ptr, size, flags)` and `dallocx(ptr, flags)`
/// free's. (`xallocx`, which resizes in place to a size it chooses, is not
/// probed.)
pub const PROBES: [ProbeSpec; 14] = [
    ProbeSpec {
        symbol: "malloc",
        entry: "malloc_enter",
        exit: Some("malloc_exit"),
    },
    ProbeSpec {
        symbol: "calloc",
        entry: "calloc_enter",
        exit: Some("calloc_exit"),
    },
    ProbeSpec {
        symbol: "realloc",
        entry: "realloc_enter",
        exit: Some("realloc_exit"),
    },
    ProbeSpec {
        symbol: "reallocarray",
        entry: "reallocarray_enter",
        exit: Some("reallocarray_exit"),
    },
    ProbeSpec {
        symbol: "free",
        entry: "free_enter",
        exit: None,
    },
    ProbeSpec {
        symbol: "posix_memalign",
        entry: "posix_memalign_enter",
        exit: Some("posix_memalign_exit"),
    },
    ProbeSpec {
        symbol: "aligned_alloc",
        entry: "aligned_alloc_enter",
        exit: Some("aligned_alloc_exit"),
    },
    ProbeSpec {
        symbol: "memalign",
        entry: "memalign_enter",
        exit: Some("memalign_exit"),
    },
    ProbeSpec {
        symbol: "valloc",
        entry: "valloc_enter",
        exit: Some("valloc_exit"),
    },
    ProbeSpec {
        symbol: "pvalloc",
        entry: "pvalloc_enter",
        exit: Some("pvalloc_exit"),
    },
    ProbeSpec {
        symbol: "mallocx",
        entry: "malloc_enter",
        exit: Some("malloc_exit"),
    },
    ProbeSpec {
        symbol: "rallocx",
        entry: "realloc_enter",
        exit: Some("realloc_exit"),
    },
    ProbeSpec {
        symbol: "sdallocx",
        entry: "free_enter",
        exit: None,
    },
    ProbeSpec {
        symbol: "dallocx",
        entry: "free_enter",
        exit: None,
    },
];

/// Empty uprobe and uretprobe programs, attached in place of every entry and
/// exit program to measure the physical floor of the probes themselves.
pub const FLOOR_PROGRAMS: (&str, &str) = ("floor_enter", "floor_exit");

/// The tracepoint that reports a traced image mapping a file's code (a
/// `dlopen`), so that the unwinder learns the new mapping within
/// milliseconds rather than at its next periodic refresh: (program,
/// category, name). Optional: a kernel without syscall tracepoints
/// (`CONFIG_FTRACE_SYSCALLS`) has only the periodic refresh.
pub const MAPPING_TRACEPOINT: (&str, &str, &str) = ("sys_enter_mmap", "syscalls", "sys_enter_mmap");

/// The tracepoint programs for process lifecycle: (program, category, name).
pub const TRACEPOINTS: [(&str, &str, &str); 3] = [
    ("sched_process_exec", "sched", "sched_process_exec"),
    ("sched_process_exit", "sched", "sched_process_exit"),
    ("sched_process_fork", "sched", "sched_process_fork"),
];
