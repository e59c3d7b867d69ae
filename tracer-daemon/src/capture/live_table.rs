//! tracerd's side of the kernel's fast live-block table: `LIVE_KEYS`
//! (buckets of [`LIVE_WAYS`] packed keys, [`LiveBucket`]) and `LIVE_VALUES`
//! (an [`AllocInfo`] per way), two `BPF_F_MMAPABLE` arrays read and changed
//! through a shared mapping, with the same atomics the programs use.
//!
//! The protocol (see tracer-ebpf's `table_insert` and `remove_block`): a
//! program claims an empty way by compare-and-swap to [`LIVE_BUSY`], writes
//! the value, then stores the key; a block is removed by compare-and-swap of
//! its key to [`LIVE_EMPTY`], by whoever wins. A block of a full bucket goes
//! to `LIVE_ALLOCS` and is counted in [`LiveBucket::spilled`], which
//! whoever removes it from `LIVE_ALLOCS` decrements.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};

use tracer_common::{
    AllocInfo, AllocKey, LIVE_BUSY, LIVE_EMPTY, LIVE_WAYS, LiveBucket, live_key, live_unpack,
};

/// The number of buckets (a power of two, at least 2) that holds `blocks`
/// blocks, [`LIVE_WAYS`] a bucket; 0 (the table off) for 0.
pub fn buckets_for(blocks: u32) -> u32 {
    if blocks == 0 {
        return 0;
    }
    blocks
        .div_ceil(LIVE_WAYS)
        .max(2)
        .checked_next_power_of_two()
        .unwrap_or(1 << 31)
}

/// The two mapped arrays. Every access goes through atomics or volatile
/// reads: the programs change them concurrently.
pub struct LiveTable {
    keys: memmap2::MmapRaw,
    values: memmap2::MmapRaw,
    buckets: u32,
}

/// Where [`LiveTable::remove`] found a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removed {
    /// It was in the table, and is removed.
    Table,
    /// Not in the table: it can only be in `LIVE_ALLOCS`; if it is removed
    /// from there, call [`LiveTable::spill_removed`].
    NotInTable,
}

impl LiveTable {
    /// Maps the arrays `keys` (`buckets` [`LiveBucket`]s) and `values`
    /// (`buckets * LIVE_WAYS` [`AllocInfo`]s) read-write.
    ///
    /// # Errors
    /// The kernel refused a mapping (the map is not `BPF_F_MMAPABLE`).
    pub fn map(
        keys: std::os::fd::BorrowedFd<'_>,
        values: std::os::fd::BorrowedFd<'_>,
        buckets: u32,
    ) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd as _;
        let bucket_bytes = buckets as usize * size_of::<LiveBucket>();
        let value_bytes = buckets as usize * LIVE_WAYS as usize * size_of::<AllocInfo>();
        let keys = memmap2::MmapOptions::new()
            .len(bucket_bytes)
            .map_raw(keys.as_raw_fd())?;
        let values = memmap2::MmapOptions::new()
            .len(value_bytes)
            .map_raw(values.as_raw_fd())?;
        Ok(Self {
            keys,
            values,
            buckets,
        })
    }

    /// The key slot `way` of `bucket`, or its spill counter for `way` None.
    fn word(&self, bucket: u32, way: Option<u32>) -> &AtomicU64 {
        debug_assert!(bucket < self.buckets && way.is_none_or(|w| w < LIVE_WAYS));
        let index = bucket as usize * 8 + way.map_or(0, |w| 1 + w as usize);
        // SAFETY: in bounds (bucket < buckets, 8 words a bucket); the
        // mapping is page-aligned, so every word is 8-byte aligned; the
        // kernel and the programs change it only atomically.
        unsafe { &*self.keys.as_ptr().cast::<AtomicU64>().add(index) }
    }

    /// The value of `way` of `bucket`, read word by word.
    fn value(&self, bucket: u32, way: u32) -> AllocInfo {
        let index = bucket as usize * LIVE_WAYS as usize + way as usize;
        // SAFETY: in bounds (the mapping holds buckets * LIVE_WAYS values),
        // aligned (page-aligned mapping, 32-byte values); a volatile read
        // of plain integers: a torn read is detected by the caller.
        unsafe { std::ptr::read_volatile(self.values.as_ptr().cast::<AllocInfo>().add(index)) }
    }

    /// Calls `f` with every block in the table, until it breaks. A block
    /// that changes while it is read (freed, its way claimed again) is
    /// passed over: its key is read before and after its value, and must be
    /// the same.
    pub fn for_each(&self, mut f: impl FnMut(AllocKey, AllocInfo) -> ControlFlow<()>) {
        for bucket in 0..self.buckets {
            for way in 0..LIVE_WAYS {
                let slot = self.word(bucket, Some(way));
                let key = slot.load(Ordering::Acquire);
                if key == LIVE_EMPTY || key == LIVE_BUSY {
                    continue;
                }
                let info = self.value(bucket, way);
                if slot.load(Ordering::Acquire) != key {
                    continue;
                }
                let (tgid, addr) = live_unpack(bucket, key, self.buckets - 1);
                let next = f(
                    AllocKey {
                        tgid,
                        _pad: 0,
                        addr,
                    },
                    info,
                );
                if next.is_break() {
                    return;
                }
            }
        }
    }

    /// Blocks now in the table.
    pub fn len(&self) -> u64 {
        let mut n = 0;
        for bucket in 0..self.buckets {
            for way in 0..LIVE_WAYS {
                let key = self.word(bucket, Some(way)).load(Ordering::Relaxed);
                n += u64::from(key != LIVE_EMPTY && key != LIVE_BUSY);
            }
        }
        n
    }

    /// Whether the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bucket and key of `block`, if it can be in the table.
    fn place(&self, block: &AllocKey) -> Option<(u32, u64)> {
        live_key(block.tgid, block.addr, self.buckets.wrapping_sub(1)).filter(|_| self.buckets >= 2)
    }

    /// Removes `block` from the table if it is there.
    pub fn remove(&self, block: &AllocKey) -> Removed {
        let Some((bucket, key)) = self.place(block) else {
            return Removed::NotInTable;
        };
        for way in 0..LIVE_WAYS {
            let slot = self.word(bucket, Some(way));
            if slot.load(Ordering::Acquire) == key
                && slot
                    .compare_exchange(key, LIVE_EMPTY, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return Removed::Table;
            }
        }
        Removed::NotInTable
    }

    /// Records that `block` was removed from `LIVE_ALLOCS` by tracerd: its
    /// bucket's spill counter goes down (if it has a bucket).
    pub fn spill_removed(&self, block: &AllocKey) {
        if let Some((bucket, _)) = self.place(block) {
            self.word(bucket, None).fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_counts_are_powers_of_two_that_hold_the_blocks() {
        assert_eq!(buckets_for(0), 0);
        assert_eq!(buckets_for(1), 2);
        assert_eq!(buckets_for(14), 2);
        assert_eq!(buckets_for(15), 4);
        assert_eq!(buckets_for(458_752), 65_536);
        assert_eq!(buckets_for(u32::MAX), 1 << 30);
    }

    /// A table over anonymous memory, filled as the programs fill it.
    fn table(buckets: u32) -> LiveTable {
        let map = |len: usize| {
            memmap2::MmapOptions::new()
                .len(len)
                .map_anon()
                .map(memmap2::MmapRaw::from)
                .expect("anonymous mapping")
        };
        LiveTable {
            keys: map(buckets as usize * 64),
            values: map(buckets as usize * LIVE_WAYS as usize * 32),
            buckets,
        }
    }

    /// Inserts as tracer-ebpf's table_insert does (without the races).
    fn insert(table: &LiveTable, block: AllocKey, info: AllocInfo) -> bool {
        let Some((bucket, key)) = table.place(&block) else {
            return false;
        };
        for way in 0..LIVE_WAYS {
            let slot = table.word(bucket, Some(way));
            if slot
                .compare_exchange(LIVE_EMPTY, LIVE_BUSY, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let index = bucket as usize * LIVE_WAYS as usize + way as usize;
                // SAFETY: in bounds, claimed.
                unsafe { *table.values.as_mut_ptr().cast::<AllocInfo>().add(index) = info };
                slot.store(key, Ordering::Release);
                return true;
            }
        }
        false
    }

    fn block(tgid: u32, addr: u64) -> AllocKey {
        AllocKey {
            tgid,
            _pad: 0,
            addr,
        }
    }

    fn info(size: u64) -> AllocInfo {
        AllocInfo {
            size,
            stack_id: size * 3,
            frame0: 0x40_1000 + size,
            generation: 7,
            source: 0,
        }
    }

    #[test]
    fn every_block_put_in_is_read_back_with_its_process_and_value() {
        let table = table(64);
        let mut want = Vec::new();
        for (i, tgid) in [(0u64, 2u32), (1, 3), (2, 4_194_303)]
            .into_iter()
            .flat_map(|(i, tgid)| (0..20).map(move |j| (i * 100 + j, tgid)))
        {
            let b = block(tgid, 0x5555_0000_0000 + i * 48);
            if insert(&table, b, info(i + 1)) {
                want.push((b, info(i + 1)));
            }
        }
        assert!(want.len() > 50, "{} of 60 went in", want.len());
        let mut got = Vec::new();
        table.for_each(|k, v| {
            got.push((k, v));
            ControlFlow::Continue(())
        });
        got.sort_by_key(|(k, _)| (k.tgid, k.addr));
        want.sort_by_key(|(k, _)| (k.tgid, k.addr));
        assert_eq!(got, want);
        assert_eq!(table.len(), want.len() as u64);
    }

    #[test]
    fn a_walk_told_to_break_reads_no_further_block() {
        let table = table(64);
        for i in 0..20u64 {
            assert!(insert(
                &table,
                block(2, 0x5555_0000_0000 + i * 48),
                info(i + 1)
            ));
        }
        let mut seen = 0;
        table.for_each(|_, _| {
            seen += 1;
            if seen == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!(seen, 3);
    }

    #[test]
    fn a_removed_block_is_gone_and_others_of_its_address_stay() {
        let table = table(2);
        let (a, b) = (block(100, 0x7000_0000), block(102, 0x7000_0000));
        assert!(insert(&table, a, info(1)));
        assert!(insert(&table, b, info(2)));
        assert_eq!(table.remove(&a), Removed::Table);
        assert_eq!(table.remove(&a), Removed::NotInTable);
        let mut got = Vec::new();
        table.for_each(|k, v| {
            got.push((k, v));
            ControlFlow::Continue(())
        });
        assert_eq!(got, vec![(b, info(2))]);
        assert_eq!(table.remove(&block(100, 0x7000_0008)), Removed::NotInTable);
    }

    #[test]
    fn busy_ways_are_passed_over_and_spill_counts_go_down() {
        let table = table(2);
        let b = block(100, 0x7000_0000);
        let (bucket, _) = table.place(&b).expect("packs");
        table
            .word(bucket, Some(3))
            .store(LIVE_BUSY, Ordering::Release);
        table.word(bucket, None).store(2, Ordering::Release);
        let mut n = 0;
        table.for_each(|_, _| {
            n += 1;
            ControlFlow::Continue(())
        });
        assert_eq!(n, 0);
        assert!(table.is_empty());
        table.spill_removed(&b);
        assert_eq!(table.word(bucket, None).load(Ordering::Acquire), 1);
    }
}
