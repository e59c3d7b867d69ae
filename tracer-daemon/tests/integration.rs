//! The root integration tests, as one binary: the real tracerd with its
//! real eBPF programs tracing C programs compiled here from
//! `tests/fixtures/`, checked through the HTTP API with exact counts, sizes
//! and `file:line`. They attach probes host-wide: run them as root and one
//! at a time (`cargo xtask test`, or `cargo test -p tracer-daemon --test
//! integration -- --test-threads=1`).

/// The suite's own allocator: TLSF (rlsf), on memory it maps itself, which
/// no tracerd probes. With glibc's malloc, the tracerd under test traced
/// this binary too: every allocation of a JSON answer parsed here (millions
/// for a traced service's blocks with their frames) trapped and walked its
/// stack, which was most of the heaviest tests' time, and its blocks filled
/// the maps that the programs under test share. The programs this suite
/// checks are its fixtures and the services it starts, never itself.
#[global_allocator]
static ALLOCATOR: rlsf::GlobalTlsf = rlsf::GlobalTlsf::new();

mod suite;
