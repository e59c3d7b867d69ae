//! `tracer ps`, `stat`, `snapshot`, `diff`, `top` and `load` on
//! `fixtures/keep.c`: exact bytes and blocks at its lines, the API's JSON
//! as it is, and tracerd's error messages.

use std::{
    io::{BufRead as _, BufReader},
    process::Stdio,
    time::Duration,
};

use serde_json::Value;

use super::{KEEP_BLOCKS, KEEP_BYTES, finish, keep_done, tracer};
use crate::suite::support::{
    Fixture, Program, TempDir, Tracerd, kill_if_running, poll, signal, snapshot_ids,
};

#[test]
fn tracer_ps_lists_the_fixture_with_its_exact_current_bytes_over_tcp_and_the_socket() {
    let socket_dir = TempDir::new("cli-socket");
    let socket = socket_dir.path().join("api.sock");
    let (_keep, tracerd, fx) = keep_done(&["--unix-socket", socket.to_str().expect("utf-8")]);
    let pid = fx.pid().to_string();
    let row = vec![
        pid.clone(),
        "keep".to_string(),
        KEEP_BYTES.to_string(),
        KEEP_BYTES.to_string(),
        KEEP_BLOCKS.to_string(),
    ];
    let over_tcp = finish(&mut tracer(&tracerd, &["ps", "--bytes"]));
    let over_socket = finish(
        super::bare_tracer()
            .args(["ps", "--bytes", "--socket"])
            .arg(&socket),
    );
    for ran in [over_tcp, over_socket] {
        assert!(ran.status.success(), "{}", ran.stderr);
        let rows = ran.rows();
        // (A NOTE column follows when a process of the host lost events.)
        assert_eq!(
            rows[0][..5],
            ["PID", "COMMAND", "CURRENT", "PEAK", "BLOCKS"],
            "{}",
            ran.stdout
        );
        assert_eq!(
            rows.iter()
                .filter(|r| r.first() == Some(&pid))
                .collect::<Vec<_>>(),
            [&row],
            "{}",
            ran.stdout
        );
    }
    // Without --bytes, as tracemalloc prints sizes.
    let human = finish(&mut tracer(&tracerd, &["ps"])).ok();
    assert!(
        human
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == [pid.as_str(), "keep", "5164", "KiB", "5164", "KiB", "20003"]),
        "{human}"
    );
}

#[test]
fn tracer_ps_all_lists_the_ended_images_after_the_live_ones() {
    let exits = Program::build("exits", &[]);
    let execs = Program::build("exec", &[]);
    let tracerd = Tracerd::start(&[]);
    // One process that exited; one pid with two images, before and after
    // its exec.
    let mut gone = Fixture::spawn(&exits.exe, &["5"]);
    let gone_pid = gone.pid().to_string();
    assert!(gone.finish().success());
    let mut twice = Fixture::spawn(&execs.exe, &[]);
    twice.expect_line("before");
    twice.go();
    twice.expect_line("after");
    let twice_pid = twice.pid().to_string();
    tracerd.wait_traced(twice.pid());
    poll(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match tracerd.get(&format!("/pid/{gone_pid}")) {
            (200, body) if body["state"] == "exited" => Ok(()),
            (status, body) => Err(format!("{status} {body}")),
        },
    );
    let live = finish(&mut tracer(&tracerd, &["ps", "--bytes"]));
    assert!(live.status.success(), "{}", live.stderr);
    assert!(
        !live.rows().iter().any(|r| r.first() == Some(&gone_pid)),
        "{}",
        live.stdout
    );
    let all = finish(&mut tracer(&tracerd, &["ps", "--all", "--bytes"]));
    assert!(all.status.success(), "{}", all.stderr);
    let rows = all.rows();
    assert_eq!(
        rows[0][..6],
        ["PID", "COMMAND", "CURRENT", "PEAK", "BLOCKS", "STATE"],
        "{}",
        all.stdout
    );
    // Live ones first.
    let state = |row: &Vec<String>| row.get(5).cloned().unwrap_or_default();
    let first_ended = rows[1..]
        .iter()
        .position(|r| state(r) != "alive")
        .expect("an ended image");
    assert!(
        rows[1 + first_ended..].iter().all(|r| state(r) != "alive"),
        "{}",
        all.stdout
    );
    let of = |pid: &str| -> Vec<Vec<String>> {
        rows.iter()
            .filter(|r| r.first().map(String::as_str) == Some(pid))
            .map(|r| r[..6].to_vec())
            .collect()
    };
    assert_eq!(
        of(&gone_pid),
        [[gone_pid.as_str(), "exits", "500", "500", "5", "exited"]],
        "{}",
        all.stdout
    );
    // 3000 blocks of 100 bytes and the buffers of stdin and stdout (4096
    // bytes each) before the exec; 5 of 10 bytes and the two buffers after
    // it, under the name the kernel gives a program run as /proc/self/exe.
    assert_eq!(
        of(&twice_pid),
        [
            [twice_pid.as_str(), "exe", "8242", "8242", "7", "alive"],
            [
                twice_pid.as_str(),
                "exec",
                "308192",
                "308192",
                "3002",
                "exec"
            ],
        ],
        "{}",
        all.stdout
    );
    twice.end();
}

#[test]
fn tracer_stat_json_is_the_apis_json() {
    let (keep, tracerd, fx) = keep_done(&[]);
    let pid = fx.pid();
    let src = keep.src();
    let ran = finish(&mut tracer(
        &tracerd,
        &[
            "stat",
            &pid.to_string(),
            "--json",
            "--group-by",
            "traceback",
            "--limit",
            "0",
            "--include",
            src,
        ],
    ));
    let printed: Value = serde_json::from_str(&ran.ok()).expect("tracer printed JSON");
    let include: String = form_urlencoded::byte_serialize(src.as_bytes()).collect();
    let api = tracerd.get_ok(&format!(
        "/pid/{pid}/statistics?group_by=traceback&limit=0&include={include}"
    ));
    assert_eq!(printed, api);
    // And the filter reached tracerd: the fixture's two sites, nothing of
    // glibc's.
    let sizes: Vec<(u64, u64)> = api["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| {
            (
                s["size"].as_u64().expect("size"),
                s["count"].as_u64().expect("count"),
            )
        })
        .collect();
    assert_eq!(sizes, [(5_120_000, 20_000), (160_000, 1)]);
}

#[test]
fn tracer_stat_tables_show_the_exact_bytes_at_each_line() {
    let (keep, tracerd, fx) = keep_done(&[]);
    let pid = fx.pid().to_string();
    let ran = finish(&mut tracer(&tracerd, &["stat", &pid, "--bytes", "-l", "2"]));
    let src = keep.src();
    assert_eq!(
        ran.stdout.lines().next(),
        Some(
            format!(
                "keep (pid {pid}, alive): {KEEP_BYTES} in {KEEP_BLOCKS} blocks, 4 groups by lineno, the top 2 shown"
            )
            .as_str()
        )
    );
    let site = format!("{src}:{}", keep.line("ALLOC_SITE"));
    let calloc = format!("{src}:{}", keep.line("calloc(20000"));
    assert_eq!(
        ran.rows()[1..],
        [
            vec!["SIZE", "BLOCKS", "AVERAGE", "WHERE"],
            vec!["5120000", "20000", "256", site.as_str()],
            vec!["160000", "1", "160000", calloc.as_str()],
        ],
        "{}",
        ran.stdout
    );
}

#[test]
fn tracer_snapshot_then_diff_shows_the_new_blocks_at_their_line() {
    let keep = Program::build("keep", &[]);
    let tracerd = Tracerd::shared(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &keep.exe, &[]);
    let pid = fx.pid().to_string();
    let src = keep.src();
    let calloc = format!("{src}:{}", keep.line("calloc(20000"));
    let site = format!("{src}:{}", keep.line("ALLOC_SITE"));
    // At "ready": the calloc and the two stdio buffers, nothing at ALLOC_SITE.
    wait_ready_blocks(&tracerd, fx.pid());
    let ran = finish(&mut tracer(
        &tracerd,
        &["snapshot", &pid, "--label", "before"],
    ));
    let id = snapshot_ids(&tracerd.get_ok("/snapshots"))[0];
    assert_eq!(
        ran.stderr,
        format!("tracer: snapshot {id} (before) of pid {pid} (keep) stored: 164 KiB in 3 blocks\n"),
        "the summary on stderr"
    );
    let stdout = ran.ok();
    assert_eq!(
        stdout.lines().next(),
        Some(format!("{calloc}: size=156 KiB, count=1, average=156 KiB").as_str()),
        "{stdout}"
    );
    assert!(!stdout.contains(&site), "{stdout}");
    // The stored snapshot's statistics, as tracerd gives them in text.
    let (_, api) = tracerd.get_text(&format!("/snapshots/{id}/statistics?limit=20&format=text"));
    assert_eq!(stdout, api);
    fx.step("done");
    // Text: tracemalloc's compare_to lines.
    let ran = finish(&mut tracer(&tracerd, &["diff", &pid]));
    assert_eq!(ran.stderr, format!("tracer: compared with snapshot {id}\n"));
    assert_eq!(
        ran.ok().lines().take(2).collect::<Vec<_>>(),
        [
            format!("{site}: size=5000 KiB (+5000 KiB), count=20000 (+20000), average=256 B"),
            format!("{calloc}: size=156 KiB (+0 B), count=1 (+0), average=156 KiB"),
        ]
    );
    // A table with exact bytes, against the label.
    let ran = finish(&mut tracer(
        &tracerd,
        &[
            "diff", &pid, "--base", "before", "--table", "--bytes", "-l", "1",
        ],
    ));
    assert_eq!(
        ran.stderr,
        format!("tracer: compared with snapshot {id} (before)\n")
    );
    assert_eq!(
        ran.rows(),
        [
            vec!["SIZE", "CHANGE", "BLOCKS", "CHANGE", "WHERE"],
            vec!["5120000", "+5120000", "20000", "+20000", site.as_str()],
        ]
    );
}

#[test]
fn tracer_top_shows_the_growth_since_it_started_and_deletes_its_snapshot() {
    let keep = Program::build("keep", &[]);
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &keep.exe, &[]);
    wait_ready_blocks(&tracerd, fx.pid());
    let pid = fx.pid().to_string();
    let site = format!("{}:{}", keep.src(), keep.line("ALLOC_SITE"));
    let mut command = tracer(
        &tracerd,
        &[
            "top",
            &pid,
            "--interval",
            "0.2",
            "-n",
            "300",
            "-l",
            "3",
            "--bytes",
        ],
    );
    let mut top = ChildGuard(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tracer top"),
    );
    let mut lines = BufReader::new(top.0.stdout.take().expect("stdout")).lines();
    let mut next = || {
        lines
            .next()
            .expect("tracer top ended early")
            .expect("read tracer top")
    };
    // The first frame: nothing grew yet.
    let first = next();
    assert_eq!(
        first,
        format!("tracer top: keep (pid {pid}, alive): current 168192, peak 168192, 3 blocks")
    );
    let view = snapshot_ids(&tracerd.get_ok("/snapshots"));
    assert_eq!(view.len(), 1, "the view's base snapshot");
    fx.step("done");
    let grown = vec![
        "5120000".to_string(),
        "+5120000".into(),
        "20000".into(),
        "+20000".into(),
        site,
    ];
    loop {
        let line = next();
        if line
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
            == grown
        {
            break;
        }
    }
    signal(top.0.id(), "INT");
    let status = top.0.wait().expect("wait tracer top");
    assert!(status.success(), "tracer top after SIGINT: {status}");
    assert_eq!(
        snapshot_ids(&tracerd.get_ok("/snapshots")),
        Vec::<u64>::new(),
        "the view deleted its snapshot {view:?}"
    );
}

/// Kills the child by pid when the test ends, whatever happened.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        kill_if_running(&mut self.0);
    }
}

/// Waits until `keep.c` at "ready" holds its three blocks: the calloc and
/// the stdio buffers (glibc gives stdin its buffer as the fixture starts
/// waiting for "go", just after it said "ready").
fn wait_ready_blocks(tracerd: &Tracerd, pid: u32) {
    poll(Duration::from_secs(10), Duration::from_millis(20), || {
        let record = tracerd.get_ok(&format!("/pid/{pid}"));
        if record["blocks"] == 3 && record["current"] == 168_192 {
            Ok(())
        } else {
            Err(format!("keep at ready: {record}"))
        }
    });
}

#[test]
fn tracer_load_uploads_a_dump_and_prints_its_statistics() {
    let (keep, tracerd, fx) = keep_done(&[]);
    let pid = fx.pid();
    let (status, taken) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{taken}");
    let (status, dump) = tracerd.get_bytes(&format!("/snapshots/{}/dump", taken["id"]));
    assert_eq!(status, 200);
    let dir = TempDir::new("cli-load");
    let file = dir.path().join("keep.tsnap");
    std::fs::write(&file, dump).expect("write the dump");
    let ran = finish(tracer(&tracerd, &["load", "--label", "loaded", "-l", "2"]).arg(&file));
    let loaded = tracerd.get_ok("/snapshots/loaded");
    assert_eq!(loaded["kind"], "loaded");
    assert_eq!(
        ran.stderr,
        format!(
            "tracer: snapshot {} (loaded) loaded from {} (tracer file): 5164 KiB in {KEEP_BLOCKS} blocks\n",
            loaded["id"],
            file.display()
        )
    );
    assert_eq!(
        ran.ok(),
        format!(
            "{src}:{}: size=5000 KiB, count=20000, average=256 B\n{src}:{}: size=156 KiB, count=1, average=156 KiB\n",
            keep.line("ALLOC_SITE"),
            keep.line("calloc(20000"),
            src = keep.src()
        )
    );
}

#[test]
fn tracerds_4xx_message_and_hint_are_what_tracer_says() {
    let (_keep, tracerd, fx) = keep_done(&[]);
    let pid = fx.pid();
    let (status, api) = tracerd.get(&format!(
        "/pid/{pid}/statistics?group_by=traceback&cumulative=true&limit=20"
    ));
    assert_eq!(status, 400, "{api}");
    let ran = finish(&mut tracer(
        &tracerd,
        &["stat", &pid.to_string(), "-g", "traceback", "--cumulative"],
    ));
    assert_eq!(ran.status.code(), Some(1));
    assert_eq!(
        ran.stderr,
        format!(
            "tracer: {}\n  hint: {}\n",
            api["error"].as_str().expect("error"),
            api["hint"].as_str().expect("hint")
        )
    );
    assert_eq!(ran.stdout, "");
    // A pid tracerd does not trace: its 404.
    let ran = finish(&mut tracer(&tracerd, &["diff", "4000000000"]));
    assert_eq!(ran.status.code(), Some(1));
    assert_eq!(
        ran.stderr,
        "tracer: pid 4000000000 is not traced: no such process\n  hint: GET /processes lists the traced pids\n"
    );
}

#[test]
fn tracer_sends_the_token_over_tcp_and_a_wrong_one_gets_tracerds_401_with_a_hint() {
    let dir = TempDir::new("cli-token");
    let right = dir.path().join("token");
    let wrong = dir.path().join("wrong");
    for (path, token) in [
        (&right, "0123456789abcdef-right\n"),
        (&wrong, "0123456789abcdef-wrong"),
    ] {
        std::fs::write(path, token).expect("write a token file");
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod 600");
    }
    let (_keep, tracerd, fx) = keep_done(&["--auth-token-file", right.to_str().expect("utf-8")]);
    let pid = fx.pid().to_string();
    // A wrong token is refused from anyone, so this shows it is sent.
    let refused = finish(tracer(&tracerd, &["ps", "--token-file"]).arg(&wrong));
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        refused.stderr,
        "tracer: missing or wrong bearer token\n  hint: tracerd wants a bearer token over TCP: pass --token-file FILE (TRACER_TOKEN_FILE) or --token TOKEN (TRACER_TOKEN) with the token of its auth_token_file, or use its Unix socket (--socket)\n"
    );
    let admitted = finish(tracer(&tracerd, &["ps", "--bytes"]).env("TRACER_TOKEN_FILE", &right));
    assert!(
        admitted.rows().iter().any(|r| r.first() == Some(&pid)),
        "{admitted:?}"
    );
}
