//! The root integration tests, as one binary: the real tracerd with its
//! real eBPF programs tracing C programs compiled here from
//! `tests/fixtures/`, checked through the HTTP API with exact counts, sizes
//! and `file:line`. They attach probes host-wide: run them as root and one
//! at a time (`cargo xtask test`, or `cargo test -p tracer-daemon --test
//! integration -- --test-threads=1`).

mod suite;
