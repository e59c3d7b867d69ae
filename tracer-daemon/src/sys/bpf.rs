//! Raw `bpf(2)` map calls that aya 0.14 does not offer: batch lookups
//! and deletes (thousands of entries per syscall), lookups into a value
//! whose size is only known at run time (`STACKS`), and key walks. One
//! implementation each; every caller in `capture` goes through here.
use std::{io, os::fd::BorrowedFd};

use std::os::fd::AsRawFd as _;

mod halves;

pub use halves::{Wanted, lookup_batch_halves};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

/// `union bpf_attr` as the map element commands use it.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `bpf(command, attr)`, `attr`'s size given as the attribute's size: the
/// call's non-negative result, or its error.
///
/// # Safety
/// `attr` is the `union bpf_attr` prefix `command` reads, and each of its
/// pointers points at a live buffer of the size or count it gives.
pub(super) unsafe fn syscall<A>(command: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: the caller's promise.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_mut(attr),
            size_of::<A>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn call(command: libc::c_long, attr: &mut ElemAttr) -> io::Result<()> {
    // SAFETY: attr is a valid, initialised bpf_attr prefix whose pointers
    // point at live buffers of the map's key and value sizes (callers).
    unsafe { syscall(command, attr) }.map(|_| ())
}

/// Looks `key` up into `value`, which must be exactly the map's value size.
pub fn lookup<K>(fd: BorrowedFd<'_>, key: &K, value: &mut [u64]) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: std::ptr::from_ref(key) as u64,
        value: value.as_mut_ptr() as u64,
        ..ElemAttr::default()
    };
    call(BPF_MAP_LOOKUP_ELEM, &mut attr)
}

/// Looks `key` up in a map whose values are `V`s (exactly the map's value
/// size): the value, or the call's error (`ENOENT`: no such key).
///
/// # Errors
/// The syscall's error.
pub fn lookup_value<K, V: Copy + Default>(fd: BorrowedFd<'_>, key: &K) -> io::Result<V> {
    let mut value = V::default();
    let mut attr = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: std::ptr::from_ref(key) as u64,
        value: std::ptr::from_mut(&mut value) as u64,
        ..ElemAttr::default()
    };
    call(BPF_MAP_LOOKUP_ELEM, &mut attr).map(|()| value)
}

const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// `union bpf_attr` as the batch commands use it.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Entries a call of BPF_MAP_LOOKUP_BATCH asks for at first. The kernel
/// walks buckets without giving way until it has them (the kernel here
/// runs without preemption, `preempt=none`, as many distribution kernels
/// do): at about 0.3 µs an entry, 1,024 keep a call near 0.3 to 0.5 ms, where
/// 4,096 held a CPU for 1 to 2 ms (up to 16 ms over a sparse map), and
/// whatever woke on that CPU meanwhile (a cheap route's thread, a client)
/// waited for it. The calls cost about 1 µs each besides.
const BATCH_ENTRIES: usize = 1024;

/// A walk of a hash map with BPF_MAP_LOOKUP_BATCH: each call reads whole
/// buckets, [`BATCH_ENTRIES`] entries at a time. The kernel's batch token is a
/// bucket index (the bucket the next call starts at), which lets a walk
/// start anywhere ([`lookup_batch_halves`]).
struct Batches<'a, K, V> {
    fd: BorrowedFd<'a>,
    keys: Vec<K>,
    values: Vec<V>,
    /// The bucket the next call starts at; None: from the first.
    start: Option<u64>,
    /// No call made yet (its refusal is the caller's to handle).
    first: bool,
    /// The walk reached the last bucket, or a later call failed.
    done: bool,
}

impl<'a, K: Copy + Default, V: Copy + Default> Batches<'a, K, V> {
    /// A walk of `fd` from bucket `start` (None: the first).
    fn new(fd: BorrowedFd<'a>, start: Option<u64>) -> Self {
        let chunk = BATCH_ENTRIES;
        Self {
            fd,
            keys: vec![K::default(); chunk],
            values: vec![V::default(); chunk],
            start,
            first: true,
            done: false,
        }
    }

    /// Reads the next buckets: how many entries are now at the front of
    /// `keys` and `values` (0 with `done` at the end).
    ///
    /// # Errors
    /// The syscall's error when the kernel refuses the first call.
    fn next(&mut self) -> io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        loop {
            let chunk = self.keys.len();
            let token_in = self.start.unwrap_or(0);
            let mut token_out = 0u64;
            let mut attr = BatchAttr {
                in_batch: if self.start.is_some() {
                    std::ptr::from_ref(&token_in) as u64
                } else {
                    0
                },
                out_batch: std::ptr::from_mut(&mut token_out) as u64,
                keys: self.keys.as_mut_ptr() as u64,
                values: self.values.as_mut_ptr() as u64,
                count: chunk as u32,
                map_fd: self.fd.as_raw_fd() as u32,
                ..BatchAttr::default()
            };
            // SAFETY: the buffers hold `count` keys and values of the map's
            // key and value sizes (K and V are the map's types); the tokens
            // are 8 bytes, more than the kernel's 4-byte hash batch token.
            let err = unsafe { syscall(BPF_MAP_LOOKUP_BATCH, &mut attr) }.err();
            let got = (attr.count as usize).min(chunk);
            if err.as_ref().and_then(io::Error::raw_os_error) == Some(libc::ENOSPC) {
                // A bucket holds more entries than fit: retry it, larger.
                self.keys.resize(chunk * 2, K::default());
                self.values.resize(chunk * 2, V::default());
                continue;
            }
            if let Some(err) = &err
                && err.raw_os_error() != Some(libc::ENOENT)
                && self.first
            {
                return Err(io::Error::new(err.kind(), err.to_string()));
            }
            self.first = false;
            self.done = err.is_some();
            self.start = Some(token_out);
            return Ok(got);
        }
    }

    /// The entries the last call read.
    fn read(&self, n: usize) -> impl Iterator<Item = (&K, &V)> {
        self.keys.iter().zip(&self.values).take(n)
    }
}

/// Calls `f` on every (key, value) of a hash map, many per syscall
/// (BPF_MAP_LOOKUP_BATCH, Linux 5.6+), until `f` breaks. Entries changed
/// meanwhile may be seen or not, as with any walk of a live map.
///
/// # Errors
/// The syscall's error when the kernel refuses the batch command at
/// once (before any entry was given to `f`): fall back to iteration.
pub fn lookup_batch<K: Copy + Default, V: Copy + Default>(
    fd: BorrowedFd<'_>,
    f: &mut impl FnMut(&K, &V) -> std::ops::ControlFlow<()>,
) -> io::Result<()> {
    let mut batches = Batches::new(fd, None);
    while !batches.done {
        let n = batches.next()?;
        for (key, value) in batches.read(n) {
            if f(key, value).is_break() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Calls `f` on every (key, value) of a hash map, a syscall for each key
/// and one for its value, until `f` breaks: [`lookup_batch`]'s fallback
/// where the kernel refuses the batch command (Linux < 5.6). A key deleted
/// between the two calls is passed over.
pub fn lookup_each<K: Copy + Default, V: Copy + Default>(
    fd: BorrowedFd<'_>,
    f: &mut impl FnMut(&K, &V) -> std::ops::ControlFlow<()>,
) {
    for key in keys::<K>(fd) {
        if let Ok(value) = lookup_value::<K, V>(fd, &key)
            && f(&key, &value).is_break()
        {
            break;
        }
    }
}

const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// Deletes keys from the front of `keys`, thousands per syscall
/// (BPF_MAP_DELETE_BATCH, Linux 5.6+), until one is not there: how many
/// were deleted (the first `n` of `keys`; `keys.len()` when all were, else
/// key `n` is not in the map), or the kernel's refusal with how many were
/// deleted before it.
///
/// # Errors
/// The syscall's error other than for an absent key (the kernel lacks the
/// batch command, ...), with the count of keys deleted before it.
pub fn delete_run<K>(fd: BorrowedFd<'_>, keys: &[K]) -> Result<usize, (usize, io::Error)> {
    let mut deleted = 0;
    while deleted < keys.len() {
        let rest = &keys[deleted..];
        let chunk = rest.len().min(65536);
        let mut attr = BatchAttr {
            keys: rest.as_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr.keys points at `count` keys of the map's key size.
        let result = unsafe { syscall(BPF_MAP_DELETE_BATCH, &mut attr) };
        deleted += (attr.count as usize).min(chunk);
        match result {
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(deleted),
            Err(err) => return Err((deleted, err)),
        }
    }
    Ok(deleted)
}

/// Deletes `keys`, thousands per syscall (BPF_MAP_DELETE_BATCH, Linux
/// 5.6+); a key that is gone already is passed over. Falls back to one
/// delete per key where the kernel lacks the batch command. Calls
/// `on_deleted` with each key this call deleted; returns how many.
pub fn delete_batch<K>(fd: BorrowedFd<'_>, keys: &[K], mut on_deleted: impl FnMut(&K)) -> usize {
    let mut deleted = 0;
    let mut rest = keys;
    while !rest.is_empty() {
        let (done, refused) = match delete_run(fd, rest) {
            Ok(done) => (done, false),
            Err((done, _)) => (done, true),
        };
        deleted += done;
        rest[..done].iter().for_each(&mut on_deleted);
        if refused {
            // No batch command: one at a time.
            for key in &rest[done..] {
                if delete(fd, key) {
                    on_deleted(key);
                    deleted += 1;
                }
            }
            return deleted;
        }
        // The key at `done` is gone already: pass it over.
        rest = rest.get(done + 1..).unwrap_or(&[]);
    }
    deleted
}

/// Deletes `key`; false if it was not there.
pub fn delete<K>(fd: BorrowedFd<'_>, key: &K) -> bool {
    let mut attr = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: std::ptr::from_ref(key) as u64,
        ..ElemAttr::default()
    };
    call(BPF_MAP_DELETE_ELEM, &mut attr).is_ok()
}

/// Every key of a map, by walking them (one syscall per key).
pub fn keys<K: Default + Copy>(fd: BorrowedFd<'_>) -> Vec<K> {
    let mut out = Vec::new();
    let mut key: Option<K> = None;
    loop {
        let mut next = K::default();
        let mut attr = ElemAttr {
            map_fd: fd.as_raw_fd() as u32,
            key: key.as_ref().map_or(0, |k| std::ptr::from_ref(k) as u64),
            value: std::ptr::from_mut(&mut next) as u64,
            ..ElemAttr::default()
        };
        if call(BPF_MAP_GET_NEXT_KEY, &mut attr).is_err() {
            return out;
        }
        out.push(next);
        key = Some(next);
    }
}

/// Number of keys, by walking them (one syscall per key).
pub fn count_keys<K: Default + Copy>(fd: BorrowedFd<'_>) -> u64 {
    keys::<K>(fd).len() as u64
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
/// `BPF_MAP_TYPE_HASH`.
const BPF_MAP_TYPE_HASH: u32 = 1;
/// `BPF_F_NO_PREALLOC`: entries are allocated as they are put in.
pub const BPF_F_NO_PREALLOC: u32 = 1;

/// `union bpf_attr` as BPF_MAP_CREATE uses it (up to `map_name`).
#[repr(C)]
#[derive(Default)]
struct CreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// Creates a hash map of `K` → `V` with room for `max_entries` entries and
/// `flags` (`BPF_F_*`), named `name` (its first 15 bytes, as bpftool shows
/// it). The kernel allocates its buckets now (16 bytes per entry of
/// `max_entries` rounded up to a power of two).
///
/// # Errors
/// The syscall's error (`ENOMEM`, `EPERM` without CAP_BPF).
pub fn create_hash<K, V>(
    name: &str,
    max_entries: u32,
    flags: u32,
) -> io::Result<std::os::fd::OwnedFd> {
    let mut map_name = [0u8; 16];
    for (to, from) in map_name.iter_mut().zip(name.bytes().take(15)) {
        *to = from;
    }
    let mut attr = CreateAttr {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: size_of::<K>() as u32,
        value_size: size_of::<V>() as u32,
        max_entries,
        map_flags: flags,
        map_name,
        ..CreateAttr::default()
    };
    // SAFETY: attr is a whole, initialised prefix of bpf_attr for
    // BPF_MAP_CREATE, with no pointer in it.
    let fd = unsafe { syscall(BPF_MAP_CREATE, &mut attr) }?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// Sets `keys[i]` to `values[i]` for every i (`elem_flags` as in
/// [`update`]) in one BPF_MAP_UPDATE_BATCH (Linux 5.6+), thousands per
/// syscall. A change of a map of maps waits for an RCU grace period (15 ms
/// here) once per call, not once per key as [`update`] does. `keys` and
/// `values` are of one length; `K` and `V` as in [`update`].
///
/// # Errors
/// The syscall's error (`E2BIG`: the map is full; `EINVAL`: the kernel
/// lacks the command), with the count of keys set before it.
pub fn update_batch<K, V>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
    elem_flags: u64,
) -> Result<usize, (usize, io::Error)> {
    let len = keys.len().min(values.len());
    let mut done = 0;
    while done < len {
        let chunk = (len - done).min(65536);
        let mut attr = BatchAttr {
            keys: keys[done..].as_ptr() as u64,
            values: values[done..].as_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags,
            ..BatchAttr::default()
        };
        // SAFETY: attr.keys and attr.values point at `count` keys and
        // values of the map's sizes.
        let result = unsafe { syscall(BPF_MAP_UPDATE_BATCH, &mut attr) };
        done += (attr.count as usize).min(chunk);
        if let Err(err) = result {
            return Err((done, err));
        }
    }
    Ok(done)
}

/// Sets `key` to `value` (`flags`: `BPF_ANY` 0, `BPF_NOEXIST` 1,
/// `BPF_EXIST` 2). `K` and `V` must be exactly the map's key and value
/// sizes (a map of maps takes a descriptor as a `u32`).
///
/// # Errors
/// The syscall's error (`E2BIG`: the map is full).
pub fn update<K, V>(fd: BorrowedFd<'_>, key: &K, value: &V, flags: u64) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: std::ptr::from_ref(key) as u64,
        value: std::ptr::from_ref(value) as u64,
        flags,
        ..ElemAttr::default()
    };
    call(BPF_MAP_UPDATE_ELEM, &mut attr)
}
