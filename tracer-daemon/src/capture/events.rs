//! Process events: the `EVENTS` ring buffer's size, and a read-only mapping
//! of its positions so that its use is known while the event loop owns it.

/// The size the kernel gives a ring buffer asked for `bytes`: a power of two
/// multiple of `page_size` bytes, rounded up as aya (and libbpf) do.
pub fn ring_size(bytes: u32, page_size: u64) -> u32 {
    let page = u32::try_from(page_size).unwrap_or(4096).max(1);
    bytes
        .max(1)
        .div_ceil(page)
        .checked_next_power_of_two()
        .and_then(|pages| pages.checked_mul(page))
        .unwrap_or(1 << 31)
}

/// A read-only mapping of a BPF ring buffer's first two pages: the
/// consumer's position (what userspace has read) and the producer's (what
/// the programs have written), so its use can be read while the event loop
/// owns the ring buffer itself.
pub(super) struct RingPositions {
    /// The mapping: the consumer page, then the producer page.
    base: std::ptr::NonNull<libc::c_void>,
    /// Page size in bytes (the mapping is two pages).
    page: usize,
}

// SAFETY: the mapping is only read, through atomics, and is unmapped once,
// by its owner, on drop: moving it to another thread is sound.
unsafe impl Send for RingPositions {}

// SAFETY: the mapping is read-only and only read through atomic loads
// ([`RingPositions::pending`]): readers on several threads at once are
// sound (the kernel is the only writer).
unsafe impl Sync for RingPositions {}

impl RingPositions {
    /// Maps the positions of the ring buffer `fd`; None if the kernel
    /// refuses (then its use is not known).
    pub(super) fn map(fd: std::os::fd::BorrowedFd<'_>, page_size: u64) -> Option<Self> {
        use std::os::fd::AsRawFd as _;
        let page = usize::try_from(page_size).ok()?;
        // SAFETY: a new shared read-only mapping of a BPF ring buffer fd
        // (the kernel allows its first pages read-only); nothing else
        // aliases it as Rust memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        Some(Self {
            base: std::ptr::NonNull::new(base)?,
            page,
        })
    }

    /// Bytes written by the programs and not yet read by tracerd.
    pub(super) fn pending(&self) -> u64 {
        let at = |offset: usize| {
            // SAFETY: offset is 0 or one page: the start of a mapped page,
            // 8-byte aligned, where the kernel keeps an unsigned long
            // position that it writes with release semantics.
            unsafe {
                (*self
                    .base
                    .as_ptr()
                    .cast::<u8>()
                    .add(offset)
                    .cast::<std::sync::atomic::AtomicU64>())
                .load(std::sync::atomic::Ordering::Acquire)
            }
        };
        let consumer = at(0);
        let producer = at(self.page);
        producer.wrapping_sub(consumer)
    }
}

impl Drop for RingPositions {
    fn drop(&mut self) {
        // SAFETY: the mapping made in map, of this length, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr(), 2 * self.page) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes_round_up_to_a_power_of_two_of_pages_as_the_kernel_needs() {
        assert_eq!(ring_size(4096, 4096), 4096);
        assert_eq!(ring_size(1, 4096), 4096);
        assert_eq!(ring_size(5000, 4096), 8192);
        assert_eq!(ring_size(3 * 4096, 4096), 4 * 4096);
        assert_eq!(ring_size(1 << 18, 4096), 1 << 18);
        assert_eq!(ring_size(1 << 30, 4096), 1 << 30);
        assert_eq!(ring_size(4096, 65536), 65536);
    }
}
