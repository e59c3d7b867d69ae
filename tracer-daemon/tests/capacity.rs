//! The capacities of the in-flight maps (`INFLIGHT_SLOTS`, `INFLIGHT`), of
//! the fast live-block table (`LIVE_KEYS`, `LIVE_VALUES`) and of the
//! process-event ring buffer (`EVENTS`) are configurable: the kernel
//! gets what was configured, `/maps` and `/metrics` say it, and when they
//! fill up tracing degrades with counted drops and never leaves a phantom
//! leak.
mod common;

use std::{
    collections::HashMap,
    process::Command,
    time::{Duration, Instant},
};

use common::{C_PRELUDE, Fixture, TempDir, Tracerd, compile_c};
use serde_json::Value;

fn n(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

/// The BPF maps process `pid` holds, by name: (type, key bytes, value
/// bytes, max_entries), as the kernel has them (bpftool, for the ids in the
/// process's `/proc/PID/fdinfo`).
fn kernel_maps_of(pid: u32) -> HashMap<String, (String, u64, u64, u64)> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .expect("fdinfo")
        .flatten()
    {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        ids.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("map_id:"))
                .filter_map(|v| v.trim().parse::<u32>().ok()),
        );
    }
    ids.sort_unstable();
    ids.dedup();
    let mut maps = HashMap::new();
    for id in ids {
        let out = Command::new("bpftool")
            .args(["-j", "map", "show", "id", &id.to_string()])
            .output()
            .expect("run bpftool (cargo xtask setup installs it)");
        let Ok(map) = serde_json::from_slice::<Value>(&out.stdout) else {
            continue;
        };
        let Some(name) = map["name"].as_str() else {
            continue;
        };
        maps.insert(
            name.to_string(),
            (
                map["type"].as_str().unwrap_or_default().to_string(),
                n(&map, "bytes_key"),
                n(&map, "bytes_value"),
                n(&map, "max_entries"),
            ),
        );
    }
    maps
}

/// The value of the sample `name{labels}` in a Prometheus text exposition.
fn sample(text: &str, name_and_labels: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// An eBPF counter from `GET /maps`.
fn counter(tracerd: &Tracerd, name: &str) -> u64 {
    let (status, maps) = tracerd.get("/maps");
    assert_eq!(status, 200, "{maps}");
    n(&maps["counters"], name)
}

#[test]
fn configured_in_flight_table_and_ring_sizes_are_the_kernels_and_maps_and_metrics_say_them() {
    let tracerd = Tracerd::start(&[
        "--max-inflight",
        "1000",
        "--inflight-slots",
        "2048",
        "--events-ring-bytes",
        "65536",
        "--live-table-blocks",
        "1000",
    ]);
    let kernel = kernel_maps_of(tracerd.pid());
    // 1000 blocks: 143 buckets of 7, rounded up to 256 buckets, 1792 blocks.
    assert_eq!(
        kernel.get(tracer_common::MAP_LIVE_KEYS),
        Some(&("array".to_string(), 4, 64, 256)),
        "{kernel:?}"
    );
    assert_eq!(
        kernel.get(tracer_common::MAP_LIVE_VALUES),
        Some(&("array".to_string(), 4, 32, 1792)),
        "{kernel:?}"
    );
    assert_eq!(
        kernel.get(tracer_common::MAP_INFLIGHT),
        Some(&("hash".to_string(), 8, 24, 1000)),
        "{kernel:?}"
    );
    assert_eq!(
        kernel.get(tracer_common::MAP_INFLIGHT_SLOTS),
        Some(&("array".to_string(), 4, 32, 2048)),
        "{kernel:?}"
    );
    assert_eq!(
        kernel.get(tracer_common::MAP_EVENTS),
        Some(&("ringbuf".to_string(), 0, 0, 65536)),
        "{kernel:?}"
    );

    let (status, maps) = tracerd.get("/maps");
    assert_eq!(status, 200, "{maps}");
    let (_, metrics) = tracerd.get_text("/metrics");
    for (map, capacity) in [
        (tracer_common::MAP_INFLIGHT, 1000),
        (tracer_common::MAP_INFLIGHT_SLOTS, 2048),
        (tracer_common::MAP_EVENTS, 65536),
        (tracer_common::MAP_LIVE_KEYS, 1792),
    ] {
        assert_eq!(n(&maps["maps"][map], "capacity"), capacity, "{maps}");
        assert!(n(&maps["maps"][map], "entries") <= capacity, "{maps}");
        assert_eq!(
            sample(
                &metrics,
                &format!("tracer_bpf_map_max_entries{{map=\"{map}\"}}")
            ),
            Some(capacity),
            "{map}"
        );
        assert!(
            sample(
                &metrics,
                &format!("tracer_bpf_map_entries{{map=\"{map}\"}}")
            )
            .is_some_and(|e| e <= capacity),
            "{map}"
        );
    }
}

#[test]
fn a_ring_size_that_is_not_a_power_of_two_of_pages_is_refused_at_start() {
    // SAFETY: sysconf has no preconditions.
    let three_pages = 3 * unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let out = Command::new(env!("CARGO_BIN_EXE_tracerd"))
        .args(["--events-ring-bytes", &three_pages.to_string()])
        .output()
        .expect("run tracerd");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let bytes = 3 * page;
    assert!(
        stderr.contains(&format!(
            "events_ring_bytes = {bytes} is out of range; valid: a power of two multiple \
             of the page size ({page} bytes), {page}..=1073741824 (bytes)"
        )),
        "{stderr}"
    );
}

/// Eight threads, started before tracing begins and released together,
/// each: 20000 blocks of 24 bytes kept, then each reallocated to 200 bytes
/// (it moves: its neighbours are live, and glibc frees the old chunk
/// itself), then all freed. Nothing stays allocated, and no address of the
/// first round is handed out again by a probed call: a realloc whose old
/// block stayed recorded would stay a leak to the end.
const THREADS_IN_CALLS: &str = r#"
#define THREADS 8
#define ROUNDS 20000
static pthread_barrier_t start;
static void *keep[THREADS][ROUNDS];
static void *work(void *arg) {
    void **mine = keep[(intptr_t)arg];
    pthread_barrier_wait(&start);
    for (int i = 0; i < ROUNDS; i++)
        if (!(mine[i] = malloc(24))) abort();
    for (int i = 0; i < ROUNDS; i++)
        if (!(mine[i] = realloc(mine[i], 200))) abort();
    for (int i = 0; i < ROUNDS; i++)
        free(mine[i]);
    return NULL;
}
int main(void) {
    pthread_t threads[THREADS];
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stdin, NULL, _IONBF, 0);
    pthread_barrier_init(&start, NULL, THREADS + 1);
    for (intptr_t i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, work, (void *)i);
    say("ready");
    wait_go();
    free(malloc(1));
    pthread_barrier_wait(&start);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    say("done");
    wait_go();
    return 0;
}
"#;

#[test]
fn a_full_in_flight_store_counts_drops_and_leaves_no_phantom_leak() {
    let dir = TempDir::new("inflightfull");
    let exe = compile_c(
        dir.path(),
        "threadsincalls",
        &format!("{C_PRELUDE}{THREADS_IN_CALLS}"),
        &["-pthread"],
    );
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    // One slot and one spill entry: a thread that enters an allocator while
    // two others are inside one finds no room. Only this process is probed.
    let tracerd = Tracerd::start(&[
        "--inflight-slots",
        "1",
        "--max-inflight",
        "1",
        "--scope-pid",
        &pid.to_string(),
    ]);
    fx.go();
    fx.expect_line("done");
    tracerd.wait_traced(pid);

    let dropped = counter(&tracerd, "drop_inflight_full");
    assert!(dropped > 0, "no call found both in-flight maps taken");
    let (status, process) = tracerd.get(&format!("/pid/{pid}"));
    assert_eq!(status, 200, "{process}");
    assert!(n(&process, "allocs") > 0, "{process}");
    // Each dropped call is a drop of its process: it says it is incomplete.
    assert!(n(&process, "drops") > 0, "{process}");
    assert!(n(&process, "drops") <= dropped, "{process}");
    assert_eq!(process["complete"], false, "{process}");
    // Everything was freed: no block is left, whatever was dropped (a
    // realloc whose call was dropped takes its old block out at once).
    assert_eq!(n(&process, "blocks"), 0, "{process}");
    assert_eq!(n(&process, "current"), 0, "{process}");
    let (_, stats) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    assert_eq!(
        stats["statistics"].as_array().map(Vec::len),
        Some(0),
        "{stats}"
    );
    let (_, maps) = tracerd.get("/maps");
    assert_eq!(
        maps["live_allocs_by_pid"].get(pid.to_string()),
        None,
        "{maps}"
    );
    let (_, metrics) = tracerd.get_text("/metrics");
    assert!(
        sample(&metrics, "tracer_drops_total{reason=\"inflight_map_full\"}")
            .is_some_and(|v| v >= dropped),
        "tracer_drops_total{{reason=\"inflight_map_full\"}}"
    );
    fx.go();
    assert!(fx.finish().success());
}

/// 400 children forked at once. Each waits at a gate, allocates one block
/// (`100 + i` bytes) and says so; once all have, the parent says
/// `allocated`, and at `go` opens a second gate, where they all exit at once
/// with their block live. So two bursts of 400 process events each: first
/// allocations, then exits. Prints the children's pids, then `done`.
const BURST: &str = r#"
#define CHILDREN 400
int main(void) {
    static pid_t kids[CHILDREN];
    int gate[2], leave[2], told[2];
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stdin, NULL, _IONBF, 0);
    if (pipe(gate) || pipe(leave) || pipe(told)) return 1;
    say("ready");
    wait_go();
    for (int i = 0; i < CHILDREN; i++) {
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            char c = 0;
            close(gate[1]);
            close(leave[1]);
            close(told[0]);
            if (read(gate[0], &c, 1) < 0) _exit(1);
            volatile char *p = malloc(100 + i);
            p[0] = 1;
            if (write(told[1], &c, 1) != 1) _exit(1);
            if (read(leave[0], &c, 1) < 0) _exit(1);
            _exit(0);
        }
        kids[i] = pid;
    }
    close(gate[1]);
    close(told[1]);
    for (int i = 0; i < CHILDREN; i++) {
        char c;
        if (read(told[0], &c, 1) != 1) return 1;
    }
    say("allocated");
    wait_go();
    close(leave[1]);
    for (int i = 0; i < CHILDREN; i++)
        waitpid(kids[i], NULL, 0);
    for (int i = 0; i < CHILDREN; i++)
        printf("%d ", kids[i]);
    printf("\n");
    say("done");
    wait_go();
    return 0;
}
"#;

#[test]
fn a_full_event_ring_counts_lost_events_and_the_sweep_leaves_no_phantom_leak() {
    let dir = TempDir::new("ringfull");
    let source = format!("{C_PRELUDE}#include <sys/wait.h>\n{BURST}");
    let exe = compile_c(dir.path(), "burst", &source, &[]);
    // One page: 36 events of 112 bytes.
    let tracerd = Tracerd::start(&["--events-ring-bytes", "4096"]);
    let mut fx = Fixture::spawn(&exe, &[], &[]);
    fx.expect_line("ready");
    let lost_before = counter(&tracerd, "drop_events");
    fx.go();
    fx.expect_line("allocated");
    // Let tracerd read what reached it of the first burst: those children
    // are known to it, and many of their exits are lost then.
    std::thread::sleep(Duration::from_secs(2));
    let lost_at_exits = counter(&tracerd, "drop_events");
    fx.go();
    let kids: Vec<u32> = fx
        .read_line()
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(kids.len(), 400);
    fx.expect_line("done");
    let lost = counter(&tracerd, "drop_events") - lost_before;
    assert!(
        counter(&tracerd, "drop_events") > lost_at_exits,
        "the burst of exits lost no event"
    );

    // Whether a child's events were lost or not, none of its blocks stays
    // in the kernel's live map (the orphan sweep, every 10 s, removes those
    // of images whose end was lost), and none is listed as alive.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, maps) = tracerd.get("/maps");
        let left: Vec<u32> = kids
            .iter()
            .copied()
            .filter(|pid| maps["live_allocs_by_pid"].get(pid.to_string()).is_some())
            .collect();
        let (_, processes) = tracerd.get("/processes");
        let alive: Vec<u32> = processes["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter(|p| p["state"] == "alive")
            .filter_map(|p| p["pid"].as_u64().map(|pid| pid as u32))
            .filter(|pid| kids.contains(pid))
            .collect();
        if left.is_empty() && alive.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 90 s, {} children still have blocks ({left:?}) and {} are listed alive ({alive:?}); {lost} events lost",
            left.len(),
            alive.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (_, metrics) = tracerd.get_text("/metrics");
    assert!(
        sample(&metrics, "tracer_drops_total{reason=\"event_ring_full\"}")
            .is_some_and(|v| v >= lost),
        "tracer_drops_total{{reason=\"event_ring_full\"}}"
    );
    fx.go();
    assert!(fx.finish().success());
}
