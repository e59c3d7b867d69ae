//! What loading a file may cost: at most [`LOAD_BYTES_PER_INPUT_BYTE`]
//! bytes of memory per byte of the file, plus [`LOAD_BASE_BYTES`] (the
//! file's own bytes, which the caller holds, not counted), and time in
//! proportion.
//!
//! Both decoders charge a [`Budget`] **before** they allocate: every value
//! the pickle machine stores (a memo, list, tuple or dict slot, and the
//! stack by its highest depth, so that `DUP`, `MEMOIZE` and `GET` are
//! charged as they run), and every node the conversion to a
//! [`Snapshot`](crate::Snapshot) materialises (a string, a frame, a
//! traceback and each frame reference in it, a trace), each at a fixed
//! cost that covers the node, its share of the tables that find it again
//! and of the snapshot's index. A file that would go past the budget is
//! refused with [`OverBudget`], naming where. A file tracer writes, or
//! Python's `Snapshot.dump()`, costs less per byte than the bound allows
//! (measured in `docs/design/0011-measured-figures.md`), so that only crafted files (a traceback of millions of references to one
//! frame, a pickle of `DUP` opcodes) meet the bound.
//!
//! Work done is charged too: every charge is proportional to the steps
//! that make it, so the time a load takes is linear in the file's size.
//! The loops also poll [`interrupt::check_every`](crate::interrupt::check_every)
//! through [`Budget::tick`].

use crate::interrupt::{Interrupted, check_every};

/// Bytes of memory a loaded file may cost per byte of it.
pub const LOAD_BYTES_PER_INPUT_BYTE: u64 = 24;

/// Bytes of memory any loaded file may cost beyond
/// [`LOAD_BYTES_PER_INPUT_BYTE`] times its size: 64 MiB.
pub const LOAD_BASE_BYTES: u64 = 64 << 20;

/// A file refused because loading it would cost more memory than
/// [`LOAD_BYTES_PER_INPUT_BYTE`] times its size plus [`LOAD_BASE_BYTES`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "loading this {input}-byte file would take more than {limit} bytes of memory (at most {LOAD_BYTES_PER_INPUT_BYTE} bytes per byte of the file plus 64 MiB); it went past that at {at}"
)]
pub struct OverBudget {
    /// Size of the file in bytes.
    pub input: u64,
    /// The budget in bytes: `24 * input + 64 MiB`.
    pub limit: u64,
    /// Where the decoder was when the budget ran out (a section and item,
    /// or a byte offset and opcode).
    pub at: String,
}

/// Fixed costs, in bytes, of what the decoders materialise.
pub(crate) mod cost {
    use crate::trace::{Frame, FrameExtra, Trace, Traceback};

    /// A trace: the `Trace`, its traceback number and the index's copy.
    pub(crate) const TRACE: u64 = (size_of::<Trace>() + 8) as u64;
    /// A distinct frame: the frame, its slot in the decoder's tables and
    /// in the index (about 80 bytes).
    pub(crate) const FRAME: u64 = (size_of::<Frame>() + 128) as u64;
    /// A frame tuple of a pickle equal to one seen before: its slot in the
    /// decoder's table of tuples.
    pub(crate) const FRAME_TUPLE: u64 = 24;
    /// A frame's extra (function, module, address).
    pub(crate) const FRAME_EXTRA: u64 = (size_of::<FrameExtra>() + 16) as u64;
    /// A traceback: its `Arc`s, its slots in the decoder's tables, and
    /// about 60 bytes of index.
    pub(crate) const TRACEBACK: u64 = (2 * size_of::<Traceback>() + 128) as u64;
    /// One frame of a traceback: the frame, its number for the index, and
    /// the index's two copies of that number.
    pub(crate) const FRAME_REF: u64 = (size_of::<Frame>() + 16) as u64;
    /// One frame of a traceback that shares its frames with another (the
    /// same tuple with another `total_nframe`): the index's copy of its
    /// number.
    pub(crate) const SHARED_FRAME_REF: u64 = 8;
    /// A string, besides twice its length (its `Arc` and the interning
    /// table's key).
    pub(crate) const STRING: u64 = 96;
    /// A byte of the JSON header, parsed (every value may be a 32-byte
    /// node in a vector that doubles) and copied once (`meta`).
    pub(crate) const HEADER_BYTE: u64 = 128;
}

/// The memory a load may still take, and its step count for the
/// interrupt check.
#[derive(Debug)]
pub(crate) struct Budget {
    input: u64,
    limit: u64,
    used: u64,
    steps: usize,
}

impl Budget {
    /// The budget of a file of `input` bytes.
    pub(crate) fn for_input(input: usize) -> Self {
        let input = input as u64;
        Budget {
            input,
            limit: input
                .saturating_mul(LOAD_BYTES_PER_INPUT_BYTE)
                .saturating_add(LOAD_BASE_BYTES),
            used: 0,
            steps: 0,
        }
    }

    /// A budget of `limit` bytes, whatever the input (for tests).
    #[cfg(test)]
    pub(crate) fn with_limit(input: usize, limit: u64) -> Self {
        Budget {
            input: input as u64,
            limit,
            used: 0,
            steps: 0,
        }
    }

    /// Bytes charged so far.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Charges `bytes` (before they are allocated); `at` says where, for
    /// the error.
    pub(crate) fn charge(
        &mut self,
        bytes: u64,
        at: impl FnOnce() -> String,
    ) -> Result<(), OverBudget> {
        let used = self.used.saturating_add(bytes);
        if used > self.limit {
            return Err(OverBudget {
                input: self.input,
                limit: self.limit,
                at: at(),
            });
        }
        self.used = used;
        Ok(())
    }

    /// Charges `count` items of `each` bytes.
    pub(crate) fn charge_n(
        &mut self,
        count: usize,
        each: u64,
        at: impl FnOnce() -> String,
    ) -> Result<(), OverBudget> {
        self.charge((count as u64).saturating_mul(each), at)
    }

    /// Makes room in `vec` for `additional` more items, charging them
    /// before it grows. Charged by length, not capacity: the part of a
    /// doubled vector not yet written is not resident.
    pub(crate) fn grow<T>(
        &mut self,
        vec: &mut Vec<T>,
        additional: usize,
        at: impl FnOnce() -> String,
    ) -> Result<(), OverBudget> {
        self.charge_n(additional, size_of::<T>() as u64, at)?;
        vec.reserve(additional);
        Ok(())
    }

    /// One step of a loop: polls the interrupt check every
    /// [`CHECK_EVERY`](crate::interrupt::CHECK_EVERY) steps.
    pub(crate) fn tick(&mut self) -> Result<(), Interrupted> {
        let step = self.steps;
        self.steps = self.steps.wrapping_add(1);
        check_every(step)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_24_per_byte_plus_64_mib_and_growth_is_charged_by_length() {
        let mut budget = Budget::for_input(1000);
        assert_eq!(budget.limit, 24_000 + 67_108_864);
        let mut vec: Vec<u64> = Vec::new();
        budget.grow(&mut vec, 3, String::new).unwrap();
        assert_eq!(budget.used(), 24);
        assert!(vec.capacity() >= 3);
        let mut small = Budget::with_limit(10, 100);
        let err = small.charge(101, || "the end".into()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "loading this 10-byte file would take more than 100 bytes of memory (at most 24 bytes per byte of the file plus 64 MiB); it went past that at the end"
        );
        assert_eq!(small.used(), 0);
    }
}
