//! The fast live-block table (`LIVE_KEYS` + `LIVE_VALUES`): its bucket
//! ([`LiveBucket`], one cache line of [`LIVE_WAYS`] key slots and a spill
//! count) and the exact packing of (tgid, address) into one 64-bit key
//! ([`live_key`], [`live_unpack`]) that both sides compute alike.
//!
//! Protocol of a key slot: [`LIVE_EMPTY`] → [`LIVE_BUSY`] (claimed by one
//! compare-and-swap) → the block's key (after its value is written) →
//! [`LIVE_EMPTY`] again when the block is freed (one compare-and-swap: only
//! the thread whose swap succeeds accounts for the block).

use core::mem::size_of;

#[cfg(doc)]
use crate::{GLOBAL_LIVE_BUCKET_MASK, MAP_LIVE_ALLOCS, MAP_LIVE_KEYS};

/// Ways (key slots) per [`LiveBucket`].
pub const LIVE_WAYS: u32 = 7;
/// Buckets of [`MAP_LIVE_KEYS`] as compiled (a power of two, at least 2);
/// tracerd sets the real number at load time, with
/// [`GLOBAL_LIVE_BUCKET_MASK`].
pub const LIVE_BUCKET_COUNT: u32 = 1 << 16;
/// A key slot that holds no block.
pub const LIVE_EMPTY: u64 = 0;
/// A key slot claimed by a program that is writing its value: no block
/// matches it, and readers pass it over. [`live_key`] never returns it.
pub const LIVE_BUSY: u64 = u64::MAX;
/// End of the user address space on x86-64 with 4-level page tables
/// (`TASK_SIZE`): every packed address is below it.
pub const LIVE_ADDR_END: u64 = 0x7fff_ffff_f000;
/// Largest tgid + 1 that packs: the kernel's `PID_MAX_LIMIT` on 64-bit.
pub const LIVE_TGID_END: u32 = 1 << 22;

/// A bucket of [`MAP_LIVE_KEYS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveBucket {
    /// Blocks of this bucket's keys that are in [`MAP_LIVE_ALLOCS`] (the
    /// bucket was full when they came): while 0, a key not found in the
    /// ways is not live at all, and no hash lookup is needed.
    pub spilled: u64,
    /// [`live_key`]s of the blocks, [`LIVE_EMPTY`] or [`LIVE_BUSY`].
    pub keys: [u64; LIVE_WAYS as usize],
}
const _: () = assert!(size_of::<LiveBucket>() == 64);

// SAFETY: #[repr(C)], Copy, made only of integers with explicit padding, so
// every bit pattern is valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for LiveBucket {}

/// The fast table's key of block `addr` of process `tgid`, with its bucket
/// among `mask + 1` buckets; None when the block cannot be packed (then it
/// lives in [`MAP_LIVE_ALLOCS`]) or the table is off (`mask` 0).
///
/// Packing is exact, so that one 64-bit compare-and-swap claims a block:
/// glibc's blocks are 16-byte aligned and below [`LIVE_ADDR_END`] (43 bits
/// of `addr >> 4`), tgids are below [`LIVE_TGID_END`] (22 bits); the key
/// keeps 21 bits of the tgid, and the 22nd flips the lowest bit of the
/// bucket the key hashes to, so [`live_unpack`] gives both back (and one
/// process's blocks spread over every bucket). A key is never [`LIVE_EMPTY`] (the
/// address is at least 16) nor [`LIVE_BUSY`].
#[inline(always)]
pub fn live_key(tgid: u32, addr: u64, mask: u32) -> Option<(u32, u64)> {
    if mask == 0 || addr & 15 != 0 || !(16..LIVE_ADDR_END).contains(&addr) || tgid >= LIVE_TGID_END
    {
        return None;
    }
    let key = (u64::from(tgid >> 1) << 43) | (addr >> 4);
    Some(((live_hash(key) & mask) ^ (tgid & 1), key))
}

/// Fibonacci hashing: the high half of the product mixes every key bit.
#[inline(always)]
fn live_hash(key: u64) -> u32 {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// The (tgid, address) of `key` found in `bucket` of `mask + 1` buckets:
/// the inverse of [`live_key`].
#[inline(always)]
pub fn live_unpack(bucket: u32, key: u64, mask: u32) -> (u32, u64) {
    let low = (bucket ^ live_hash(key) & mask) & 1;
    let tgid = (((key >> 43) as u32) << 1) | low;
    (tgid, (key & ((1 << 43) - 1)) << 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_keys_unpack_to_their_block_at_every_edge() {
        let mask = (1 << 16) - 1;
        for tgid in [0, 1, 2, 12_345, LIVE_TGID_END - 2, LIVE_TGID_END - 1] {
            for addr in [16, 0x5555_5555_a2b0, LIVE_ADDR_END - 16] {
                let (bucket, key) = live_key(tgid, addr, mask).expect("packs");
                assert!(bucket <= mask);
                assert_ne!(key, LIVE_EMPTY);
                assert_ne!(key, LIVE_BUSY);
                assert_eq!(
                    live_unpack(bucket, key, mask),
                    (tgid, addr),
                    "{tgid} {addr:#x}"
                );
            }
        }
    }

    #[test]
    fn blocks_that_cannot_be_packed_are_refused() {
        let mask = 1023;
        assert_eq!(live_key(7, 0x1008, mask), None, "not 16-byte aligned");
        assert_eq!(live_key(7, 0, mask), None, "null");
        assert_eq!(live_key(7, LIVE_ADDR_END, mask), None, "kernel half");
        assert_eq!(
            live_key(LIVE_TGID_END, 0x1000, mask),
            None,
            "tgid too large"
        );
        assert_eq!(live_key(7, 0x1000, 0), None, "table off");
    }

    #[test]
    fn two_processes_with_one_address_have_distinct_keys_or_buckets() {
        let mask = 255;
        let a = live_key(1000, 0x4000_0000, mask).expect("packs");
        let b = live_key(1001, 0x4000_0000, mask).expect("packs");
        assert_eq!(a.1, b.1);
        assert_eq!(a.0 ^ b.0, 1);
        assert_ne!(live_key(1002, 0x4000_0000, mask), Some(a));
    }

    #[test]
    fn one_process_uses_every_bucket() {
        let mask = 7;
        let mut seen = [false; 8];
        for i in 0..64u64 {
            let (bucket, _) = live_key(1001, 0x1000 + i * 16, mask).expect("packs");
            seen[bucket as usize] = true;
        }
        assert_eq!(seen, [true; 8]);
    }
}
