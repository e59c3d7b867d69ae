//! Process lifecycle events, the records of the `EVENTS` ring buffer: what
//! happened ([`ProcEventKind`]) to which process image, with its final
//! totals when the image ended ([`ProcEvent`]).
//!
//! The kernel writes the kind as a `u32`; tracerd decodes it with
//! [`ProcEventKind::try_from`], which refuses a number it does not know.

use core::mem::size_of;

#[cfg(doc)]
use crate::MAP_EVENTS;
use crate::ProcStats;

/// What a [`ProcEvent`] reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcEventKind {
    /// A process image starts: at a fork (the child), at an exec (the new
    /// program), or, for a process that was running before tracerd, at its
    /// first allocation seen: read its maps now.
    New = 1,
    /// The image was replaced by exec: its blocks are gone.
    Exec = 2,
    /// The last thread exited: its blocks are gone.
    Exit = 3,
    /// A process (traced or not) called exec: its new image's allocators
    /// are looked for, and, when scoped, whether it matches.
    ExecAny = 4,
    /// Scoped mode: a task was created; `tgid` is the child's id (a thread
    /// or a process: userspace tells them apart).
    Fork = 5,
    /// A process is mapping a file's code (`mmap` with `PROT_EXEC`: a
    /// library loaded at start or `dlopen`ed): re-read its mappings for
    /// allocator discovery and the unwinder (`generation` 0: not traced yet).
    Mapped = 6,
    /// A process image spills blocks past its fast-table buckets and needs
    /// the next level of its own spill map (`level`; see
    /// [`crate::own_spill`]).
    Spill = 7,
}

impl TryFrom<u32> for ProcEventKind {
    /// The number, which names no kind (a newer or corrupt kernel side).
    type Error = u32;

    /// The kind whose number ([`ProcEvent::kind`]) is `kind`.
    fn try_from(kind: u32) -> Result<Self, Self::Error> {
        match kind {
            1 => Ok(ProcEventKind::New),
            2 => Ok(ProcEventKind::Exec),
            3 => Ok(ProcEventKind::Exit),
            4 => Ok(ProcEventKind::ExecAny),
            5 => Ok(ProcEventKind::Fork),
            6 => Ok(ProcEventKind::Mapped),
            7 => Ok(ProcEventKind::Spill),
            other => Err(other),
        }
    }
}

/// Ring buffer record of [`MAP_EVENTS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEvent {
    /// A [`ProcEventKind`] as u32.
    pub kind: u32,
    /// The process.
    pub tgid: u32,
    /// The generation the event is about (for Exec/Exit: the one that ended).
    pub generation: u32,
    /// For Spill: the level of the image's own spill map asked for; for
    /// New: the parent's tgid when the image starts at a fork (0: unknown,
    /// an image first seen at an exec or an allocation); else 0.
    pub detail: u32,
    /// `bpf_ktime_get_ns()` at the event, ns since boot (CLOCK_MONOTONIC).
    pub ktime_ns: u64,
    /// For Exec/Exit: the final totals of the generation that ended.
    pub stats: ProcStats,
    /// `comm` of the thread that caused the event (`bpf_get_current_comm`),
    /// NUL-padded: the name of a process gone before `/proc` could be read.
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<ProcEvent>() == 112);

// SAFETY: #[repr(C)], Copy, made only of integers with explicit padding, so
// every bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcEvent {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_kind_decodes_from_the_number_the_kernel_writes() {
        let kinds = [
            ProcEventKind::New,
            ProcEventKind::Exec,
            ProcEventKind::Exit,
            ProcEventKind::ExecAny,
            ProcEventKind::Fork,
            ProcEventKind::Mapped,
            ProcEventKind::Spill,
        ];
        for kind in kinds {
            assert_eq!(ProcEventKind::try_from(kind as u32), Ok(kind));
        }
        assert_eq!(ProcEventKind::try_from(1), Ok(ProcEventKind::New));
        assert_eq!(ProcEventKind::try_from(2), Ok(ProcEventKind::Exec));
        assert_eq!(ProcEventKind::try_from(3), Ok(ProcEventKind::Exit));
        assert_eq!(ProcEventKind::try_from(4), Ok(ProcEventKind::ExecAny));
        assert_eq!(ProcEventKind::try_from(5), Ok(ProcEventKind::Fork));
        assert_eq!(ProcEventKind::try_from(6), Ok(ProcEventKind::Mapped));
        assert_eq!(ProcEventKind::try_from(7), Ok(ProcEventKind::Spill));
    }

    #[test]
    fn unknown_event_kinds_are_refused_with_their_number() {
        for number in [0, 8, 0x100, u32::MAX] {
            assert_eq!(ProcEventKind::try_from(number), Err(number));
        }
    }
}
