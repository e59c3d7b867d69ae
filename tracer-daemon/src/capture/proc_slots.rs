//! tracerd's side of the kernel's direct-mapped per-process totals,
//! `PROC_SLOTS`: [`PROC_SLOT_COUNT`] [`ProcSlot`]s in a `BPF_F_MMAPABLE`
//! array, read through a shared mapping with the atomics the programs use.
//!
//! The protocol (see tracer-ebpf's `proc_stats` and `end_generation`): a
//! process claims its free slot ([`proc_slot_index`]) at its first
//! allocation by one compare-and-swap of the slot word to its tgid and
//! generation; if the slot is taken it goes to `PROCS`, counted in the
//! slot's spill count. The slot is freed (totals zeroed, the word's owner
//! and generation cleared) when the image ends.

use std::sync::atomic::{AtomicU64, Ordering};

use tracer_common::{
    FAMILY_COUNT, FamilyTotals, PROC_SLOT_COUNT, ProcSlot, ProcStats, ProcTotals, proc_slot_gen,
    proc_slot_index, proc_slot_owner, proc_slot_spill,
};

/// Words (u64) per [`ProcSlot`]: the slot word, then [`ProcStats`], then
/// each source's current and peak ([`ProcTotals::sources`]).
const SLOT_WORDS: usize = size_of::<ProcSlot>() / 8;
/// Word of the first source's `current` within a slot.
const SOURCES: usize = 1 + size_of::<ProcStats>() / 8;
/// Word of [`ProcTotals::stacks`] within a slot.
const STACKS: usize = SOURCES + 2 * FAMILY_COUNT;
/// Word of [`ProcTotals::stack_totals_lost`] within a slot.
const STACK_TOTALS_LOST: usize = STACKS + 1;
/// Word of a slot's `totals.shared_spill` (then `own_asked`, `own_spill`).
const SHARED_SPILL: usize = STACK_TOTALS_LOST + 1;
/// Word of [`ProcTotals::stack_keys`] within a slot.
const STACK_KEYS: usize = SHARED_SPILL + 3;
/// Word of [`ProcTotals::mmap_max_len`] within a slot (then the four of
/// `mmap_pages`).
const MMAP_MAX_LEN: usize = STACK_KEYS + 1;
/// Word of [`ProcStats::current`] within a slot (after the slot word and
/// `generation`/`_pad`).
const CURRENT: usize = 2;
/// Word of [`ProcStats::peak`] within a slot.
const PEAK: usize = 3;

/// The mapped array. Every access is atomic: the programs change it
/// concurrently.
pub struct ProcSlots {
    map: memmap2::MmapRaw,
}

impl ProcSlots {
    /// Maps the array `fd` ([`PROC_SLOT_COUNT`] [`ProcSlot`]s) read-write.
    ///
    /// # Errors
    /// The kernel refused the mapping (the map is not `BPF_F_MMAPABLE`).
    pub fn map(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd as _;
        let map = memmap2::MmapOptions::new()
            .len(PROC_SLOT_COUNT as usize * size_of::<ProcSlot>())
            .map_raw(fd.as_raw_fd())?;
        Ok(Self { map })
    }

    /// Word `word` (0: the slot word) of slot `index`.
    fn word(&self, index: u32, word: usize) -> &AtomicU64 {
        debug_assert!(index < PROC_SLOT_COUNT && word < SLOT_WORDS);
        let at = index as usize * SLOT_WORDS + word;
        // SAFETY: in bounds (index < PROC_SLOT_COUNT, SLOT_WORDS words a
        // slot); 8-byte aligned (page-aligned mapping, 208-byte slots); the
        // programs change it only atomically or while the slot is free.
        unsafe { &*self.map.as_ptr().cast::<AtomicU64>().add(at) }
    }

    /// The totals of slot `index` as owned by the word `word` (its
    /// generation in `generation`), read field by field.
    fn stats(&self, index: u32, word: u64) -> ProcStats {
        let field = |n: usize| self.word(index, 1 + n).load(Ordering::Relaxed);
        ProcStats {
            generation: proc_slot_gen(word),
            _pad: 0,
            current: field(1),
            peak: field(2),
            blocks: field(3),
            allocs: field(4),
            frees: field(5),
            unknown_frees: field(6),
            drops: field(7),
            cut: field(8),
        }
    }

    /// The bytes by source of slot `index`, read field by field.
    fn sources(&self, index: u32) -> [FamilyTotals; FAMILY_COUNT] {
        std::array::from_fn(|source| FamilyTotals {
            current: self
                .word(index, SOURCES + 2 * source)
                .load(Ordering::Relaxed),
            peak: self
                .word(index, SOURCES + 2 * source + 1)
                .load(Ordering::Relaxed),
        })
    }

    /// The totals of `tgid` if it owns its slot; None: it is in `PROCS`,
    /// or not traced.
    pub fn get(&self, tgid: u32) -> Option<ProcStats> {
        let index = proc_slot_index(tgid);
        let word = self.word(index, 0).load(Ordering::Acquire);
        (proc_slot_owner(word) == tgid && tgid != 0).then(|| self.stats(index, word))
    }

    /// The totals and bytes by source of `tgid` if it owns its slot.
    pub fn get_totals(&self, tgid: u32) -> Option<ProcTotals> {
        let index = proc_slot_index(tgid);
        let stats = self.get(tgid)?;
        Some(ProcTotals {
            stats,
            sources: self.sources(index),
            stacks: self.word(index, STACKS).load(Ordering::Relaxed),
            stack_totals_lost: self.word(index, STACK_TOTALS_LOST).load(Ordering::Relaxed),
            shared_spill: self.word(index, SHARED_SPILL).load(Ordering::Relaxed),
            own_asked: self.word(index, SHARED_SPILL + 1).load(Ordering::Relaxed),
            own_spill: self.word(index, SHARED_SPILL + 2).load(Ordering::Relaxed),
            stack_keys: self.word(index, STACK_KEYS).load(Ordering::Acquire),
            mmap_max_len: self.word(index, MMAP_MAX_LEN).load(Ordering::Relaxed),
            mmap_pages: std::array::from_fn(|w| {
                self.word(index, MMAP_MAX_LEN + 1 + w)
                    .load(Ordering::Relaxed)
            }),
        })
    }

    /// Sets the stacks count of `tgid`'s image of generation `generation` if it
    /// owns its slot; false otherwise.
    pub fn set_stacks(&self, tgid: u32, generation: u32, stacks: u64) -> bool {
        let Some(index) = self.slot_of(tgid, generation) else {
            return false;
        };
        self.word(index, STACKS).store(stacks, Ordering::Relaxed);
        true
    }

    /// The slot `tgid`'s image of generation `generation` owns; None when the
    /// slot is another's (or free: the image is in `PROCS`, or ended).
    fn slot_of(&self, tgid: u32, generation: u32) -> Option<u32> {
        let index = proc_slot_index(tgid);
        let word = self.word(index, 0).load(Ordering::Acquire);
        (proc_slot_owner(word) == tgid && tgid != 0 && proc_slot_gen(word) == generation)
            .then_some(index)
    }

    /// Lowers the counts of `tgid`'s image of generation `generation` of blocks
    /// in its own spill maps (`own`) and in `LIVE_ALLOCS` (`shared`) by
    /// blocks tracerd removed from there, never below 0 (the programs raise
    /// a count before the insert and lower it after the delete, so it stays
    /// at or above the truth); false when the image does not own its slot.
    pub fn lower_spill(&self, tgid: u32, generation: u32, own: u64, shared: u64) -> bool {
        let Some(index) = self.slot_of(tgid, generation) else {
            return false;
        };
        for (at, by) in [(SHARED_SPILL, shared), (SHARED_SPILL + 2, own)] {
            if by > 0 {
                // Never fails: the closure always gives a value.
                let _ =
                    self.word(index, at)
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                            Some(n.saturating_sub(by))
                        });
            }
        }
        true
    }

    /// Whether some process of `tgid`'s slot is in `PROCS` (else `tgid`
    /// cannot be there).
    pub fn spilled(&self, tgid: u32) -> bool {
        proc_slot_spill(self.word(proc_slot_index(tgid), 0).load(Ordering::Acquire)) != 0
    }

    /// Every process that owns a slot: tgid → totals.
    pub fn all(&self) -> Vec<(u32, ProcStats)> {
        (0..PROC_SLOT_COUNT)
            .filter_map(|index| {
                let word = self.word(index, 0).load(Ordering::Acquire);
                let owner = proc_slot_owner(word);
                (owner != 0).then(|| (owner, self.stats(index, word)))
            })
            .collect()
    }

    /// Slots owned now.
    pub fn len(&self) -> u64 {
        (0..PROC_SLOT_COUNT)
            .filter(|&index| proc_slot_owner(self.word(index, 0).load(Ordering::Relaxed)) != 0)
            .count() as u64
    }

    /// Whether no slot is owned.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets the peak of `tgid` to its current value, if it owns its slot.
    /// Atomic per field: an allocation meanwhile raises the peak again.
    pub fn reset_peak(&self, tgid: u32) -> bool {
        if self.get(tgid).is_none() {
            return false;
        }
        let index = proc_slot_index(tgid);
        for (current, peak) in std::iter::once((CURRENT, PEAK))
            .chain((0..FAMILY_COUNT).map(|source| (SOURCES + 2 * source, SOURCES + 2 * source + 1)))
        {
            let now = self.word(index, current).load(Ordering::Acquire);
            self.word(index, peak).store(now, Ordering::Release);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_words_match_the_slot_layout() {
        let slot = ProcSlot::default();
        let base = std::ptr::from_ref(&slot) as usize;
        let word_of = |p: *const u64| (p as usize - base) / 8;
        assert_eq!(SLOT_WORDS, 37);
        assert_eq!(word_of(&raw const slot.totals.stats.current), CURRENT);
        assert_eq!(word_of(&raw const slot.totals.stats.peak), PEAK);
        assert_eq!(word_of(&raw const slot.totals.stats.drops), 8);
        assert_eq!(word_of(&raw const slot.totals.stats.cut), 9);
        assert_eq!(word_of(&raw const slot.totals.sources[0].current), SOURCES);
        assert_eq!(word_of(&raw const slot.totals.sources[7].peak), 25);
        assert_eq!(word_of(&raw const slot.totals.stacks), STACKS);
        assert_eq!(
            word_of(&raw const slot.totals.stack_totals_lost),
            STACK_TOTALS_LOST
        );
        assert_eq!(word_of(&raw const slot.totals.shared_spill), SHARED_SPILL);
        assert_eq!(word_of(&raw const slot.totals.own_asked), SHARED_SPILL + 1);
        assert_eq!(word_of(&raw const slot.totals.own_spill), SHARED_SPILL + 2);
        assert_eq!(word_of(&raw const slot.totals.stack_keys), STACK_KEYS);
        assert_eq!(word_of(&raw const slot.totals.mmap_max_len), MMAP_MAX_LEN);
        assert_eq!(
            word_of(&raw const slot.totals.mmap_pages[3]),
            MMAP_MAX_LEN + 4
        );
        assert_eq!(MMAP_MAX_LEN + 5, SLOT_WORDS, "the slot's last word");
    }
}
