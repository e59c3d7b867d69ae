//! The allocation machinery's frames: whether a snapshot drops them
//! ([`AllocatorFrames`]), and how a traceback's leading run of them is
//! dropped ([`AllocatorFrameMatcher::drop_leading`]) so that frame 0 is the first frame
//! outside allocators and their wrappers.
//!
//! A frame belongs to the machinery when its function name matches a
//! function pattern of `allocator_frames` or its module path a `module:`
//! pattern ([`FramePatterns`]). Only the leading run is dropped: a matching
//! frame after the first one that does not match stays. A frame of a
//! stripped binary with no name (a static function: PostgreSQL's
//! `AllocSetAlloc`, nginx's `ngx_palloc_large`, glib's slice helpers) is
//! part of the run when its caller (past other nameless frames of its
//! module) is a machinery frame of the same module: the wrapper called it
//! (`[?, MemoryContextAlloc, ?, hash_search, ...]` drops the first two);
//! one whose caller is not (the program's own static function, called by
//! `main`, itself called by the C library's start) is the caller, and
//! stays. When every frame matches, the last one stays: a
//! traceback is never empty. Each distinct function name and module path
//! is matched once per snapshot.
use std::{collections::HashMap, sync::Arc};

use serde::{Deserialize, Serialize};
use tracer_model::Frame;

use super::frame_patterns::FramePatterns;

/// What a snapshot does with the allocation machinery's leading frames
/// (the query parameter `allocator_frames`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllocatorFrames {
    /// Drop them: frame 0 is the user's (the default).
    #[default]
    Drop,
    /// Keep them: frame 0 is where the allocator was called, as captured.
    Keep,
}

impl AllocatorFrames {
    /// The valid values, for hints.
    pub const VALID: &'static str = "keep, drop";

    /// The word of the API and the files: `drop` or `keep`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            AllocatorFrames::Drop => "drop",
            AllocatorFrames::Keep => "keep",
        }
    }

    /// Reads [`AllocatorFrames::as_str`]'s words.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "drop" => Some(AllocatorFrames::Drop),
            "keep" => Some(AllocatorFrames::Keep),
            _ => None,
        }
    }
}

impl std::fmt::Display for AllocatorFrames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The patterns with what they said of each name so far: one per snapshot
/// build, so each distinct function name and module path is matched once.
pub struct AllocatorFrameMatcher<'a> {
    patterns: &'a FramePatterns,
    functions: HashMap<Arc<str>, bool>,
    modules: HashMap<Arc<str>, bool>,
}

impl<'a> AllocatorFrameMatcher<'a> {
    /// An empty memory over `patterns`.
    #[must_use]
    pub fn new(patterns: &'a FramePatterns) -> Self {
        Self {
            patterns,
            functions: HashMap::new(),
            modules: HashMap::new(),
        }
    }

    /// Whether `frame` belongs to the allocation machinery: its function
    /// matches a function pattern, or its module a module pattern. A frame
    /// with neither name (`<unknown>`) never does.
    pub fn is_allocator_frame(&mut self, frame: &Frame) -> bool {
        let Some(extra) = frame.extra.as_deref() else {
            return false;
        };
        let patterns = self.patterns;
        if let Some(function) = &extra.function {
            let hit = *self
                .functions
                .entry(Arc::clone(function))
                .or_insert_with(|| patterns.matches_function(function));
            if hit {
                return true;
            }
        }
        if let Some(module) = &extra.module {
            return *self
                .modules
                .entry(Arc::clone(module))
                .or_insert_with(|| patterns.matches_module(module));
        }
        false
    }

    /// Drops the leading run of machinery frames of `frames` (most recent
    /// first), nameless frames followed by a machinery frame in the run
    /// included (see the module doc), keeping the last frame when every
    /// one matches.
    pub fn drop_leading(&mut self, frames: &mut Vec<Frame>) {
        if self.patterns.is_empty() {
            return;
        }
        let mut leading = 0;
        while let Some(frame) = frames.get(leading) {
            if self.is_allocator_frame(frame) {
                leading += 1;
                continue;
            }
            // Nameless frames of one module, then their caller: machinery
            // of that module makes them the machinery's own.
            let Some(module) = nameless_module(frame) else {
                break;
            };
            let past = leading
                + frames[leading..]
                    .iter()
                    .take_while(|f| nameless_module(f) == Some(module))
                    .count();
            match frames.get(past) {
                Some(caller)
                    if module_of(caller) == Some(module) && self.is_allocator_frame(caller) =>
                {
                    leading = past + 1;
                }
                _ => break,
            }
        }
        let leading = leading.min(frames.len().saturating_sub(1));
        frames.drain(..leading);
    }
}

/// The module of a frame of a stripped binary's code with no name (a
/// static function whose symbol was stripped: a module, but neither a
/// function nor a line); None for any other frame.
fn nameless_module(frame: &Frame) -> Option<&str> {
    let extra = frame.extra.as_deref()?;
    if frame.lineno != 0 || extra.function.is_some() {
        return None;
    }
    extra.module.as_deref()
}

/// The module path of a frame, if known.
fn module_of(frame: &Frame) -> Option<&str> {
    frame.extra.as_deref()?.module.as_deref()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;
    use tracer_model::FrameExtra;

    fn frame(function: Option<&str>, module: Option<&str>, line: u32) -> Frame {
        Frame::new("f.c", line).with_extra(FrameExtra {
            function: function.map(Arc::from),
            module: module.map(Arc::from),
            address: Some(0x1000),
            build_id: None,
        })
    }

    fn lines(frames: &[Frame]) -> Vec<u32> {
        frames.iter().map(|f| f.lineno).collect()
    }

    fn patterns(list: &[&str]) -> FramePatterns {
        FramePatterns::compile(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn only_the_leading_run_is_dropped() {
        let p = patterns(&["xmalloc", "xstrdup"]);
        let mut frames = vec![
            frame(Some("xmalloc"), None, 1),
            frame(Some("xstrdup"), None, 2),
            frame(Some("user"), None, 3),
            frame(Some("xmalloc"), None, 4),
            frame(Some("main"), None, 5),
        ];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        assert_eq!(lines(&frames), [3, 4, 5]);
    }

    #[test]
    fn when_every_frame_matches_the_last_stays() {
        let p = patterns(&["g_*"]);
        let mut frames = vec![
            frame(Some("g_malloc"), None, 1),
            frame(Some("g_strdup"), None, 2),
        ];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        assert_eq!(lines(&frames), [2]);
        let mut one = vec![frame(Some("g_malloc"), None, 7)];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut one);
        assert_eq!(lines(&one), [7]);
        let mut none: Vec<Frame> = Vec::new();
        AllocatorFrameMatcher::new(&p).drop_leading(&mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn module_patterns_match_the_module_path_not_the_function() {
        let p = patterns(&["module:*/libc.so.6"]);
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let mut frames = vec![
            frame(Some("__strdup"), Some(libc), 1),
            frame(None, Some(libc), 2),
            frame(Some("libc.so.6"), Some("/srv/app"), 3),
            frame(Some("main"), Some("/srv/app"), 4),
        ];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        assert_eq!(lines(&frames), [3, 4]);
    }

    #[test]
    fn a_nameless_frame_the_machinery_calls_goes_with_it_and_a_nameless_caller_stays() {
        let p = patterns(&["MemoryContextAlloc", "palloc", "ngx_alloc", "ngx_pcalloc"]);
        let postgres = Some("/usr/lib/postgresql/15/bin/postgres");
        // AllocSetAlloc (static, stripped) called by MemoryContextAlloc,
        // called by a static function of dynahash, called by a named one.
        let mut frames = vec![
            frame(None, postgres, 0),
            frame(Some("MemoryContextAlloc"), postgres, 0),
            frame(None, postgres, 0),
            frame(Some("hash_search_with_hash_value"), postgres, 0),
        ];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        assert_eq!(frames.len(), 2);
        assert!(frames[0].extra.as_deref().unwrap().function.is_none());
        // nginx: ngx_alloc, the static ngx_palloc_large, ngx_pcalloc.
        let nginx = Some("/usr/sbin/nginx");
        let mut frames = vec![
            frame(Some("ngx_alloc"), nginx, 0),
            frame(None, nginx, 0),
            frame(Some("ngx_pcalloc"), nginx, 0),
            frame(Some("ngx_hash_keys_array_init"), nginx, 0),
        ];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        let first = frames[0].extra.as_deref().unwrap().function.clone();
        assert_eq!(first.as_deref(), Some("ngx_hash_keys_array_init"));
        // A nameless first frame with no machinery after it is the caller.
        let mut frames = vec![
            frame(None, nginx, 0),
            frame(Some("ngx_http_init"), nginx, 0),
        ];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        assert_eq!(frames.len(), 2);
        // A program's nameless main, called by the C library's start
        // (machinery of another module): the caller of APR, kept.
        let p = patterns(&["module:*/libapr-1.so*", "module:*/libc.so.6"]);
        let (apr, ab, libc) = (
            Some("/usr/lib/x86_64-linux-gnu/libapr-1.so.0.7.2"),
            Some("/usr/bin/ab"),
            Some("/usr/lib/x86_64-linux-gnu/libc.so.6"),
        );
        let mut frames = vec![
            frame(Some("apr_allocator_create"), apr, 0),
            frame(Some("apr_initialize"), apr, 0),
            frame(None, ab, 0),
            frame(Some("__libc_start_call_main"), libc, 0),
            frame(None, ab, 0),
        ];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        assert_eq!(frames.len(), 3);
        assert_eq!(module_of(&frames[0]), ab);
    }

    #[test]
    fn unknown_frames_and_frames_without_names_stay() {
        let p = patterns(&["*"]);
        let mut frames = vec![Frame::unknown(), frame(Some("main"), None, 2)];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        assert_eq!(frames.len(), 2);
    }

    #[test]
    fn no_patterns_drop_nothing() {
        let p = patterns(&[]);
        let mut frames = vec![
            frame(Some("xmalloc"), None, 1),
            frame(Some("main"), None, 2),
        ];
        AllocatorFrameMatcher::new(&p).drop_leading(&mut frames);
        assert_eq!(lines(&frames), [1, 2]);
    }

    #[test]
    fn each_name_is_matched_once() {
        let p = patterns(&["xmalloc"]);
        let mut matcher = AllocatorFrameMatcher::new(&p);
        for _ in 0..3 {
            let mut frames = vec![
                frame(Some("xmalloc"), Some("/a"), 1),
                frame(Some("main"), Some("/a"), 2),
            ];
            matcher.drop_leading(&mut frames);
            assert_eq!(lines(&frames), [2]);
        }
        assert_eq!(matcher.functions.len(), 2);
        // "main" did not match by name, so its module was looked at; xmalloc's never.
        assert_eq!(matcher.modules.len(), 1);
    }

    #[test]
    fn the_words_are_keep_and_drop() {
        assert_eq!(AllocatorFrames::default(), AllocatorFrames::Drop);
        for mode in [AllocatorFrames::Drop, AllocatorFrames::Keep] {
            assert_eq!(AllocatorFrames::parse(mode.as_str()), Some(mode));
            assert_eq!(serde_json::to_value(mode).unwrap(), mode.as_str());
        }
        assert_eq!(AllocatorFrames::parse("Keep"), None);
    }
}
