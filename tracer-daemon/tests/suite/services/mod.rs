//! The product on what users run: Debian's own services (nginx with two
//! workers under `ab`, a PostgreSQL backend under `pgbench`, Node.js holding
//! Buffers, python3 across `os.fork()`, OpenJDK, `ab`'s APR, `gio`'s glib,
//! `ldbadd`'s talloc) and a C fixture that forks, traced by the real
//! tracerd, judged block by block:
//!
//! - a traceback is whole: it reaches the function every allocation of the
//!   process runs under, and no walk was cut (`total_nframe`, read by
//!   CPython's own tracemalloc from the snapshot's pickle, is not more than
//!   its frames unless `nframe` cut it);
//! - `statistics?group_by=traceback` is `/traces` grouped by hand, exactly:
//!   a group per distinct traceback, frames told apart by their code
//!   location (`filename:lineno` when they have a line, else their
//!   function, module and address);
//! - frame 0 is the first call site outside the allocation machinery: the
//!   caller of the service's allocator wrappers, as tracerd's default
//!   `allocator_frames` (read from the crate) name the machinery.
//!
//! A process whose blocks are read twice is frozen (SIGSTOP) meanwhile.

mod fork;
mod nginx;
mod node;
mod postgres;
mod wrappers;

use std::{
    collections::BTreeMap,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use tracer_daemon::snapshot::FramePatterns;

use crate::suite::support::{TempDir, Tracerd, output_ok};

/// `nframe` of the services' tracerd where a test looks for a frame deep
/// in the stack (the worker's cycle, main): their deepest stacks fit.
const NFRAME: &str = "64";

/// `nframe` of the tests of processes with many blocks (node, java): what
/// they look at is near frame 0, and 64 frames of 50,000 blocks are a
/// `/traces` answer of a gigabyte.
const NFRAME_MANY: &str = "16";

/// One live block from `/traces`: its size and frames (most recent first).
struct Block {
    size: u64,
    frames: Vec<Value>,
}

/// Blocks per page of `/traces`: a page of blocks at a time keeps this
/// process's memory (traced too) small.
const PAGE: usize = 5000;

/// Calls `each` with every block of `pid` now (`GET
/// /pid/{pid}/traces?offset=&limit={PAGE}{query}`, page by page).
fn each_block(tracerd: &Tracerd, pid: u32, query: &str, mut each: impl FnMut(Block)) {
    let mut offset = 0;
    loop {
        let body = tracerd.get_ok(&format!(
            "/pid/{pid}/traces?offset={offset}&limit={PAGE}{query}"
        ));
        let traces = body["traces"].as_array().expect("traces");
        for t in traces {
            each(Block {
                size: t["size"].as_u64().expect("size"),
                frames: t["traceback"].as_array().expect("traceback").clone(),
            });
        }
        if traces.len() < PAGE {
            return;
        }
        offset += PAGE;
    }
}

/// The blocks of `pid` now (a process with few blocks).
fn blocks(tracerd: &Tracerd, pid: u32, query: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    each_block(tracerd, pid, query, |b| blocks.push(b));
    blocks
}

/// A JSON frame's function name ("" when it has none).
fn function(frame: &Value) -> &str {
    frame["function"].as_str().unwrap_or("")
}

/// A JSON frame's module path ("" when it has none).
fn module(frame: &Value) -> &str {
    frame["module"].as_str().unwrap_or("")
}

/// Whether a traceback has a frame of function `name` (or one whose name
/// starts with `name(`: C++ names carry their parameters).
fn reaches(frames: &[Value], name: &str) -> bool {
    frames.iter().any(|f| {
        let function = function(f);
        function == name
            || function
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('('))
    })
}

/// A frame's identity, its code location: `filename:lineno` when it has a
/// line; else its function, module and address (one process: an address is
/// one place in the code).
fn frame_key(frame: &Value) -> String {
    let filename = frame["filename"].as_str().unwrap_or("");
    match frame["lineno"].as_u64() {
        Some(line) if line > 0 => format!("{filename}:{line}"),
        _ => format!(
            "{filename}:0 {} in {} at {:#x}",
            function(frame),
            module(frame),
            frame["address"].as_u64().unwrap_or(0)
        ),
    }
}

/// A traceback's identity: its frames' identities.
fn traceback_key(frames: &[Value]) -> Vec<String> {
    frames.iter().map(frame_key).collect()
}

/// (size, count) per distinct traceback.
type Groups = BTreeMap<Vec<String>, (u64, u64)>;

/// `blocks` grouped by hand.
fn grouped_by_hand(blocks: &[Block]) -> Groups {
    let mut groups = Groups::new();
    for block in blocks {
        let group = groups.entry(traceback_key(&block.frames)).or_default();
        group.0 += block.size;
        group.1 += 1;
    }
    groups
}

/// Asserts that `statistics?group_by=traceback&limit=0` of `pid` is its
/// `/traces` grouped by hand: the same groups, each with the same size and
/// count, exactly. `pid` must not change meanwhile (frozen, or waiting).
/// Returns the groups.
fn assert_groups_are_traces_grouped(tracerd: &Tracerd, pid: u32) -> Groups {
    let stats = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
    let mut by_hand = Groups::new();
    let mut count = 0;
    each_block(tracerd, pid, "", |block| {
        count += 1;
        let group = by_hand.entry(traceback_key(&block.frames)).or_default();
        group.0 += block.size;
        group.1 += 1;
    });
    let mut served = Groups::new();
    let mut twice = 0;
    for stat in stats["statistics"].as_array().expect("statistics") {
        let key = traceback_key(stat["traceback"].as_array().expect("traceback"));
        let value = (
            stat["size"].as_u64().expect("size"),
            stat["count"].as_u64().expect("count"),
        );
        if served.insert(key, value).is_some() {
            twice += 1;
        }
    }
    let mut wrong = Vec::new();
    for (key, want) in &by_hand {
        match served.get(key) {
            Some(got) if got == want => {}
            got => wrong.push((
                want.0,
                format!(
                    "traces grouped by hand: size {} count {}; statistics: {got:?}; frames {:?}",
                    want.0,
                    want.1,
                    &key[..key.len().min(4)]
                ),
            )),
        }
    }
    let unknown = served.keys().filter(|k| !by_hand.contains_key(*k)).count();
    let total = |g: &Groups| g.values().fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1));
    assert!(
        wrong.is_empty() && unknown == 0 && twice == 0,
        "pid {pid}: {} blocks, {} groups by hand (size, count {:?}); statistics: {} groups \
         ({:?}, totals {}), {} of them twice, {unknown} not among the hand groups; {} hand \
         groups differ, the largest first:\n{}",
        count,
        by_hand.len(),
        total(&by_hand),
        served.len(),
        total(&served),
        stats["totals"],
        twice,
        wrong.len(),
        largest(wrong).join("\n")
    );
    by_hand
}

/// The texts of the 8 largest of `lines` (size, text).
fn largest(mut lines: Vec<(u64, String)>) -> Vec<String> {
    lines.sort_by_key(|(size, _)| std::cmp::Reverse(*size));
    lines.into_iter().take(8).map(|(_, text)| text).collect()
}

/// What CPython's tracemalloc reads of a snapshot of `pid` taken now
/// (`POST /pid/{pid}/snapshots`, its `dump?format=tracemalloc` loaded by
/// `tracemalloc.Snapshot.load`): `(frames, total_nframe)` of every trace,
/// and the snapshot's `traceback_limit`.
fn frames_and_totals(tracerd: &Tracerd, pid: u32) -> (Vec<(u64, u64)>, u64) {
    let (status, snapshot) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{snapshot}");
    let id = snapshot["id"].as_u64().expect("snapshot id");
    let (status, pickle) = tracerd.get_bytes(&format!("/snapshots/{id}/dump?format=tracemalloc"));
    assert_eq!(status, 200, "dump: {}", String::from_utf8_lossy(&pickle));
    let dir = TempDir::new("pickle");
    let path = dir.path().join("snapshot.pickle");
    std::fs::write(&path, pickle).expect("write the pickle");
    let out = output_ok(
        Command::new("python3")
            .arg("-c")
            .arg(READ_TOTALS)
            .arg(&path),
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    let limit = lines
        .next()
        .and_then(|l| l.parse().ok())
        .expect("traceback_limit");
    let traces = lines
        .map(|l| {
            let (frames, total) = l.split_once(' ').expect("frames total");
            (
                frames.parse().expect("frames"),
                total.parse().unwrap_or(u64::MAX),
            )
        })
        .collect();
    (traces, limit)
}

/// Prints a loaded snapshot's traceback_limit, then each trace's frame
/// count and total_nframe (`None` when unknown).
const READ_TOTALS: &str = "import sys, tracemalloc
s = tracemalloc.Snapshot.load(sys.argv[1])
print(s.traceback_limit)
for trace in s.traces._traces:
    print(len(trace[2]), trace[3])
";

/// Why some walks of `pid`'s blocks were cut, if any was: a trace whose
/// `total_nframe` is more than its frames, below the limit (`nframe` did
/// not cut it).
fn cut_walks(tracerd: &Tracerd, pid: u32) -> Option<String> {
    let (traces, limit) = frames_and_totals(tracerd, pid);
    let cut: Vec<&(u64, u64)> = traces
        .iter()
        .filter(|&&(frames, total)| total != frames && !(frames == limit && total > limit))
        .collect();
    let mut by_frames: BTreeMap<u64, usize> = BTreeMap::new();
    for (frames, _) in &cut {
        *by_frames.entry(*frames).or_default() += 1;
    }
    let one_frame = traces.iter().filter(|(frames, _)| *frames == 1).count();
    eprintln!(
        "pid {pid}: {} blocks, {} cut, {one_frame} of one frame",
        traces.len(),
        cut.len()
    );
    (traces.is_empty() || !cut.is_empty()).then(|| {
        format!(
            "pid {pid}: {} of {} blocks have a cut traceback (total_nframe more than their \
             frames, below the limit {limit}); how many frames they kept: {by_frames:?}; \
             (frames, total_nframe) of the first: {:?}",
            cut.len(),
            traces.len(),
            &cut[..cut.len().min(8)]
        )
    })
}

/// Asserts that no walk of `pid`'s blocks was cut ([`cut_walks`]).
fn assert_no_cut_walk(tracerd: &Tracerd, pid: u32) {
    if let Some(why) = cut_walks(tracerd, pid) {
        panic!("{why}");
    }
}

/// Waits up to `within` until tracerd's unwinder has `pid`'s mappings
/// (`/maps`' `unwind_pids`), as a user's process has them once it has run a
/// moment. When it never has them the test goes on (and says so): its
/// blocks must be whole all the same, a fork child's with its parent's
/// tables.
fn settle_within(tracerd: &Tracerd, pid: u32, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let maps = tracerd.get_ok("/maps");
        if maps["unwind_pids"]
            .as_array()
            .is_some_and(|p| p.iter().any(|v| v.as_u64() == Some(u64::from(pid))))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("pid {pid}: the unwinder has not had its mappings within {within:?}");
}

/// [`settle_within`] 20 s.
fn settle(tracerd: &Tracerd, pid: u32) {
    settle_within(tracerd, pid, Duration::from_secs(20));
}

/// What [`assert_frame_0_is_the_wrappers_caller`] found.
#[derive(Debug, Default)]
struct AllocatorFramesReport {
    blocks: usize,
    /// Blocks whose kept traceback starts in the machinery (a leading run
    /// of tracerd's default `allocator_frames`).
    through_allocator_frames: usize,
    /// ... of them, those whose run has a frame of the program's family.
    through_family: usize,
    /// ... whose dropped traceback starts at the machinery's caller.
    at_caller: usize,
    /// ... whose kept traceback is the call site alone, in the machinery
    /// (the stack was not stored: a cut traceback).
    call_site_alone: usize,
    /// ... whose kept traceback of more than one frame ends in the
    /// machinery (a walk that stopped in it).
    ended_inside: usize,
    /// ... whose kept traceback is machinery to the outermost frame (the
    /// dynamic loader's own allocations before `main`, up to its
    /// `_start`): a traceback keeps its last frame.
    all_allocator_frames: usize,
    /// ... whose dropped frame 0 is still inside the machinery.
    inside: usize,
    /// Blocks whose dropped frame 0 is machinery: only those whose walk
    /// ended in it (a traceback keeps its last frame).
    frame_0_allocator_frame: usize,
    examples: Vec<String>,
}

/// tracerd's default `allocator_frames` (`Config::default()`, read through
/// the crate: the judge cannot drift from what the daemon drops).
fn default_allocator_frames() -> Vec<String> {
    tracer_daemon::config::Config::default()
        .capture
        .allocator_frames
}

/// `patterns` compiled as tracerd compiles `allocator_frames`.
fn compiled(patterns: &[String]) -> FramePatterns {
    FramePatterns::compile(patterns).expect("the allocator_frames patterns compile")
}

/// Whether `frame` matches `patterns` as tracerd matches a frame: its
/// function a function pattern, or its module a `module:` pattern (a frame
/// with neither name never does).
fn matches(patterns: &FramePatterns, frame: &Value) -> bool {
    let (function, module) = (function(frame), module(frame));
    (!function.is_empty() && patterns.matches_function(function))
        || (!module.is_empty() && patterns.matches_module(module))
}

/// Whether `frame` is a stripped binary's nameless code: a module, but
/// neither a function nor a line.
fn nameless(frame: &Value) -> bool {
    function(frame).is_empty()
        && frame["lineno"].as_u64().unwrap_or(0) == 0
        && !module(frame).is_empty()
}

/// The index of the last frame of `frames`' leading run of machinery
/// (`is_allocator_frame`), where a run of nameless frames of one module is part
/// of it when the frame after them is machinery of that module; None when
/// the traceback does not start in the machinery.
fn last_of_the_leading_run(
    frames: &[Value],
    is_allocator_frame: &dyn Fn(&Value) -> bool,
) -> Option<usize> {
    let mut last = None;
    let mut at = 0;
    while let Some(frame) = frames.get(at) {
        if is_allocator_frame(frame) {
            last = Some(at);
            at += 1;
            continue;
        }
        if !nameless(frame) {
            break;
        }
        let past = at
            + frames[at..]
                .iter()
                .take_while(|f| nameless(f) && module(f) == module(frame))
                .count();
        match frames.get(past) {
            Some(caller) if module(caller) == module(frame) && is_allocator_frame(caller) => {
                last = Some(past);
                at = past + 1;
            }
            _ => break,
        }
    }
    last
}

/// Counts the block `k` (its traceback kept whole) and `d` (the same block,
/// the allocation machinery dropped) in `report`, by where `d` starts
/// against the leading run of `machinery` in `k` (through `family`, the
/// program's own layer, or not); an example of it when it is wrong.
fn judge_block(
    report: &mut AllocatorFramesReport,
    k: &Block,
    d: &Block,
    matcher: &FramePatterns,
    family: &FramePatterns,
) {
    let is_allocator_frame = |f: &Value| matches(matcher, f);
    let frame_0 = &d.frames[0];
    if is_allocator_frame(frame_0) {
        report.frame_0_allocator_frame += 1;
    }
    // The leading run of the allocation layer: its wrappers, and
    // the nameless statics of a stripped binary that a wrapper of
    // their module calls (a wrapper's helper). Wrappers deeper in
    // the stack are callers' business.
    let Some(last) = last_of_the_leading_run(&k.frames, &is_allocator_frame) else {
        return;
    };
    report.through_allocator_frames += 1;
    if k.frames[..=last].iter().any(|f| matches(family, f)) {
        report.through_family += 1;
    }
    let wrong = match k.frames.get(last + 1) {
        None if k.frames.len() == 1 => {
            report.call_site_alone += 1;
            false
        }
        // The kept traceback reached nframe inside the machinery (a
        // dlopen's loader is deep): the dropped one starts past it.
        None if k.frames.len() > 1 && !is_allocator_frame(frame_0) => {
            report.at_caller += 1;
            false
        }
        None if k.frames.last().is_some_and(|f| function(f) == "_start") && d.frames.len() == 1 => {
            report.all_allocator_frames += 1;
            false
        }
        None => {
            report.ended_inside += 1;
            true
        }
        Some(caller) if caller == frame_0 => {
            report.at_caller += 1;
            false
        }
        Some(_) => {
            report.inside += 1;
            true
        }
    };
    if wrong && report.examples.len() < 6 {
        report.examples.push(format!(
            "kept {:?}\n    dropped {:?}",
            frame_names(&k.frames),
            frame_names(&d.frames)
        ));
    }
}

/// The first 6 frames of a traceback as `FUNCTION@MODULE` (the module's
/// file name), for a message.
fn frame_names(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .take(6)
        .map(|f| {
            format!(
                "{}@{}",
                function(f),
                module(f).rsplit('/').next().unwrap_or("")
            )
        })
        .collect()
}

/// Asserts that every block of `pid` (frozen meanwhile) starts at the
/// caller of the allocation machinery, as tracerd's default
/// `allocator_frames` (read from the crate) name it: when its kept
/// traceback (`allocator_frames=keep`) starts with a run of machinery
/// frames, its dropped traceback starts at the frame after the last of
/// them, and no dropped frame 0 is machinery. A walk that ended inside
/// the machinery is accepted only as a block whose stack was not stored
/// (its call site alone), and never more of them than the process
/// declares cut tracebacks. At least `min` blocks must pass through the
/// program's own layer: `family`, each of them one of the defaults.
fn assert_frame_0_is_the_wrappers_caller(
    tracerd: &Tracerd,
    pid: u32,
    family: &[&str],
    min: usize,
) -> AllocatorFramesReport {
    let defaults = default_allocator_frames();
    let unknown: Vec<&&str> = family
        .iter()
        .filter(|p| !defaults.iter().any(|d| d == **p))
        .collect();
    assert!(
        unknown.is_empty(),
        "{unknown:?} are not among tracerd's default allocator_frames"
    );
    let matcher = compiled(&defaults);
    let family = compiled(&family.iter().map(|p| p.to_string()).collect::<Vec<_>>());
    let mut report = AllocatorFramesReport::default();
    // The same blocks kept and dropped, a page of each at a time (the
    // process is frozen: each answer lists them in one order).
    let page = |offset: usize, query: &str| -> Vec<Block> {
        let body = tracerd.get_ok(&format!(
            "/pid/{pid}/traces?offset={offset}&limit={PAGE}{query}"
        ));
        body["traces"]
            .as_array()
            .expect("traces")
            .iter()
            .map(|t| Block {
                size: t["size"].as_u64().expect("size"),
                frames: t["traceback"].as_array().expect("traceback").clone(),
            })
            .collect()
    };
    let mut offset = 0;
    loop {
        let kept = page(offset, "&allocator_frames=keep");
        let dropped = page(offset, "");
        let sizes = |b: &[Block]| b.iter().map(|b| b.size).collect::<Vec<_>>();
        assert_eq!(
            sizes(&kept),
            sizes(&dropped),
            "pid {pid}: the blocks changed, or came in another order"
        );
        report.blocks += kept.len();
        for (k, d) in kept.iter().zip(&dropped) {
            judge_block(&mut report, k, d, &matcher, &family);
        }
        if kept.len() < PAGE {
            break;
        }
        offset += PAGE;
    }
    eprintln!("pid {pid}: {report:?}");
    // A block whose stack was not stored (the stack map refused it, a
    // preemption of the walk) keeps its call site alone, in the allocator's
    // wrapper when that called malloc: never hidden, the process counts it
    // among its cut tracebacks. A walk that stopped inside the machinery
    // with frames (the unwinder lost its way in a wrapper) is a bug.
    let declared = tracerd.get_ok(&format!("/pid/{pid}"))["cut_tracebacks"]
        .as_u64()
        .unwrap_or(0);
    // Walks that ended in the machinery, alone or with frames: cut ones,
    // which the process must declare.
    let cut_inside = report.call_site_alone + report.ended_inside;
    assert!(
        report.through_family >= min
            && report.at_caller + cut_inside + report.all_allocator_frames
                == report.through_allocator_frames
            && cut_inside as u64 <= declared
            && report.frame_0_allocator_frame == cut_inside + report.all_allocator_frames,
        "pid {pid}: of {} blocks, {} start in the machinery, {} of them through the program's \
         own layer (at least {min} must): {} start at its caller, {} kept their call site alone \
         (the process declares {declared} cut tracebacks), {} walks ended inside it, {} are \
         matcher to the loader's _start, {} start inside it; {} start at a matcher frame. \
         Examples:\n{}",
        report.blocks,
        report.through_allocator_frames,
        report.through_family,
        report.at_caller,
        report.call_site_alone,
        report.ended_inside,
        report.all_allocator_frames,
        report.inside,
        report.frame_0_allocator_frame,
        report.examples.join("\n")
    );
    report
}
