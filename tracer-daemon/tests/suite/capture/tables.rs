//! The kernel's tables of live blocks and of per-process totals: blocks
//! beyond a full fast table spill to `LIVE_ALLOCS` and every free finds
//! them; a process whose slot of `PROC_SLOTS` is taken keeps exact totals in
//! `PROCS`.

use std::{path::Path, time::Duration};

use serde_json::json;

use super::build;
use crate::suite::support::{Fixture, Tracerd, poll, stat_at, u64_of};

/// (allocs, frees, unknown frees, live blocks, current bytes) of `pid`.
fn totals(tracerd: &Tracerd, pid: u32) -> [u64; 5] {
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    ["allocs", "frees", "unknown_frees", "blocks", "current"].map(|f| {
        process[f]
            .as_u64()
            .unwrap_or_else(|| panic!("{f} in {process}"))
    })
}

/// Entries of the fast table and of LIVE_ALLOCS, from GET /maps.
/// Blocks in the fast table, and in the spill (`LIVE_ALLOCS` and the
/// images' own spill maps together).
fn live_entries(tracerd: &Tracerd) -> (u64, u64) {
    let (table, shared, own) = live_places(tracerd);
    (table, shared + own)
}

/// Blocks in the fast table, `LIVE_ALLOCS` and the own spill maps.
fn live_places(tracerd: &Tracerd) -> (u64, u64, u64) {
    let maps = tracerd.maps();
    let entries = |map: &str| u64_of(&maps["maps"][map], "entries");
    (
        entries(tracer_common::MAP_LIVE_KEYS),
        entries(tracer_common::MAP_LIVE_ALLOCS),
        entries(tracer_common::MAP_OWN_LIVE),
    )
}

#[test]
fn blocks_beyond_a_full_fast_table_spill_and_every_free_finds_them() {
    let prog = build("spill");
    let line = prog.line("SPILL_SITE");
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    // The smallest table (2 buckets of 7) and only this process traced:
    // its blocks fill both buckets and the other 2986 spill.
    let pid_s = pid.to_string();
    let tracerd = Tracerd::start(&["--live-table-blocks", "14", "--scope-pid", &pid_s]);
    fx.step("allocated");
    tracerd.wait_traced(pid);
    assert_eq!(totals(&tracerd, pid), [3000, 0, 0, 3000, 144_000]);
    assert_eq!(live_entries(&tracerd), (14, 2986));
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    let stat = stat_at(&body["statistics"], &prog.source, line).expect("the spill site");
    assert_eq!(
        (&stat["count"], &stat["size"]),
        (&3000.into(), &144_000.into())
    );

    fx.step("half");
    assert_eq!(totals(&tracerd, pid), [3000, 1500, 0, 1500, 72_000]);
    let (table, spilled) = live_entries(&tracerd);
    assert_eq!(table + spilled, 1500, "{table} in the table");

    fx.step("freed");
    assert_eq!(totals(&tracerd, pid), [3000, 3000, 0, 0, 0]);
    assert_eq!(live_entries(&tracerd), (0, 0));
    fx.end();
}

/// The levels an image has once `held` blocks went to its own spill maps:
/// a level is asked for when the blocks fill 3/4 of the levels before it
/// (`tracer_common::own_spill`).
fn levels_for(held: u64) -> u32 {
    let mut levels = 1;
    while held > 0 && tracer_common::own_wants_next(levels, held) {
        levels += 1;
    }
    levels
}

/// The capacity of the own spill maps, from GET /maps.
fn own_capacity(tracerd: &Tracerd) -> u64 {
    u64_of(
        &tracerd.maps()["maps"][tracer_common::MAP_OWN_LIVE],
        "capacity",
    )
}

/// Waits until the own spill maps' capacity is `made` (`what` says when,
/// for the failure).
fn wait_own_capacity(tracerd: &Tracerd, made: u64, what: &str) {
    poll(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match own_capacity(tracerd) {
            capacity if capacity == made => Ok(()),
            other => Err(format!("{what}: own spill capacity {other}, not {made}")),
        },
    );
}

#[test]
fn a_process_s_spill_goes_to_maps_of_its_own_that_grow_ahead_of_it_and_every_free_finds_them() {
    let prog = build("ownspill");
    let line = prog.line("OWN_SITE");
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    // The smallest table (2 buckets of 7) and only this process traced.
    let pid_s = pid.to_string();
    let tracerd = Tracerd::start(&["--live-table-blocks", "14", "--scope-pid", &pid_s]);
    fx.step("first");
    tracerd.wait_traced(pid);
    // Nothing spilled yet: no level (level 0 is asked for at the first
    // spilled block; most processes never spill).
    assert_eq!(own_capacity(&tracerd), 0);
    let mut own_blocks = 0;
    for step in 1..=6u64 {
        fx.step("step");
        let spilled = 1 + 1000 * step - 14;
        // Mostly in its own maps: a level is given from the pool as soon
        // as it is asked for, with a quarter of the newest's room left (a
        // few blocks may reach LIVE_ALLOCS when the ask is read late).
        let (table, shared, own) = live_places(&tracerd);
        assert_eq!(
            (table, shared + own),
            (14, spilled),
            "step {step}: every spilled block in the spill, {shared} in LIVE_ALLOCS"
        );
        // The next level is asked for once the blocks in the own maps fill
        // 3/4 of the levels (768, 2,304, 5,376 blocks): wait until it is
        // made before the next step runs.
        own_blocks = own;
        let made = tracer_common::own_levels_blocks(levels_for(own));
        wait_own_capacity(&tracerd, made, &format!("step {step}"));
    }
    // Levels of 1024, 2048, 4096 and (with more than 5,376 of its blocks in
    // them) 8192 blocks.
    assert_eq!(
        own_capacity(&tracerd),
        tracer_common::own_levels_blocks(levels_for(own_blocks))
    );
    assert_eq!(totals(&tracerd, pid), [6001, 0, 0, 6001, 6001 * 48]);
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    let stat = stat_at(&body["statistics"], &prog.source, line).expect("the spill site");
    assert_eq!(
        (&stat["count"], &stat["size"]),
        (&6000.into(), &288_000.into())
    );
    let traces = tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0"));
    assert_eq!(traces["traces"].as_array().map(Vec::len), Some(6001));

    fx.step("half");
    assert_eq!(totals(&tracerd, pid), [6001, 3000, 0, 3001, 3001 * 48]);
    let (table, shared, own) = live_places(&tracerd);
    assert_eq!(table + own + shared, 3001, "{table} in the table");

    assert_eq!(
        tracerd.maps()["spilled_by_pid"][&pid_s],
        json!({"own": own, "shared": shared}),
        "the kernel counts the blocks in the process's own maps and in LIVE_ALLOCS"
    );

    // clear_traces() removes them all, and lowers the kernel's counts of
    // them (else the image would ask for levels early and a read of its
    // blocks would walk LIVE_ALLOCS).
    let (status, body) = tracerd.post(&format!("/pid/{pid}/clear-traces"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(live_places(&tracerd), (0, 0, 0));
    assert_eq!(
        tracerd.maps()["spilled_by_pid"].get(&pid_s),
        None,
        "no count left"
    );
    fx.step("freed");
    // Their frees are unknown now.
    assert_eq!(totals(&tracerd, pid), [6001, 3000, 3001, 0, 0]);
    assert_eq!(live_places(&tracerd), (0, 0, 0));
    fx.end();
    // The ended image's maps are dropped.
    poll(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match own_capacity(&tracerd) {
            0 => Ok(()),
            other => Err(format!("own spill capacity {other} after the exit")),
        },
    );
}

#[test]
fn processes_that_spill_at_once_get_their_levels_together_and_the_kernel_counts_each_block_where_it_is()
 {
    let prog = build("ownspill");
    let mut fxs: Vec<Fixture> = (0..3)
        .map(|_| Fixture::spawn_ready(&prog.exe, &[]))
        .collect();
    let pids: Vec<String> = fxs.iter().map(|fx| fx.pid().to_string()).collect();
    // The smallest table (2 buckets of 7), shared by the three.
    let mut args = vec!["--live-table-blocks", "14"];
    for pid in &pids {
        args.extend(["--scope-pid", pid.as_str()]);
    }
    let tracerd = Tracerd::start(&args);
    // Each step is told to all three before any is waited for: their
    // events come in the same batches, and the levels they ask for go
    // into OWN_LIVE together (one batch update).
    let step_all = |fxs: &mut Vec<Fixture>, line: &str| {
        fxs.iter_mut().for_each(Fixture::go);
        fxs.iter_mut().for_each(|fx| fx.expect_line(line));
    };
    step_all(&mut fxs, "first");
    for fx in &fxs {
        tracerd.wait_traced(fx.pid());
    }
    // Nothing spilled yet: no level (level 0 comes at the first spill).
    assert_eq!(own_capacity(&tracerd), 0);
    for step in 1..=6u64 {
        step_all(&mut fxs, "step");
        // Which of the three holds the table's 14 blocks varies.
        let blocks = 1 + 1000 * step;
        // (A few may reach LIVE_ALLOCS when an ask is read late: the three
        // share two CPUs with tracerd.)
        let (table, shared, own) = live_places(&tracerd);
        assert_eq!(
            (table, shared + own),
            (14, 3 * blocks - 14),
            "step {step}: every spilled block in the spill, {shared} in LIVE_ALLOCS"
        );
        // Each process's levels follow the blocks in its own maps.
        let spilled = tracerd.maps()["spilled_by_pid"].clone();
        let made: u64 = pids
            .iter()
            .map(|pid| {
                let own = spilled[pid]["own"].as_u64().unwrap_or(0);
                tracer_common::own_levels_blocks(levels_for(own))
            })
            .sum();
        wait_own_capacity(&tracerd, made, &format!("step {step}"));
    }
    let spilled = tracerd.maps()["spilled_by_pid"].clone();
    let (_, in_shared, in_own) = live_places(&tracerd);
    let (mut own_total, mut shared_total) = (0, 0);
    for (fx, pid) in fxs.iter().zip(&pids) {
        assert_eq!(totals(&tracerd, fx.pid()), [6001, 0, 0, 6001, 6001 * 48]);
        let count = |place: &str| spilled[pid][place].as_u64().unwrap_or(0);
        let (own, shared) = (count("own"), count("shared"));
        assert!(
            (6001 - 14..=6001).contains(&(own + shared)),
            "{pid}: {own} + {shared} in {spilled}"
        );
        own_total += own;
        shared_total += shared;
    }
    // The kernel's counts are where the blocks are.
    assert_eq!((own_total, shared_total), (in_own, in_shared));
    assert_eq!(own_total + shared_total, 3 * 6001 - 14);
    step_all(&mut fxs, "half");
    step_all(&mut fxs, "freed");
    for fx in &fxs {
        assert_eq!(totals(&tracerd, fx.pid()), [6001, 6001, 0, 0, 0]);
    }
    assert_eq!(live_places(&tracerd), (0, 0, 0));
    for fx in &mut fxs {
        fx.end();
    }
    wait_own_capacity(&tracerd, 0, "after the exits");
}

#[test]
fn processes_that_start_while_the_sweep_walks_millions_of_blocks_keep_their_own_spill_maps() {
    // Every block spills (a table of 14): the sweep walks the big
    // process's 1.5 M blocks in its own maps for about a second, and the
    // small ones' maps are made meanwhile. The sweep once took an image
    // whose maps were made after it began for an ended one, and dropped
    // them while it lived: its blocks in them were lost.
    let big = build("millions");
    let small = build("keepn");
    let tracerd = Tracerd::start(&["--live-table-blocks", "14"]);
    let mut holder = Fixture::spawn_traced(&tracerd, &big.exe, &["1500000"]);
    holder.step("done");
    let before = tracerd.metric("tracer_orphan_sweeps_total");
    let mut started = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // Small processes one after another until two sweeps ended.
    while tracerd.metric("tracer_orphan_sweeps_total") < before + 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no two sweeps in 60 s"
        );
        let mut fx = Fixture::spawn_ready(&small.exe, &["2000"]);
        fx.step("done");
        started.push(fx);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(started.len() >= 10, "{} processes", started.len());
    let spilled = tracerd.maps()["spilled_by_pid"].clone();
    let mut own_total = 0;
    for fx in &started {
        let pid = fx.pid();
        let traces = tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0"));
        let blocks = traces["traces"].as_array().map_or(0, Vec::len);
        // Its 2,000 blocks and the array of pointers.
        assert!(
            (2001..2010).contains(&blocks),
            "pid {pid}: {blocks} blocks read, its spill {}",
            spilled[pid.to_string()]
        );
        own_total += spilled[pid.to_string()]["own"].as_u64().unwrap_or(0);
    }
    let holder_own = spilled[holder.pid().to_string()]["own"]
        .as_u64()
        .unwrap_or(0);
    let (_, _, in_own_maps) = live_places(&tracerd);
    // Every block the kernel counts in own maps is in a map tracerd has
    // (other processes of the host may hold some too).
    assert!(
        in_own_maps >= holder_own + own_total,
        "{in_own_maps} in the own maps, {holder_own} + {own_total} counted"
    );
    for mut fx in started {
        fx.end();
    }
    holder.end();
}

/// Spawns `exe` as a process whose pid is `pid`'s, plus or minus a multiple
/// of PROC_SLOT_COUNT (so that it maps to the same slot of PROC_SLOTS; the
/// nearest that no task holds), by
/// writing the pid before it to `/proc/sys/kernel/ns_last_pid`. Another
/// process may fork in between: then it is tried again.
fn spawn_in_slot_of(exe: &Path, pid: u32) -> Fixture {
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("pid_max is a number");
    let slots = tracer_common::PROC_SLOT_COUNT;
    // A pid of the same slot that no task holds now (a kernel worker may
    // hold the nearest one).
    let target = (1..pid_max / slots)
        .flat_map(|k| [pid.checked_add(k * slots), pid.checked_sub(k * slots)])
        .flatten()
        .find(|t| *t > 300 && *t < pid_max && !Path::new(&format!("/proc/{t}")).exists())
        .expect("a free pid in the slot");
    for _ in 0..20 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (target - 1).to_string())
            .expect("write ns_last_pid (needs root)");
        let mut fx = Fixture::spawn(exe, &[]);
        if fx.pid() == target {
            return fx;
        }
        fx.expect_line("ready");
        fx.step("allocated");
        fx.step("half");
        fx.step("freed");
        fx.end();
    }
    panic!("no process got pid {target} in 20 tries");
}

#[test]
fn a_process_whose_slot_is_taken_has_exact_totals_from_procs() {
    let prog = build("spill");
    let tracerd = Tracerd::start(&[]);
    let mut owner = Fixture::spawn_ready(&prog.exe, &[]);
    owner.step("allocated");
    tracerd.wait_traced(owner.pid());
    let mut other = spawn_in_slot_of(&prog.exe, owner.pid());
    assert_eq!(
        tracer_common::proc_slot_index(other.pid()),
        tracer_common::proc_slot_index(owner.pid())
    );
    other.expect_line("ready");
    other.step("allocated");
    tracerd.wait_traced(other.pid());
    let maps = tracerd.maps();
    let in_procs = maps["maps"]["PROCS"]["entries"].as_u64();
    assert!(in_procs.is_some_and(|n| n >= 1), "{maps}");
    for fx in [&owner, &other] {
        assert_eq!(totals(&tracerd, fx.pid()), [3000, 0, 0, 3000, 144_000]);
    }
    other.step("half");
    assert_eq!(totals(&tracerd, other.pid()), [3000, 1500, 0, 1500, 72_000]);
    owner.step("half");
    assert_eq!(totals(&tracerd, owner.pid()), [3000, 1500, 0, 1500, 72_000]);
    other.step("freed");
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
    owner.step("freed");
    assert_eq!(totals(&tracerd, owner.pid()), [3000, 3000, 0, 0, 0]);
    for mut fx in [other, owner] {
        fx.end();
    }
}
