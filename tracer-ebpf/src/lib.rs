//! Empty library target: it lets `tracer-daemon` list this crate as a
//! build-dependency so that cargo rebuilds the daemon when the programs
//! change. The programs themselves are the `tracer` binary (src/main.rs).
#![no_std]
