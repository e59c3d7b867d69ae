//! Fork children that allocate at once: Debian's python3 (3.11, LTO, no
//! frame pointers; `PYTHONMALLOC=malloc`) right after `os.fork()`, and
//! `fixtures/fork_chain.c` built without frame pointers. The child starts
//! with an empty live set, and every one of its blocks has its whole
//! traceback, as the same allocation in its parent does.

use std::{
    collections::{BTreeMap, BTreeSet},
    process::Command,
};

use super::{NFRAME, assert_no_cut_walk, blocks, function, grouped_by_hand, settle, traceback_key};
use crate::suite::support::{Fixture, Held, Program, TempDir, Tracerd};

/// Objects each process allocates, and each one's block: `bytearray(7000)`
/// mallocs 7001 bytes.
const OBJECTS: usize = 1000;
const OBJECT_SIZE: u64 = 7001;

/// The parent allocates OBJECTS bytearrays, forks; the child allocates as
/// many by the same function, says "child PID" and waits for a line.
const SCRIPT: &str = "import os, sys
def make(n):
    return [bytearray(7000) for _ in range(n)]
print('ready', flush=True)
sys.stdin.readline()
parent = make(1000)
pid = os.fork()
if pid == 0:
    child = make(1000)
    print('child', os.getpid(), flush=True)
    sys.stdin.readline()
    os._exit(0)
os.waitpid(pid, 0)
print('done', flush=True)
sys.stdin.readline()
";

#[test]
fn a_python_fork_childs_objects_have_the_whole_traceback_of_the_parents() {
    // Python alone: the test's own parsing of its 50,000 blocks' traces is
    // not traced too.
    let python3 = std::fs::canonicalize("/usr/bin/python3").expect("python3");
    let tracerd = Tracerd::start(&[
        "--nframe",
        NFRAME,
        "--scope-exe",
        python3.to_str().expect("utf-8"),
    ]);
    let dir = TempDir::new("python-fork");
    let script = dir.path().join("fork.py");
    std::fs::write(&script, SCRIPT).expect("write the script");
    let mut python = Held::spawn(
        Command::new("/usr/bin/python3")
            .arg(&script)
            .env("PYTHONMALLOC", "malloc")
            .env("PYTHONDONTWRITEBYTECODE", "1"),
    );
    python.line_starting("ready");
    let parent = python.pid();
    tracerd.wait_traced(parent);
    settle(&tracerd, parent);
    python.send("go");
    let said = python.line_starting("child ");
    let child: u32 = said["child ".len()..].parse().expect("child pid");
    tracerd.wait_traced(child);
    let objects = |pid: u32| -> Vec<Vec<String>> {
        blocks(&tracerd, pid, "")
            .iter()
            .filter(|b| b.size == OBJECT_SIZE)
            .map(|b| traceback_key(&b.frames))
            .collect()
    };
    let in_parent = objects(parent);
    let in_child = objects(child);
    assert_eq!(in_parent.len(), OBJECTS, "the parent's bytearrays");
    assert_eq!(in_child.len(), OBJECTS, "the child's bytearrays");
    let parents: BTreeSet<&Vec<String>> = in_parent.iter().collect();
    let depths = |tracebacks: &[Vec<String>]| -> BTreeMap<usize, usize> {
        let mut depths = BTreeMap::new();
        for t in tracebacks {
            *depths.entry(t.len()).or_default() += 1;
        }
        depths
    };
    let strangers: Vec<&Vec<String>> = in_child.iter().filter(|t| !parents.contains(t)).collect();
    assert!(
        strangers.is_empty(),
        "{} of the child's {OBJECTS} bytearrays have a traceback the parent's have not: \
         child's depths {:?}, parent's {:?}; the first: {:?}\nthe parent's: {:?}",
        strangers.len(),
        depths(&in_child),
        depths(&in_parent),
        strangers[0],
        parents.iter().next()
    );
    assert_no_cut_walk(&tracerd, child);
    python.send("go");
    python.line_starting("done");
}

#[test]
fn a_fork_childs_3210_blocks_through_a_chain_are_one_traceback_of_that_chain() {
    const BLOCKS: u64 = 3210;
    const SIZE: u64 = 1357;
    let prog = Program::build("fork_chain", &["-O2", "-fomit-frame-pointer"]);
    let tracerd = Tracerd::shared(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    settle(&tracerd, fx.pid());
    fx.go();
    let said = fx.read_line();
    let child: u32 = said
        .strip_prefix("child ")
        .unwrap_or_else(|| panic!("fixture said {said:?}"))
        .parse()
        .expect("child pid");
    tracerd.wait_traced(child);
    let blocks = blocks(&tracerd, child, "");
    let ours: Vec<_> = blocks.into_iter().filter(|b| b.size == SIZE).collect();
    assert_eq!(ours.len() as u64, BLOCKS, "the child's blocks of {SIZE} B");
    let groups = grouped_by_hand(&ours);
    let mut by_depth: BTreeMap<usize, u64> = BTreeMap::new();
    for (key, (_, count)) in &groups {
        *by_depth.entry(key.len()).or_default() += count;
    }
    let src = prog.src();
    let chain: Vec<String> = ["LEAF", "MIDDLE", "TOP", "MAIN"]
        .iter()
        .map(|m| format!("{src}:{}", prog.line(&format!("/* {m} */"))))
        .collect();
    let at_chain = groups
        .iter()
        .filter(|(key, _)| key.len() >= chain.len() && key[..chain.len()] == chain[..])
        .map(|(_, (_, count))| count)
        .sum::<u64>();
    assert!(
        groups.len() == 1 && at_chain == BLOCKS,
        "the child's {BLOCKS} blocks are {} groups by traceback ({at_chain} start with the \
         chain {chain:?}); blocks by frame count: {by_depth:?}",
        groups.len()
    );
    // The served statistics say the same.
    let stats = tracerd.get_ok(&format!(
        "/pid/{child}/statistics?group_by=traceback&limit=0"
    ));
    let stat = stats["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .find(|s| {
            s["traceback"]
                .as_array()
                .is_some_and(|t| traceback_key(t).starts_with(&chain))
        })
        .unwrap_or_else(|| panic!("no statistic at the chain: {stats}"));
    assert_eq!(
        (stat["count"].as_u64(), stat["size"].as_u64()),
        (Some(BLOCKS), Some(BLOCKS * SIZE)),
        "{stat}"
    );
    let functions: Vec<&str> = stat["traceback"]
        .as_array()
        .expect("traceback")
        .iter()
        .take(4)
        .map(function)
        .collect();
    assert_eq!(functions.len(), 4, "{stat}");
    for (got, want) in functions
        .iter()
        .zip(["chain_leaf", "chain_middle", "chain_top", "main"])
    {
        assert!(got.starts_with(want), "{functions:?}");
    }
    assert_no_cut_walk(&tracerd, child);
    fx.go();
    fx.expect_line("done");
    fx.end();
}
