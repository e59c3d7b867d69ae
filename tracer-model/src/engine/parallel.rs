//! Threads for the grouping: how many a piece of work gets, running parts
//! of it on scoped threads, a two-thread sort and a two-way join. Every
//! helper falls back to the calling thread when a spawned one fails, so a
//! result never depends on how many threads ran.

use std::sync::OnceLock;

/// What each helper thread runs first ([`on_helper_thread_start`]).
static HELPER_START: OnceLock<fn()> = OnceLock::new();

/// Sets what each helper thread of a grouping runs before its part: a
/// daemon lowers their priority, so that a big grouping leaves a CPU to
/// its cheap requests (the calling thread keeps its own). The first call
/// sets it; later calls change nothing.
pub fn on_helper_thread_start(start: fn()) {
    let _ = HELPER_START.set(start);
}

/// Runs the hook of [`on_helper_thread_start`], if any.
fn helper_started() {
    if let Some(start) = HELPER_START.get() {
        start();
    }
}

/// Inputs smaller than this are grouped on the calling thread only.
const PARALLEL_MIN: usize = 50_000;

/// Most threads one grouping uses.
const MAX_THREADS: usize = 8;

/// How many threads to spread `work` items over.
pub(super) fn threads_for(work: usize) -> usize {
    if work < PARALLEL_MIN {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
}

/// Runs `job(part)` for every part in `0..parts`, part 0 on the calling
/// thread and the others on scoped threads; results in part order. A part
/// whose thread failed is run again on the calling thread.
pub(super) fn in_parallel<T: Send>(parts: usize, job: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if parts <= 1 {
        return vec![job(0)];
    }
    std::thread::scope(|scope| {
        let job = &job;
        let handles: Vec<_> = (1..parts)
            .map(|part| {
                scope.spawn(move || {
                    helper_started();
                    job(part)
                })
            })
            .collect();
        let mut results = Vec::with_capacity(parts);
        results.push(job(0));
        for (offset, handle) in handles.into_iter().enumerate() {
            results.push(handle.join().unwrap_or_else(|_| job(offset + 1)));
        }
        results
    })
}

/// Sorts `items` by `cmp`, the two halves on two threads when there are
/// many, then merges them.
pub(super) fn sort_parallel<T: Send>(
    mut items: Vec<T>,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering + Sync,
) -> Vec<T> {
    if threads_for(items.len()) < 2 {
        items.sort_unstable_by(&cmp);
        return items;
    }
    let mid = items.len() / 2;
    let failed = std::thread::scope(|scope| {
        let cmp = &cmp;
        let (left, right) = items.split_at_mut(mid);
        let handle = scope.spawn(move || {
            helper_started();
            right.sort_unstable_by(cmp);
        });
        left.sort_unstable_by(cmp);
        handle.join().is_err()
    });
    if failed && let Some(right) = items.get_mut(mid..) {
        right.sort_unstable_by(&cmp);
    }
    let right = items.split_off(mid);
    let left = items;
    let mut merged = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some(a), Some(b)) => cmp(a, b) != std::cmp::Ordering::Greater,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_left { left.next() } else { right.next() };
        merged.extend(next);
    }
    merged
}

/// Runs `a` on this thread and `b` on another when `parallel`, else both
/// here; `b` runs here again if its thread failed.
pub(super) fn join<A, B: Send>(
    parallel: bool,
    a: impl FnOnce() -> A,
    b: impl Fn() -> B + Sync,
) -> (A, B) {
    if !parallel {
        return (a(), b());
    }
    std::thread::scope(|scope| {
        let b = &b;
        let handle = scope.spawn(move || {
            helper_started();
            b()
        });
        let a = a();
        (a, handle.join().unwrap_or_else(|_| b()))
    })
}
