//! Python's own tracemalloc dump files: `Snapshot.dump()` writes
//! `pickle.dump(snapshot, f, pickle.HIGHEST_PROTOCOL)`, and
//! `Snapshot.load()` reads it back with `pickle.load`.
//!
//! [`load_tracemalloc`] parses such a file **without executing it**: it is
//! a small interpreter of the pickle opcodes that protocols 2 to 5 use for
//! a `tracemalloc.Snapshot` (ints, strings, tuples, lists, dicts, `None`,
//! booleans, memo, framing, `NEWOBJ` and `BUILD`), in which the only
//! classes that may be named are `tracemalloc.Snapshot` and
//! `tracemalloc._Traces`, and no class is ever called: objects are plain
//! records of their state. Anything else (other globals, `REDUCE`,
//! extension codes, persistent ids, protocol 0/1 text opcodes) is refused
//! with an error naming the opcode and its offset. Memory use is bounded by
//! [`LOAD_BYTES_PER_INPUT_BYTE`](crate::LOAD_BYTES_PER_INPUT_BYTE) bytes
//! per byte of the input plus [`LOAD_BASE_BYTES`](crate::LOAD_BASE_BYTES),
//! and time is linear in its size (see `tracer-model/src/codec/budget.rs`).
//!
//! [`dump_tracemalloc`] writes a protocol-4 pickle that Python's
//! `tracemalloc.Snapshot.load()` reads into an equal snapshot (file names,
//! line numbers, domains, sizes, `total_nframe`, `traceback_limit`; the
//! extras tracemalloc has no place for are not written). A frame with no
//! line info is written as tracemalloc sees it, `(name, 0)` with its site
//! in the name (`/usr/bin/node!f+0x1f`, `/usr/bin/node+0x1a2b30`: see
//! [`Frame`](crate::Frame)), so Python keeps two sites apart and prints
//! them as tracer does; [`load_tracemalloc`] reads such a name back as a
//! site ([`Frame::from_tracemalloc`](crate::Frame::from_tracemalloc)).
//!
//! Three steps: `vm` runs the opcodes into plain objects (`value`), `load`
//! turns those into a `Snapshot`, and `dump` writes one.

mod dump;
mod load;
#[cfg(test)]
mod tests;
mod value;
mod vm;

use crate::codec::budget::OverBudget;
use crate::interrupt::Interrupted;

pub use dump::dump_tracemalloc;
pub use load::load_tracemalloc;
#[cfg(test)]
use load::load_with;

/// Why a pickle was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    /// The input is not a pickle this parser reads, or is malformed.
    #[error("not a tracemalloc snapshot pickle: {reason} (at byte {offset})")]
    Malformed {
        /// Byte offset of the opcode.
        offset: usize,
        /// What is wrong.
        reason: String,
    },
    /// The pickle is well formed but does not hold a tracemalloc snapshot
    /// of the expected shape.
    #[error("the pickle does not hold a tracemalloc snapshot: {reason}")]
    Shape {
        /// What is wrong, with the path of the value.
        reason: String,
    },
    /// Loading the pickle would take more memory than
    /// [`LOAD_BYTES_PER_INPUT_BYTE`](crate::LOAD_BYTES_PER_INPUT_BYTE)
    /// bytes per byte of it plus
    /// [`LOAD_BASE_BYTES`](crate::LOAD_BASE_BYTES): opcodes that replicate
    /// values (`DUP`, `MEMOIZE`, `GET`) or tracebacks that expand into more
    /// frames than the file could describe. Nothing of it is kept.
    #[error("tracemalloc pickle refused: {0}")]
    OverBudget(#[from] OverBudget),
    /// The thread's interrupt check ([`crate::interrupt`]) stopped the
    /// loading.
    #[error(transparent)]
    Interrupted(#[from] Interrupted),
}

fn shape(reason: impl Into<String>) -> PickleError {
    PickleError::Shape {
        reason: reason.into(),
    }
}
