//! The worker thread that owns blazesym's symbolizer (neither `Send` nor
//! `Sync`): it answers [`Symbolizer`](super::Symbolizer)'s requests, keeps
//! each loaded module's interned strings, caches frames by (module, file
//! offset), and applies the frame rules: the line of the call instruction,
//! inlined calls as frames of their own, innermost first, and without line
//! info the site's name at line 0 (`MODULE!FUNCTION+0xOFFSET`, else
//! `MODULE+0xOFFSET`). It reads each module's build id when it loads it.
use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use blazesym::symbolize::source::{self, Source};
use blazesym::symbolize::{CodeInfo, Input, Sym, Symbolized, evict};

use super::cache::GenerationalCache;
use super::{IDLE_SWEEP, Job, Request, Stats, SymFrame};
use crate::sys::modules::Module;

pub(super) fn run_worker(
    inbox: &mpsc::Receiver<Request>,
    cached_addresses: usize,
    stats: &Arc<Stats>,
) {
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
                        .map(|job| Arc::from([SymFrame::module_only(&job.module, job.offset)]))
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
    /// The file's GNU build id in lowercase hex, read once when it is loaded.
    build_id: Option<Arc<str>>,
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
            // Names are demangled here, and only mangled ones (see demangle).
            .enable_demangling(false)
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
                frames
                    .unwrap_or_else(|| Arc::from([SymFrame::module_only(&job.module, job.offset)]))
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
                .map(|&offset| Arc::from([SymFrame::module_only(module, offset)]))
                .collect()
        };
        let Some(fd_path) = module.fd_path() else {
            return fallback();
        };
        let loaded = self.loaded.entry(module.id()).or_insert_with(|| Loaded {
            module: Arc::downgrade(module),
            build_id: build_id(&fd_path, module),
            fd_path: fd_path.clone(),
            strings: HashSet::new(),
            warned: false,
        });
        let src = Source::Elf(source::Elf::new(fd_path));
        match self.blaze.symbolize(&src, Input::FileOffset(&offsets)) {
            Ok(symbolized) if symbolized.len() == offsets.len() => symbolized
                .iter()
                .zip(&offsets)
                .map(|(sym, &offset)| frames_of(sym, module, offset, loaded))
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

/// The GNU build id of the module open at `fd_path`, in lowercase hex; None
/// when it has none or its notes cannot be read (logged at debug level: the
/// frames simply carry no build id).
fn build_id(fd_path: &std::path::Path, module: &Module) -> Option<Arc<str>> {
    match blazesym::helper::read_elf_build_id(fd_path) {
        Ok(Some(bytes)) if !bytes.is_empty() => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            Some(Arc::from(hex))
        }
        Ok(_) => None,
        Err(error) => {
            tracing::debug!(target = %module.path(), %error, "cannot read the build id");
            None
        }
    }
}

/// The frames of one blazesym result for the file offset `offset` of
/// `addr - 1`, innermost first, `address` 0.
///
/// blazesym reports the containing function in `sym` and the inlined calls in
/// `sym.inlined`, outermost first; each level's `code_info` is the location
/// *within that level* (for `sym` and all but the last inlined function: the line
/// of the call to the next level in; for the last: the line of the address).
/// A level with no line is named by its site: its function and the return
/// address's offset from the start of the containing function `sym` (a call
/// inlined into it has no code of its own), or with no symbol at all the
/// return address's offset in the module's file.
fn frames_of(
    symbolized: &Symbolized<'_>,
    module: &Module,
    offset: u64,
    loaded: &mut Loaded,
) -> Arc<[SymFrame]> {
    let Symbolized::Sym(sym) = symbolized else {
        return Arc::from([SymFrame {
            build_id: loaded.build_id.clone(),
            ..SymFrame::module_only(module, offset)
        }]);
    };
    let Sym {
        name,
        code_info,
        inlined,
        offset: function_offset,
        ..
    } = sym;
    let site = Site {
        // Of the return address: one past `addr - 1`.
        function_offset: u64::try_from(*function_offset)
            .unwrap_or(u64::MAX)
            .saturating_add(1),
        module_offset: offset.saturating_add(1),
    };
    let mut frames = Vec::with_capacity(inlined.len() + 1);
    for inlined_fn in inlined.iter().rev() {
        frames.push(frame_of(
            &inlined_fn.name,
            inlined_fn.code_info.as_ref(),
            site,
            module,
            loaded,
        ));
    }
    frames.push(frame_of(name, code_info.as_deref(), site, module, loaded));
    Arc::from(frames)
}

/// Where a return address is, for the frames of it with no line.
#[derive(Clone, Copy)]
struct Site {
    /// Its offset from the start of the containing function.
    function_offset: u64,
    /// Its offset in the module's file.
    module_offset: u64,
}

fn frame_of(
    function: &str,
    code_info: Option<&CodeInfo<'_>>,
    site: Site,
    module: &Module,
    loaded: &mut Loaded,
) -> SymFrame {
    let function = (!function.is_empty()).then(|| loaded.intern(&demangle(function)));
    let line = code_info
        .and_then(|info| info.line)
        .filter(|&line| line > 0);
    let (filename, lineno, site_start) = match (code_info, line) {
        (Some(info), Some(line)) => (loaded.intern(&info.to_path().to_string_lossy()), line, None),
        _ => {
            // No line: the source file DWARF names, else the module.
            let file = match code_info {
                Some(info) => info.to_path().to_string_lossy().into_owned(),
                None => module.path().to_string(),
            };
            let offset = match function {
                Some(_) => site.function_offset,
                None => site.module_offset,
            };
            let name = tracer_model::site_name(&file, function.as_deref(), offset);
            // Not interned: a site's name is its own (the cache shares it).
            (Arc::from(name), 0, Some(file.len()))
        }
    };
    SymFrame {
        filename,
        lineno,
        function,
        module: Some(Arc::clone(module.path())),
        address: 0,
        site_start,
        build_id: loaded.build_id.clone(),
    }
}

/// `name` demangled when it is a mangled C++ or Rust symbol (`_Z...`, Rust's
/// legacy `_ZN...E` with its hash, or Rust v0 `_R...`), else as it is. A
/// plain C name is never demangled: read as an Itanium type encoding, `b`
/// would become `bool` and `a` `signed char`.
pub(super) fn demangle(name: &str) -> std::borrow::Cow<'_, str> {
    if !(name.starts_with("_Z") || name.starts_with("_R") || name.starts_with("__Z")) {
        return std::borrow::Cow::Borrowed(name);
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return std::borrow::Cow::Owned(format!("{rust:#}"));
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|symbol| symbol.demangle().ok())
        .map_or(std::borrow::Cow::Borrowed(name), std::borrow::Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_c_names_are_never_read_as_itanium_types() {
        for name in ["a", "b", "c", "i", "main", "malloc", "St", "Ss"] {
            assert_eq!(demangle(name), name);
        }
    }

    #[test]
    fn mangled_cpp_and_rust_names_are_demangled() {
        assert_eq!(demangle("_Z3fooi"), "foo(int)");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate4main"), "mycrate::main");
        // Not a valid mangling: left as it is.
        assert_eq!(demangle("_Z"), "_Z");
    }
}
