//! Facts of the operating system, no policy: readers of `/proc`
//! ([`procfs`]), the executable files a process maps, held open
//! ([`modules`]), raw `bpf(2)` map calls ([`bpf`]), execs held until
//! tracerd answers ([`fanotify`]), the user on the other end of a local
//! connection ([`peer`]), atomic file writes
//! ([`fsync`]), uprobe_multi links,
//! which aya does not offer ([`uprobe_multi`]), a global allocator
//! that counts each thread's bytes ([`alloc`]), and the lowered threads of
//! work that grows with the traced data ([`EXPENSIVE_NICE`]), and the running
//! kernel's structure layouts from its BTF ([`btf`]). One implementation
//! of each, for every later stage.
pub mod alloc;
pub mod bpf;
pub mod btf;
pub mod fanotify;
pub mod fsync;
pub mod modules;
pub mod peer;
pub mod procfs;
pub mod uprobe_multi;

/// Milliseconds since the Unix epoch of a wall-clock time (0 before it).
#[must_use]
pub fn unix_ms(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Raises this process's soft limit of open files (`RLIMIT_NOFILE`)
/// towards `wanted`, as far as its hard limit allows; returns the soft
/// limit in force afterwards. Under systemd the unit's `LimitNOFILE` sets
/// it (and its seccomp filter refuses `setrlimit`: then the limit is
/// simply kept); a shell's usual 1024 is raised here.
///
/// # Errors
/// What `getrlimit` said.
pub fn raise_open_files(wanted: u64) -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit struct, written by the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur >= wanted {
        return Ok(limit.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: wanted.min(limit.rlim_max),
        rlim_max: limit.rlim_max,
    };
    // SAFETY: a valid rlimit struct for the call's duration.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
        Ok(raised.rlim_cur)
    } else {
        Ok(limit.rlim_cur)
    }
}

/// Puts the calling thread in the `SCHED_IDLE` class: it runs only where a
/// CPU has nothing else to run, and gives way at once to any other thread.
/// For a helper that nothing waits on (a lock holder there could be starved
/// on a busy host). A failure leaves it as it was (logged at debug).
pub fn idle_this_thread() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid sched_param for the call's duration; pid 0 is the
    // calling thread, and moving oneself to SCHED_IDLE needs no privilege.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &raw const param) } != 0 {
        tracing::debug!(err = %std::io::Error::last_os_error(), "the thread keeps its scheduling class");
    }
}

/// The nice value of the threads of `work::threads::spawn_expensive`: a snapshot of
/// millions of blocks takes a CPU for a second or more, and a cheap
/// route's thread (nice 0) must get one first, even on a host whose other
/// CPUs are busy. (The model's helper threads, the sweeps and the refill
/// of the spill maps' pool run at this nice too.)
pub const EXPENSIVE_NICE: i32 = 10;

/// Sets the calling thread's nice value to `nice` (Linux's nice is per
/// thread): for a thread of its own that ends with its work, since going
/// back to 0 needs CAP_SYS_NICE. A failure leaves it as it was (logged at
/// debug).
pub fn lower_this_threads_priority(nice: i32) {
    // SAFETY: gettid and setpriority take no pointer; raising one's own
    // nice value needs no privilege and touches this thread only.
    let ret = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if ret != 0 {
        tracing::debug!(err = %std::io::Error::last_os_error(), nice, "the thread keeps its priority");
    }
}
