//! Facts of the operating system, no policy: readers of `/proc`
//! ([`procfs`]), the executable files a process maps, held open
//! ([`modules`]), raw `bpf(2)` map calls ([`bpf`]), execs held until
//! tracerd answers ([`fanotify`]), the user on the other end of a local
//! connection ([`peer`]), atomic file writes
//! ([`fsync`]), the shared objects the dynamic loader of a process's
//! root would load for an executable ([`ldso`]) and uprobe_multi links,
//! which aya does not offer ([`uprobe_multi`]). One implementation of
//! each, for every later stage.
pub mod bpf;
pub mod fanotify;
pub mod fsync;
pub mod ldso;
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
