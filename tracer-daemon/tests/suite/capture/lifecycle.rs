//! Processes come and go: an exited process leaves the kernel's maps at
//! once and stays queryable, churn leaves nothing behind, exec starts a new
//! image, and tracing scoped to some processes runs no program for others.

use std::time::Duration;

use serde_json::{Value, json};

use super::build;
use crate::suite::support::{Fixture, Program, Tracerd, poll, stat_at, u64_of};

/// Entries of `pid` in the kernel's live-block map, from GET /maps.
fn kernel_blocks(tracerd: &Tracerd, pid: u32) -> u64 {
    tracerd.maps()["live_allocs_by_pid"][pid.to_string()]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn an_exited_program_leaves_the_maps_within_a_second_and_stays_queryable() {
    let prog = build("exits");
    let line = prog.line("EXIT_ALLOC");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn(&prog.exe, &["1000"]);
    let pid = fx.pid();
    let status = fx.finish();
    assert!(status.success());
    poll(
        Duration::from_secs(1),
        Duration::from_millis(10),
        || match kernel_blocks(&tracerd, pid) {
            0 => Ok(()),
            _ => Err(format!("entries of {pid} still in LIVE_ALLOCS")),
        },
    );
    // The last state of the 50 ms program stays, symbolized after its exit.
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    assert_eq!(process["state"], "exited");
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    let stat = stat_at(&body["statistics"], &prog.source, line).expect("the exited program's line");
    assert_eq!(stat["count"], 1000);
    assert_eq!(stat["size"], 100_000);
}

#[test]
fn process_churn_leaves_no_entries_of_exited_processes() {
    let prog = build("exits");
    let tracerd = Tracerd::start(&[]);
    let mut pids = Vec::new();
    for _ in 0..50 {
        let mut fx = Fixture::spawn(&prog.exe, &["200"]);
        pids.push(fx.pid());
        assert!(fx.finish().success());
    }
    std::thread::sleep(Duration::from_millis(1000));
    let maps = tracerd.maps();
    // Other processes on the host allocate meanwhile; none of ours may stay.
    for pid in &pids {
        let left = &maps["live_allocs_by_pid"][pid.to_string()];
        assert!(
            left.is_null(),
            "pid {pid} still has {left} blocks in LIVE_ALLOCS"
        );
        let process = tracerd.get_ok(&format!("/pid/{pid}"));
        assert_eq!(process["state"], "exited", "{process}");
        assert_eq!(
            process["allocs"].as_u64().map(|n| n >= 200),
            Some(true),
            "{process}"
        );
    }
    let entries = |map: &str| u64_of(&maps["maps"][map], "entries");
    let procs = entries("PROC_SLOTS") + entries("PROCS");
    assert!(
        procs < 200,
        "PROC_SLOTS and PROCS hold {procs} processes after churn"
    );
}

#[test]
fn exec_starts_a_new_image_that_never_mixes_with_the_old_one() {
    let prog = build("exec");
    let tracerd = Tracerd::start(&[]);
    // Its first line is "before", not "ready".
    let mut fx = Fixture::spawn(&prog.exe, &[]);
    fx.expect_line("before");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    let (_, body) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
    let before =
        stat_at(&body["statistics"], &prog.source, prog.line("BEFORE_EXEC")).expect("before");
    assert_eq!(before["count"], 3000);
    let (status, old) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    fx.step("after");
    let body = poll(Duration::from_secs(5), Duration::from_millis(20), || {
        let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0"));
        if status == 200
            && stat_at(&body["statistics"], &prog.source, prog.line("AFTER_EXEC")).is_some()
        {
            Ok(body)
        } else {
            Err(format!("new image not seen: {body}"))
        }
    });
    assert!(
        stat_at(&body["statistics"], &prog.source, prog.line("BEFORE_EXEC")).is_none(),
        "{body}"
    );
    let after = stat_at(&body["statistics"], &prog.source, prog.line("AFTER_EXEC")).expect("after");
    assert_eq!(after["count"], 5);
    assert_eq!(after["size"], 50);
    // The old image's snapshot belongs to the old image only.
    let (status, err) = tracerd.get(&format!("/pid/{pid}/compare?base={}", old["id"]));
    assert_eq!(status, 409, "{err}");
    let (_, list) = tracerd.get(&format!("/pid/{pid}/snapshots"));
    assert_eq!(list["snapshots"], Value::Array(vec![]));
    fx.end();
}

#[test]
fn scoped_tracing_runs_no_program_for_processes_outside_the_scope() {
    let prog = build("keep");
    let churn = build("exits");
    let line = prog.line("ALLOC_SITE");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    let (status, body) = tracerd.put(&format!("/scope?pid={pid}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["attached_pids"], json!([pid]));
    let (_, scope) = tracerd.get("/scope");
    assert_eq!(scope["all_processes"], false, "{scope}");

    // 100000 allocations of a process out of scope: no program runs at all.
    let (allocs, frees) = (tracerd.counter("allocs"), tracerd.counter("frees"));
    let mut other = Fixture::spawn(&churn.exe, &["100000"]);
    assert!(other.finish().success());
    assert_eq!(tracerd.counter("allocs"), allocs);
    assert_eq!(tracerd.counter("frees"), frees);
    let (status, _) = tracerd.get(&format!("/pid/{}", other.pid()));
    assert_eq!(status, 404);

    // The process in scope is traced exactly.
    tracerd.wait_traced(pid);
    let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    fx.step("done");
    let body = tracerd.get_ok(&format!("/pid/{pid}/compare?limit=0"));
    let stat = stat_at(&body["statistics"], &prog.source, line).expect("the allocation site");
    assert_eq!(stat["count_diff"], 20_000);
    assert_eq!(stat["size_diff"], 5_120_000);

    // Back to every process.
    let (status, body) = tracerd.put("/scope");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["all_processes"], true);
    let (status, body) = tracerd.put("/scope?exe=relative/path");
    assert_eq!(status, 400, "{body}");
    fx.end();
}

/// A scope change that takes a process out and back (`PUT /scope?pid=`
/// another, then its own) removes the probes while its threads are inside
/// malloc: those calls' returns are never seen. Each thread's later calls
/// must still be recorded, exactly: four threads churning malloc/free
/// through scope changes, then keeping 1000 blocks of 777 bytes each at one
/// line, show 4000 blocks there. And leaving the scope cleared the
/// process's traces (blocks freed while it was out would be leaks that are
/// not there): its totals are those 4000 blocks, exactly.
#[test]
fn calls_in_flight_when_a_scope_change_removes_their_probes_leave_their_threads_traced() {
    let prog = build("scopeflip");
    let line = prog.line("KEEP_SITE");
    let mut sleeper = std::process::Command::new("sleep")
        .arg("120")
        .spawn()
        .expect("spawn sleep");
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    // Scoped to the fixture, so that the counters are its own.
    let tracerd = Tracerd::start(&["--scope-pid", &pid.to_string()]);
    tracerd.wait_traced(pid);
    let stale = tracerd.counter("stale_inflight");
    // The probes leave on several threads, in no set order: a call is left
    // in flight only when its return probe goes before its entry's, so the
    // scope goes out and back until some call was (at most 8 times).
    let mut flips = 0;
    while flips < 8 && tracerd.counter("stale_inflight") == stale {
        std::thread::sleep(Duration::from_millis(200));
        let (status, body) = tracerd.put(&format!("/scope?pid={}", sleeper.id()));
        assert_eq!(status, 200, "{body}");
        std::thread::sleep(Duration::from_millis(200));
        let (status, body) = tracerd.put(&format!("/scope?pid={pid}"));
        assert_eq!(status, 200, "{body}");
        tracerd.wait_traced(pid);
        flips += 1;
    }
    let nested = tracerd.counter("nested");
    std::thread::sleep(Duration::from_millis(300));
    // Nothing the fixture calls nests: a thread with a call stuck in flight
    // would count every later call here.
    let nested_after = tracerd.counter("nested") - nested;
    fx.step("done");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let stats = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    let stat = stat_at(&stats["statistics"], &prog.source, line)
        .unwrap_or_else(|| panic!("no statistic at line {line}: {stats}"));
    let stale = tracerd.counter("stale_inflight") - stale;
    eprintln!(
        "scope flip: {flips} flips, {stale} stale calls in flight forgotten, \
         {nested_after} nested calls"
    );
    assert_eq!(u64_of(stat, "count"), 4000, "{stat}");
    assert_eq!(u64_of(stat, "size"), 4000 * 777, "{stat}");
    assert!(
        stale > 0,
        "no call was in flight when its probes left: the test saw nothing"
    );
    fx.end();
}

/// A scope of cgroup `/` matches every process, kernel threads included;
/// kernel threads run no allocator, so none is put in scope.
#[test]
fn a_scope_of_the_root_cgroup_takes_no_kernel_thread() {
    let prog = build("keep");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let (status, body) = tracerd.put("/scope?cgroup=/");
    assert_eq!(status, 200, "{body}");
    let (_, scope) = tracerd.get("/scope");
    let pids: Vec<u64> = scope["filter_pids"]
        .as_array()
        .expect("filter_pids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    // kthreadd (pid 2) and every other kernel thread: PF_KTHREAD (0x200000)
    // in the flags of /proc/PID/stat (field 9).
    let kernel_thread = |pid: u64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after
                .split_ascii_whitespace()
                .nth(6)
                .and_then(|f| f.parse::<u64>().ok())
                .is_some_and(|flags| flags & 0x0020_0000 != 0)
        })
    };
    assert!(kernel_thread(2), "pid 2 is kthreadd");
    let kernel: Vec<u64> = pids.iter().copied().filter(|&p| kernel_thread(p)).collect();
    assert!(kernel.is_empty(), "kernel threads in scope: {kernel:?}");
    assert!(pids.contains(&u64::from(fx.pid())), "{scope}");
    let (status, body) = tracerd.put("/scope");
    assert_eq!(status, 200, "{body}");
    fx.end();
}

/// A wide scope change (300 processes given by pid, each its own probes,
/// then every process again) takes seconds, and `/health` answers
/// throughout, each time within 250 ms (it read the probed libraries under
/// the kernel lock, which the change holds: 1.1 to 2.9 s answers before).
#[test]
fn a_wide_scope_change_takes_seconds_and_never_blocks_health() {
    let tracerd = Tracerd::start(&[]);
    let mut sleepers: Vec<std::process::Child> = (0..300)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("300")
                .spawn()
                .expect("spawn sleep")
        })
        .collect();
    let pids: Vec<String> = sleepers.iter().map(|c| format!("pid={}", c.id())).collect();
    let wide = format!("/scope?{}", pids.join("&"));
    let done = std::sync::atomic::AtomicBool::new(false);
    let (took, health) = std::thread::scope(|s| {
        let poller = s.spawn(|| {
            let mut answers = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let start = std::time::Instant::now();
                let (status, _) = tracerd.get("/health");
                answers.push((status, start.elapsed()));
                std::thread::sleep(Duration::from_millis(10));
            }
            answers
        });
        std::thread::sleep(Duration::from_millis(200));
        let start = std::time::Instant::now();
        let (status, body) = tracerd.put(&wide);
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["attached_pids"].as_array().map(Vec::len),
            Some(300),
            "{body}"
        );
        let (status, body) = tracerd.put("/scope");
        assert_eq!(status, 200, "{body}");
        let took = start.elapsed();
        done.store(true, std::sync::atomic::Ordering::Release);
        (took, poller.join().expect("health poller"))
    });
    for sleeper in &mut sleepers {
        let _ = sleeper.kill();
        let _ = sleeper.wait();
    }
    assert!(
        took < Duration::from_secs(30),
        "the scope changes took {took:?}"
    );
    let slow: Vec<_> = health
        .iter()
        .filter(|(status, t)| *status != 200 || *t > Duration::from_millis(250))
        .collect();
    assert!(
        slow.is_empty(),
        "/health during scope changes of {took:?}: {slow:?} of {} answers",
        health.len()
    );
    assert!(health.len() >= 10, "{} answers in {took:?}", health.len());
}

/// A churn of 3,000 short-lived programs, 30 at a time (each lives about
/// 50 ms and allocates 41 blocks): every one is in `/processes`, ended by
/// its exit, within seconds of the last one's end, and no event was lost.
/// (Each ended image cost a pass over the kernel maps, so the handling fell
/// minutes behind: 3 s after such a churn, 1,100 of 3,000 were listed.)
#[test]
fn a_churn_of_3000_short_lived_programs_lists_every_one() {
    let prog = build("short_lived");
    let tracerd = Tracerd::start(&[]);
    let started = std::time::Instant::now();
    let mut pids = Vec::new();
    for _ in 0..100 {
        let mut batch: Vec<std::process::Child> = (0..30)
            .map(|_| {
                std::process::Command::new(&prog.exe)
                    .spawn()
                    .expect("spawn short_lived")
            })
            .collect();
        for child in &mut batch {
            pids.push(child.id());
            assert!(child.wait().expect("wait").success());
        }
    }
    let churn = started.elapsed();
    let listed_after = std::time::Instant::now();
    poll(Duration::from_secs(20), Duration::from_millis(250), || {
        let list = tracerd.get_ok("/processes");
        let listed: std::collections::HashSet<u64> = list["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter(|p| p["comm"] == "short_lived" && p["state"] == "exited")
            .filter_map(|p| p["pid"].as_u64())
            .collect();
        let missing = pids
            .iter()
            .filter(|pid| !listed.contains(&u64::from(**pid)))
            .count();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} of {} programs not listed", pids.len()))
        }
    });
    eprintln!(
        "churn: 3000 programs in {churn:?}, all listed {:?} after the last",
        listed_after.elapsed()
    );
    assert_eq!(tracerd.counter("drop_events"), 0);
}

/// With an event ring of one page (about 30 events), 300 programs that
/// make their first allocation at once (started before tracerd, then let go
/// together) overflow it: the images whose start event was lost are found
/// in the kernel's totals and listed all the same, alive, with their
/// command.
#[test]
fn images_whose_start_the_full_ring_lost_are_listed_from_the_kernel_s_totals() {
    const PROGRAMS: usize = 300;
    let prog = Program::build("keepn", &[]);
    let mut fixtures: Vec<Fixture> = (0..PROGRAMS)
        .map(|_| Fixture::spawn(&prog.exe, &["1"]))
        .collect();
    for fx in &mut fixtures {
        fx.expect_line("ready");
    }
    let tracerd = Tracerd::start(&["--events-ring-bytes", "4096"]);
    for fx in &mut fixtures {
        fx.go();
    }
    for fx in &mut fixtures {
        fx.expect_line("done");
    }
    let pids: Vec<u64> = fixtures.iter().map(|fx| u64::from(fx.pid())).collect();
    poll(Duration::from_secs(15), Duration::from_millis(250), || {
        let list = tracerd.get_ok("/processes");
        let listed: std::collections::HashSet<u64> = list["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter(|p| p["comm"] == "keepn" && p["state"] == "alive")
            .filter_map(|p| p["pid"].as_u64())
            .collect();
        let missing = pids.iter().filter(|pid| !listed.contains(pid)).count();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} of {PROGRAMS} programs not listed"))
        }
    });
    let lost = tracerd.counter("drop_events");
    eprintln!("full ring: {lost} events lost, all {PROGRAMS} programs listed");
    assert!(lost > 0, "the ring never overflowed: the test saw nothing");
    for fx in &mut fixtures {
        assert!(fx.finish().success());
    }
}

#[test]
fn a_fork_child_is_traced_from_its_fork_allocation_or_not_and_inherits_nothing() {
    let prog = build("quietfork");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    let parent = fx.pid();
    fx.go();
    let said = fx.read_line();
    let child: u32 = said
        .strip_prefix("child ")
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("child PID, not {said:?}"));
    // Its image started at the fork: known at once, though the child never
    // allocates, with nothing of the 1000 blocks its parent holds.
    tracerd.wait_traced(child);
    let process = tracerd.get_ok(&format!("/pid/{child}"));
    assert_eq!(
        (
            &process["state"],
            &process["blocks"],
            &process["allocs"],
            &process["current"],
            &process["complete"]
        ),
        (
            &json!("alive"),
            &json!(0),
            &json!(0),
            &json!(0),
            &json!(true)
        ),
        "{process}"
    );
    assert_eq!(process["ppid"], parent, "{process}");
    let listed = tracerd.get_ok("/processes");
    assert!(
        listed["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .any(|p| p["pid"] == child && p["state"] == "alive"),
        "{listed}"
    );
    // The parent keeps its own: the 1000 blocks at their line.
    let lines = tracerd.get_ok(&format!("/pid/{parent}/statistics?group_by=lineno&limit=0"));
    let kept = stat_at(&lines["statistics"], &prog.source, prog.line("KEPT")).expect("KEPT");
    assert_eq!(
        (&kept["count"], &kept["size"]),
        (&json!(1000), &json!(300_000)),
        "{lines}"
    );
    fx.go();
    fx.expect_line("done");
    // The child's exit ends its image: its last state is kept.
    poll(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || match tracerd.get_ok(&format!("/pid/{child}"))["state"].as_str() {
            Some("exited") => Ok(()),
            other => Err(format!("child {child} is {other:?}")),
        },
    );
    fx.end();
}
