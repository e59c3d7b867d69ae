//! A batch walk of a hash map in two halves: this thread walks from the
//! first bucket while a helper thread at the lowest priority walks from the
//! middle, and the two are joined without waiting for the helper.
use std::{
    io,
    ops::ControlFlow,
    os::fd::{BorrowedFd, OwnedFd},
    sync::{Arc, Mutex},
};

use super::{Batches, lookup_batch};

/// A batch read by the upper half's thread: the bucket it started at, and
/// its entries.
type Part<K, V> = (u64, Vec<(K, V)>);

/// The lower walk's call that crossed the middle (or reached the end): its
/// entries, and the bucket after it (`u64::MAX` at the end).
type Crossing<K, V> = (Vec<(K, V)>, u64);

/// Which entries of a map a walk keeps: shared with a helper thread that
/// may outlive the call.
pub type Wanted<K, V> = std::sync::Arc<dyn Fn(&K, &V) -> bool + Send + Sync>;

/// What the upper half's thread has read, shared with the lower walk.
struct Upper<K, V> {
    /// Raised by the lower walk when it takes over: the upper thread
    /// publishes nothing more and ends.
    quit: bool,
    /// Its batches, in bucket order from the middle.
    parts: Vec<Part<K, V>>,
    /// The bucket its next batch starts at; None: it reached the end.
    next: Option<u64>,
}

/// Locks the upper half's shared state (a poisoned lock is taken as is:
/// every change to it is whole).
fn upper_of<K, V>(upper: &std::sync::Mutex<Upper<K, V>>) -> std::sync::MutexGuard<'_, Upper<K, V>> {
    upper
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`lookup_batch`] of a hash map of `buckets` buckets (the kernel's
/// `n_buckets`: its `max_entries` rounded up to a power of two), with a
/// helper: this thread walks the buckets from the first; a thread of its
/// own at the lowest priority (`SCHED_IDLE`: it runs only where a CPU has
/// nothing else to run) walks those from `buckets / 2` on. When this walk
/// reaches the middle it takes what the helper has read and goes on from
/// where the helper got to, without waiting for it: on a busy host the
/// walk costs what one walk costs, never more, and on an idle one about
/// half (reading a million entries costs the kernel about 0.25 s, mostly
/// walking its buckets). `f` gets the entries in the order one walk gives
/// them. A walk's last call reads past where it stopped: entries both
/// read (a key is in one bucket) are given once. The helper keeps only the
/// entries `wanted` accepts (`f` must pass over the others itself: an
/// entry this walk read past the middle may reach it), so that a pass
/// after one process's blocks does not copy every other process's.
///
/// # Errors
/// As [`lookup_batch`].
pub fn lookup_batch_halves<K, V>(
    fd: BorrowedFd<'_>,
    buckets: u32,
    wanted: Wanted<K, V>,
    f: &mut impl FnMut(&K, &V) -> ControlFlow<()>,
) -> io::Result<()>
where
    K: Copy + Default + Send + Sync + Eq + std::hash::Hash + 'static,
    V: Copy + Default + Send + Sync + 'static,
{
    let mid = u64::from(buckets / 2);
    let Some(helper_fd) = (mid > 0).then(|| fd.try_clone_to_owned().ok()).flatten() else {
        return lookup_batch(fd, f);
    };
    let Some(upper) = spawn_upper(helper_fd, mid, wanted) else {
        return lookup_batch(fd, f);
    };
    let Some((last, end)) = walk_lower(fd, mid, &upper, f)? else {
        return Ok(());
    };
    // Take what the helper read, and stop it.
    let (parts, next) = {
        let mut upper = upper_of(&upper);
        upper.quit = true;
        (std::mem::take(&mut upper.parts), upper.next)
    };
    let Some(from) = give_middle(&last, end, &parts, next, f) else {
        return Ok(());
    };
    let mut rest = Batches::<K, V>::new(fd, Some(from));
    while !rest.done {
        let Ok(n) = rest.next() else {
            break;
        };
        for (key, value) in rest.read(n) {
            if f(key, value).is_break() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Starts the upper half's thread on `helper_fd` from bucket `mid`,
/// keeping the entries `wanted` accepts: the state it shares, or None
/// when no thread could be started.
fn spawn_upper<K, V>(
    helper_fd: OwnedFd,
    mid: u64,
    wanted: Wanted<K, V>,
) -> Option<Arc<Mutex<Upper<K, V>>>>
where
    K: Copy + Default + Send + Sync + 'static,
    V: Copy + Default + Send + Sync + 'static,
{
    let upper = Arc::new(Mutex::new(Upper::<K, V> {
        quit: false,
        parts: Vec::new(),
        next: Some(mid),
    }));
    let shared = Arc::clone(&upper);
    let spawned = std::thread::Builder::new()
        .name("tracerd-batch".into())
        .spawn(move || {
            crate::sys::idle_this_thread();
            let mut batches = Batches::<K, V>::new(std::os::fd::AsFd::as_fd(&helper_fd), Some(mid));
            while !batches.done {
                let start = batches.start.unwrap_or(mid);
                let Ok(n) = batches.next() else {
                    return;
                };
                let kept = batches.read(n).filter(|(k, v)| wanted(k, v));
                let part = (start, kept.map(|(k, v)| (*k, *v)).collect());
                let mut upper = upper_of(&shared);
                if upper.quit {
                    return;
                }
                upper.parts.push(part);
                upper.next = (!batches.done).then_some(batches.start.unwrap_or(mid));
            }
        });
    spawned.is_ok().then_some(upper)
}

/// The lower walk, from the first bucket to the middle `mid`: gives `f`
/// the entries of each call that ends before it, and returns the call that
/// crossed the middle (or reached the end) with the bucket after it
/// (`u64::MAX` at the end). None when `f` broke; the helper is stopped
/// then, and on an error.
///
/// # Errors
/// The kernel's refusal of the first call.
fn walk_lower<K, V>(
    fd: BorrowedFd<'_>,
    mid: u64,
    upper: &Mutex<Upper<K, V>>,
    f: &mut impl FnMut(&K, &V) -> ControlFlow<()>,
) -> io::Result<Option<Crossing<K, V>>>
where
    K: Copy + Default,
    V: Copy + Default,
{
    let stop = || upper_of(upper).quit = true;
    let mut lower = Batches::<K, V>::new(fd, None);
    loop {
        let n = match lower.next() {
            Ok(n) => n,
            Err(err) => {
                stop();
                return Err(err);
            }
        };
        let end = lower.start.unwrap_or(u64::MAX);
        if lower.done || end > mid {
            let end = if lower.done { u64::MAX } else { end };
            return Ok(Some((
                lower.read(n).map(|(k, v)| (*k, *v)).collect::<Vec<_>>(),
                end,
            )));
        }
        for (key, value) in lower.read(n) {
            if f(key, value).is_break() {
                stop();
                return Ok(None);
            }
        }
    }
}

/// Gives `f` the lower walk's `last` call (which ended at bucket `end`) and
/// the helper's `parts` (its next batch at `next`), each entry once: where
/// the walk goes on from, past its last call or past the helper's last
/// batch, whichever is further. None when `f` broke or nothing is left.
fn give_middle<K, V>(
    last: &[(K, V)],
    end: u64,
    parts: &[Part<K, V>],
    next: Option<u64>,
    f: &mut impl FnMut(&K, &V) -> ControlFlow<()>,
) -> Option<u64>
where
    K: Copy + Eq + std::hash::Hash,
{
    let mut give = |entries: &mut dyn Iterator<Item = &(K, V)>| -> ControlFlow<()> {
        for (key, value) in entries {
            f(key, value)?;
        }
        ControlFlow::Continue(())
    };
    let from = match next {
        Some(next) if next <= end => {
            // The helper's batches are all inside what this walk read.
            if give(&mut last.iter()).is_break() {
                return None;
            }
            Some(end)
        }
        next => {
            // Keys both read: the helper's batches that began before this
            // walk's last call ended.
            let both: std::collections::HashSet<K> = parts
                .iter()
                .take_while(|(start, _)| *start < end)
                .flat_map(|(_, entries)| entries.iter().map(|(k, _)| *k))
                .collect();
            let mut rest = last.iter().filter(|(k, _)| !both.contains(k));
            let mut helper = parts.iter().flat_map(|(_, entries)| entries.iter());
            if give(&mut rest).is_break() || give(&mut helper).is_break() {
                return None;
            }
            next
        }
    };
    from.filter(|from| *from != u64::MAX)
}
