//! The sort of tracemalloc's groups: their keys (size, count, ids, signs)
//! packed into one `u64` or `u128` when they fit, sorted as integers,
//! biggest first, and unpacked when read.

/// Bits needed to hold `x`.
fn width(x: u64) -> u32 {
    u64::BITS - x.leading_zeros()
}

/// Group keys of `N` fields, sorted biggest first (most significant field
/// first). When the fields' values fit in 64 (or 128) bits together,
/// which they do in practice, each key is packed into one `u64` (`u128`),
/// sorted as such and unpacked when read: integers sort several times
/// faster than arrays.
pub(super) struct SortedKeys<const N: usize> {
    /// Bits of each field in a packed key.
    widths: [u32; N],
    keys: Keys<N>,
}

/// The sorted keys, packed or not.
enum Keys<const N: usize> {
    Narrow(Vec<u64>),
    Wide(Vec<u128>),
    Plain(Vec<[u64; N]>),
}

impl<const N: usize> SortedKeys<N> {
    /// The keys `key(i)` of `0..n` (None: no key), biggest first.
    pub(super) fn sort(n: usize, key: impl Fn(usize) -> Option<[u64; N]>) -> Self {
        let mut widths = [0u32; N];
        for fields in (0..n).filter_map(&key) {
            for (w, value) in widths.iter_mut().zip(fields) {
                *w = (*w).max(width(value));
            }
        }
        let pack = |fields: [u64; N]| -> u128 {
            let mut packed = 0u128;
            for (&w, value) in widths.iter().zip(fields) {
                packed = (packed << w) | u128::from(value);
            }
            packed
        };
        let total: u32 = widths.iter().sum();
        let keys = if total <= 64 {
            let mut keys: Vec<u64> = (0..n).filter_map(&key).map(|k| pack(k) as u64).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            Keys::Narrow(keys)
        } else if total <= 128 {
            let mut keys: Vec<u128> = (0..n).filter_map(&key).map(pack).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            Keys::Wide(keys)
        } else {
            let mut keys: Vec<[u64; N]> = (0..n).filter_map(&key).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            Keys::Plain(keys)
        };
        SortedKeys { widths, keys }
    }

    /// How many keys.
    pub(super) fn len(&self) -> usize {
        match &self.keys {
            Keys::Narrow(keys) => keys.len(),
            Keys::Wide(keys) => keys.len(),
            Keys::Plain(keys) => keys.len(),
        }
    }

    /// The `i`th biggest key.
    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<[u64; N]> {
        let mut packed = match &self.keys {
            Keys::Narrow(keys) => u128::from(*keys.get(i)?),
            Keys::Wide(keys) => *keys.get(i)?,
            Keys::Plain(keys) => return keys.get(i).copied(),
        };
        let mut fields = [0u64; N];
        for (&w, value) in self.widths.iter().zip(fields.iter_mut()).rev() {
            // Widths are at most 64: the mask fits.
            *value = (packed & ((1u128 << w) - 1)) as u64;
            packed >>= w;
        }
        Some(fields)
    }
}

/// The `i64` of magnitude `magnitude` (from `i64::unsigned_abs`: at most
/// 2^63) and sign `negative`.
pub(super) fn signed(magnitude: u64, negative: bool) -> i64 {
    match (i64::try_from(magnitude), negative) {
        (Ok(value), false) => value,
        (Ok(value), true) => -value,
        (Err(_), false) => i64::MAX,
        (Err(_), true) => i64::MIN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::totals::difference;

    #[test]
    fn packed_sorts_equal_the_plain_sort_whatever_the_widths() {
        let mut random = crate::testing::lcg(7);
        let mut next = move |bits: u32| (random() >> 11) >> (53 - bits.min(53));
        // Small values (one u64), wider ones (one u128), and full-width
        // ones (not packed); some keys absent.
        for bits in [4, 20, 40, 64] {
            let keys: Vec<Option<[u64; 3]>> = (0..2000u64)
                .map(|id| {
                    let big = |v: u64| if bits == 64 { v << 11 | 1 << 63 } else { v };
                    let count = if bits == 64 {
                        big(next(53))
                    } else {
                        next(bits.min(12))
                    };
                    (id % 7 != 3).then(|| [big(next(bits)), count, id])
                })
                .collect();
            let sorted = SortedKeys::sort(keys.len(), |i| keys[i]);
            let mut expected: Vec<[u64; 3]> = keys.iter().flatten().copied().collect();
            expected.sort_by(|a, b| b.cmp(a));
            let got: Vec<[u64; 3]> = (0..sorted.len()).filter_map(|i| sorted.get(i)).collect();
            assert_eq!(got, expected, "{bits} bits");
            assert!(sorted.get(sorted.len()).is_none());
        }
        assert_eq!(signed(5, true), -5);
        assert_eq!(signed(5, false), 5);
        assert_eq!(signed(1 << 63, true), i64::MIN);
        assert_eq!(difference(0, u64::MAX).unsigned_abs(), 1 << 63);
    }
}
