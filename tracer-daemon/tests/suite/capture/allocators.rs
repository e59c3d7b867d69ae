//! Allocators found per object (`lifecycle::allocators`), with no flag:
//! programs linked with Debian's libjemalloc, gperftools' libtcmalloc and
//! libmimalloc, musl (dynamic and static), a static glibc program, C++ on
//! jemalloc's own `operator new`, a program in its own root with its own
//! copy of glibc (as in a container), and Debian's redis-server. Each
//! block is recorded once, with its exact size, at its line.
//!
//! A process whose allocator is new to tracerd is traced from the moment
//! its object is probed, shortly after exec: each fixture says "ready"
//! and waits until tracerd lists the object it allocates with as probed,
//! then allocates.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use reqwest::Method;
use serde_json::Value;

use crate::suite::support::{
    Fixture, Program, TempDir, Tracerd, cgroup_v2, kill_if_running, poll, stat_at,
};

mod redis;

use redis::{
    assert_redis_functions_allocate, blocks, insert_keys, jemalloc_size_class, redis_cli,
    start_redis, stopped_blocks_are_where_the_maps_say, used_memory,
};

/// Each `(marker, count, size)`: the `count` and `size` of the statistic
/// at the marker's line (none at all for 0 and 0).
pub(super) fn expect(prog: &Program, stats: &Value, what: &str, sites: &[(&str, i64, i64)]) {
    expect_at(stats, &prog.source, |marker| prog.line(marker), what, sites);
}

/// [`expect`] for the file `source`, whose line holding a marker
/// (`/* NAME */`) `line` gives.
pub(super) fn expect_at(
    stats: &Value,
    source: &Path,
    line: impl Fn(&str) -> u32,
    what: &str,
    sites: &[(&str, i64, i64)],
) {
    for &(marker, count, size) in sites {
        let line = line(&format!("/* {marker} */"));
        let got = stat_at(stats, source, line).map(|s| (s["count"].as_i64(), s["size"].as_i64()));
        let want = (count != 0).then_some((Some(count), Some(size)));
        assert_eq!(got, want, "{what}: {marker} at line {line} in {stats}");
    }
}

/// The C API's sites of `fixtures/allocator_libs.c` after "go".
pub(super) const C_API: &[(&str, i64, i64)] = &[
    // 100 blocks of 1000 bytes, every other one freed.
    ("LIB_MALLOC", 50, 50 * 1000),
    ("LIB_CALLOC", 50, 50 * 300),
    ("LIB_GROW_FROM", 0, 0),
    ("LIB_GROW_TO", 40, 40 * 5000),
    ("LIB_MEMALIGN", 30, 30 * 640),
    ("LIB_ALIGNED", 20, 20 * 2560),
];

/// The family tracerd gives the probed object at `path` (`GET /health`),
/// compared with symlinks resolved.
pub(super) fn family_of(tracerd: &Tracerd, path: &Path) -> Option<String> {
    let health = tracerd.get_ok("/health");
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    health["libraries"].as_array()?.iter().find_map(|l| {
        let probed = PathBuf::from(l["path"].as_str()?);
        let probed = std::fs::canonicalize(&probed).unwrap_or(probed);
        (probed == canonical).then(|| l["family"].as_str().unwrap_or_default().to_string())
    })
}

/// Waits until tracerd probes `object` (`GET /health` lists it).
pub(super) fn wait_probed(tracerd: &Tracerd, object: &Path) {
    poll(Duration::from_secs(10), Duration::from_millis(10), || {
        family_of(tracerd, object)
            .map(|_| ())
            .ok_or_else(|| format!("{} not probed", object.display()))
    });
}

/// Runs `fx` (said "ready", pid `pid`) once `object` (its allocator) is
/// probed, until "done"; returns its statistics by line (`limit=0`).
fn run_probed(tracerd: &Tracerd, fx: &mut Fixture, pid: u32, object: &Path) -> Value {
    wait_probed(tracerd, object);
    fx.step("done");
    // Its first allocation's event reaches tracerd's registry soon after.
    tracerd.wait_traced(pid);
    tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"))["statistics"].clone()
}

#[test]
fn jemalloc_tcmalloc_and_mimalloc_programs_are_traced_exactly() {
    let tracerd = Tracerd::start(&[]);
    for (flags, library, family) in [
        (
            &["-ljemalloc", "-DJEMALLOC"][..],
            "libjemalloc.so.2",
            "jemalloc",
        ),
        (&["-ltcmalloc"], "libtcmalloc.so.4", "tcmalloc"),
        (&["-lmimalloc"], "libmimalloc.so.2", "mimalloc"),
    ] {
        let prog = Program::build("allocator_libs", flags);
        let lib = Path::new("/usr/lib/x86_64-linux-gnu").join(library);
        let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
        let pid = fx.pid();
        let stats = run_probed(&tracerd, &mut fx, pid, &lib);
        expect(&prog, &stats, library, C_API);
        if family == "jemalloc" {
            expect(
                &prog,
                &stats,
                library,
                &[
                    ("JE_MALLOCX", 25, 25 * 3000),
                    ("JE_RALLOC_FROM", 0, 0),
                    ("JE_RALLOC_TO", 15, 15 * 7000),
                    ("JE_SDALLOC", 0, 0),
                    ("JE_DALLOC", 0, 0),
                ],
            );
        }
        assert_eq!(
            family_of(&tracerd, &lib).as_deref(),
            Some(family),
            "{library}"
        );
        // The library replaces glibc's allocator: every traced byte is its.
        let memory = tracerd.get_ok(&format!("/pid/{pid}/traced-memory"));
        let current = memory["current"].as_i64().expect("current");
        let sources = by_source(&tracerd, pid);
        assert_eq!(sources.len(), 1, "{library}: {memory}");
        assert_eq!(
            (sources[0].0.as_str(), sources[0].1),
            (family, current),
            "{library}: {memory}"
        );
        fx.end();
    }
}

/// `GET /pid/{pid}/traced-memory`'s `by_source`: source → (current, peak).
pub(super) fn by_source(tracerd: &Tracerd, pid: u32) -> Vec<(String, i64, i64)> {
    let memory = tracerd.get_ok(&format!("/pid/{pid}/traced-memory"));
    let sources = memory["by_source"].as_object().expect("by_source");
    sources
        .iter()
        .map(|(name, totals)| {
            let field = |f: &str| totals[f].as_i64().expect("bytes");
            (name.clone(), field("current"), field("peak"))
        })
        .collect()
}

#[test]
fn each_block_keeps_its_source_in_one_process_with_two_allocators() {
    // glibc's malloc for the C API, a dlopen'ed mimalloc's mi_malloc beside
    // it: every block says which allocator it came from, and filters and
    // totals by source split the process exactly.
    let tracerd = Tracerd::start(&[]);
    let prog = Program::build("allocator_libs", &["-DMIXED", "-ldl"]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    let mimalloc = Path::new("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2");
    let all = run_probed(&tracerd, &mut fx, pid, mimalloc);
    expect(&prog, &all, "glibc", C_API);
    expect(&prog, &all, "mimalloc", &[("MIX_MI", 12, 12 * 4321)]);
    let stats = |query: &str| {
        tracerd.get_ok(&format!(
            "/pid/{pid}/statistics?group_by=lineno&limit=0&{query}"
        ))["statistics"]
            .clone()
    };
    // Only mimalloc's: its one line.
    let only = stats("allocator=mimalloc");
    assert_eq!(only.as_array().map(Vec::len), Some(1), "{only}");
    expect(&prog, &only, "mimalloc only", &[("MIX_MI", 12, 12 * 4321)]);
    // Without mimalloc's: glibc's lines, none of mimalloc's.
    let rest = stats("exclude_allocator=mimalloc");
    expect(&prog, &rest, "glibc only", C_API);
    expect(&prog, &rest, "glibc only", &[("MIX_MI", 0, 0)]);
    assert_eq!(stats("allocator=glibc"), rest);
    assert_eq!(stats("allocator=jemalloc"), serde_json::json!([]));
    // Each trace says its source.
    let traces = tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0&allocator=mimalloc"));
    let traces = traces["traces"].as_array().expect("traces");
    assert_eq!(traces.len(), 12);
    assert!(
        traces
            .iter()
            .all(|t| t["source"] == "mimalloc" && t["size"] == 4321),
        "{traces:?}"
    );
    // A stored snapshot keeps each trace's source, and so does tracer's
    // file: dumped and loaded back, mimalloc's 12 traces are still its.
    let (status, snap) = tracerd.post(&format!("/pid/{pid}/snapshots?label=mixed"));
    assert_eq!(status, 201, "{snap}");
    let id = snap["id"].as_u64().expect("id");
    let (status, file) = tracerd.get_bytes(&format!("/snapshots/{id}/dump"));
    assert_eq!(status, 200);
    let (status, loaded) = tracerd.send(Method::POST, "/snapshots?label=mixed-file", Some(file));
    assert_eq!(status, 201, "{loaded}");
    for stored in [id, loaded["id"].as_u64().expect("id")] {
        let traces = tracerd.get_ok(&format!(
            "/snapshots/{stored}/traces?limit=0&allocator=mimalloc"
        ));
        let traces = traces["traces"].as_array().expect("traces");
        assert_eq!(traces.len(), 12, "snapshot {stored}");
        assert!(traces.iter().all(|t| t["source"] == "mimalloc"));
    }
    // The kernel's totals by source add up to the process's, and
    // mimalloc's are exactly its blocks (nothing was freed: peak = current).
    let memory = tracerd.get_ok(&format!("/pid/{pid}/traced-memory"));
    let sources = by_source(&tracerd, pid);
    let names: Vec<&str> = sources.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["glibc", "mimalloc"], "{memory}");
    assert_eq!(sources[1], ("mimalloc".into(), 12 * 4321, 12 * 4321));
    let glibc_bytes: i64 = rest
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| s["size"].as_i64().expect("size"))
        .sum();
    assert_eq!(sources[0].1, glibc_bytes, "{memory}");
    assert_eq!(
        sources[0].1 + sources[1].1,
        memory["current"].as_i64().expect("current")
    );
    // An unknown source is a 400 that names the valid ones.
    let (status, err) = tracerd.get(&format!("/pid/{pid}/statistics?allocator=dlmalloc"));
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"], "invalid allocator \"dlmalloc\"");
    assert_eq!(
        err["hint"],
        "allocator is a block's source: one of unknown, glibc, musl, jemalloc, tcmalloc, mimalloc, malloc, mmap; repeat it for more"
    );
    fx.end();
}

#[test]
fn a_50_ms_program_on_an_installed_allocator_is_traced_from_its_first_allocation() {
    // libjemalloc is probed when tracerd starts, before any process maps
    // it: a program that links it is traced from its first allocation, even
    // one that lives 50 ms and waits for nothing.
    let tracerd = Tracerd::start(&["--probe-installed-allocators", "true"]);
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
    wait_probed(&tracerd, lib);
    let health = tracerd.get_ok("/health");
    let entry = health["libraries"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["family"] == "jemalloc"))
        .cloned()
        .expect("libjemalloc listed");
    assert_eq!(entry["found_in"], Value::Null, "probed at start: {entry}");
    let prog = Program::build("short_lived", &["-ljemalloc"]);
    let started = std::time::Instant::now();
    let mut child = Command::new(&prog.exe).spawn().expect("spawn");
    let pid = child.id();
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    let lived = started.elapsed();
    assert!(lived < Duration::from_millis(500), "it lived {lived:?}");
    // Its image ended; tracerd keeps it, symbolized.
    let stats = poll(Duration::from_secs(10), Duration::from_millis(50), || {
        let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
        if status == 200 && body["process"]["state"] == "exited" {
            Ok(body)
        } else {
            Err(format!("{status} {body}"))
        }
    });
    expect(
        &prog,
        &stats["statistics"],
        "a 50 ms program",
        &[("SHORT_FIRST", 1, 777), ("SHORT_LOOP", 40, 80_000)],
    );
}

#[test]
fn musl_and_static_programs_are_traced_exactly() {
    let tracerd = Tracerd::start(&[]);
    for (compiler, flags, family) in [
        ("musl-gcc", &[][..], "musl"),
        ("musl-gcc", &["-static"][..], "musl"),
        ("cc", &["-static"][..], "glibc"),
    ] {
        let what = format!("{compiler} {flags:?}");
        let prog = Program::build_with(compiler, "allocator_libs.c", flags);
        // The object probed: musl's libc.so (its dynamic loader too), or
        // the static executable itself.
        let object = if flags.is_empty() {
            PathBuf::from("/lib/ld-musl-x86_64.so.1")
        } else {
            prog.exe.clone()
        };
        let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
        let pid = fx.pid();
        let stats = run_probed(&tracerd, &mut fx, pid, &object);
        expect(&prog, &stats, &what, C_API);
        assert_eq!(
            family_of(&tracerd, &object).as_deref(),
            Some(family),
            "{what}"
        );
        fx.end();
    }
}

#[test]
fn cpp_new_and_delete_of_jemalloc_are_traced_exactly() {
    let tracerd = Tracerd::start(&[]);
    let prog = Program::build_with("g++", "allocators_cpp.cpp", &["-ljemalloc"]);
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    let stats = run_probed(&tracerd, &mut fx, pid, lib);
    expect(
        &prog,
        &stats,
        "jemalloc's operator new",
        &[
            ("CPP_NEW", 50, 50 * 48),
            ("CPP_NEW_ARRAY", 30, 30 * 3000),
            ("CPP_ALIGNED", 20, 20 * 640),
            ("CPP_NOTHROW", 20, 20 * 900),
        ],
    );
    fx.end();
}

/// The host pid of the process `unshare --fork` started (its only child).
fn child_of(pid: u32) -> u32 {
    poll(Duration::from_secs(5), Duration::from_millis(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| format!("no child of {pid} yet"))
    })
}

/// A root with a copy of the host's glibc and dynamic loader (other
/// inodes: what a container's image holds) and `exe` as `/prog`.
fn rootfs(exe: &Path) -> TempDir {
    let root = TempDir::new("rootfs");
    for (from, to) in [
        (
            "/lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/libc.so.6",
        ),
        ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
    ] {
        let to = root.path().join(to);
        std::fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
        std::fs::copy(from, &to).expect("copy the C library");
    }
    std::fs::copy(exe, root.path().join("prog")).expect("copy the program");
    root
}

#[test]
fn a_program_in_its_own_root_with_its_own_glibc_is_traced_exactly() {
    let tracerd = Tracerd::start(&[]);
    let prog = Program::build("allocator_libs", &[]);
    let root = rootfs(&prog.exe);
    let root_str = root.path().to_str().expect("utf-8");
    // chroot (the host's, on the host's glibc) execs /prog in new mount
    // and pid namespaces.
    let mut fx = Fixture::spawn(
        Path::new("unshare"),
        &["--mount", "--pid", "--fork", "chroot", root_str, "/prog"],
    );
    fx.expect_line("ready");
    let pid = child_of(fx.pid());
    // The copy is an object of its own; tracerd names it by its host path.
    let copied = root.path().join("lib/x86_64-linux-gnu/libc.so.6");
    let stats = run_probed(&tracerd, &mut fx, pid, &copied);
    expect(&prog, &stats, "its own glibc", C_API);
    assert_eq!(family_of(&tracerd, &copied).as_deref(), Some("glibc"));
    // chroot's own blocks ended with its image: none is left on the pid.
    let files = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=filename&limit=0"));
    for stat in files["statistics"].as_array().expect("statistics") {
        let file = stat["traceback"][0]["filename"]
            .as_str()
            .unwrap_or_default();
        assert!(
            !file.contains("chroot") && file != "<unknown>",
            "a block of the old image: {stat}"
        );
    }
    // Its pid in its own namespace is 1 (unshare's first child), and its
    // cgroup is the test's.
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    assert_eq!(process["nspid"], 1, "{process}");
    assert_eq!(process["cgroup"], cgroup_v2(pid), "{process}");
    fx.end();
}

#[test]
fn redis_server_growth_is_within_five_percent_of_its_used_memory() {
    assert_eq!(jemalloc_size_class(24), 32);
    assert_eq!(jemalloc_size_class(129), 160);
    assert_eq!(jemalloc_size_class(1025), 1280);
    // The smallest fast table (2 buckets of 7): redis's blocks go to the
    // spill, its own spill maps growing as they come.
    let tracerd = Tracerd::start(&["--live-table-blocks", "14"]);
    let dir = TempDir::new("redis");
    let socket = dir.path().join("redis.sock");
    let mut server = start_redis(&socket, dir.path());
    let pid = server.0.id();
    wait_probed(
        &tracerd,
        Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    );
    // A command, to have it traced (its first allocation seen).
    redis_cli(&socket, &["SET", "warm", "up"]);
    tracerd.wait_traced(pid);
    let (used_before, before) = (used_memory(&socket), blocks(&tracerd, pid));
    insert_keys(&socket, dir.path());
    let used = used_memory(&socket) - used_before;
    let after = blocks(&tracerd, pid);
    let (count, requested, classes) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    // redis counts what jemalloc gives (the size class), tracer what was
    // asked for, as tracemalloc does: the same blocks, in size classes,
    // must be redis's growth.
    let ratio = classes as f64 / used as f64;
    eprintln!(
        "redis: {count} blocks, {requested} B requested, {classes} B in size classes; used_memory grew {used} B ({ratio:.4})"
    );
    // 3 blocks or more per key; the blocks counted before may include a
    // client connection's buffers that redis frees meanwhile (a run counted
    // 12 fewer blocks, 34 KB less, with the same used_memory growth).
    assert!(count >= 300_000 - 100, "3 blocks or more per key: {count}");
    assert!(
        (0.95..=1.05).contains(&ratio),
        "traced growth {classes} B in size classes ({requested} B requested), used_memory growth {used} B: {ratio:.4}"
    );
    assert_redis_functions_allocate(&tracerd, pid);

    // Stopped, redis holds still: its blocks read from the kernel maps (a
    // stored snapshot reads the fast table, its own spill maps and, if it
    // has blocks there, LIVE_ALLOCS) are exactly those the totals per
    // stack count, and /maps finds them in those places.
    stopped_blocks_are_where_the_maps_say(&tracerd, pid);
    kill_if_running(&mut server.0);
}
