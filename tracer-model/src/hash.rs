//! A small, fast, deterministic hasher for the hash tables of the model.
//!
//! Indexing a snapshot of 1,000,000 traces looks up every distinct frame by
//! its text, hashes every distinct traceback's frame ids, and the loaders and
//! the `function`/`module` groupings key tables by addresses and names.
//! std's SipHash would cost more than the rest of that work, so the model
//! uses the multiply-rotate scheme of rustc's `FxHasher` with a final folded
//! multiply, because hashbrown takes the bucket index from the low bits and
//! `Arc` addresses have their low 3–4 bits at zero.
//!
//! Not resistant to chosen collisions: keys are allocation addresses, and
//! file names from the traced programs' own debug info.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Odd 64-bit constant of rustc's `FxHasher` (from the golden ratio).
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// `FxHasher` plus a folded-multiply finish (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let (chunks, rest) = bytes.as_chunks::<8>();
        for chunk in chunks {
            self.add(u64::from_le_bytes(*chunk));
        }
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            for (dst, src) in last.iter_mut().zip(rest) {
                *dst = *src;
            }
            // The length keeps "ab" and "ab\0" apart.
            self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        let wide = u128::from(self.hash) * u128::from(SEED);
        ((wide >> 64) as u64) ^ (wide as u64)
    }
}

/// `HashMap` with [`FxHasher`].
pub(crate) type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hash;

    fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
        let mut hasher = FxHasher::default();
        value.hash(&mut hasher);
        hasher.finish()
    }

    #[test]
    fn hashes_are_deterministic_and_separate_close_keys() {
        assert_eq!(hash_of("a.c"), hash_of("a.c"));
        assert_ne!(hash_of("a.c"), hash_of("a.d"));
        assert_ne!(hash_of(&("ab", 0u32)), hash_of(&("ab\0", 0u32)));
        assert_ne!(hash_of(&0x1000usize), hash_of(&0x1010usize));
        // Addresses 16 bytes apart must still spread over the low bits,
        // which pick the bucket.
        let low_bits: std::collections::HashSet<u64> = (0..256usize)
            .map(|i| hash_of(&(0x7f00_0000_1000 + 16 * i)) & 0xff)
            .collect();
        assert!(
            low_bits.len() > 128,
            "{} distinct low bytes",
            low_bits.len()
        );
    }
}
