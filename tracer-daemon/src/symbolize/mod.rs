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
//! Frame rules (docs/architecture.md): the frame of a return address is the line of `addr - 1`
//! (the call instruction), inlined calls are frames of their own, innermost first;
//! without line info the frame is named by its site at line 0 (see
//! [`tracer_model::Frame`]): `MODULE!FUNCTION+0xOFFSET` (the return address's offset
//! from the start of the function, from the ELF symbol tables or DWARF), else
//! `MODULE+0xOFFSET` (its offset in the module's file), never an absolute address;
//! with nothing at all, `<unknown>`:0. Each module's GNU build id is read once, when
//! blazesym first loads it, and carried by its frames.
//!
//! [`linecache`] reads the source lines that `Traceback.format()` shows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::sys::modules::{Module, ModuleMaps};

mod cache;
pub mod linecache;
mod worker;

pub use linecache::LineCache;

use worker::run_worker;

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
    /// name is relative (e.g. `/srv/app/src/cache.c`); when the address has no line
    /// info, the name of its site, `MODULE!FUNCTION+0xOFFSET` or `MODULE+0xOFFSET`
    /// ([`tracer_model::site_name`]; DWARF's source file in place of `MODULE` when
    /// it names one but no line); [`UNKNOWN_FILENAME`] when it is in no module.
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
    /// Where the site starts in `filename` (the length of its module path) when
    /// the frame is named by its site; None for a frame with a line or unknown.
    pub site_start: Option<usize>,
    /// The module's GNU build id in lowercase hex (`.note.gnu.build-id`, read
    /// by blazesym), when it has one and its file could be read.
    pub build_id: Option<Arc<str>>,
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
            site_start: None,
            build_id: None,
        }
    }

    /// The frame of a return address in `module` without line info or symbol,
    /// `probe_offset` the offset of `addr - 1` in the module's file: named
    /// `MODULE+0xOFFSET` by the return address's offset (`probe_offset + 1`),
    /// lineno 0; `address` 0 (the caller sets it).
    fn module_only(module: &Module, probe_offset: u64) -> Self {
        let path = module.path();
        let name = tracer_model::site_name(path, None, probe_offset.saturating_add(1));
        Self {
            filename: Arc::from(name),
            lineno: 0,
            function: None,
            module: Some(Arc::clone(path)),
            address: 0,
            site_start: Some(path.len()),
            build_id: None,
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
                Some((module, offset)) if module.file().is_none() => {
                    out.push(vec![SymFrame {
                        address: addr,
                        ..SymFrame::module_only(module, offset)
                    }]);
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
            .map(|job| Arc::from([SymFrame::module_only(&job.module, job.offset)]))
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

#[cfg(test)]
// CONTRIBUTING.md: tests may unwrap.
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
