//! Vectors that grow without moving what they hold, for the decoders'
//! tables whose length a file decides.
//!
//! A `Vec` that doubles copies its items into a buffer twice as large, and
//! the allocator may keep the old buffer resident for a while (mimalloc,
//! tracerd's allocator, does, and its `realloc` always copies): a vector
//! grown to `n` items can hold up to four times `n` items' memory at its
//! peak: a pickle of `DUP`s then went past the load bound
//! ([`super::budget`]; measured in `docs/design/0011-measured-figures.md`).
//! [`Chunked`] and [`Slab`] allocate in chunks of [`CHUNK`] items that never
//! move, so what they hold costs its length plus at most one chunk's
//! growth, whatever the allocator: charging by length is then exact.

/// Items per chunk: 65,536 (1 MiB of 16-byte values).
pub(crate) const CHUNK: usize = 1 << 16;

/// A vector in chunks of [`CHUNK`] items. Chunk `k` holds items
/// `k * CHUNK ..`; only the first chunk grows by doubling (up to `CHUNK`,
/// a power of two, so never past it), every later one is allocated whole.
/// [`Chunked::truncate`] keeps the chunks it empties for the next pushes
/// (the decoders charge a stack by the highest depth it reached).
#[derive(Debug)]
pub(crate) struct Chunked<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunked<T> {
    /// Items held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no item.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `value`.
    pub(crate) fn push(&mut self, value: T) {
        let k = self.len / CHUNK;
        if k == self.chunks.len() {
            // The first chunk starts small (most tables are); later ones
            // are allocated whole, never moved.
            let capacity = if k == 0 { 0 } else { CHUNK };
            self.chunks.push(Vec::with_capacity(capacity));
        }
        if let Some(chunk) = self.chunks.get_mut(k) {
            chunk.push(value);
            self.len += 1;
        }
    }

    /// Removes and returns the last item.
    pub(crate) fn pop(&mut self) -> Option<T> {
        let last = self.len.checked_sub(1)?;
        let value = self.chunks.get_mut(last / CHUNK)?.pop()?;
        self.len = last;
        Some(value)
    }

    /// The item at `index`.
    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        if index >= self.len {
            return None;
        }
        self.chunks.get(index / CHUNK)?.get(index % CHUNK)
    }

    /// The item at `index`, to change.
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        if index >= self.len {
            return None;
        }
        self.chunks.get_mut(index / CHUNK)?.get_mut(index % CHUNK)
    }

    /// The last item.
    pub(crate) fn last(&self) -> Option<&T> {
        self.get(self.len.checked_sub(1)?)
    }

    /// The last item, to change.
    pub(crate) fn last_mut(&mut self) -> Option<&mut T> {
        self.get_mut(self.len.checked_sub(1)?)
    }

    /// Keeps the first `len` items (dropping the others); the chunks
    /// emptied stay allocated for later pushes.
    pub(crate) fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for (k, chunk) in self.chunks.iter_mut().enumerate() {
            chunk.truncate(len.saturating_sub(k * CHUNK));
        }
        self.len = len;
    }

    /// The items in order (and, reversed, from the last).
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// The items from `from` on, in order.
    pub(crate) fn iter_from(&self, from: usize) -> impl Iterator<Item = &T> {
        self.chunks
            .get(from / CHUNK..)
            .unwrap_or(&[])
            .iter()
            .flatten()
            .skip(from % CHUNK)
    }
}

/// Slices of items of any length, each kept whole in one chunk (a tuple's
/// items): a slice goes in the current chunk if it fits, else in a new chunk
/// of `max(CHUNK, its length)` items. A chunk's unused end is never
/// written, so it takes address space, not memory.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    chunks: Vec<Vec<T>>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { chunks: Vec::new() }
    }
}

/// Where a slice of a [`Slab`] is: its chunk, its start in it, its length.
pub(crate) type SlabRef = (u32, u32, u32);

impl<T: Copy> Slab<T> {
    /// Stores `items` (`len` of them) as one slice; `None` when a chunk or
    /// an offset would not fit in 32 bits.
    pub(crate) fn push_slice(
        &mut self,
        len: usize,
        items: impl IntoIterator<Item = T>,
    ) -> Option<SlabRef> {
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| c.capacity() - c.len() >= len);
        if !fits {
            self.chunks.push(Vec::with_capacity(len.max(CHUNK)));
        }
        let k = self.chunks.len() - 1;
        let chunk = self.chunks.last_mut()?;
        let start = chunk.len();
        chunk.extend(items.into_iter().take(len));
        let added = chunk.len() - start;
        Some((
            u32::try_from(k).ok()?,
            u32::try_from(start).ok()?,
            u32::try_from(added).ok()?,
        ))
    }

    /// The slice `at` refers to (empty if none).
    pub(crate) fn slice(&self, (k, start, len): SlabRef) -> &[T] {
        let (start, len) = (start as usize, len as usize);
        self.chunks
            .get(k as usize)
            .and_then(|c| c.get(start..start + len))
            .unwrap_or(&[])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    #[test]
    fn a_chunked_vector_keeps_its_items_in_place_across_chunks() {
        let mut v: Chunked<u64> = Chunked::default();
        let n = 3 * CHUNK as u64 + 5;
        for i in 0..n {
            v.push(i);
        }
        assert_eq!(v.len(), n as usize);
        // Later chunks are allocated whole and never grow: the address of
        // an item does not change as more are pushed.
        let at = v.get(CHUNK).unwrap() as *const u64;
        for i in 0..CHUNK as u64 {
            v.push(n + i);
        }
        assert_eq!(v.get(CHUNK).unwrap() as *const u64, at);
        assert_eq!(*v.get(2 * CHUNK + 7).unwrap(), 2 * CHUNK as u64 + 7);
        assert_eq!(v.get(v.len()), None);
        assert_eq!(
            v.iter_from(CHUNK - 2).take(4).copied().collect::<Vec<_>>(),
            [
                CHUNK as u64 - 2,
                CHUNK as u64 - 1,
                CHUNK as u64,
                CHUNK as u64 + 1
            ]
        );
        assert_eq!(v.iter().next_back(), v.last());
        v.truncate(CHUNK + 1);
        assert_eq!(v.len(), CHUNK + 1);
        assert_eq!(v.iter().count(), CHUNK + 1);
        assert_eq!(v.last(), Some(&(CHUNK as u64)));
        assert_eq!(v.pop(), Some(CHUNK as u64));
        assert_eq!(v.pop(), Some(CHUNK as u64 - 1));
        v.push(7);
        *v.last_mut().unwrap() += 1;
        assert_eq!(v.iter_from(CHUNK - 1).copied().collect::<Vec<_>>(), [8]);
        assert_eq!(
            v.iter().copied().sum::<u64>(),
            (0..CHUNK as u64 - 1).sum::<u64>() + 8
        );
    }

    #[test]
    fn a_slab_keeps_each_slice_whole() {
        let mut slab: Slab<u32> = Slab::default();
        let a = slab.push_slice(3, [1, 2, 3]).unwrap();
        let big = slab.push_slice(CHUNK + 1, 0..CHUNK as u32 + 1).unwrap();
        let b = slab.push_slice(2, [4, 5]).unwrap();
        let empty = slab.push_slice(0, []).unwrap();
        assert_eq!(slab.slice(a), [1, 2, 3]);
        assert_eq!(big.0, 1);
        assert_eq!(slab.slice(big).len(), CHUNK + 1);
        assert_eq!(slab.slice(big).last(), Some(&(CHUNK as u32)));
        // The big slice filled its own chunk: the next one starts a third.
        assert_eq!(b, (2, 0, 2));
        assert_eq!(slab.slice(b), [4, 5]);
        assert_eq!(slab.slice(empty), [] as [u32; 0]);
        assert_eq!(slab.slice((9, 0, 1)), [] as [u32; 0]);
    }
}
