//! Facts of the operating system, no policy: readers of `/proc`
//! ([`procfs`]), the executable files a process maps, held open
//! ([`modules`]), raw `bpf(2)` map calls ([`bpf`]) and atomic file writes
//! ([`fsync`]). One implementation of each, for every later stage.
pub mod bpf;
pub mod fsync;
pub mod modules;
pub mod procfs;
