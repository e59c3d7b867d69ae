//! A small open-addressing hash table for the indexing's hot loops, keyed
//! by addresses (of a traceback, or of a file name plus a line) or hashes,
//! whose lookups can be prefetched.
//!
//! Indexing 1,000,000 traces does one lookup per trace (by the address of
//! its traceback) into a table of hundreds of thousands of entries, and
//! without a loader's frame numbers one per frame of every distinct
//! traceback: every lookup is a cache miss.
//! With std's `HashMap` each miss is waited for in turn; here the loop
//! computes the bucket of the item `AHEAD` positions later and prefetches
//! it, so many misses are in flight at once. Linear probing keeps a probe
//! sequence within one or two cache lines; the load factor stays at or
//! below one half.

/// How many items ahead the hot loops prefetch.
pub(super) const AHEAD: usize = 16;

/// A key: `Copy`, with a reserved empty value (never a real key).
pub(super) trait TableKey: Copy + Eq {
    /// The value marking an empty bucket.
    const EMPTY: Self;
    /// A well-mixed 64-bit hash.
    fn hash(&self) -> u64;
}

/// Folded multiply of `x` by an odd constant: mixes the low bits (zero in
/// aligned addresses) into the high bits the bucket index is taken from.
#[inline]
fn mix(x: u64) -> u64 {
    let wide = u128::from(x) * 0x9E37_79B9_7F4A_7C15;
    (wide as u64) ^ ((wide >> 64) as u64)
}

/// An address (never 0 for a live object).
impl TableKey for usize {
    const EMPTY: Self = 0;

    #[inline]
    fn hash(&self) -> u64 {
        mix(*self as u64)
    }
}

/// An address and a line number.
impl TableKey for (usize, u32) {
    const EMPTY: Self = (0, 0);

    #[inline]
    fn hash(&self) -> u64 {
        mix((self.0 as u64) ^ (u64::from(self.1) << 47).rotate_left(9))
    }
}

#[derive(Clone, Copy)]
struct Bucket<K, V> {
    key: K,
    value: V,
}

/// The table: keys to small `Copy` values kept in the bucket (so that a
/// lookup and an update touch one cache line).
pub(super) struct Table<K: TableKey, V: Copy + Default> {
    buckets: Vec<Bucket<K, V>>,
    mask: usize,
    len: usize,
}

impl<K: TableKey, V: Copy + Default> Table<K, V> {
    /// A table sized for about `expected` keys (it grows as needed).
    pub(super) fn with_capacity(expected: usize) -> Self {
        let buckets = (expected.max(8) * 2).next_power_of_two();
        Table {
            buckets: vec![
                Bucket {
                    key: K::EMPTY,
                    value: V::default()
                };
                buckets
            ],
            mask: buckets - 1,
            len: 0,
        }
    }

    #[inline]
    fn start(&self, key: &K) -> usize {
        // High bits: the best mixed.
        (key.hash() >> 32) as usize & self.mask
    }

    /// Hints the CPU to fetch the bucket `key` starts at.
    #[inline]
    pub(super) fn prefetch(&self, key: &K) {
        if let Some(bucket) = self.buckets.get(self.start(key)) {
            prefetch(std::ptr::from_ref(bucket).cast());
        }
    }

    /// The bucket holding `key`, or the empty one where it would go.
    #[inline]
    fn find(&self, key: &K) -> Option<usize> {
        let mut i = self.start(key);
        // The load factor is at most one half: an empty bucket is found
        // within `buckets.len()` probes.
        for _ in 0..self.buckets.len() {
            let bucket = self.buckets.get(i)?;
            if bucket.key == *key || bucket.key == K::EMPTY {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// The value of `key`, inserting `make()` if it is absent; the flag
    /// says whether it was inserted.
    #[inline]
    pub(super) fn get_or_insert(&mut self, key: K, make: impl FnOnce() -> V) -> (&mut V, bool) {
        if (self.len + 1) * 2 > self.buckets.len() {
            self.grow();
        }
        let Some(i) = self.find(&key) else {
            // Unreachable with the load factor kept at one half; growing
            // makes room.
            self.grow();
            return self.get_or_insert(key, make);
        };
        // In bounds: `find` masks its index, and `buckets.len() == mask + 1`.
        let bucket = &mut self.buckets[i & self.mask];
        let empty = bucket.key == K::EMPTY;
        if empty {
            *bucket = Bucket { key, value: make() };
            self.len += 1;
        }
        (&mut bucket.value, empty)
    }

    /// Every key and value, in bucket order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.buckets
            .iter()
            .filter(|b| b.key != K::EMPTY)
            .map(|b| (&b.key, &b.value))
    }

    /// The value of `key`, if present.
    #[cfg(test)]
    pub(super) fn get(&self, key: &K) -> Option<V> {
        let bucket = self.buckets.get(self.find(key)?)?;
        (bucket.key == *key).then_some(bucket.value)
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.buckets);
        let size = (old.len() * 2).max(16);
        self.buckets = vec![
            Bucket {
                key: K::EMPTY,
                value: V::default()
            };
            size
        ];
        self.mask = size - 1;
        self.len = 0;
        for bucket in old {
            if bucket.key != K::EMPTY {
                let value = bucket.value;
                self.get_or_insert(bucket.key, || value);
            }
        }
    }
}

/// Prefetches the cache line at `address` (a hint; never faults).
#[inline]
pub(super) fn prefetch(address: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache; it never faults, whatever
    // the address, and SSE is part of the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(address);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_finds_and_grows() {
        let mut table: Table<usize, u32> = Table::with_capacity(2);
        for key in 1..10_000usize {
            let (value, new) = table.get_or_insert(key * 16, || key as u32);
            assert_eq!((*value, new), (key as u32, true));
        }
        for key in 1..10_000usize {
            assert_eq!(table.get(&(key * 16)), Some(key as u32));
            let (value, new) = table.get_or_insert(key * 16, || 0);
            *value += 1;
            assert!(!new);
        }
        assert_eq!(table.get(&16), Some(2));
        assert_eq!(table.get(&8), None);
        assert_eq!(table.iter().count(), 9_999);
        let mut pairs: Table<(usize, u32), u32> = Table::with_capacity(4);
        assert_eq!(*pairs.get_or_insert((16, 1), || 7).0, 7);
        assert_eq!(*pairs.get_or_insert((16, 2), || 8).0, 8);
        assert_eq!(pairs.get(&(16, 1)), Some(7));
        assert_eq!(pairs.get(&(32, 1)), None);
        pairs.prefetch(&(16, 1));
    }
}
