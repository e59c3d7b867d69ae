//! What the tasks share, one implementation each: running cargo and other
//! commands ([`cmd`]), the workspace's paths ([`paths`]), owning a child
//! process ([`child`]), compiling a C workload ([`cc`]), talking HTTP to
//! tracerd ([`http`]), a release tracerd on loopback ([`daemon`]), the list
//! of tracers that distort measurements ([`tracers`]) and medians and
//! percentiles ([`stats`]).
pub mod cc;
pub mod child;
pub mod cmd;
pub mod daemon;
pub mod http;
pub mod paths;
pub mod stats;
pub mod tracers;
