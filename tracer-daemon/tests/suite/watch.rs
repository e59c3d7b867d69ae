//! tracerd's default, `exact = "demand"`: every process watched cheaply
//! (`/proc/PID/statm`), traced exactly when a query asks for it or when
//! the watch sees it grow steadily, and let go once it stops growing.
//! Processes not traced exactly have no probe at all.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::suite::support::{Fixture, Program, Tracerd, poll, stat_at};

/// The watch made quick enough for a test: a read a second, a window of
/// 3 s, 1 MiB of growth, a process held 10 s.
const QUICK_WATCH: [&str; 10] = [
    "--exact",
    "demand",
    "--watch-interval",
    "1",
    "--auto-exact-window",
    "3",
    "--auto-exact-growth",
    "1048576",
    "--auto-exact-for",
    "10",
];

/// `pid`'s entry of `GET /scope`'s `on_demand`, if any.
fn on_demand(tracerd: &Tracerd, pid: u32) -> Option<Value> {
    let scope = tracerd.get_ok("/scope");
    scope["on_demand"]
        .as_array()
        .expect("on_demand")
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned()
}

/// Whether `pid` has probes of its own (`GET /scope`'s `attached_pids`).
fn attached(tracerd: &Tracerd, pid: u32) -> bool {
    tracerd.get_ok("/scope")["attached_pids"]
        .as_array()
        .expect("attached_pids")
        .iter()
        .any(|p| *p == pid)
}

/// `pid`'s row of `GET /processes`' `watched`.
fn watched(tracerd: &Tracerd, pid: u32) -> Value {
    let list = tracerd.get_ok("/processes");
    assert_eq!(list["exact"], "demand", "{list}");
    list["watched"]
        .as_array()
        .expect("watched")
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("pid {pid} not watched: {list}"))
}

/// A query of a process the default only watches starts its exact
/// tracing, as `tracemalloc.start()` would: the blocks it kept before are
/// not traced, those it allocates after are, exactly; `tracing/stop`
/// detaches its probes again.
#[test]
fn a_query_of_a_watched_process_starts_its_exact_tracing() {
    let prog = Program::build("ondemand", &[]);
    let tracerd = Tracerd::start(&[
        "--exact",
        "demand",
        "--watch-interval",
        "1",
        "--auto-exact",
        "false",
    ]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &["query"]);
    let pid = fx.pid();
    // Watched only: no probe, no image.
    let row = poll(Duration::from_secs(5), Duration::from_millis(50), || {
        let list = tracerd.get_ok("/processes");
        list["watched"]
            .as_array()
            .and_then(|w| w.iter().find(|p| p["pid"] == pid).cloned())
            .ok_or(format!("pid {pid} not watched yet: {list}"))
    });
    assert_eq!(row["exact"], Value::Null, "{row}");
    assert!(row["watch"]["anon"].as_u64().unwrap() > 0, "{row}");
    assert!(!attached(&tracerd, pid));

    // The first query starts it, and says since when.
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let _ = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    let entry = on_demand(&tracerd, pid).expect("traced on demand");
    assert_eq!(entry["reason"], "query", "{entry}");
    assert!(entry["since_ms"].as_u64().unwrap() >= before, "{entry}");
    assert!(attached(&tracerd, pid));
    assert_eq!(watched(&tracerd, pid)["exact"]["reason"], "query");

    fx.step("done");
    let body = poll(Duration::from_secs(5), Duration::from_millis(50), || {
        let (status, body) = tracerd.get(&format!("/pid/{pid}/compare?limit=0"));
        if status == 200
            && stat_at(&body["statistics"], &prog.source, prog.line("AFTER_SITE")).is_some()
        {
            Ok(body)
        } else {
            Err(format!("{status} {body}"))
        }
    });
    let after = stat_at(&body["statistics"], &prog.source, prog.line("AFTER_SITE")).unwrap();
    assert_eq!(after["count_diff"], 5, "{body}");
    assert_eq!(after["size_diff"], 5000, "{body}");
    // Kept before tracing started: not traced.
    assert!(stat_at(&body["statistics"], &prog.source, prog.line("BEFORE_SITE")).is_none());
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    assert_eq!(process["exact"]["reason"], "query", "{process}");
    assert_eq!(process["current"], 5000, "{process}");
    assert!(
        process["watch"]["anon"].as_u64().unwrap() >= 5000,
        "{process}"
    );

    let (status, body) = tracerd.post(&format!("/pid/{pid}/tracing/stop"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(on_demand(&tracerd, pid), None);
    assert!(!attached(&tracerd, pid));
    fx.end();
}

/// A process that grows steadily is traced exactly by the watch within a
/// bounded time, its growth site then shows in `compare`; once it stops
/// growing it is let go after the bound (its probes detached), while a
/// process traced on demand by a query stays traced.
#[test]
fn the_watch_traces_a_growing_process_and_lets_it_go_when_it_stops() {
    let prog = Program::build("ondemand", &[]);
    let tracerd = Tracerd::start(&QUICK_WATCH);
    let mut other = Fixture::spawn_ready(&prog.exe, &["query"]);
    let _ = tracerd.get(&format!("/pid/{}/traced-memory", other.pid()));
    assert_eq!(
        on_demand(&tracerd, other.pid()).expect("queried")["reason"],
        "query"
    );

    let mut fx = Fixture::spawn_ready(&prog.exe, &["grow"]);
    let pid = fx.pid();
    fx.go();
    let grew = Instant::now();
    // Picked once its reads cover the window (3 s) and it gained 1 MiB.
    let entry = poll(Duration::from_secs(12), Duration::from_millis(100), || {
        on_demand(&tracerd, pid).ok_or_else(|| format!("not picked: {}", tracerd.get_ok("/scope")))
    });
    let picked_after = grew.elapsed();
    assert_eq!(entry["reason"], "watch", "{entry}");
    assert!(attached(&tracerd, pid));
    let row = watched(&tracerd, pid);
    assert_eq!(row["exact"]["reason"], "watch", "{row}");
    assert!(
        row["watch"]["anon_growth"].as_i64().unwrap() >= 1 << 20,
        "{row}"
    );

    // Its growth site, exactly: every block there is 64 KiB.
    let body = poll(Duration::from_secs(5), Duration::from_millis(100), || {
        let (status, body) = tracerd.get(&format!("/pid/{pid}/compare?limit=0"));
        match stat_at(&body["statistics"], &prog.source, prog.line("GROW_SITE")) {
            Some(s) if status == 200 && s["count_diff"].as_u64() >= Some(4) => Ok(body.clone()),
            _ => Err(format!("{status} {body}")),
        }
    });
    let site = stat_at(&body["statistics"], &prog.source, prog.line("GROW_SITE")).unwrap();
    assert_eq!(
        site["size_diff"].as_u64().unwrap(),
        65536 * site["count_diff"].as_u64().unwrap(),
        "{site}"
    );
    assert_eq!(
        body["statistics"][0]["traceback"][0]["lineno"],
        prog.line("GROW_SITE")
    );

    // It stops growing: let go 10 s after it was picked, not before.
    fx.step("stopped");
    let stopped = Instant::now();
    poll(
        Duration::from_secs(25),
        Duration::from_millis(200),
        || match on_demand(&tracerd, pid) {
            None => Ok(()),
            Some(entry) => Err(format!("still traced: {entry}")),
        },
    );
    assert!(
        picked_after + stopped.elapsed() >= Duration::from_secs(9),
        "let go before its bound"
    );
    assert!(!attached(&tracerd, pid));
    assert_eq!(watched(&tracerd, pid)["exact"], Value::Null);
    // The process traced on demand by a query stays traced.
    fx.step("done");
    other.step("done");
    let body = poll(Duration::from_secs(5), Duration::from_millis(50), || {
        let (status, body) = tracerd.get(&format!("/pid/{}/compare?limit=0", other.pid()));
        match stat_at(&body["statistics"], &prog.source, prog.line("AFTER_SITE")) {
            Some(_) if status == 200 => Ok(body.clone()),
            _ => Err(format!("{status} {body}")),
        }
    });
    let after = stat_at(&body["statistics"], &prog.source, prog.line("AFTER_SITE")).unwrap();
    assert_eq!(after["count_diff"], 5, "{body}");
    assert_eq!(
        on_demand(&tracerd, other.pid()).expect("still traced")["reason"],
        "query"
    );
    assert!(attached(&tracerd, other.pid()));
    fx.end();
    other.end();
}
