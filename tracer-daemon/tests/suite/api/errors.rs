//! Every route, every bad parameter: the status and a hint that names the
//! valid values; a state conflict is a 409.

use std::time::Duration;

use reqwest::Method;

use super::start;
use crate::suite::support::poll;

/// A bad request: its method, path, status and a text its hint holds.
type Case = (Method, String, u16, &'static str);

/// The bad parameters of `/pid/{pid}/statistics`.
fn statistics_cases(pid: u32) -> Vec<Case> {
    vec![
        (
            Method::GET,
            format!("/pid/{pid}/statistics?group_by=line"),
            400,
            "group_by is one of: filename, lineno, traceback, function, module",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?cumulative=yes"),
            400,
            "cumulative is one of: true, false, 1, 0",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?group_by=traceback&cumulative=true"),
            400,
            "cumulative=true works with group_by=filename, lineno, function or module",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?limit=-1"),
            400,
            "limit is a whole number >= 0 (0 means all)",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?format=xml"),
            400,
            "format is one of: json, text, pprof, collapsed, svg",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?source=true"),
            400,
            "add format=text (JSON always has every frame)",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?format=text&tb_limit=x"),
            400,
            "tb_limit is Traceback.format()'s limit",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?include=a.c:99999999999"),
            400,
            "include is PATTERN[:LINENO][@DOMAIN]",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?domain=-1"),
            400,
            "domain is a domain (a pid, 0 to 4294967295)",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?exclude_domain=x"),
            400,
            "exclude_domain is a domain",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?all_frames=2"),
            400,
            "all_frames is one of: true, false, 1, 0",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?limit=1&limit=2"),
            400,
            "give each parameter once",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/statistics?bogus=1"),
            400,
            "valid parameters: group_by, cumulative, limit, format, source, tb_limit, most_recent_first, include",
        ),
    ]
}

/// The bad parameters of `/pid/{pid}/compare` and `/pid/{pid}/traces`.
fn compare_cases(pid: u32) -> Vec<Case> {
    vec![
        (
            Method::GET,
            format!("/pid/{pid}/compare?base=0"),
            400,
            "base is a snapshot id (1 or more) or label",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/compare?new=a%20b"),
            400,
            "new is a snapshot id or label from GET /snapshots, or now",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/compare?since=10x"),
            400,
            "since is a duration",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/compare?base=99999"),
            404,
            "GET /snapshots lists the stored snapshots",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/compare?base=nolabel"),
            404,
            "GET /snapshots lists the stored snapshots and their labels",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/traces?offset=-1"),
            400,
            "offset is a whole number >= 0",
        ),
    ]
}

/// A pid that is no process (0, or `missing`, which is none), on each
/// route of a process.
fn unknown_pid_cases(missing: u32) -> Vec<Case> {
    vec![
        (
            Method::GET,
            "/pid/0/statistics".into(),
            400,
            "pid is a positive integer",
        ),
        (
            Method::GET,
            format!("/pid/{missing}/statistics"),
            404,
            "GET /processes lists the traced pids",
        ),
        (
            Method::GET,
            format!("/pid/{missing}/traced-memory"),
            404,
            "GET /processes lists the traced pids",
        ),
        (
            Method::POST,
            format!("/pid/{missing}/clear-traces"),
            404,
            "GET /processes lists the traced pids",
        ),
        (
            Method::POST,
            format!("/pid/{missing}/reset-peak"),
            404,
            "GET /processes lists the traced pids",
        ),
        (
            Method::POST,
            format!("/pid/{missing}/tracing/stop"),
            404,
            "GET /processes lists the traced pids",
        ),
        (
            Method::GET,
            format!("/pid/{missing}/tracing"),
            404,
            "GET /processes lists the traced pids",
        ),
    ]
}

/// The bad parameters of the actions on `pid` (snapshots, objects, tracing).
fn pid_action_cases(pid: u32) -> Vec<Case> {
    vec![
        (
            Method::POST,
            format!("/pid/{pid}/snapshots?label=123"),
            400,
            "a label is 1 to 64 of A-Z a-z 0-9 . _ : - and not all digits",
        ),
        (
            Method::POST,
            format!("/pid/{pid}/snapshots?label=one"),
            409,
            "choose another label",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/object/zz"),
            400,
            "address is where a block starts",
        ),
        (
            Method::GET,
            format!("/pid/{pid}/object/0x1"),
            404,
            "GET /pid/",
        ),
        (
            Method::POST,
            format!("/pid/{pid}/tracing/start?nframe=99"),
            400,
            "nframe is 1 to 16",
        ),
        (
            Method::POST,
            format!("/pid/{pid}/tracing/start?depth=1"),
            400,
            "valid parameters: nframe",
        ),
    ]
}

/// The bad parameters of the snapshot routes (`id`: a stored snapshot).
fn snapshot_cases(id: u64) -> Vec<Case> {
    vec![
        (
            Method::GET,
            "/snapshots/0".into(),
            400,
            "id is a snapshot id (1 or more) or label",
        ),
        (
            Method::GET,
            "/snapshots/99999".into(),
            404,
            "GET /snapshots lists the stored snapshots",
        ),
        (
            Method::GET,
            "/snapshots?kind=manual".into(),
            400,
            "kind is one of: taken, auto, loaded",
        ),
        (
            Method::GET,
            "/snapshots?pid=x".into(),
            400,
            "pid is a positive integer",
        ),
        (
            Method::GET,
            format!("/snapshots/{id}/compare"),
            400,
            "give base=ID or base=LABEL",
        ),
        (
            Method::GET,
            format!("/snapshots/{id}/compare?base=99999"),
            404,
            "GET /snapshots lists the stored snapshots",
        ),
        (
            Method::GET,
            format!("/snapshots/{id}/dump?format=zip"),
            400,
            "format is one of: tracer, tracemalloc",
        ),
        (
            Method::GET,
            format!("/snapshots/{id}/traces?limit=x"),
            400,
            "limit is a whole number >= 0",
        ),
        (
            Method::PATCH,
            format!("/snapshots/{id}"),
            400,
            "PATCH /snapshots/{id}?label=NAME sets a label",
        ),
        (
            Method::PATCH,
            format!("/snapshots/{id}?label=now"),
            400,
            "a label is 1 to 64",
        ),
        (
            Method::DELETE,
            "/snapshots/99999".into(),
            404,
            "GET /snapshots lists the stored snapshots",
        ),
        (
            Method::POST,
            "/snapshots?format=tracemalloc".into(),
            400,
            "send the snapshot file as the body",
        ),
        (
            Method::POST,
            "/snapshots?format=zip".into(),
            400,
            "format is one of: tracer, tracemalloc",
        ),
    ]
}

/// Unknown routes and methods, and the bad parameters of the routes of
/// every process.
fn route_cases() -> Vec<Case> {
    vec![
        (Method::GET, "/nowhere".into(), 404, "GET /health"),
        (Method::PUT, "/statistics".into(), 405, "GET /health"),
        (
            Method::GET,
            "/statistics?group_by=x".into(),
            400,
            "group_by is one of",
        ),
        (
            Method::GET,
            "/compare?since=".into(),
            400,
            "since is a duration",
        ),
        (
            Method::GET,
            "/traces?limit=x".into(),
            400,
            "limit is a whole number",
        ),
        (
            Method::POST,
            "/tracing/start?nframe=0".into(),
            400,
            "nframe is 1 to 16",
        ),
        (
            Method::GET,
            "/tracing?x=1".into(),
            400,
            "valid parameters: ",
        ),
    ]
}
/// Every route, every bad parameter: the status and the hint.
#[test]
fn bad_parameters_name_the_valid_values() {
    let (_app, tracerd, fx, _) = start(1);
    let pid = fx.pid();
    let (_, snap) = tracerd.post(&format!("/pid/{pid}/snapshots?label=one"));
    let id = snap["id"].as_u64().expect("id");
    let missing = 4_000_000_000u32;
    let cases: Vec<Case> = [
        statistics_cases(pid),
        compare_cases(pid),
        unknown_pid_cases(missing),
        pid_action_cases(pid),
        snapshot_cases(id),
        route_cases(),
    ]
    .concat();
    for (method, path, status, hint) in cases {
        let (got, body) = tracerd.send(method.clone(), &path, None);
        assert_eq!(got, status, "{method} {path}: {body}");
        let text = body["hint"].as_str().unwrap_or_default();
        assert!(
            text.contains(hint),
            "{method} {path}: hint {text:?} lacks {hint:?}"
        );
        assert!(
            !body["error"].as_str().unwrap_or_default().is_empty(),
            "{method} {path}: no error text"
        );
    }
    // A snapshot of another scope in /pid/{pid}/compare: 409.
    let (_, system) = tracerd.send(Method::POST, "/snapshots", None);
    let (status, err) = tracerd.get(&format!("/pid/{pid}/compare?base={}", system["id"]));
    assert_eq!(status, 409, "{err}");
    assert_eq!(
        err["error"],
        format!(
            "snapshot {} is not of pid {pid}'s current image (it is system-wide)",
            system["id"]
        )
    );
    // An exited process: 409 for what needs it alive, its last state stays.
    let mut fx = fx;
    assert!(fx.finish().success());
    poll(Duration::from_secs(10), Duration::from_millis(50), || {
        if tracerd.get(&format!("/pid/{pid}")).1["state"] == "alive" {
            Err("exit not seen".to_string())
        } else {
            Ok(())
        }
    });
    let (status, err) = tracerd.post(&format!("/pid/{pid}/clear-traces"));
    assert_eq!(status, 409, "{err}");
    assert_eq!(
        err["error"],
        format!("pid {pid} has exited: its blocks are gone")
    );
    assert_eq!(tracerd.get(&format!("/pid/{pid}/statistics")).0, 200);
}

/// A process of the test, killed by pid on drop.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        crate::suite::support::kill_if_running(&mut self.0);
    }
}

/// A pid tracer does not trace is a 404 that says why: no such process,
/// tracerd itself, a stripped static program (no symbols name its
/// allocator: it maps no probed allocator), a
/// process that has not allocated since tracerd started, one outside the
/// scope.
#[test]
fn a_pid_that_is_not_traced_is_a_404_that_says_why() {
    use std::process::{Command, Stdio};

    use crate::suite::support::{TempDir, Tracerd, output_ok};

    let dir = TempDir::new("not-traced");
    let source = dir.path().join("waits.c");
    std::fs::write(
        &source,
        "#include <unistd.h>\nint main(void) { char b[8]; return read(0, b, sizeof b) < 0; }\n",
    )
    .expect("write source");
    let exe = dir.path().join("waits");
    output_ok(
        Command::new("cc")
            .args(["-static", "-s"])
            .arg("-o")
            .arg(&exe)
            .arg(&source),
    );
    let sleeper = Process(Command::new("sleep").arg("60").spawn().expect("sleep"));
    let static_program = Process(
        Command::new(&exe)
            .stdin(Stdio::piped())
            .spawn()
            .expect("static program"),
    );
    let said = |tracerd: &Tracerd, pid: u32| {
        let (status, body) = tracerd.get(&format!("/pid/{pid}"));
        assert_eq!(status, 404, "pid {pid}: {body}");
        body["error"].as_str().unwrap_or_default().to_string()
    };
    {
        let tracerd = Tracerd::start(&[]);
        for (pid, why) in [
            (4_000_000_000, "no such process"),
            (tracerd.pid(), "it is tracerd, which never traces itself"),
            (
                static_program.0.id(),
                "it maps none of the allocators tracerd probes (/",
            ),
            (
                sleeper.0.id(),
                "no allocation seen from it since tracerd started",
            ),
        ] {
            let error = said(&tracerd, pid);
            assert!(
                error.starts_with(&format!("pid {pid} is not traced: {why}")),
                "pid {pid}: {error:?}"
            );
        }
    }
    let scoped = Tracerd::start(&["--scope-pid", &static_program.0.id().to_string()]);
    let error = said(&scoped, sleeper.0.id());
    assert!(
        error.ends_with(
            "it is outside tracerd's scope (GET /scope shows it, PUT /scope changes it)"
        ),
        "{error:?}"
    );
}
