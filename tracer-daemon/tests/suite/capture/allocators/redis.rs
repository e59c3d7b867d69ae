//! redis-server under tracerd: starting it, filling it, and reading what it
//! holds as redis counts it (`used_memory`, jemalloc's size classes) and as
//! tracerd does.
use std::{path::Path, process::Command, time::Duration};

use crate::suite::support::{Tracerd, kill_if_running, output_ok, poll};

/// `redis-cli -s socket args...`'s output, trimmed.
pub(super) fn redis_cli(socket: &Path, args: &[&str]) -> String {
    let out = output_ok(Command::new("redis-cli").arg("-s").arg(socket).args(args));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `used_memory` of redis's `INFO memory`, in bytes.
pub(super) fn used_memory(socket: &Path) -> i64 {
    let info = redis_cli(socket, &["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory in {info}"))
}

/// The size jemalloc gives a request of `size` bytes (its size classes on
/// x86-64 with 4 KiB pages: 8, then multiples of 16 up to 128, then four
/// classes per doubling), which is what redis counts in `used_memory`
/// (`zmalloc_size`, `malloc_usable_size`).
pub(super) fn jemalloc_size_class(size: i64) -> i64 {
    match size {
        ..=8 => 8,
        9..=128 => (size + 15) / 16 * 16,
        _ => {
            let k = 63 - i64::from((size - 1).leading_zeros());
            let delta = 1 << (k - 2);
            (size + delta - 1) / delta * delta
        }
    }
}

/// The live blocks of `pid` by traceback: (count, requested bytes, bytes
/// in jemalloc's size classes). The blocks of one traceback are taken to
/// be of one size (their average): true of redis's fixed-size structures
/// and of the test's keys and values, which all have one length (a
/// per-block listing of 300,000 traces takes longer than a request may in
/// the debug build the tests run).
pub(super) fn blocks(tracerd: &Tracerd, pid: u32) -> (i64, i64, i64) {
    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=traceback&limit=0"));
    let (mut count, mut size, mut classes) = (0, 0, 0);
    for stat in body["statistics"].as_array().expect("statistics") {
        let (n, bytes) = (
            stat["count"].as_i64().expect("count"),
            stat["size"].as_i64().expect("size"),
        );
        count += n;
        size += bytes;
        classes += n * jemalloc_size_class(bytes / n.max(1));
    }
    (count, size, classes)
}

/// A server process, killed (by pid) when the test ends, failed or not.
pub(super) struct Server(pub(super) std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        kill_if_running(&mut self.0);
    }
}

/// Starts redis-server on the unix socket `socket`, its data in `dir`,
/// and waits until it answers PING.
pub(super) fn start_redis(socket: &Path, dir: &Path) -> Server {
    let server = Command::new("redis-server")
        .args(["--port", "0", "--save", "", "--appendonly", "no"])
        .arg("--unixsocket")
        .arg(socket)
        .arg("--dir")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start redis-server");
    let server = Server(server);
    poll(Duration::from_secs(10), Duration::from_millis(20), || {
        (socket.exists() && redis_cli(socket, &["PING"]) == "PONG")
            .then_some(())
            .ok_or_else(|| "redis-server not up".to_string())
    });
    server
}

/// Inserts 100,000 known keys into the redis at `socket` by mass insertion
/// (the commands written in `dir`), which must all succeed.
pub(super) fn insert_keys(socket: &Path, dir: &Path) {
    // 100,000 known keys, by mass insertion (RESP on redis-cli --pipe).
    let mut commands = Vec::new();
    for i in 0..100_000 {
        // Keys of 24 bytes and values of 8: the key's copy in the database
        // (an sds: 3 + 24 + 1 bytes) and the value (an embedded string
        // object: 16 + 3 + 8 + 1) are both 28-byte blocks, which redis
        // allocates under one traceback: each traceback's blocks are then
        // of one size (see `blocks`).
        let (key, value) = (
            format!("key:{i:06}:{}", "k".repeat(13)),
            format!("v:{i:06}"),
        );
        commands.extend_from_slice(
            format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
                key.len(),
                value.len()
            )
            .as_bytes(),
        );
    }
    let pipe = dir.join("insert.resp");
    std::fs::write(&pipe, &commands).expect("write the commands");
    let out = output_ok(Command::new("sh").arg("-c").arg(format!(
        "redis-cli -s {} --pipe < {}",
        socket.display(),
        pipe.display()
    )));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("errors: 0, replies: 100000"), "{said}");
    assert_eq!(redis_cli(socket, &["DBSIZE"]), "100001");
}

/// redis's own functions are among the 20 first of `pid`'s statistics by
/// function.
pub(super) fn assert_redis_functions_allocate(tracerd: &Tracerd, pid: u32) {
    let functions = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=function&limit=20"));
    let names: Vec<&str> = functions["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .filter_map(|s| s["label"].as_str())
        .collect();
    let redis_functions = [
        "dictAddRaw",
        "dictAdd",
        "dbAdd",
        "createStringObject",
        "createObject",
        "sdsnewlen",
        "_sdsnewlen",
        "sdsdup",
        "zmalloc",
        "ztrymalloc_usable",
        "_dictExpand",
        "dictExpand",
    ];
    assert!(
        names.iter().any(|n| redis_functions.contains(n)),
        "redis's functions: {names:?}"
    );
}

/// With redis stopped: its blocks read from the kernel maps are exactly
/// those the totals per stack count, and `/maps` finds them in its own spill
/// maps and `LIVE_ALLOCS`. redis goes on after.
pub(super) fn stopped_blocks_are_where_the_maps_say(tracerd: &Tracerd, pid: u32) {
    let signal = |name: &str| {
        output_ok(Command::new("kill").args([name, &pid.to_string()]));
    };
    signal("-STOP");
    let live = blocks(tracerd, pid);
    let (status, taken) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{taken}");
    let id = taken["id"].as_u64().expect("id");
    let stored = tracerd.get_ok(&format!(
        "/snapshots/{id}/statistics?group_by=filename&limit=0"
    ));
    let sum = |field: &str| -> i64 {
        stored["statistics"]
            .as_array()
            .expect("statistics")
            .iter()
            .map(|s| s[field].as_i64().expect("a number"))
            .sum()
    };
    assert_eq!(
        (sum("count"), sum("size")),
        (live.0, live.1),
        "the snapshot's blocks"
    );
    let maps = tracerd.maps();
    let pid_s = pid.to_string();
    assert_eq!(
        maps["live_allocs_by_pid"][&pid_s].as_i64(),
        Some(live.0),
        "{}",
        maps["live_allocs_by_pid"]
    );
    let spilled = &maps["spilled_by_pid"][&pid_s];
    let (own, shared) = (
        spilled["own"].as_i64().expect("own"),
        spilled["shared"].as_i64().expect("shared"),
    );
    eprintln!("redis: {own} blocks in its own spill maps, {shared} in LIVE_ALLOCS");
    assert!(
        own + shared <= live.0 && own + shared >= live.0 - 14,
        "{spilled}"
    );
    assert!(own * 2 >= live.0, "most blocks in its own maps: {spilled}");
    signal("-CONT");
}
