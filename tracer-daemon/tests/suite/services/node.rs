//! Node.js 20 holding Buffers: 2,000 `Buffer.alloc(40001)` (80 MB, their
//! bytes malloc'd by `NodeArrayBufferAllocator`, called by V8), and 50 zlib
//! streams (another allocation path: zlib's state, malloc'd by node's zlib
//! binding), allocated once node is traced with its unwind tables, kept
//! alive and read while node is frozen.

use std::process::Command;

use super::{
    Groups, NFRAME_MANY, assert_frame_0_is_the_wrappers_caller, assert_groups_are_traces_grouped,
    blocks, grouped_by_hand, settle, traceback_key,
};
use crate::suite::support::{Frozen, Held, SharedTracerd, TempDir, Tracerd};

/// Buffers the script holds, and the size of each.
const BUFFERS: u64 = 2_000;
const BUFFER_SIZE: u64 = 40_001;

/// "ready"; on a line, the Buffers and streams, "held"; on the next line,
/// the end.
const SCRIPT: &str = "const zlib = require('zlib');
const buffers = [];
const streams = [];
console.log('ready');
let lines = 0;
process.stdin.on('data', () => {
    if (lines++ > 0) process.exit(0);
    for (let i = 0; i < 2000; i++) buffers.push(Buffer.alloc(40001, i & 0xff));
    for (let i = 0; i < 50; i++) streams.push(zlib.createDeflate());
    console.log('held', buffers.length, streams.length);
});
";

/// V8's and node's allocation layer: its patterns among tracerd's default
/// `allocator_frames`.
const ALLOCATOR_FRAMES: [&str; 5] = [
    "v8::internal::Malloced::operator new*",
    "v8::internal::AllocWithRetry*",
    "v8::internal::AlignedAllocWithRetry*",
    "v8::internal::Heap::AllocateExternalBackingStore*",
    "node::NodeArrayBufferAllocator::*",
];

/// tracerd (nframe 16) and node holding its Buffers.
fn holding() -> (SharedTracerd, Held, TempDir) {
    let tracerd = Tracerd::shared(&["--nframe", NFRAME_MANY]);
    let dir = TempDir::new("node");
    let script = dir.path().join("buffers.js");
    std::fs::write(&script, SCRIPT).expect("write the script");
    let mut node = Held::spawn(Command::new("node").arg(&script));
    node.line_starting("ready");
    tracerd.wait_traced(node.pid());
    settle(&tracerd, node.pid());
    node.send("go");
    node.line_starting("held");
    (tracerd, node, dir)
}

#[test]
fn node_buffers_group_by_traceback_as_their_traces_do_and_apart_from_the_rest() {
    let (tracerd, node, _dir) = holding();
    let pid = node.pid();
    let _frozen = Frozen::new(pid);
    let groups = assert_groups_are_traces_grouped(&tracerd, pid);
    // The groups that hold a Buffer's bytes hold nothing else: by hand,
    // each distinct traceback of a block of BUFFER_SIZE bytes has only
    // such blocks.
    let blocks = blocks(&tracerd, pid, "");
    let buffer_tracebacks: std::collections::BTreeSet<Vec<String>> = blocks
        .iter()
        .filter(|b| b.size == BUFFER_SIZE)
        .map(|b| traceback_key(&b.frames))
        .collect();
    let buffer_groups: Groups = grouped_by_hand(&blocks)
        .into_iter()
        .filter(|(key, _)| buffer_tracebacks.contains(key))
        .collect();
    let (size, count) = buffer_groups
        .values()
        .fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1));
    let mixed: Vec<(u64, u64)> = buffer_groups
        .values()
        .filter(|(size, count)| *size != count * BUFFER_SIZE)
        .copied()
        .collect();
    eprintln!(
        "node {pid}: {} groups; the Buffers' {} groups: {count} blocks, {size} B",
        groups.len(),
        buffer_groups.len()
    );
    assert!(
        mixed.is_empty(),
        "groups of the Buffers' tracebacks hold other blocks too (size, count): {mixed:?}"
    );
    assert!(
        count >= BUFFERS,
        "{count} blocks of {BUFFER_SIZE} B, {BUFFERS} Buffers held"
    );
}

#[test]
fn frame_0_of_node_blocks_is_the_caller_of_v8s_and_nodes_allocators() {
    let (tracerd, node, _dir) = holding();
    let pid = node.pid();
    let _frozen = Frozen::new(pid);
    assert_frame_0_is_the_wrappers_caller(&tracerd, pid, &ALLOCATOR_FRAMES, 2 * BUFFERS as usize);
}
