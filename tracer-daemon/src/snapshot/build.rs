//! Kernel blocks and frames into a tracemalloc [`Snapshot`]: one
//! symbolization per distinct stack (every captured address, inlined calls
//! as frames of their own), the leading frames of the allocation machinery
//! dropped unless the build keeps them, then each traceback cut to `nframe`
//! frames with its `total_nframe` (the frames after the drop), domain =
//! pid. With sampling on, the sampled blocks become unbiased estimates (see
//! [`SnapshotBuilder::build`]).
use std::{collections::HashMap, sync::Arc};

use tracer_model::{
    AllocatorFamily, Frame, FrameExtra, Snapshot, Trace, Traceback, TracebackTotals, interrupt,
};

use super::frame_patterns::FramePatterns;
use super::machinery::{AllocatorFrameMatcher, AllocatorFrames};
use crate::capture::Stopping;
use crate::capture::stacks::STACK_CUT_MARK;
use crate::lifecycle::RawBlock;
use crate::symbolize::{SymFrame, Symbolizer};
use crate::sys::modules::ModuleMaps;

/// A traceback's sampled blocks of one source: its stack, estimated count
/// and bytes.
type EstimatedGroup = (Option<Arc<[u64]>>, f64, f64);

/// The blocks of one stack of an image, from the kernel's totals per
/// stack: its return addresses (frame 0 first; None: unknown), source,
/// blocks and bytes.
pub type StackGroup = (Option<Arc<[u64]>>, AllocatorFamily, u64, u64);

/// Builds snapshots of traced processes; one per daemon.
pub struct SnapshotBuilder {
    /// Turns return addresses into frames (its caches are shared by every
    /// snapshot).
    pub symbolizer: Symbolizer,
    /// The traceback limit in frames (tracerd's `nframe`).
    pub nframe: u32,
    /// Mean sampling interval in bytes; 0: exact.
    pub sample_interval: u64,
    /// The allocation machinery (`allocator_frames`): leading frames that
    /// match are dropped from every traceback a build does not keep them in.
    pub allocator_frames: FramePatterns,
    /// tracerd's stop: a build ends at the next block once it is raised,
    /// and its snapshot then holds only some of the blocks (its caller
    /// answers that tracerd is stopping instead). A build also ends early
    /// when the thread's interrupt check ([`tracer_model::interrupt`]:
    /// the request's) says to stop, which its caller finds out the same
    /// way (`Service::unless_stopping`).
    pub stopping: Stopping,
}

/// What one build shares between its tracebacks.
struct Pass<'a> {
    maps: Option<&'a ModuleMaps>,
    /// None when the build keeps the machinery's frames.
    matcher: Option<AllocatorFrameMatcher<'a>>,
}

/// The traceback of a block with no stack at all: `<unknown>:0`.
fn unknown_traceback() -> Arc<Traceback> {
    Arc::new(Traceback::new(vec![Frame::unknown()], Some(1)))
}

impl SnapshotBuilder {
    /// A build's shared state over `maps`, dropping the machinery's frames
    /// unless `frames` keeps them.
    fn pass<'a>(&'a self, maps: Option<&'a ModuleMaps>, frames: AllocatorFrames) -> Pass<'a> {
        Pass {
            maps,
            matcher: (frames == AllocatorFrames::Drop)
                .then(|| AllocatorFrameMatcher::new(&self.allocator_frames)),
        }
    }

    /// Turns raw blocks into a [`Snapshot`]: one symbolization per distinct
    /// stack, the machinery's leading frames dropped (unless `frames` is
    /// [`AllocatorFrames::Keep`]), tracebacks truncated to `nframe` frames,
    /// domain = pid. Partial once [`SnapshotBuilder::stopping`] is raised.
    pub fn build(
        &self,
        pid: u32,
        blocks: &[RawBlock],
        maps: Option<&ModuleMaps>,
        frames: AllocatorFrames,
    ) -> Snapshot {
        let mut pass = self.pass(maps, frames);
        let mut tracebacks: HashMap<*const u64, Arc<Traceback>> = HashMap::new();
        let unknown = unknown_traceback();
        let mean = self.sample_interval;
        if mean > 0 {
            return Snapshot::new(
                self.estimated_traces(pid, blocks, &mut pass, mean),
                self.nframe,
            );
        }
        let mut traces = Vec::with_capacity(blocks.len());
        // The last stack's traceback: blocks come in runs of one stack, and
        // a hit costs no hashing.
        let mut last: Option<(*const u64, Arc<Traceback>)> = None;
        for (step, block) in blocks.iter().enumerate() {
            if self.stopping.is_raised() || interrupt::check_every(step).is_err() {
                break;
            }
            let traceback = match &block.stack {
                None => unknown.clone(),
                Some(stack) => match &last {
                    Some((address, traceback)) if *address == stack.as_ptr() => traceback.clone(),
                    _ => {
                        let traceback = tracebacks
                            .entry(stack.as_ptr())
                            .or_insert_with(|| Arc::new(self.traceback(stack, &mut pass)))
                            .clone();
                        last = Some((stack.as_ptr(), traceback.clone()));
                        traceback
                    }
                },
            };
            traces.push(Trace {
                source: block.source,
                domain: pid,
                size: block.size,
                traceback,
            });
        }
        Snapshot::new(traces, self.nframe)
    }

    /// Turns the kernel's totals per stack of one image into a snapshot of
    /// totals ([`Snapshot::from_totals`]): each distinct stack symbolized
    /// once as [`SnapshotBuilder::build`] does, then cut to `limit` frames.
    /// `groups` are (stack: return addresses, frame 0 first, or None for
    /// an unknown one; source; blocks; bytes). Exact builds only (a sampled
    /// build needs each block's size): callers check `sample_interval`.
    /// Partial once [`SnapshotBuilder::stopping`] is raised.
    pub fn build_totals(
        &self,
        pid: u32,
        groups: &[StackGroup],
        maps: Option<&ModuleMaps>,
        frames: AllocatorFrames,
        limit: u32,
    ) -> Snapshot {
        let mut pass = self.pass(maps, frames);
        let mut tracebacks: HashMap<*const u64, Arc<Traceback>> = HashMap::new();
        let unknown = unknown_traceback();
        let mut out = Vec::with_capacity(groups.len());
        for (step, (stack, source, count, size)) in groups.iter().enumerate() {
            if self.stopping.is_raised() || interrupt::check_every(step).is_err() {
                break;
            }
            let traceback = match stack {
                None => unknown.clone(),
                Some(stack) => tracebacks
                    .entry(stack.as_ptr())
                    .or_insert_with(|| {
                        super::truncate::cut_traceback(
                            &Arc::new(self.traceback(stack, &mut pass)),
                            limit,
                        )
                    })
                    .clone(),
            };
            out.push(TracebackTotals {
                traceback,
                domain: pid,
                source: *source,
                count: *count,
                size: *size,
            });
        }
        Snapshot::from_totals(out, limit)
    }

    /// Sampled blocks to traces with unbiased estimates. A block of `s`
    /// bytes (but an `mmap` one, always recorded) was sampled with
    /// probability p = 1 - exp(-s/mean), so it stands
    /// for 1/p blocks and s/p bytes (Horvitz-Thompson). Per traceback the
    /// estimates are summed, and the group is rebuilt as round(count)
    /// traces (at least 1) whose sizes add up to round(bytes): statistics
    /// and compare_to then report the estimated count and size.
    fn estimated_traces(
        &self,
        pid: u32,
        blocks: &[RawBlock],
        pass: &mut Pass<'_>,
        mean: u64,
    ) -> Vec<Trace> {
        let mut groups: HashMap<(Option<*const u64>, AllocatorFamily), EstimatedGroup> =
            HashMap::new();
        for (step, block) in blocks.iter().enumerate() {
            if self.stopping.is_raised() || interrupt::check_every(step).is_err() {
                break;
            }
            let s = block.size as f64;
            // Anonymous mappings are recorded whole, never sampled.
            let p = if block.source == AllocatorFamily::MMAP {
                1.0
            } else {
                -(-s / mean as f64).exp_m1()
            };
            let (count, bytes) = if p > 0.0 {
                (1.0 / p, s / p)
            } else {
                (mean as f64, 0.0)
            };
            let key = (
                block.stack.as_ref().map(|stack| stack.as_ptr()),
                block.source,
            );
            let entry = groups
                .entry(key)
                .or_insert_with(|| (block.stack.clone(), 0.0, 0.0));
            entry.1 += count;
            entry.2 += bytes;
        }
        let mut traces = Vec::new();
        for (step, ((_, source), (stack, count, bytes))) in groups.into_iter().enumerate() {
            if self.stopping.is_raised() || interrupt::check_every(step).is_err() {
                break;
            }
            let traceback = match &stack {
                Some(stack) => Arc::new(self.traceback(stack, pass)),
                None => unknown_traceback(),
            };
            let n = (count.round() as u64).max(1);
            let total = bytes.round() as u64;
            let (each, extra) = (total / n, total % n);
            for i in 0..n {
                let size = each + u64::from(i < extra);
                traces.push(Trace {
                    source,
                    domain: pid,
                    size,
                    traceback: traceback.clone(),
                });
            }
        }
        traces
    }

    /// One stack's traceback: every address symbolized, the machinery's
    /// leading frames dropped (when the pass drops them), then cut to
    /// `nframe`; `total_nframe` counts the frames after the drop.
    fn traceback(&self, stack: &[u64], pass: &mut Pass<'_>) -> Traceback {
        // A walk that was cut ends with STACK_CUT_MARK: the stack has at
        // least one frame more than was walked.
        let (mut stack, mut walk_cut) = match stack.split_last() {
            Some((&STACK_CUT_MARK, walked)) => (walked, true),
            _ => (stack, false),
        };
        let mut frames = Vec::new();
        if let Some(maps) = pass.maps {
            // A return address outside every executable mapping is not a
            // frame (a frame-pointer walk through code built without them,
            // before the unwinder had the process's mappings): the stack is
            // cut there.
            if let Some(bad) = stack
                .iter()
                .skip(1)
                .position(|&address| !maps.is_executable(address))
            {
                stack = &stack[..=bad];
                walk_cut = true;
            }
            for per_address in self.symbolizer.symbolize(maps, stack) {
                frames.extend(per_address.into_iter().map(frame_of));
            }
        } else {
            frames.extend(stack.iter().map(|&address| {
                Frame::unknown().with_extra(FrameExtra {
                    address: Some(address),
                    ..FrameExtra::default()
                })
            }));
        }
        cut(frames, pass.matcher.as_mut(), self.nframe, walk_cut)
    }
}

/// The model's frame of a symbolized one: a frame with no line named by its
/// site keeps where the site starts (its file is the module).
fn frame_of(sym: SymFrame) -> Frame {
    let frame = match sym.site_start {
        Some(start) => Frame::with_site(sym.filename, start),
        None => Frame::new(sym.filename, sym.lineno),
    };
    frame.with_extra(FrameExtra {
        function: sym.function,
        module: sym.module,
        address: Some(sym.address),
        build_id: sym.build_id,
    })
}

/// A traceback of `frames` (most recent first): the machinery's leading
/// frames dropped when `machinery` is given, then at most `nframe` frames;
/// `total_nframe` counts the frames after the drop, plus one when the walk
/// was cut (`walk_cut`: the stack goes on beyond what was walked, as
/// tracemalloc counts a traceback it truncated). No frame at all is
/// `<unknown>`:0.
fn cut(
    mut frames: Vec<Frame>,
    matcher: Option<&mut AllocatorFrameMatcher<'_>>,
    nframe: u32,
    walk_cut: bool,
) -> Traceback {
    if let Some(matcher) = matcher {
        matcher.drop_leading(&mut frames);
    }
    if frames.is_empty() {
        frames.push(Frame::unknown());
    }
    let total = u32::try_from(frames.len() + usize::from(walk_cut)).unwrap_or(u32::MAX);
    frames.truncate(nframe as usize);
    Traceback::new(frames, Some(total))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;
    use crate::config::Config;

    /// A frame of `function` at `file:line` in `module`, at `address` (the
    /// frames an address expands to share it: inlined calls).
    fn frame(function: &str, line: u32, module: &str, address: u64) -> Frame {
        let file = if module.ends_with("/app") {
            "/srv/app.cc"
        } else {
            "lib.cc"
        };
        Frame::new(file, line).with_extra(FrameExtra {
            function: Some(Arc::from(function)),
            module: Some(Arc::from(module)),
            address: Some(address),
            build_id: None,
        })
    }

    fn defaults() -> FramePatterns {
        FramePatterns::compile(&Config::default().capture.allocator_frames).unwrap()
    }

    fn functions(traceback: &Traceback) -> Vec<&str> {
        traceback
            .frames()
            .iter()
            .map(|f| {
                f.extra
                    .as_ref()
                    .and_then(|e| e.function.as_deref())
                    .unwrap_or("?")
            })
            .collect()
    }

    const APP: &str = "/srv/app";
    const LIBSTDCXX: &str = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30";

    /// `std::vector<int> v(n)` at -O2: operator new in libstdc++, then one
    /// address in main with the allocator templates inlined into it.
    fn vector_stack() -> Vec<Frame> {
        vec![
            frame("operator new(unsigned long)", 0, LIBSTDCXX, 0x10),
            frame(
                "std::__new_allocator<int>::allocate(unsigned long, void const*)",
                151,
                APP,
                0x20,
            ),
            frame(
                "std::_Vector_base<int, std::allocator<int> >::_M_allocate(unsigned long)",
                381,
                APP,
                0x20,
            ),
            frame(
                "std::vector<int, std::allocator<int> >::vector(unsigned long, std::allocator<int> const&)",
                557,
                APP,
                0x20,
            ),
            frame("main", 12, APP, 0x20),
            frame(
                "__libc_start_call_main",
                0,
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                0x30,
            ),
        ]
    }

    #[test]
    fn inlined_machinery_frames_are_dropped_one_by_one_before_nframe_counts() {
        let patterns = defaults();
        let mut matcher = AllocatorFrameMatcher::new(&patterns);
        let tb = cut(vector_stack(), Some(&mut matcher), 1, false);
        assert_eq!(functions(&tb), ["main"]);
        assert_eq!(tb.frames()[0].lineno, 12);
        // main and __libc_start_call_main remain: the drop is only leading.
        assert_eq!(tb.total_nframe(), Some(2));
        let tb = cut(vector_stack(), Some(&mut matcher), 16, false);
        assert_eq!(functions(&tb), ["main", "__libc_start_call_main"]);
    }

    #[test]
    fn a_cut_walk_counts_one_frame_more_than_it_walked() {
        let patterns = defaults();
        let mut matcher = AllocatorFrameMatcher::new(&patterns);
        let tb = cut(vector_stack(), Some(&mut matcher), 16, true);
        assert_eq!(functions(&tb), ["main", "__libc_start_call_main"]);
        assert_eq!(tb.total_nframe(), Some(3));
        let tb = cut(vector_stack(), Some(&mut matcher), 1, true);
        assert_eq!(functions(&tb), ["main"]);
        assert_eq!(tb.total_nframe(), Some(3));
    }

    #[test]
    fn kept_frames_are_cut_as_captured() {
        let tb = cut(vector_stack(), None, 2, false);
        assert_eq!(
            functions(&tb),
            [
                "operator new(unsigned long)",
                "std::__new_allocator<int>::allocate(unsigned long, void const*)"
            ]
        );
        assert_eq!(tb.total_nframe(), Some(6));
    }

    #[test]
    fn a_user_call_inlined_into_machinery_stops_the_drop() {
        let patterns = defaults();
        let mut matcher = AllocatorFrameMatcher::new(&patterns);
        let stack = vec![
            frame("operator new(unsigned long)", 0, LIBSTDCXX, 0x10),
            frame("Cache::make_entry(int)", 40, APP, 0x20),
            frame(
                "void std::__insertion_sort<int*>(int*, int*)",
                1800,
                APP,
                0x20,
            ),
            frame("main", 9, APP, 0x28),
        ];
        let tb = cut(stack, Some(&mut matcher), 16, false);
        assert_eq!(
            functions(&tb),
            [
                "Cache::make_entry(int)",
                "void std::__insertion_sort<int*>(int*, int*)",
                "main"
            ]
        );
        assert_eq!(tb.total_nframe(), Some(3));
    }

    #[test]
    fn rust_frames_mangled_or_not_are_dropped_to_the_users_line() {
        let patterns = defaults();
        let mut matcher = AllocatorFrameMatcher::new(&patterns);
        let stack = vec![
            frame("_RNvCsfLfy6EI15iL_7___rustc12___rust_alloc", 0, APP, 0x10),
            frame(
                "alloc::raw_vec::finish_grow::<alloc::alloc::Global>",
                0,
                APP,
                0x18,
            ),
            frame(
                "<alloc::raw_vec::RawVecInner<_>>::reserve::do_reserve_and_handle::<alloc::alloc::Global>",
                0,
                APP,
                0x20,
            ),
            frame("<alloc::string::String>::push", 0, APP, 0x28),
            frame("myapp::render", 31, APP, 0x30),
            frame("myapp::main", 7, APP, 0x38),
            frame(
                "core::ops::function::FnOnce::call_once::<fn(), ()>",
                250,
                APP,
                0x40,
            ),
        ];
        let tb = cut(stack, Some(&mut matcher), 16, false);
        assert_eq!(
            functions(&tb),
            [
                "myapp::render",
                "myapp::main",
                "core::ops::function::FnOnce::call_once::<fn(), ()>"
            ]
        );
        assert_eq!(tb.total_nframe(), Some(3));
    }

    #[test]
    fn a_traceback_all_machinery_keeps_its_last_frame() {
        let patterns = defaults();
        let mut matcher = AllocatorFrameMatcher::new(&patterns);
        let stack = vec![
            frame(
                "g_malloc",
                0,
                "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0",
                0x10,
            ),
            frame(
                "g_strdup",
                0,
                "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0",
                0x18,
            ),
        ];
        let tb = cut(stack, Some(&mut matcher), 16, false);
        assert_eq!(functions(&tb), ["g_strdup"]);
        assert_eq!(tb.total_nframe(), Some(1));
    }

    #[test]
    fn no_frame_at_all_is_unknown() {
        let patterns = defaults();
        let tb = cut(
            Vec::new(),
            Some(&mut AllocatorFrameMatcher::new(&patterns)),
            16,
            false,
        );
        assert_eq!(tb.frames(), [Frame::unknown()]);
        assert_eq!(tb.total_nframe(), Some(1));
    }

    #[test]
    fn a_build_without_module_maps_has_no_names_and_drops_nothing() {
        let builder = SnapshotBuilder {
            symbolizer: Symbolizer::new(),
            nframe: 16,
            sample_interval: 0,
            allocator_frames: FramePatterns::compile(&["*".to_string()]).unwrap(),
            stopping: Stopping::default(),
        };
        let stack: Arc<[u64]> = Arc::from([0x10u64, 0x20]);
        let blocks = [RawBlock {
            size: 8,
            stack: Some(stack),
            source: AllocatorFamily::UNKNOWN,
        }];
        let snapshot = builder.build(1, &blocks, None, AllocatorFrames::Drop);
        let traceback = &snapshot.traces()[0].traceback;
        assert_eq!(traceback.frames().len(), 2);
        assert_eq!(traceback.total_nframe(), Some(2));
    }

    #[test]
    fn sampling_scales_allocations_but_not_mappings_which_are_recorded_whole() {
        let builder = SnapshotBuilder {
            symbolizer: Symbolizer::new(),
            nframe: 16,
            sample_interval: 512 * 1024,
            allocator_frames: FramePatterns::compile(&[]).unwrap(),
            stopping: Stopping::default(),
        };
        let block = |addr: u64, source| RawBlock {
            size: 65536,
            stack: Some(Arc::from([addr])),
            source,
        };
        let blocks = [
            block(0x10, AllocatorFamily::MMAP),
            block(0x20, AllocatorFamily::from_code(1)),
        ];
        let snapshot = builder.build(1, &blocks, None, AllocatorFrames::Drop);
        let of = |source| -> Vec<u64> {
            snapshot
                .traces()
                .iter()
                .filter(|t| t.source == source)
                .map(|t| t.size)
                .collect()
        };
        assert_eq!(of(AllocatorFamily::MMAP), [65536]);
        // p = 1 - exp(-1/8): 8.51 blocks, 557,738 bytes.
        let sampled = of(AllocatorFamily::from_code(1));
        assert_eq!(sampled.len(), 9);
        assert_eq!(sampled.iter().sum::<u64>(), 557_738);
    }
}
