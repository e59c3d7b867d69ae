//! The systemd unit: tracerd works with exactly the capabilities it grants
//! (and holds no exec without CAP_SYS_ADMIN), `systemd-analyze verify`
//! accepts it, and READY=1 comes only once the probes are attached.

use std::{io::Read as _, process::Command, time::Duration};

use super::{Running, TRACERD, workspace_file};
use crate::suite::support::{Fixture, Program, TempDir, poll, require_root};

/// The unit's CapabilityBoundingSet, as setpriv's `--bounding-set` list.
fn unit_capabilities(drop: Option<&str>) -> String {
    let unit = std::fs::read_to_string(workspace_file("deploy/tracerd.service")).expect("unit");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet in the unit");
    let mut list = String::from("-all");
    for cap in line.split_whitespace() {
        if Some(cap) == drop {
            continue;
        }
        list.push_str(",+");
        list.push_str(&cap.trim_start_matches("CAP_").to_lowercase());
    }
    list
}

#[test]
fn tracerd_works_with_exactly_the_units_capabilities_and_holds_execs_only_with_cap_sys_admin() {
    require_root();
    let caps = unit_capabilities(None);
    let mut running = Running::spawn(
        &["setpriv", "--bounding-set", &caps, "--inh-caps=-all"],
        &[],
        &[],
        None,
    );
    running.wait_ready(None);
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", running.pid())).expect("status");
    let bounding = status
        .lines()
        .find(|l| l.starts_with("CapBnd:"))
        .expect("CapBnd");
    // CAP_DAC_READ_SEARCH 2, CAP_SYS_PTRACE 19, CAP_SYS_ADMIN 21, CAP_PERFMON 38, CAP_BPF 39.
    assert_eq!(bounding, "CapBnd:\t000000c000280004");

    let prog = Program::build("keep1000", &[]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    // The unit runs tracerd's default, exact on demand: the first query
    // of the fixture starts its exact tracing, with the probes of its own
    // that the unit's capabilities must allow; it allocated nothing
    // since (it waits), so it is not traced yet.
    let (status, first) = running.get(&format!("/pid/{pid}/traced-memory"));
    assert_eq!(status, 404, "{first}");
    fx.step("done");
    let after = poll(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || match running.get(&format!("/pid/{pid}/traced-memory")) {
            (200, after) => Ok(after),
            (status, after) => Err(format!("{status}: {after}")),
        },
    );
    assert_eq!(
        after["current"].as_u64(),
        Some(333_000),
        "exact bytes traced with the unit's capabilities: {after}"
    );
    let (_, stats) = running.get(&format!("/pid/{pid}/statistics?limit=1"));
    assert_eq!(
        stats["statistics"][0]["traceback"][0]["filename"].as_str(),
        prog.source.to_str()
    );
    fx.end();
    drop(running);

    // Without CAP_SYS_ADMIN the probes still attach: uprobe_multi links
    // need CAP_BPF and CAP_PERFMON only (perf events' uprobes were refused,
    // `perf_event_open: Permission denied`). Holding execs does not:
    // fanotify's permission events need it, and tracerd says so.
    let without = unit_capabilities(Some("CAP_SYS_ADMIN"));
    let mut running = Running::spawn(
        &["setpriv", "--bounding-set", &without, "--inh-caps=-all"],
        &["--bpf-stats", "false", "--discover-allocators", "false"],
        &[],
        None,
    );
    running.wait_ready(None);
    let (clean, took) = running.stop("TERM");
    assert!(clean, "exit after SIGTERM ({took:?})");
    let mut err = String::new();
    running
        .child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("tracerd's log");
    assert!(err.contains("tracerd ready"), "{err}");
    assert!(
        err.contains("execs are not held") && err.contains("Operation not permitted"),
        "{err}"
    );
    assert!(!err.contains("no uprobe_multi links"), "{err}");
}

#[test]
fn systemd_analyze_verify_accepts_the_unit() {
    let dir = TempDir::new("unit");
    let unit = std::fs::read_to_string(workspace_file("deploy/tracerd.service")).expect("unit");
    assert!(unit.contains("\nType=notify\n"));
    assert!(
        !unit.contains("ProtectProc="),
        "tracerd must see every process"
    );
    // verify checks that ExecStart exists: point it at the built binary.
    let path = dir.path().join("tracerd.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/tracerd", TRACERD)).expect("write unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let about_ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("tracerd.service"))
        .collect();
    assert_eq!(about_ours, Vec::<&str>::new());
}

#[test]
fn ready_is_notified_only_after_the_probes_are_attached() {
    require_root();
    let dir = TempDir::new("notify");
    let socket_path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut running = Running::spawn(
        &[],
        &[],
        &[("NOTIFY_SOCKET", socket_path.to_str().expect("utf-8"))],
        None,
    );
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).expect("a notification within 60 s");
    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(message.lines().any(|l| l == "READY=1"), "{message}");
    // At READY the probes are attached: the API answers and lists them.
    let (status, health) = running.get("/health");
    assert_eq!(status, 200);
    assert!(
        !health["libraries"]
            .as_array()
            .expect("libraries")
            .is_empty(),
        "{health}"
    );
    let (clean, _) = running.stop("TERM");
    assert!(clean);
    // Then STOPPING=1 (systemd takes any number of messages before it).
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let n = socket.recv(&mut buf).expect("STOPPING=1");
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        let stopping = message.lines().any(|l| l == "STOPPING=1");
        seen.push(message);
        if stopping {
            break;
        }
    }
    assert!(
        seen.last()
            .is_some_and(|m| m.lines().any(|l| l == "STOPPING=1")),
        "{seen:?}"
    );
}

/// `systemd-analyze security --offline=true` of the unit (ExecStart
/// pointed at the built binary): the overall exposure it prints.
fn unit_exposure() -> f64 {
    let dir = TempDir::new("unit-security");
    let unit = std::fs::read_to_string(workspace_file("deploy/tracerd.service")).expect("unit");
    let path = dir.path().join("tracerd.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/tracerd", TRACERD)).expect("write unit");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split_once("Overall exposure level for tracerd.service: "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure in: {text}"))
}

#[test]
fn the_units_exposure_stays_at_2_8_or_better() {
    let exposure = unit_exposure();
    assert!(exposure <= 2.8, "exposure {exposure}");
}

#[test]
fn systemd_sysusers_creates_the_operators_group_the_unit_names() {
    let unit = std::fs::read_to_string(workspace_file("deploy/tracerd.service")).expect("unit");
    assert!(
        unit.contains("\nExecStartPre=+-/usr/bin/systemd-sysusers tracer.conf\n"),
        "the unit creates the group before each start"
    );
    // The group the configuration names by default, created by the
    // sysusers.d file the unit runs, in a root of its own.
    let root = TempDir::new("sysusers");
    std::fs::create_dir(root.path().join("etc")).expect("etc");
    let out = Command::new("systemd-sysusers")
        .arg(format!("--root={}", root.path().display()))
        .arg(workspace_file("deploy/tracer.sysusers.conf"))
        .output()
        .expect("systemd-sysusers");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let group = std::fs::read_to_string(root.path().join("etc/group")).expect("group");
    let line = group
        .lines()
        .find(|l| l.starts_with("tracer:"))
        .unwrap_or_else(|| panic!("no tracer group in {group}"));
    let gid: u32 = line
        .split(':')
        .nth(2)
        .and_then(|g| g.parse().ok())
        .expect("gid");
    // A system group (below the first user's gid, 1000 on Debian).
    assert!(gid < 1000, "{line}");
    let config = tracer_daemon::config::Config::default();
    assert_eq!(config.api.operators_group, "tracer");
}
