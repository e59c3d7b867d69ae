//! The capacities of the in-flight maps (`INFLIGHT_SLOTS`, `INFLIGHT`), of
//! the fast live-block table (`LIVE_KEYS`, `LIVE_VALUES`) and of the
//! process-event ring buffer (`EVENTS`) are configurable: the kernel
//! gets what was configured, `/maps` and `/metrics` say it, and when they
//! fill up tracing degrades with counted drops and never leaves a phantom
//! leak.

use std::{collections::HashMap, process::Command, time::Duration};

use super::support::{
    Fixture, Program, Tracerd, bpf_ids, bpftool_json, poll, sample, stop_shared, u64_of,
};

/// The BPF maps process `pid` holds, by name: (type, key bytes, value
/// bytes, max_entries), as the kernel has them (bpftool, for the ids in the
/// process's `/proc/PID/fdinfo`).
fn kernel_maps_of(pid: u32) -> HashMap<String, (String, u64, u64, u64)> {
    let mut maps = HashMap::new();
    for (_, id) in bpf_ids(pid).into_iter().filter(|(kind, _)| *kind == "map") {
        let Some(map) = bpftool_json("map", id) else {
            continue;
        };
        let Some(name) = map["name"].as_str() else {
            continue;
        };
        maps.insert(
            name.to_string(),
            (
                map["type"].as_str().unwrap_or_default().to_string(),
                u64_of(&map, "bytes_key"),
                u64_of(&map, "bytes_value"),
                u64_of(&map, "max_entries"),
            ),
        );
    }
    maps
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
    for (map, kind, key, value, max_entries) in [
        (tracer_common::MAP_LIVE_KEYS, "array", 4, 64, 256),
        (tracer_common::MAP_LIVE_VALUES, "array", 4, 32, 1792),
        (tracer_common::MAP_INFLIGHT, "hash", 8, 32, 1000),
        (tracer_common::MAP_INFLIGHT_SLOTS, "array", 4, 40, 2048),
        (tracer_common::MAP_EVENTS, "ringbuf", 0, 0, 65536),
    ] {
        assert_eq!(
            kernel.get(map),
            Some(&(kind.to_string(), key, value, max_entries)),
            "{kernel:?}"
        );
    }

    let maps = tracerd.maps();
    let (_, metrics) = tracerd.get_text("/metrics");
    for (map, capacity) in [
        (tracer_common::MAP_INFLIGHT, 1000),
        (tracer_common::MAP_INFLIGHT_SLOTS, 2048),
        (tracer_common::MAP_EVENTS, 65536),
        (tracer_common::MAP_LIVE_KEYS, 1792),
    ] {
        assert_eq!(u64_of(&maps["maps"][map], "capacity"), capacity, "{maps}");
        assert!(u64_of(&maps["maps"][map], "entries") <= capacity, "{maps}");
        assert_eq!(
            sample(&metrics, "tracer_bpf_map_max_entries", &[("map", map)]),
            Some(capacity as f64),
            "{map}"
        );
        assert!(
            sample(&metrics, "tracer_bpf_map_entries", &[("map", map)])
                .is_some_and(|e| e <= capacity as f64),
            "{map}"
        );
    }
}

#[test]
fn a_ring_size_that_is_not_a_power_of_two_of_pages_is_refused_at_start() {
    // SAFETY: sysconf has no preconditions.
    let three_pages = 3 * unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    stop_shared();
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

#[test]
fn a_full_in_flight_store_counts_drops_and_leaves_no_phantom_leak() {
    let prog = Program::build("threadsincalls", &["-pthread"]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
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
    fx.step("done");
    tracerd.wait_traced(pid);

    let dropped = tracerd.counter("drop_inflight_full");
    assert!(dropped > 0, "no call found both in-flight maps taken");
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    assert!(u64_of(&process, "allocs") > 0, "{process}");
    // Each dropped call is a drop of its process: it says it is incomplete.
    assert!(u64_of(&process, "drops") > 0, "{process}");
    assert!(u64_of(&process, "drops") <= dropped, "{process}");
    assert_eq!(process["complete"], false, "{process}");
    // Everything was freed: no block is left, whatever was dropped (a
    // realloc whose call was dropped takes its old block out at once).
    assert_eq!(u64_of(&process, "blocks"), 0, "{process}");
    assert_eq!(u64_of(&process, "current"), 0, "{process}");
    let (_, stats) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    assert_eq!(
        stats["statistics"].as_array().map(Vec::len),
        Some(0),
        "{stats}"
    );
    let maps = tracerd.maps();
    assert_eq!(
        maps["live_allocs_by_pid"].get(pid.to_string()),
        None,
        "{maps}"
    );
    let counted = tracerd.drops_total("inflight_map_full");
    assert!(counted >= dropped as f64, "{counted} < {dropped}");
    fx.end();
}

#[test]
fn a_full_event_ring_counts_lost_events_and_the_sweep_leaves_no_phantom_leak() {
    let prog = Program::build("burst", &[]);
    // One page: 36 events of 112 bytes.
    let tracerd = Tracerd::start(&["--events-ring-bytes", "4096"]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let lost_before = tracerd.counter("drop_events");
    fx.step("allocated");
    // Let tracerd read what reached it of the first burst: those children
    // are known to it, and many of their exits are lost then.
    std::thread::sleep(Duration::from_secs(2));
    let lost_at_exits = tracerd.counter("drop_events");
    fx.go();
    let kids: Vec<u32> = fx
        .read_line()
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(kids.len(), 400);
    fx.expect_line("done");
    let lost = tracerd.counter("drop_events") - lost_before;
    assert!(
        tracerd.counter("drop_events") > lost_at_exits,
        "the burst of exits lost no event"
    );

    // Whether a child's events were lost or not, none of its blocks stays
    // in the kernel's live map (the orphan sweep, every 10 s, removes those
    // of images whose end was lost), and none is listed as alive.
    poll(Duration::from_secs(90), Duration::from_millis(500), || {
        let maps = tracerd.maps();
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
            return Ok(());
        }
        Err(format!(
            "{} children still have blocks ({left:?}) and {} are listed alive ({alive:?}); {lost} events lost",
            left.len(),
            alive.len()
        ))
    });
    let counted = tracerd.drops_total("event_ring_full");
    assert!(counted >= lost as f64, "{counted} < {lost}");
    fx.end();
}
