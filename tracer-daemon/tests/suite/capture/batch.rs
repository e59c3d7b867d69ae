//! A large `LIVE_ALLOCS` or own spill map is read by two walks
//! at once (`sys::bpf::lookup_batch_halves`), which must give exactly the
//! entries of one walk (`lookup_batch`) in its order, whatever bucket count
//! it is told and however far its helper got (done before the caller's
//! walk reached the middle, or starved: on the caller's one CPU, where a
//! `SCHED_IDLE` thread does not run while the caller does), on a real
//! kernel hash map.
use std::ops::ControlFlow;
use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::Arc;

use tracer_daemon::sys::bpf::{self as bpf_sys, lookup_batch, lookup_batch_halves};

type Key = [u64; 2];
type Value = [u64; 4];

/// A preallocated BPF hash of `max_entries` (a power of two: as many
/// buckets) holding `n` entries.
fn hash_with(max_entries: u32, n: u64) -> OwnedFd {
    let fd = bpf_sys::create_hash::<Key, Value>("batch_test", max_entries, 0)
        .unwrap_or_else(|e| panic!("BPF_MAP_CREATE: {e}"));
    for i in 0..n {
        let key: Key = [i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i];
        let value: Value = [i, i * 2, i * 3, i * 4];
        bpf_sys::update(fd.as_fd(), &key, &value, 0)
            .unwrap_or_else(|e| panic!("BPF_MAP_UPDATE_ELEM: {e}"));
    }
    fd
}

#[test]
fn two_walks_of_a_hash_give_the_entries_of_one_walk_in_its_order() {
    let (max_entries, n) = (1u32 << 17, 100_000u64);
    let fd = hash_with(max_entries, n);
    for _ in 0..5 {
        check_two_walks(&fd, max_entries, n);
    }
    // On one CPU the helper (SCHED_IDLE, on the CPUs of the thread that
    // made it) runs only when the caller waits: the caller reads it all.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // SAFETY: a zeroed cpu_set_t with CPU 0 set, for this thread
            // (pid 0) only.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set),
                    0
                );
            }
            check_two_walks(&fd, max_entries, n);
        });
    });
}

/// [`lookup_batch_halves`] of `fd` (`max_entries` buckets, `n` entries)
/// told several bucket counts, a filter and a stop, against one walk.
fn check_two_walks(fd: &OwnedFd, max_entries: u32, n: u64) {
    let mut one = Vec::new();
    lookup_batch::<Key, Value>(fd.as_fd(), &mut |k, v| {
        one.push((*k, *v));
        ControlFlow::Continue(())
    })
    .expect("batch lookups");
    assert_eq!(one.len() as u64, n);
    let mut keys: Vec<u64> = one
        .iter()
        .map(|(k, v)| {
            assert_eq!(*v, [k[1], k[1] * 2, k[1] * 3, k[1] * 4]);
            k[1]
        })
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, (0..n).collect::<Vec<_>>());
    // The kernel's bucket count, fewer (an uneven split), more (the upper
    // walk finds nothing), and the smallest split.
    for buckets in [max_entries, 1 << 10, 1 << 20, 2] {
        let mut two = Vec::new();
        lookup_batch_halves::<Key, Value>(
            fd.as_fd(),
            buckets,
            Arc::new(|_, _| true),
            &mut |k, v| {
                two.push((*k, *v));
                ControlFlow::Continue(())
            },
        )
        .expect("batch lookups");
        assert!(
            two == one,
            "{buckets} buckets: {} entries, not the one walk's",
            two.len()
        );
    }
    // The upper walk keeps only what is wanted; what the lower walk read
    // past the middle is the caller's to pass over, as one walk's are.
    let even = |k: &Key| k[1].is_multiple_of(2);
    let mut wanted = Vec::new();
    lookup_batch_halves::<Key, Value>(
        fd.as_fd(),
        max_entries,
        Arc::new(move |k, _| even(k)),
        &mut |k, v| {
            if even(k) {
                wanted.push((*k, *v));
            }
            ControlFlow::Continue(())
        },
    )
    .expect("batch lookups");
    let one_even: Vec<_> = one.iter().filter(|(k, _)| even(k)).copied().collect();
    assert_eq!(one_even.len() as u64, n / 2);
    assert!(
        wanted == one_even,
        "{} wanted entries, not the one walk's",
        wanted.len()
    );
    // A walk told to stop gets the first entries of one walk, no more.
    let mut first = Vec::new();
    lookup_batch_halves::<Key, Value>(
        fd.as_fd(),
        max_entries,
        Arc::new(|_, _| true),
        &mut |k, v| {
            first.push((*k, *v));
            if first.len() == 70_000 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    )
    .expect("batch lookups");
    assert!(
        first[..] == one[..70_000],
        "the first 70,000 entries differ"
    );
}
