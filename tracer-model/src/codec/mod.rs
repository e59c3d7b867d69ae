//! The snapshot file formats, as pure byte codecs (the daemon does the
//! file I/O): tracer's own format (`dump`) and tracemalloc's pickle
//! (`pickle`). Both decoders share file names across the snapshots they
//! read (`intern`), as snapshots of one process share them.

pub(crate) mod budget;
pub(crate) mod chunked;
pub(crate) mod dump;
mod intern;
pub(crate) mod pickle;
