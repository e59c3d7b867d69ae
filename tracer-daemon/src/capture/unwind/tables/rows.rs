//! The row allocator of `UNWIND_ROWS`: runs of a fixed array of rows,
//! first fit, freed runs merged.
use std::collections::BTreeMap;

/// Runs of a fixed array of rows: first fit, freed runs merged.
#[derive(Clone, Debug)]
pub struct RowAllocator {
    capacity: u32,
    /// Free runs: start → length, not touching each other.
    free: BTreeMap<u32, u32>,
}

impl RowAllocator {
    /// An allocator of `capacity` rows, all free.
    #[must_use]
    pub fn new(capacity: u32) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Self { capacity, free }
    }

    /// A run of `count` rows (at least 1), or None when no free run is as
    /// long.
    pub fn alloc(&mut self, count: u32) -> Option<u32> {
        if count == 0 {
            return None;
        }
        let (&start, &len) = self.free.iter().find(|(_, len)| **len >= count)?;
        self.free.remove(&start);
        if len > count {
            self.free.insert(start + count, len - count);
        }
        Some(start)
    }

    /// Gives back the run `start..start + count`, merged with its free
    /// neighbours.
    pub fn release(&mut self, start: u32, count: u32) {
        if count == 0 {
            return;
        }
        let (mut start, mut count) = (start, count);
        if let Some((&before, &len)) = self.free.range(..start).next_back()
            && before + len == start
        {
            self.free.remove(&before);
            start = before;
            count += len;
        }
        if let Some(&after_len) = self.free.get(&(start + count)) {
            self.free.remove(&(start + count));
            count += after_len;
        }
        self.free.insert(start, count);
    }

    /// Rows not allocated.
    #[must_use]
    pub fn free_rows(&self) -> u64 {
        self.free.values().map(|&n| u64::from(n)).sum()
    }

    /// Rows in all.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}
