//! What the tasks share, one implementation each: running cargo and other
//! commands ([`cmd`]), the workspace's paths ([`paths`]), compiling a C
//! workload ([`cc`]), a release tracerd on loopback ([`daemon`]), the list
//! of tracers that distort measurements ([`tracers`]) and medians and
//! percentiles ([`stats`]). Scratch directories, child processes, the C
//! compiler, the HTTP client and the tracerd runner are the root suite's
//! too: `tracer_testkit`'s.
pub mod cc;
pub mod cmd;
pub mod daemon;
pub mod paths;
pub mod stats;
pub mod tracers;
