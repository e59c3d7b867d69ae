//! A global allocator that counts, per thread, the bytes the thread holds
//! net (allocated minus freed by it), over any other allocator: what a
//! request's memory budget is measured with (tracerd's `main` wraps
//! mimalloc in it).
//!
//! The count is a plain thread-local `Cell<i64>` with a const initialiser
//! and no destructor: reading or writing it allocates nothing and needs no
//! registration, so it is safe inside the allocator itself. A block freed
//! by another thread than the one that allocated it lowers the freeing
//! thread's count (which may go below 0); code that hands what it
//! allocated to another thread says so with [`handed_off`].
use std::{
    alloc::{GlobalAlloc, Layout},
    cell::Cell,
};

thread_local! {
    /// Bytes this thread allocated minus the bytes it freed (and handed
    /// off), since it started.
    static NET: Cell<i64> = const { Cell::new(0) };
}

/// Adds `bytes` (negative: subtracts) to this thread's count. Never
/// panics, allocates nothing.
fn add(bytes: i64) {
    // try_with: no count during the thread's own teardown, when the
    // thread-local may be gone (a Cell has no destructor, but the access
    // stays fallible).
    let _ = NET.try_with(|net| net.set(net.get().wrapping_add(bytes)));
}

/// Bytes of `layout`, as the count keeps them.
fn size(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// The allocator `A` with each thread's net bytes counted (see the
/// module's doc). Its `alloc`, `dealloc`, `alloc_zeroed` and `realloc` are
/// `A`'s, plus one thread-local add.
#[derive(Debug, Default)]
pub struct Counting<A>(pub A);

// SAFETY: every method forwards to `A` with the same arguments and returns
// what it returned; the count is a side effect that never allocates.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let block = unsafe { self.0.alloc(layout) };
        if !block.is_null() {
            add(size(layout.size()));
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let block = unsafe { self.0.alloc_zeroed(layout) };
        if !block.is_null() {
            add(size(layout.size()));
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.0.dealloc(block, layout) };
        add(-size(layout.size()));
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let moved = unsafe { self.0.realloc(block, layout, new_size) };
        if !moved.is_null() {
            add(size(new_size).wrapping_sub(size(layout.size())));
        }
        moved
    }
}

/// Bytes the current thread holds net: allocated minus freed by it, minus
/// what it [`handed_off`], since it started; under another global
/// allocator than [`Counting`], always 0. Compare two readings to know
/// what a piece of work on this thread holds.
#[must_use]
pub fn thread_net_bytes() -> i64 {
    NET.try_with(Cell::get).unwrap_or(0)
}

/// Says that `bytes` this thread allocated now belong to another thread
/// (a chunk of an answer sent to the connection's task, which frees it):
/// they leave this thread's count.
pub fn handed_off(bytes: usize) {
    add(-size(bytes));
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    };

    /// A block handed to the other thread, and its word that it dropped
    /// it: neither allocates (a channel's wake-ups would).
    static SLOT: Mutex<Option<Vec<u8>>> = Mutex::new(None);
    static DROPPED: AtomicBool = AtomicBool::new(false);

    #[test]
    fn a_thread_counts_what_it_holds_net_and_what_it_hands_off_leaves_its_count() {
        // The lib's test binary runs on Counting<System> (lib.rs). The
        // thread that frees is made before the count starts.
        let other = std::thread::spawn(|| {
            loop {
                let taken = SLOT.lock().ok().and_then(|mut slot| slot.take());
                if let Some(block) = taken {
                    drop(block);
                    DROPPED.store(true, Ordering::Release);
                    return;
                }
                std::thread::yield_now();
            }
        });
        let start = thread_net_bytes();
        let block = vec![0u8; 1 << 20];
        assert_eq!(thread_net_bytes() - start, 1 << 20);
        let mut grown = Vec::<u8>::with_capacity(1000);
        grown.reserve_exact(3000);
        assert_eq!(grown.capacity(), 3000);
        assert_eq!(thread_net_bytes() - start, (1 << 20) + 3000);
        drop(grown);
        // Freed on another thread: this one still counts it until handed
        // off.
        *SLOT.lock().expect("slot") = Some(block);
        while !DROPPED.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        assert_eq!(thread_net_bytes() - start, 1 << 20);
        handed_off(1 << 20);
        assert_eq!(thread_net_bytes() - start, 0);
        other.join().expect("the other thread ends");
    }
}
