//! Symbolization: return addresses of a traced process to source frames
//! (`file:line`, function, module) with DWARF, as tracemalloc's frames.
//!
//! Input: a [`ModuleMaps`] captured from `/proc/PID/maps` while the process lived,
//! and the return addresses of a user stack. Each address is translated into
//! (module, file offset) by the maps, and the module's file, held open by the maps,
//! is read by blazesym through `/proc/self/fd/N`: this works after the process
//! exited and after the file was deleted or replaced, and needs no ASLR arithmetic.
//!
//! One long-lived `blazesym` symbolizer keeps each file's parsed ELF and DWARF;
//! on top of it a bounded cache maps (module, file offset) to frames, so that a
//! stack seen again costs hash lookups only. blazesym's symbolizer is neither
//! `Send` nor `Sync` (its caches use `Rc`/`RefCell`), so it lives on one worker
//! thread that owns it, as its maintainers advise
//! (<https://github.com/libbpf/blazesym/issues/930>); [`Symbolizer`] is the
//! `Send + Sync` handle that sends it requests and waits for the answer (call it
//! from `spawn_blocking` in async code).
//!
//! Frame rules (DESIGN.md): the frame of a return address is the line of `addr - 1`
//! (the call instruction), inlined calls are frames of their own, innermost first;
//! without line info the filename is the module path and lineno 0; with nothing at
//! all, `<unknown>`:0.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use blazesym::symbolize::source::{self, Source};
use blazesym::symbolize::{CodeInfo, Input, Sym, Symbolized, evict};

use crate::sys::modules::{Module, ModuleMaps};

/// The filename of a frame about which nothing is known, as tracemalloc writes it.
pub const UNKNOWN_FILENAME: &str = "<unknown>";

/// Default bound on the number of (module, file offset) results the
/// [`Symbolizer`] caches.
pub const DEFAULT_CACHED_ADDRESSES: usize = 1 << 18;

/// How long the worker may sit idle before it releases what exited processes left.
const IDLE_SWEEP: Duration = Duration::from_secs(10);

/// One frame of a symbolized stack, the shape of the model's `Frame` plus extras.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SymFrame {
    /// Source file as DWARF names it, the compilation directory joined in when the
    /// name is relative (e.g. `/srv/app/src/cache.c`); the module path when the
    /// address has no line info; [`UNKNOWN_FILENAME`] when it is in no module.
    pub filename: Arc<str>,
    /// 1-based source line from the DWARF line table; 0 when unknown.
    pub lineno: u32,
    /// The function (demangled for C++ and Rust): for an inlined call, the inlined
    /// function; from DWARF, else the ELF symbol table; `None` when unknown.
    pub function: Option<Arc<str>>,
    /// Path of the mapped file (program or library) from `/proc/PID/maps`;
    /// `None` when the address is in no file-backed executable mapping.
    pub module: Option<Arc<str>>,
    /// The return address as captured (a virtual address of the traced process,
    /// not minus one); every frame an address expands to carries it.
    pub address: u64,
}

impl SymFrame {
    /// The frame of an address about which nothing is known: `<unknown>`:0.
    pub fn unknown(address: u64) -> Self {
        Self {
            filename: Arc::from(UNKNOWN_FILENAME),
            lineno: 0,
            function: None,
            module: None,
            address,
        }
    }

    /// The frame of an address in `module` without line info or symbol:
    /// the module path as filename, lineno 0.
    fn module_only(module: &Module, address: u64) -> Self {
        Self {
            filename: Arc::clone(module.path()),
            lineno: 0,
            function: None,
            module: Some(Arc::clone(module.path())),
            address,
        }
    }
}

/// Counters of a [`Symbolizer`], for metrics and `get_tracemalloc_memory`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolizerStats {
    /// Addresses answered from the (module, file offset) cache.
    pub cache_hits: u64,
    /// Addresses that needed blazesym (distinct per request).
    pub cache_misses: u64,
    /// Modules whose ELF/DWARF blazesym currently keeps loaded.
    pub loaded_modules: u64,
    /// (module, file offset) results currently cached.
    pub cached_addresses: u64,
}

#[derive(Debug, Default)]
struct Stats {
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    loaded_modules: AtomicU64,
    cached_addresses: AtomicU64,
}

/// Turns return addresses into frames; one per daemon, shared by all tasks.
///
/// `Send + Sync`; each call blocks until the worker thread answers (other callers
/// wait in line), so call it from blocking contexts only.
#[derive(Debug)]
pub struct Symbolizer {
    cached_addresses: usize,
    /// Started on first use, restarted if it ever ended.
    worker: Mutex<Option<WorkerHandle>>,
    /// A failure to start the worker was logged already.
    spawn_failure_logged: AtomicBool,
    stats: Arc<Stats>,
}

#[derive(Debug)]
struct WorkerHandle {
    requests: mpsc::Sender<Request>,
    thread: JoinHandle<()>,
}

/// One address to resolve: its module (open) and the file offset of `addr - 1`.
struct Job {
    module: Arc<Module>,
    offset: u64,
}

enum Request {
    Symbolize {
        jobs: Vec<Job>,
        reply: mpsc::SyncSender<Vec<Arc<[SymFrame]>>>,
    },
    ReleaseUnused {
        reply: mpsc::SyncSender<()>,
    },
}

impl Symbolizer {
    /// A symbolizer caching up to [`DEFAULT_CACHED_ADDRESSES`] results. Its worker
    /// thread starts on first use.
    pub fn new() -> Self {
        Self::with_cache_capacity(DEFAULT_CACHED_ADDRESSES)
    }

    /// A symbolizer caching up to about `cached_addresses` (module, file offset)
    /// results (least recently used go first). Its worker thread starts on first use.
    pub fn with_cache_capacity(cached_addresses: usize) -> Self {
        Self {
            cached_addresses,
            worker: Mutex::new(None),
            spawn_failure_logged: AtomicBool::new(false),
            stats: Arc::new(Stats::default()),
        }
    }

    /// Symbolizes the return addresses `addrs` of the process image `maps` was
    /// captured from: one `Vec` of frames per address, in input order, each the
    /// inlined calls innermost first then the containing function, with the line
    /// of `addr - 1`. Never fails: what cannot be resolved gets the fallback frames
    /// (module path:0, or `<unknown>`:0), so every inner `Vec` has at least one frame.
    pub fn symbolize(&self, maps: &ModuleMaps, addrs: &[u64]) -> Vec<Vec<SymFrame>> {
        let mut out: Vec<Vec<SymFrame>> = Vec::with_capacity(addrs.len());
        let mut jobs = Vec::new();
        let mut job_slots = Vec::new();
        for &addr in addrs {
            // A return address follows its call: addr - 1 is inside the call.
            match addr.checked_sub(1).and_then(|probe| maps.lookup(probe)) {
                None => out.push(vec![SymFrame::unknown(addr)]),
                Some((module, _)) if module.file().is_none() => {
                    out.push(vec![SymFrame::module_only(module, addr)]);
                }
                Some((module, offset)) => {
                    job_slots.push(out.len());
                    jobs.push(Job {
                        module: Arc::clone(module),
                        offset,
                    });
                    out.push(Vec::new());
                }
            }
        }
        if jobs.is_empty() {
            return out;
        }
        let fallback: Vec<Arc<[SymFrame]>> = jobs
            .iter()
            .map(|job| Arc::from([SymFrame::module_only(&job.module, 0)]))
            .collect();
        let results = self.ask_symbolize(jobs).unwrap_or(fallback);
        for (slot, frames) in job_slots.into_iter().zip(results) {
            let (Some(out), Some(&address)) = (out.get_mut(slot), addrs.get(slot)) else {
                continue;
            };
            *out = frames
                .iter()
                .map(|frame| SymFrame {
                    address,
                    ..frame.clone()
                })
                .collect();
        }
        out
    }

    /// Makes blazesym drop, now rather than at the next request, the parsed data
    /// and the file descriptor it keeps for each module that no [`ModuleMaps`] or
    /// [`ModuleCache`](crate::sys::modules::ModuleCache) holds any more. The worker also
    /// does this before each request and after 10 s idle. (Cached frames of such
    /// modules are not looked up again and age out of the bounded cache.)
    pub fn release_unused(&self) {
        let (reply, answer) = mpsc::sync_channel(1);
        // A worker that never started holds nothing: do not start one for this.
        if self.send(Request::ReleaseUnused { reply }, false) {
            let _ = answer.recv();
        }
    }

    /// Current counters.
    pub fn stats(&self) -> SymbolizerStats {
        SymbolizerStats {
            cache_hits: self.stats.cache_hits.load(Ordering::Relaxed),
            cache_misses: self.stats.cache_misses.load(Ordering::Relaxed),
            loaded_modules: self.stats.loaded_modules.load(Ordering::Relaxed),
            cached_addresses: self.stats.cached_addresses.load(Ordering::Relaxed),
        }
    }

    fn ask_symbolize(&self, jobs: Vec<Job>) -> Option<Vec<Arc<[SymFrame]>>> {
        let expected = jobs.len();
        let (reply, answer) = mpsc::sync_channel(1);
        if !self.send(Request::Symbolize { jobs, reply }, true) {
            return None;
        }
        match answer.recv() {
            Ok(frames) if frames.len() == expected => Some(frames),
            _ => {
                tracing::error!("the symbolizer worker did not answer; using fallback frames");
                None
            }
        }
    }

    /// Sends `request` to the worker, starting it first if `start`.
    fn send(&self, request: Request, start: bool) -> bool {
        let Some(requests) = self.requests(start) else {
            return false;
        };
        let sent = requests.send(request).is_ok();
        if !sent {
            tracing::error!("the symbolizer worker is gone; using fallback frames");
        }
        sent
    }

    /// The worker's inbox; if the worker is not running, `None`, or with `start`
    /// the inbox of a newly started one.
    fn requests(&self, start: bool) -> Option<mpsc::Sender<Request>> {
        let mut worker = self
            .worker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if worker.as_ref().is_none_or(|w| w.thread.is_finished()) {
            if !start {
                return None;
            }
            let (requests, inbox) = mpsc::channel();
            let cached_addresses = self.cached_addresses;
            let stats = Arc::clone(&self.stats);
            let spawned = std::thread::Builder::new()
                .name("tracer-symbolize".into())
                .spawn(move || run_worker(&inbox, cached_addresses, &stats));
            match spawned {
                Ok(thread) => *worker = Some(WorkerHandle { requests, thread }),
                Err(error) => {
                    if !self.spawn_failure_logged.swap(true, Ordering::Relaxed) {
                        tracing::error!(%error, "cannot start the symbolizer thread; using fallback frames");
                    }
                    return None;
                }
            }
        }
        worker.as_ref().map(|w| w.requests.clone())
    }
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Symbolizer {
    fn drop(&mut self) {
        let worker = self
            .worker
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(WorkerHandle { requests, thread }) = worker {
            // Closing the channel ends the worker's loop.
            drop(requests);
            let _ = thread.join();
        }
    }
}

fn run_worker(inbox: &mpsc::Receiver<Request>, cached_addresses: usize, stats: &Arc<Stats>) {
    let mut worker = Worker::new(cached_addresses, Arc::clone(stats));
    loop {
        let request = match inbox.recv_timeout(IDLE_SWEEP) {
            Ok(request) => request,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                worker.release_unused();
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        match request {
            Request::Symbolize { jobs, reply } => {
                let result = catch_unwind(AssertUnwindSafe(|| worker.symbolize(&jobs)));
                let frames = result.unwrap_or_else(|_| {
                    // blazesym's state may be inconsistent after a panic: start afresh.
                    tracing::error!("symbolization panicked; resetting the symbolizer");
                    worker = Worker::new(cached_addresses, Arc::clone(stats));
                    jobs.iter()
                        .map(|job| Arc::from([SymFrame::module_only(&job.module, 0)]))
                        .collect()
                });
                let _ = reply.send(frames);
            }
            Request::ReleaseUnused { reply } => {
                worker.release_unused();
                let _ = reply.send(());
            }
        }
    }
}

/// What the worker keeps per module blazesym has loaded.
struct Loaded {
    /// Alive while some `ModuleMaps` or the module cache holds the file open.
    module: Weak<Module>,
    /// The path blazesym knows the file by.
    fd_path: PathBuf,
    /// Interned filenames and function names of this module's frames.
    strings: HashSet<Arc<str>>,
    /// blazesym failed on this file once already: do not log it again.
    warned: bool,
}

impl Loaded {
    fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(interned) = self.strings.get(text) {
            return Arc::clone(interned);
        }
        let interned: Arc<str> = Arc::from(text);
        self.strings.insert(Arc::clone(&interned));
        interned
    }
}

/// The cache misses of one request in one module.
struct Misses<'a> {
    module: &'a Arc<Module>,
    /// Each distinct missed file offset → the indices of the jobs that asked for it.
    jobs_by_offset: HashMap<u64, Vec<usize>>,
}

/// The state owned by the worker thread.
struct Worker {
    blaze: blazesym::symbolize::Symbolizer,
    /// By [`Module::id`], which is never reused.
    loaded: HashMap<u64, Loaded>,
    /// (module id, file offset) → frames with `address` 0.
    frames: GenerationalCache<(u64, u64), Arc<[SymFrame]>>,
    stats: Arc<Stats>,
}

impl Worker {
    fn new(cached_addresses: usize, stats: Arc<Stats>) -> Self {
        let blaze = blazesym::symbolize::Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            // Stat the path on each use: `/proc/self/fd/N` may name another file
            // once N is closed and reused (we evict first; this is the backstop).
            .enable_auto_reload(true)
            .build();
        stats.loaded_modules.store(0, Ordering::Relaxed);
        stats.cached_addresses.store(0, Ordering::Relaxed);
        Self {
            blaze,
            loaded: HashMap::new(),
            frames: GenerationalCache::new(cached_addresses),
            stats,
        }
    }

    /// Evicts from blazesym every module whose file was closed. Cached frames of
    /// those modules are keyed by an id that is never reused: they age out.
    fn release_unused(&mut self) {
        let blaze = &mut self.blaze;
        self.loaded.retain(|_, loaded| {
            if loaded.module.strong_count() > 0 {
                return true;
            }
            let target = evict::Elf::new(loaded.fd_path.clone());
            if let Err(error) = blaze.evict(&target.into()) {
                tracing::debug!(target = %loaded.fd_path.display(), %error, "blazesym eviction failed");
            }
            false
        });
        self.update_gauges();
    }

    fn update_gauges(&self) {
        let loaded = u64::try_from(self.loaded.len()).unwrap_or(u64::MAX);
        let cached = u64::try_from(self.frames.len()).unwrap_or(u64::MAX);
        self.stats.loaded_modules.store(loaded, Ordering::Relaxed);
        self.stats.cached_addresses.store(cached, Ordering::Relaxed);
    }

    fn symbolize(&mut self, jobs: &[Job]) -> Vec<Arc<[SymFrame]>> {
        self.release_unused();
        let mut results: Vec<Option<Arc<[SymFrame]>>> = Vec::with_capacity(jobs.len());
        let mut misses: HashMap<u64, Misses<'_>> = HashMap::new();
        let mut hits = 0u64;
        for (index, job) in jobs.iter().enumerate() {
            let key = (job.module.id(), job.offset);
            if let Some(frames) = self.frames.get(&key) {
                hits += 1;
                results.push(Some(frames));
            } else {
                results.push(None);
                misses
                    .entry(job.module.id())
                    .or_insert_with(|| Misses {
                        module: &job.module,
                        jobs_by_offset: HashMap::new(),
                    })
                    .jobs_by_offset
                    .entry(job.offset)
                    .or_default()
                    .push(index);
            }
        }
        let mut missed = 0u64;
        for (
            id,
            Misses {
                module,
                jobs_by_offset,
            },
        ) in misses
        {
            let offsets: Vec<(u64, Vec<usize>)> = jobs_by_offset.into_iter().collect();
            missed += u64::try_from(offsets.len()).unwrap_or(u64::MAX);
            let frames = self.resolve(module, offsets.iter().map(|(offset, _)| *offset));
            for ((offset, indices), frames) in offsets.into_iter().zip(frames) {
                for index in indices {
                    if let Some(slot) = results.get_mut(index) {
                        *slot = Some(Arc::clone(&frames));
                    }
                }
                self.frames.insert((id, offset), frames);
            }
        }
        self.stats.cache_hits.fetch_add(hits, Ordering::Relaxed);
        self.stats.cache_misses.fetch_add(missed, Ordering::Relaxed);
        self.update_gauges();
        results
            .into_iter()
            .zip(jobs)
            .map(|(frames, job)| {
                frames.unwrap_or_else(|| Arc::from([SymFrame::module_only(&job.module, 0)]))
            })
            .collect()
    }

    /// Symbolizes file offsets of one module with blazesym: one frames list each.
    fn resolve(
        &mut self,
        module: &Arc<Module>,
        offsets: impl Iterator<Item = u64>,
    ) -> Vec<Arc<[SymFrame]>> {
        let offsets: Vec<u64> = offsets.collect();
        let fallback = || -> Vec<Arc<[SymFrame]>> {
            offsets
                .iter()
                .map(|_| Arc::from([SymFrame::module_only(module, 0)]))
                .collect()
        };
        let Some(fd_path) = module.fd_path() else {
            return fallback();
        };
        let loaded = self.loaded.entry(module.id()).or_insert_with(|| Loaded {
            module: Arc::downgrade(module),
            fd_path: fd_path.clone(),
            strings: HashSet::new(),
            warned: false,
        });
        let src = Source::Elf(source::Elf::new(fd_path));
        match self.blaze.symbolize(&src, Input::FileOffset(&offsets)) {
            Ok(symbolized) if symbolized.len() == offsets.len() => symbolized
                .iter()
                .map(|sym| frames_of(sym, module, loaded))
                .collect(),
            Ok(_) => fallback(),
            Err(error) => {
                if !loaded.warned {
                    loaded.warned = true;
                    tracing::warn!(target = %module.path(), %error, "cannot symbolize module");
                }
                fallback()
            }
        }
    }
}

/// The frames of one blazesym result, innermost first, `address` 0.
///
/// blazesym reports the containing function in `sym` and the inlined calls in
/// `sym.inlined`, outermost first; each level's `code_info` is the location
/// *within that level* (for `sym` and all but the last inlined function: the line
/// of the call to the next level in; for the last: the line of the address).
fn frames_of(symbolized: &Symbolized<'_>, module: &Module, loaded: &mut Loaded) -> Arc<[SymFrame]> {
    let Symbolized::Sym(sym) = symbolized else {
        return Arc::from([SymFrame::module_only(module, 0)]);
    };
    let Sym {
        name,
        code_info,
        inlined,
        ..
    } = sym;
    let mut frames = Vec::with_capacity(inlined.len() + 1);
    for inlined_fn in inlined.iter().rev() {
        frames.push(frame_of(
            &inlined_fn.name,
            inlined_fn.code_info.as_ref(),
            module,
            loaded,
        ));
    }
    frames.push(frame_of(name, code_info.as_deref(), module, loaded));
    Arc::from(frames)
}

fn frame_of(
    function: &str,
    code_info: Option<&CodeInfo<'_>>,
    module: &Module,
    loaded: &mut Loaded,
) -> SymFrame {
    let (filename, lineno) = match code_info {
        Some(info) => (
            loaded.intern(&info.to_path().to_string_lossy()),
            info.line.unwrap_or(0),
        ),
        None => (Arc::clone(module.path()), 0),
    };
    SymFrame {
        filename,
        lineno,
        function: (!function.is_empty()).then(|| loaded.intern(function)),
        module: Some(Arc::clone(module.path())),
        address: 0,
    }
}

/// A bounded map that forgets the least recently used entries, approximately and
/// in O(1): entries live in the current generation; when it is full it becomes the
/// previous one (dropping the old previous), and a hit in the previous generation
/// moves the entry back to the current one. Holds at most `2 * (capacity / 2)`.
struct GenerationalCache<K, V> {
    generation_capacity: usize,
    current: HashMap<K, V>,
    previous: HashMap<K, V>,
}

impl<K: std::hash::Hash + Eq, V: Clone> GenerationalCache<K, V> {
    fn new(capacity: usize) -> Self {
        Self {
            generation_capacity: (capacity / 2).max(1),
            current: HashMap::new(),
            previous: HashMap::new(),
        }
    }

    fn get(&mut self, key: &K) -> Option<V> {
        if let Some(value) = self.current.get(key) {
            return Some(value.clone());
        }
        let (key, value) = self.previous.remove_entry(key)?;
        self.insert(key, value.clone());
        Some(value)
    }

    fn insert(&mut self, key: K, value: V) {
        if self.current.len() >= self.generation_capacity && !self.current.contains_key(&key) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, value);
    }

    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

#[cfg(test)]
// STYLE.md: tests may unwrap.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn symbolizer_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Symbolizer>();
        assert_send_sync::<ModuleMaps>();
    }

    #[test]
    fn generational_cache_keeps_recent_and_bounds_size() {
        let mut cache = GenerationalCache::new(4);
        cache.insert(1, "a");
        cache.insert(2, "b");
        assert_eq!(cache.len(), 2);
        // Current is full: 3 starts a new generation, 1 and 2 become previous.
        cache.insert(3, "c");
        assert_eq!(cache.get(&1), Some("a")); // promoted: 3 and 1 current
        cache.insert(4, "d"); // rotates: previous = {3, 1}, 2 is forgotten
        assert_eq!(cache.get(&2), None);
        assert_eq!(cache.get(&3), Some("c"));
        assert_eq!(cache.get(&4), Some("d"));
        assert!(cache.len() <= 4);
        // Overwriting a present key never rotates.
        let mut cache = GenerationalCache::new(2);
        cache.insert(1, "a");
        cache.insert(1, "b");
        assert_eq!(cache.get(&1), Some("b"));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn address_in_no_mapping_is_unknown() {
        let symbolizer = Symbolizer::new();
        let maps = ModuleMaps::empty(1);
        let frames = symbolizer.symbolize(&maps, &[0, 1, 0xdead_beef]);
        assert_eq!(
            frames,
            vec![
                vec![SymFrame::unknown(0)],
                vec![SymFrame::unknown(1)],
                vec![SymFrame::unknown(0xdead_beef)],
            ]
        );
        assert_eq!(&*frames[0][0].filename, "<unknown>");
        assert_eq!(symbolizer.stats().cache_misses, 0);
    }
}
