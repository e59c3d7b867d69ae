//! Root integration tests: the real tracerd with its real eBPF programs
//! tracing C programs compiled here, checked through the HTTP API with exact
//! sizes, counts and file:line.
mod common;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use common::{C_PRELUDE, Fixture, TempDir, Tracerd, compile_c, line_of, stat_at};
use serde_json::Value;

/// Compiles a fixture whose body is `body`, returning (exe, source path, source).
fn fixture(dir: &TempDir, name: &str, body: &str) -> (PathBuf, PathBuf, String) {
    let source = format!("{C_PRELUDE}{body}");
    let exe = compile_c(dir.path(), name, &source, &["-pthread"]);
    (exe, dir.path().join(format!("{name}.c")), source)
}

const KEEP_20000: &str = r#"
int main(void) {
    void **keep = calloc(20000, sizeof(void *));
    say("ready");
    wait_go();
    for (int i = 0; i < 20000; i++)
        keep[i] = malloc(256); /* ALLOC_SITE */
    say("done");
    wait_go();
    return keep[0] == NULL;
}
"#;

#[test]
fn twenty_thousand_mallocs_at_one_line_show_exactly_in_compare() {
    let dir = TempDir::new("keep20000");
    let (exe, src, source) = fixture(&dir, "keep", KEEP_20000);
    let line = line_of(&source, "ALLOC_SITE");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    let (status, base) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{base}");
    fx.go();
    fx.expect_line("done");

    let (status, body) = tracerd.get(&format!("/pid/{pid}/compare?group_by=lineno&limit=0"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["base"]["kind"], "snapshot");
    assert_eq!(body["base"]["id"], base["id"]);
    let stats = &body["statistics"];
    let top = &stats[0];
    assert_eq!(
        top["traceback"][0]["filename"].as_str(),
        src.to_str(),
        "{top}"
    );
    assert_eq!(top["traceback"][0]["lineno"], line);
    assert_eq!(top["size_diff"], 5_120_000);
    assert_eq!(top["count_diff"], 20_000);
    assert_eq!(top["size"], 5_120_000);
    assert_eq!(top["count"], 20_000);
    let expected = format!(
        "{}:{line}: size=5000 KiB (+5000 KiB), count=20000 (+20000), average=256 B",
        src.display()
    );
    assert_eq!(top["text"], expected);
    // Nothing else changed by more than a few blocks (stdio buffers at most).
    for other in stats.as_array().expect("array").iter().skip(1) {
        assert!(
            other["count_diff"].as_i64().expect("count_diff").abs() <= 2,
            "{other}"
        );
    }

    let (status, text) = tracerd.get_text(&format!(
        "/pid/{pid}/compare?group_by=lineno&limit=1&format=text"
    ));
    assert_eq!(status, 200);
    assert_eq!(text, format!("{expected}\n"));

    let (status, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    assert_eq!(status, 200);
    let current = memory["current"].as_u64().expect("current");
    assert!(current >= 5_120_000 + 160_000, "{memory}");
    assert!(memory["peak"].as_u64().expect("peak") >= current);
    fx.go();
    assert!(fx.finish().success());
}

const ALLOCATORS: &str = r#"
int main(void) {
    say("ready");
    wait_go();
    void *a = calloc(10, 30); /* CALLOC */
    void *b = malloc(100); /* GROW_FROM */
    b = realloc(b, 1000); /* GROW_TO */
    void *c = malloc(1000); /* SHRINK_FROM */
    c = realloc(c, 10); /* SHRINK_TO */
    void *d = realloc(NULL, 777); /* REALLOC_NULL */
    void *e = malloc(555); /* ZERO_FROM */
    void *e2 = realloc(e, 0); /* ZERO_TO */
    void *f = malloc(444); /* FAIL_FROM */
    void *f2 = realloc(f, SIZE_MAX / 2); /* FAIL_TO */
    void *g = reallocarray(NULL, 7, 11); /* REALLOCARRAY */
    void *g2 = reallocarray(NULL, SIZE_MAX, 2); /* REALLOCARRAY_OVERFLOW */
    void *h = NULL;
    int rc = posix_memalign(&h, 64, 640); /* POSIX_MEMALIGN */
    void *h2 = NULL;
    int rc2 = posix_memalign(&h2, 3, 640); /* POSIX_MEMALIGN_EINVAL */
    void *i = aligned_alloc(64, 128); /* ALIGNED_ALLOC */
    void *j = memalign(32, 96); /* MEMALIGN */
    void *k = valloc(200); /* VALLOC */
    void *l = pvalloc(100); /* PVALLOC */
    void *m = calloc(SIZE_MAX, 2); /* CALLOC_OVERFLOW */
    void *n = malloc(300); /* FREED */
    free(n);
    free(NULL);
    printf("%d %d %d %d %d\n", e2 == NULL, f2 == NULL, g2 == NULL, rc, rc2 != 0);
    fflush(stdout);
    say("done");
    wait_go();
    return (a && b && c && d && f && g && h && i && j && k && l && !m) ? 0 : 1;
}
"#;

#[test]
fn every_allocator_records_its_exact_size_and_failures_record_nothing() {
    let dir = TempDir::new("allocators");
    let (exe, src, source) = fixture(&dir, "allocators", ALLOCATORS);
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    fx.go();
    assert_eq!(
        fx.read_line(),
        "1 1 1 0 1",
        "glibc's own results as the test assumes"
    );
    fx.expect_line("done");
    let (status, body) = tracerd.get(&format!("/pid/{pid}/compare?group_by=lineno&limit=0"));
    assert_eq!(status, 200, "{body}");
    let stats = &body["statistics"];
    let expect = |marker: &str, size: i64, count: i64| {
        let line = line_of(&source, &format!("/* {marker} */"));
        match stat_at(stats, &src, line) {
            Some(stat) => {
                assert_eq!(
                    (stat["size_diff"].as_i64(), stat["count_diff"].as_i64()),
                    (Some(size), Some(count)),
                    "{marker} at line {line}: {stat}"
                );
            }
            None => assert_eq!(
                (size, count),
                (0, 0),
                "{marker} at line {line} missing in {stats}"
            ),
        }
    };
    expect("CALLOC", 300, 1);
    expect("GROW_FROM", 0, 0);
    expect("GROW_TO", 1000, 1);
    expect("SHRINK_FROM", 0, 0);
    expect("SHRINK_TO", 10, 1);
    expect("REALLOC_NULL", 777, 1);
    expect("ZERO_FROM", 0, 0);
    expect("ZERO_TO", 0, 0);
    expect("FAIL_FROM", 444, 1);
    expect("FAIL_TO", 0, 0);
    expect("REALLOCARRAY", 77, 1);
    expect("REALLOCARRAY_OVERFLOW", 0, 0);
    expect("POSIX_MEMALIGN", 640, 1);
    expect("POSIX_MEMALIGN_EINVAL", 0, 0);
    expect("ALIGNED_ALLOC", 128, 1);
    expect("MEMALIGN", 96, 1);
    expect("VALLOC", 200, 1);
    expect("PVALLOC", 4096, 1);
    expect("CALLOC_OVERFLOW", 0, 0);
    expect("FREED", 0, 0);
    fx.go();
    assert!(fx.finish().success());
}

const THREADS: &str = r#"
#define PER_THREAD 5000
static void *blocks[4][PER_THREAD];
static pthread_barrier_t barrier;
static void *worker(void *arg) {
    long t = (long)arg;
    for (int i = 0; i < PER_THREAD; i++)
        blocks[t][i] = malloc((size_t)(t + 1) * 16); /* THREAD_ALLOC */
    pthread_barrier_wait(&barrier);
    /* Free half of the next thread's blocks: frees cross threads. */
    long u = (t + 1) % 4;
    for (int i = 0; i < PER_THREAD / 2; i++)
        free(blocks[u][i]);
    return NULL;
}
int main(void) {
    pthread_t threads[4];
    say("ready");
    wait_go();
    pthread_barrier_init(&barrier, NULL, 4);
    for (long t = 0; t < 4; t++)
        pthread_create(&threads[t], NULL, worker, (void *)t);
    for (int t = 0; t < 4; t++)
        pthread_join(threads[t], NULL);
    say("done");
    wait_go();
    return 0;
}
"#;

#[test]
fn four_threads_freeing_across_threads_give_exact_totals() {
    let dir = TempDir::new("threads");
    let (exe, src, source) = fixture(&dir, "threads", THREADS);
    let line = line_of(&source, "THREAD_ALLOC");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    let (_, before) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    fx.go();
    fx.expect_line("done");
    let (status, body) = tracerd.get(&format!("/pid/{pid}/compare?group_by=lineno&limit=0"));
    assert_eq!(status, 200, "{body}");
    let stat = stat_at(&body["statistics"], &src, line).expect("the worker's malloc line");
    // 2500 live blocks per thread, of 16, 32, 48 and 64 bytes.
    assert_eq!(stat["count_diff"], 10_000, "{stat}");
    assert_eq!(stat["size_diff"], 2500 * (16 + 32 + 48 + 64), "{stat}");
    assert_eq!(stat["count"], 10_000);
    let (_, after) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    let (before, after) = (
        before["current"].as_i64().expect("n"),
        after["current"].as_i64().expect("n"),
    );
    // Thread start-up allocates a little of its own (TLS), freed at join or kept.
    let grew = after - before;
    assert!(
        (400_000..400_000 + 8192).contains(&grew),
        "current grew by {grew}"
    );
    fx.go();
    assert!(fx.finish().success());
}

const CHAIN: &str = r#"
__attribute__((noinline)) static void *make_block(size_t n) {
    return malloc(n); /* MAKE_BLOCK */
}
__attribute__((noinline)) static void *grow(size_t n) {
    void *p = make_block(n * 2); /* GROW */
    return p;
}
int main(void) {
    say("ready");
    wait_go();
    void *p = grow(1234); /* MAIN */
    say("done");
    wait_go();
    return p == NULL;
}
"#;

/// Runs `exe` (a fixture that says ready, allocates on go, says done)
/// under `tracerd`, and returns it (waiting for its last go) with the
/// frames of its traceback of `size` bytes (statistics by traceback).
fn traceback_of_size(tracerd: &Tracerd, exe: &std::path::Path, size: u64) -> (Fixture, Vec<Value>) {
    let mut fx = Fixture::spawn(exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    fx.go();
    fx.expect_line("done");
    let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
    assert_eq!(status, 200, "{body}");
    let stat = body["statistics"]
        .as_array()
        .expect("array")
        .iter()
        .find(|s| s["size"] == size)
        .unwrap_or_else(|| panic!("no {size}-byte block in {body}"));
    let frames = stat["traceback"].as_array().expect("frames").clone();
    (fx, frames)
}

#[test]
fn traceback_grouping_shows_the_whole_caller_chain() {
    let dir = TempDir::new("chain");
    let (exe, src, source) = fixture(&dir, "chain", CHAIN);
    let tracerd = Tracerd::start(&[]);
    let (mut fx, frames) = traceback_of_size(&tracerd, &exe, 2468);
    let got: Vec<(Option<&str>, u64, Option<&str>)> = frames
        .iter()
        .take(3)
        .map(|f| {
            (
                f["filename"].as_str(),
                f["lineno"].as_u64().unwrap_or(0),
                f["function"].as_str(),
            )
        })
        .collect();
    let file = src.to_str();
    assert_eq!(
        got,
        vec![
            (
                file,
                u64::from(line_of(&source, "MAKE_BLOCK")),
                Some("make_block")
            ),
            (file, u64::from(line_of(&source, "GROW */")), Some("grow")),
            (file, u64::from(line_of(&source, "MAIN */")), Some("main")),
        ]
    );
    assert!(
        frames[0]["module"]
            .as_str()
            .is_some_and(|m| m.ends_with("/chain")),
        "{frames:?}"
    );
    assert!(frames[0]["address"].as_u64().is_some());
    fx.go();
    assert!(fx.finish().success());
}

/// 24 recursive calls whose frames hold 300 bytes each: the chain spans
/// several pages of stack.
const DEEP: &str = r#"
__attribute__((noinline)) static void *deep(int n) {
    volatile char pad[300];
    pad[0] = (char)n;
    if (n == 0)
        return malloc(4321); /* DEEP_ALLOC */
    void *p = deep(n - 1); /* DEEP_CALL */
    return pad[0] >= 0 ? p : NULL;
}
int main(void) {
    say("ready");
    wait_go();
    void *p = deep(24); /* DEEP_MAIN */
    say("done");
    wait_go();
    return p == NULL;
}
"#;

#[test]
fn a_deep_chain_of_large_frames_is_walked_to_main() {
    let dir = TempDir::new("deep");
    let (exe, src, source) = fixture(&dir, "deep", DEEP);
    // The largest nframe: its programs load, and its walk goes to main.
    let tracerd = Tracerd::start(&["--nframe", "64"]);
    let (mut fx, frames) = traceback_of_size(&tracerd, &exe, 4321);
    let got: Vec<(Option<&str>, u64)> = frames
        .iter()
        .take(26)
        .map(|f| (f["filename"].as_str(), f["lineno"].as_u64().unwrap_or(0)))
        .collect();
    let file = src.to_str();
    let mut want = vec![(file, u64::from(line_of(&source, "DEEP_ALLOC")))];
    want.extend([(file, u64::from(line_of(&source, "DEEP_CALL"))); 24]);
    want.push((file, u64::from(line_of(&source, "DEEP_MAIN"))));
    assert_eq!(got, want);
    fx.go();
    assert!(fx.finish().success());
}

const EXITS: &str = r#"
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    for (int i = 0; i < n; i++)
        if (!malloc(100)) /* EXIT_ALLOC */
            return 1;
    usleep(50 * 1000);
    return 0;
}
"#;

/// Entries of `pid` in the kernel's live-block map, from GET /maps.
fn kernel_blocks(tracerd: &Tracerd, pid: u32) -> u64 {
    let (status, maps) = tracerd.get("/maps");
    assert_eq!(status, 200, "{maps}");
    maps["live_allocs_by_pid"][pid.to_string()]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn an_exited_program_leaves_the_maps_within_a_second_and_stays_queryable() {
    let dir = TempDir::new("exits");
    let (exe, src, source) = fixture(&dir, "exits", EXITS);
    let line = line_of(&source, "EXIT_ALLOC");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn(&exe, &["1000"], &[]);
    let pid = fx.pid();
    let status = fx.finish();
    let exited_at = Instant::now();
    assert!(status.success());
    loop {
        if kernel_blocks(&tracerd, pid) == 0 {
            break;
        }
        assert!(
            exited_at.elapsed() < Duration::from_secs(1),
            "entries of {pid} still in LIVE_ALLOCS"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The last state of the 50 ms program stays, symbolized after its exit.
    let (status, process) = tracerd.get(&format!("/pid/{pid}"));
    assert_eq!(status, 200, "{process}");
    assert_eq!(process["state"], "exited");
    let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    assert_eq!(status, 200, "{body}");
    let stat = stat_at(&body["statistics"], &src, line).expect("the exited program's line");
    assert_eq!(stat["count"], 1000);
    assert_eq!(stat["size"], 100_000);
}

#[test]
fn process_churn_leaves_no_entries_of_exited_processes() {
    let dir = TempDir::new("churn");
    let (exe, _, _) = fixture(&dir, "churn", EXITS);
    let tracerd = Tracerd::start(&[]);
    let mut pids = Vec::new();
    for _ in 0..50 {
        let mut fx = Fixture::spawn(&exe, &["200"], &[]);
        pids.push(fx.pid());
        assert!(fx.finish().success());
    }
    std::thread::sleep(Duration::from_millis(1000));
    let (_, maps) = tracerd.get("/maps");
    // Other processes on the host allocate meanwhile; none of ours may stay.
    for pid in &pids {
        let left = &maps["live_allocs_by_pid"][pid.to_string()];
        assert!(
            left.is_null(),
            "pid {pid} still has {left} blocks in LIVE_ALLOCS"
        );
        let (status, process) = tracerd.get(&format!("/pid/{pid}"));
        assert_eq!(status, 200, "{process}");
        assert_eq!(process["state"], "exited", "{process}");
        assert_eq!(
            process["allocs"].as_u64().map(|n| n >= 200),
            Some(true),
            "{process}"
        );
    }
    let entries = |map: &str| {
        maps["maps"][map]["entries"]
            .as_u64()
            .unwrap_or_else(|| panic!("{map} entries: {maps}"))
    };
    let procs = entries("PROC_SLOTS") + entries("PROCS");
    assert!(
        procs < 200,
        "PROC_SLOTS and PROCS hold {procs} processes after churn"
    );
}

/// 3000 blocks of 48 bytes kept, then every other one freed, then the
/// rest. stdin and stdout are unbuffered so that stdio allocates nothing.
const SPILL: &str = r#"
int main(void) {
    static void *keep[3000];
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stdin, NULL, _IONBF, 0);
    say("ready");
    wait_go();
    for (int i = 0; i < 3000; i++)
        keep[i] = malloc(48); /* SPILL_SITE */
    say("allocated");
    wait_go();
    for (int i = 0; i < 3000; i += 2)
        free(keep[i]);
    say("half");
    wait_go();
    for (int i = 1; i < 3000; i += 2)
        free(keep[i]);
    say("freed");
    wait_go();
    return 0;
}
"#;

/// (allocs, frees, unknown frees, live blocks, current bytes) of `pid`.
fn totals(tracerd: &Tracerd, pid: u32) -> [u64; 5] {
    let (status, process) = tracerd.get(&format!("/pid/{pid}"));
    assert_eq!(status, 200, "{process}");
    ["allocs", "frees", "unknown_frees", "blocks", "current"].map(|f| {
        process[f]
            .as_u64()
            .unwrap_or_else(|| panic!("{f} in {process}"))
    })
}

/// Entries of the fast table and of LIVE_ALLOCS, from GET /maps.
fn live_entries(tracerd: &Tracerd) -> (u64, u64) {
    let (_, maps) = tracerd.get("/maps");
    let entries = |map: &str| {
        maps["maps"][map]["entries"]
            .as_u64()
            .unwrap_or_else(|| panic!("{map} in {maps}"))
    };
    (
        entries(tracer_common::MAP_LIVE_KEYS),
        entries(tracer_common::MAP_LIVE_ALLOCS),
    )
}

#[test]
fn blocks_beyond_a_full_fast_table_spill_and_every_free_finds_them() {
    let dir = TempDir::new("spill");
    let (exe, src, source) = fixture(&dir, "spill", SPILL);
    let line = line_of(&source, "SPILL_SITE");
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    // The smallest table (2 buckets of 7) and only this process traced:
    // its blocks fill both buckets and the other 2986 spill.
    let pid_s = pid.to_string();
    let tracerd = Tracerd::start(&["--live-table-blocks", "14", "--scope-pid", &pid_s]);
    fx.go();
    fx.expect_line("allocated");
    tracerd.wait_traced(pid);
    assert_eq!(totals(&tracerd, pid), [3000, 0, 0, 3000, 144_000]);
    assert_eq!(live_entries(&tracerd), (14, 2986));
    let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    assert_eq!(status, 200, "{body}");
    let stat = stat_at(&body["statistics"], &src, line).expect("the spill site");
    assert_eq!(
        (&stat["count"], &stat["size"]),
        (&3000.into(), &144_000.into())
    );

    fx.go();
    fx.expect_line("half");
    assert_eq!(totals(&tracerd, pid), [3000, 1500, 0, 1500, 72_000]);
    let (table, spilled) = live_entries(&tracerd);
    assert_eq!(table + spilled, 1500, "{table} in the table");

    fx.go();
    fx.expect_line("freed");
    assert_eq!(totals(&tracerd, pid), [3000, 3000, 0, 0, 0]);
    assert_eq!(live_entries(&tracerd), (0, 0));
    fx.go();
    assert!(fx.finish().success());
}

/// Spawns `exe` as a process whose pid is `pid`'s, plus or minus a multiple
/// of PROC_SLOT_COUNT (so that it maps to the same slot of PROC_SLOTS), by
/// writing the pid before it to `/proc/sys/kernel/ns_last_pid`. Another
/// process may fork in between: then it is tried again.
fn spawn_in_slot_of(exe: &std::path::Path, pid: u32) -> Fixture {
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("pid_max is a number");
    let slots = tracer_common::PROC_SLOT_COUNT;
    let target = if pid + slots < pid_max {
        pid + slots
    } else {
        pid - slots
    };
    for _ in 0..20 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (target - 1).to_string())
            .expect("write ns_last_pid (needs root)");
        let mut fx = Fixture::spawn(exe, &[], &[]);
        if fx.pid() == target {
            return fx;
        }
        fx.expect_line("ready");
        fx.go();
        fx.expect_line("allocated");
        fx.go();
        fx.expect_line("half");
        fx.go();
        fx.expect_line("freed");
        fx.go();
        assert!(fx.finish().success());
    }
    panic!("no process got pid {target} in 20 tries");
}

#[test]
fn a_process_whose_slot_is_taken_has_exact_totals_from_procs() {
    let dir = TempDir::new("slots");
    let (exe, _, _) = fixture(&dir, "slots", SPILL);
    let tracerd = Tracerd::start(&[]);
    let mut owner = Fixture::spawn(&exe, &[], &[]);
    owner.expect_line("ready");
    owner.go();
    owner.expect_line("allocated");
    tracerd.wait_traced(owner.pid());
    let mut other = spawn_in_slot_of(&exe, owner.pid());
    assert_eq!(
        tracer_common::proc_slot_index(other.pid()),
        tracer_common::proc_slot_index(owner.pid())
    );
    other.expect_line("ready");
    other.go();
    other.expect_line("allocated");
    tracerd.wait_traced(other.pid());
    let (_, maps) = tracerd.get("/maps");
    let in_procs = maps["maps"]["PROCS"]["entries"].as_u64();
    assert!(in_procs.is_some_and(|n| n >= 1), "{maps}");
    for fx in [&owner, &other] {
        assert_eq!(totals(&tracerd, fx.pid()), [3000, 0, 0, 3000, 144_000]);
    }
    other.go();
    other.expect_line("half");
    assert_eq!(totals(&tracerd, other.pid()), [3000, 1500, 0, 1500, 72_000]);
    owner.go();
    owner.expect_line("half");
    assert_eq!(totals(&tracerd, owner.pid()), [3000, 1500, 0, 1500, 72_000]);
    other.go();
    other.expect_line("freed");
    assert_eq!(totals(&tracerd, other.pid()), [3000, 3000, 0, 0, 0]);
    // reset_peak in both places: the owner's slot and the other's entry.
    for (fx, current) in [(&owner, 72_000), (&other, 0)] {
        let (status, peak) = tracerd.post(&format!("/pid/{}/reset-peak", fx.pid()));
        assert_eq!(status, 200, "{peak}");
        assert_eq!(
            (&peak["current"], &peak["peak"]),
            (&current.into(), &current.into())
        );
    }
    owner.go();
    owner.expect_line("freed");
    assert_eq!(totals(&tracerd, owner.pid()), [3000, 3000, 0, 0, 0]);
    for mut fx in [other, owner] {
        fx.go();
        assert!(fx.finish().success());
    }
}

const EXEC: &str = r#"
int main(int argc, char **argv) {
    if (argc > 1) {
        for (int i = 0; i < 5; i++)
            malloc(10); /* AFTER_EXEC */
        say("after");
        wait_go();
        return 0;
    }
    for (int i = 0; i < 3000; i++)
        malloc(100); /* BEFORE_EXEC */
    say("before");
    wait_go();
    execl("/proc/self/exe", argv[0], "again", (char *)NULL);
    return 1;
}
"#;

#[test]
fn exec_starts_a_new_image_that_never_mixes_with_the_old_one() {
    let dir = TempDir::new("exec");
    let (exe, src, source) = fixture(&dir, "exec", EXEC);
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("before");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    let (_, body) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    let before =
        stat_at(&body["statistics"], &src, line_of(&source, "BEFORE_EXEC")).expect("before");
    assert_eq!(before["count"], 3000);
    let (status, old) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    fx.go();
    fx.expect_line("after");
    let deadline = Instant::now() + Duration::from_secs(5);
    let body = loop {
        let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
        if status == 200
            && stat_at(&body["statistics"], &src, line_of(&source, "AFTER_EXEC")).is_some()
        {
            break body;
        }
        assert!(Instant::now() < deadline, "new image not seen: {body}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        stat_at(&body["statistics"], &src, line_of(&source, "BEFORE_EXEC")).is_none(),
        "{body}"
    );
    let after = stat_at(&body["statistics"], &src, line_of(&source, "AFTER_EXEC")).expect("after");
    assert_eq!(after["count"], 5);
    assert_eq!(after["size"], 50);
    // The old image's snapshot belongs to the old image only.
    let (status, err) = tracerd.get(&format!("/pid/{pid}/compare?base={}", old["id"]));
    assert_eq!(status, 409, "{err}");
    let (_, list) = tracerd.get(&format!("/pid/{pid}/snapshots"));
    assert_eq!(list["snapshots"], Value::Array(vec![]));
    fx.go();
    assert!(fx.finish().success());
}

#[test]
fn tracerd_never_traces_itself_and_stops_cleanly_on_sigterm() {
    let mut tracerd = Tracerd::start(&[]);
    // Make tracerd allocate a lot: symbolization and JSON of every process.
    for _ in 0..5 {
        let (status, _) = tracerd.get("/processes");
        assert_eq!(status, 200);
    }
    let (status, body) = tracerd.get(&format!("/pid/{}", tracerd.pid()));
    assert_eq!(status, 404, "{body}");
    let (clean, took) = tracerd.terminate();
    assert!(clean, "tracerd did not exit 0 on SIGTERM");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn bad_requests_get_a_4xx_that_names_the_valid_values() {
    let tracerd = Tracerd::start(&[]);
    let cases: [(&str, u16, &str); 8] = [
        ("/pid/abc/statistics", 400, "pid is a positive integer"),
        (
            "/pid/1/statistics?group_by=line",
            400,
            "group_by is one of: filename, lineno, traceback",
        ),
        (
            "/pid/1/statistics?cumulative=yes",
            400,
            "cumulative is one of: true, false, 1, 0",
        ),
        (
            "/pid/1/statistics?limit=-3",
            400,
            "limit is a whole number >= 0 (0 means all)",
        ),
        (
            "/pid/1/statistics?format=xml",
            400,
            "format is one of: json, text",
        ),
        (
            "/pid/1/statistics?bogus=1",
            400,
            "valid parameters: group_by, cumulative, limit, format",
        ),
        (
            "/pid/4000000/statistics",
            404,
            "GET /processes lists the traced pids",
        ),
        ("/nope", 404, "GET /health"),
    ];
    for (path, status, hint) in cases {
        let (got, body) = tracerd.get(path);
        assert_eq!(got, status, "{path}: {body}");
        assert!(
            body["hint"].as_str().is_some_and(|h| h.contains(hint)),
            "{path}: {body}"
        );
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{path}: {body}"
        );
    }
}

/// 600 distinct callers of one allocation site: 600 distinct stacks.
fn many_callers_source() -> String {
    let mut body = String::from(
        "__attribute__((noinline)) static void *alloc_here(void) {\n    return malloc(48); /* MANY_SITE */\n}\n",
    );
    for i in 0..600 {
        body.push_str(&format!(
            "__attribute__((noinline)) static void *caller{i}(void) {{ return alloc_here(); }}\n"
        ));
    }
    body.push_str("int main(void) {\n    say(\"ready\");\n    wait_go();\n");
    for i in 0..600 {
        body.push_str(&format!("    if (!caller{i}()) return 1;\n"));
    }
    body.push_str("    say(\"done\");\n    wait_go();\n    return 0;\n}\n");
    body
}

#[test]
fn blocks_whose_stack_was_not_stored_keep_their_exact_call_site() {
    let dir = TempDir::new("manystacks");
    let (exe, src, source) = fixture(&dir, "many", &many_callers_source());
    let line = line_of(&source, "MANY_SITE");
    // Room for 256 stacks only: most of the 600 cannot be stored.
    let tracerd = Tracerd::start(&["--max-stacks", "256"]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    fx.go();
    fx.expect_line("done");
    let (_, maps) = tracerd.get("/maps");
    let dropped = maps["counters"]["drop_stack"].as_u64().expect("drop_stack");
    assert!(
        dropped >= 600 - 256,
        "only {dropped} stacks dropped: {maps}"
    );
    let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    assert_eq!(status, 200, "{body}");
    let stat = stat_at(&body["statistics"], &src, line).expect("the allocation site");
    assert_eq!(stat["count"], 600, "{stat}");
    assert_eq!(stat["size"], 600 * 48);
    fx.go();
    assert!(fx.finish().success());
}

/// 150 distinct stacks freed at once, then the last of them again (the same
/// call instructions: the same stack), kept; pinned to CPU 0 so the second
/// allocation meets that CPU's cache of the last stack stored.
fn collected_stacks_source() -> String {
    let mut body = String::from(
        "__attribute__((noinline)) static void *alloc_here(void) {\n    return malloc(48); /* GC_SITE */\n}\n",
    );
    for i in 0..150 {
        body.push_str(&format!(
            "__attribute__((noinline)) static void *caller{i}(void) {{ return alloc_here(); }}\n"
        ));
    }
    body.push_str(
        "int main(void) {\n    cpu_set_t one;\n    CPU_ZERO(&one);\n    CPU_SET(0, &one);\n    \
         if (sched_setaffinity(0, sizeof one, &one)) return 2;\n    say(\"ready\");\n    wait_go();\n",
    );
    for i in 0..149 {
        body.push_str(&format!("    free(caller{i}());\n"));
    }
    // One call instruction for both allocations of caller149: one stack.
    body.push_str(
        "    void *kept = NULL;\n    for (int round = 0; round < 2; round++) {\n        \
         void *p = caller149();\n        if (round == 1) { kept = p; break; }\n        \
         free(p);\n        say(\"freed\");\n        wait_go();\n    }\n",
    );
    body.push_str("    say(\"kept\");\n    wait_go();\n    return kept == NULL;\n}\n");
    body
}

#[test]
fn a_stack_collected_by_the_sweep_is_stored_again_by_its_next_allocation() {
    let dir = TempDir::new("gcstacks");
    let source = format!("#include <sched.h>\n{}", collected_stacks_source());
    let (exe, src, source) = fixture(&dir, "gcstacks", &source);
    let line = line_of(&source, "GC_SITE");
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    // Only this process, and room for 256 stacks: the sweep collects
    // unreferenced stacks once more than 128 are stored.
    let scope = pid.to_string();
    let tracerd = Tracerd::start(&["--scope-pid", &scope, "--max-stacks", "256"]);
    fx.go();
    fx.expect_line("freed");
    let stacks = |tracerd: &Tracerd| {
        let (_, maps) = tracerd.get("/maps");
        maps["maps"]["STACKS"]["entries"]
            .as_u64()
            .expect("STACKS entries")
    };
    assert!(stacks(&tracerd) >= 150, "{}", stacks(&tracerd));
    // The sweep runs every 10 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while stacks(&tracerd) >= 150 {
        assert!(
            std::time::Instant::now() < deadline,
            "no stack collected in 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    fx.go();
    fx.expect_line("kept");
    let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
    assert_eq!(status, 200, "{body}");
    let stat = stat_at(&body["statistics"], &src, line).expect("the kept block");
    assert_eq!(stat["count"], 1, "{stat}");
    // alloc_here <- caller149 <- main: the whole stack, not the call site alone.
    let functions: Vec<&str> = stat["traceback"]
        .as_array()
        .expect("traceback")
        .iter()
        .take(3)
        .map(|f| f["function"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(functions, ["alloc_here", "caller149", "main"], "{stat}");
    fx.go();
    assert!(fx.finish().success());
}

fn put(tracerd: &Tracerd, path: &str) -> (u16, Value) {
    let r = tracerd
        .client
        .put(format!("{}{path}", tracerd.base))
        .send()
        .expect("PUT");
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

fn counter(tracerd: &Tracerd, name: &str) -> u64 {
    let (_, maps) = tracerd.get("/maps");
    maps["counters"][name].as_u64().expect("counter")
}

#[test]
fn scoped_tracing_runs_no_program_for_processes_outside_the_scope() {
    let dir = TempDir::new("scope");
    let (exe, src, source) = fixture(&dir, "keep", KEEP_20000);
    let (churn, _, _) = fixture(&dir, "churn", EXITS);
    let line = line_of(&source, "ALLOC_SITE");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    let (status, body) = put(&tracerd, &format!("/scope?pid={pid}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["attached_pids"], serde_json::json!([pid]));
    let (_, scope) = tracerd.get("/scope");
    assert_eq!(scope["all_processes"], false, "{scope}");

    // 100000 allocations of a process out of scope: no program runs at all.
    let (allocs, frees) = (counter(&tracerd, "allocs"), counter(&tracerd, "frees"));
    let mut other = Fixture::spawn(&churn, &["100000"], &[]);
    assert!(other.finish().success());
    assert_eq!(counter(&tracerd, "allocs"), allocs);
    assert_eq!(counter(&tracerd, "frees"), frees);
    let (status, _) = tracerd.get(&format!("/pid/{}", other.pid()));
    assert_eq!(status, 404);

    // The process in scope is traced exactly.
    tracerd.wait_traced(pid);
    let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    fx.go();
    fx.expect_line("done");
    let (status, body) = tracerd.get(&format!("/pid/{pid}/compare?limit=0"));
    assert_eq!(status, 200, "{body}");
    let stat = stat_at(&body["statistics"], &src, line).expect("the allocation site");
    assert_eq!(stat["count_diff"], 20_000);
    assert_eq!(stat["size_diff"], 5_120_000);

    // Back to every process.
    let (status, body) = put(&tracerd, "/scope");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["all_processes"], true);
    let (status, body) = put(&tracerd, "/scope?exe=relative/path");
    assert_eq!(status, 400, "{body}");
    fx.go();
    assert!(fx.finish().success());
}

const SAMPLED: &str = r#"
int main(void) {
    say("ready");
    wait_go();
    for (int i = 0; i < 100000; i++) if (!malloc(32)) return 1; /* SMALL */
    for (int i = 0; i < 20000; i++) if (!malloc(1000)) return 1; /* MEDIUM */
    for (int i = 0; i < 200; i++) if (!malloc(100000)) return 1; /* LARGE */
    say("done");
    wait_go();
    return 0;
}
"#;

/// (count, size) per marker line of SAMPLED, compared with the start of tracing.
fn sampled_run(extra: &[&str], dir: &TempDir) -> Vec<(f64, f64)> {
    let (exe, src, source) = fixture(dir, "sampled", SAMPLED);
    let tracerd = Tracerd::start(extra);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    fx.go();
    fx.expect_line("done");
    // Sampled, a process is first seen at its first sampled allocation: the
    // loops above make sure there is one.
    tracerd.wait_traced(pid);
    let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    assert_eq!(status, 200, "{body}");
    let figures = ["SMALL", "MEDIUM", "LARGE"]
        .iter()
        .map(|marker| {
            let line = line_of(&source, &format!("/* {marker} */"));
            let stat = stat_at(&body["statistics"], &src, line)
                .unwrap_or_else(|| panic!("no statistic at {marker}: {body}"));
            (
                stat["count"].as_f64().expect("count"),
                stat["size"].as_f64().expect("size"),
            )
        })
        .collect();
    fx.go();
    assert!(fx.finish().success());
    figures
}

#[test]
fn sampling_estimates_are_within_the_stated_error_of_an_exact_run() {
    let dir = TempDir::new("sampling");
    let exact = sampled_run(&[], &dir);
    assert_eq!(
        exact,
        vec![
            (100_000.0, 3_200_000.0),
            (20_000.0, 20_000_000.0),
            (200.0, 20_000_000.0)
        ]
    );
    // Mean interval 8 KiB: about 390, 2440 and 200 samples at the three
    // sites; the bounds are about 4 standard deviations of each estimate.
    let sampled = sampled_run(&["--sample-interval", "8192"], &dir);
    for ((site, bound), ((count, size), (exact_count, exact_size))) in
        [("SMALL", 0.20), ("MEDIUM", 0.08), ("LARGE", 0.02)]
            .iter()
            .zip(sampled.iter().zip(&exact))
    {
        let count_error = (count - exact_count).abs() / exact_count;
        let size_error = (size - exact_size).abs() / exact_size;
        eprintln!(
            "sampling {site}: count {count} ({count_error:.3}), size {size} ({size_error:.3})"
        );
        assert!(
            count_error <= *bound,
            "{site}: count {count} vs {exact_count} ({count_error:.3} > {bound})"
        );
        assert!(
            size_error <= *bound,
            "{site}: size {size} vs {exact_size} ({size_error:.3} > {bound})"
        );
    }
}
