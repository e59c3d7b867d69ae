//! Who sees what, tested as the users themselves: processes started as
//! root, as uid 65534 (`nobody`), as a member of the operators' group (a
//! user and group made for the test) and a `nobody` process that made
//! itself non-dumpable; requests sent by clients running as each user
//! (`setpriv`, Debian's `python3`) over loopback TCP and over the Unix
//! socket, and with the token.
//!
//! The judge of who may see a process is the kernel's ptrace rule, read
//! from `/proc` here: all of its uids the user's and dumpable (`/proc/PID/mem`
//! owned by the user).

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::suite::support::{Fixture, Program, TempDir, Tracerd, output_ok, token_file};

const NOBODY: u32 = 65534;
const TOKEN: &str = "access-test-token-0123456789abcdef";

/// A group and a user in it, made with `groupadd`/`useradd` for the test
/// and removed on drop.
struct Member {
    user: String,
    group: String,
    uid: u32,
    gid: u32,
}

impl Member {
    fn create() -> Self {
        let tag = std::process::id();
        let group = format!("trcops{tag}");
        let user = format!("trcmem{tag}");
        output_ok(Command::new("groupadd").arg(&group));
        // Made before useradd can fail, so that the group goes on drop.
        let mut member = Self {
            uid: 0,
            gid: 0,
            user: user.clone(),
            group: group.clone(),
        };
        output_ok(Command::new("useradd").args(["-M", "-N", "-g", "nogroup", "-G", &group, &user]));
        let out = output_ok(Command::new("id").args(["-u", &user]));
        member.uid = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a uid");
        let text = std::fs::read_to_string("/etc/group").expect("/etc/group");
        member.gid = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{group}:x:")))
            .and_then(|rest| rest.split(':').next())
            .and_then(|g| g.parse().ok())
            .expect("the group's gid");
        member
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.user).output();
        let _ = Command::new("groupdel").arg(&self.group).output();
    }
}

/// `setpriv` arguments that run a command as `uid` with primary group
/// `gid` and no supplementary group.
fn as_user(uid: u32, gid: u32) -> Vec<String> {
    vec![
        format!("--reuid={uid}"),
        format!("--regid={gid}"),
        "--clear-groups".into(),
    ]
}

/// How a client reaches tracerd.
#[derive(Clone, Copy, Debug)]
enum Via<'a> {
    /// Loopback TCP, `host:port`.
    Tcp(&'a str),
    /// The Unix socket at this path.
    Unix(&'a Path),
}

/// Sends `requests` (method, path, body or null, with the token or not) as
/// `uid`/`gid`, one connection each, from one Python process; prints its
/// pid and each (status, body: JSON, or the text when it is not JSON).
const CLIENT: &str = r#"
import json, sys, socket, http.client
via, where, reqs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(where)
out = []
for method, path, body, token in reqs:
    c = Unix('localhost') if via == 'unix' else http.client.HTTPConnection(where)
    headers = {'Authorization': 'Bearer ' + token} if token else {}
    try:
        c.request(method, path, body=None if body is None else body.encode(), headers=headers)
    except (BrokenPipeError, ConnectionResetError):
        pass  # answered before the body was read (403): the answer is there
    r = c.getresponse()
    text = r.read().decode('utf-8', 'replace')
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    out.append([r.status, value])
    c.close()
import os
print(json.dumps({'pid': os.getpid(), 'answers': out}))
"#;

/// [`CLIENT`] run as `uid`/`gid`: its pid (setpriv execs it in place) and
/// its answers.
fn send_as(
    uid: u32,
    gid: u32,
    via: Via<'_>,
    requests: &[(&str, String, Option<&str>, bool)],
) -> (u32, Vec<(u16, Value)>) {
    let list: Vec<Value> = requests
        .iter()
        .map(|(method, path, body, token)| json!([method, path, body, token.then_some(TOKEN)]))
        .collect();
    let (kind, place) = match via {
        Via::Tcp(addr) => ("tcp", addr.to_string()),
        Via::Unix(path) => ("unix", path.display().to_string()),
    };
    let out = output_ok(
        Command::new("setpriv")
            .args(as_user(uid, gid))
            .args(["/usr/bin/python3", "-c", CLIENT, kind, &place])
            .arg(Value::Array(list).to_string()),
    );
    let printed: Value = serde_json::from_slice(&out.stdout).expect("the client's answers");
    let answers: Vec<(u16, Value)> =
        serde_json::from_value(printed["answers"].clone()).expect("answers");
    assert_eq!(answers.len(), requests.len());
    (printed["pid"].as_u64().expect("pid") as u32, answers)
}

fn get(path: impl Into<String>) -> (&'static str, String, Option<&'static str>, bool) {
    ("GET", path.into(), None, false)
}

/// The kernel's answer: whether uid `uid` may look into process `pid` (all
/// its uids `uid`'s, and dumpable: the files of `/proc/PID` owned by
/// `uid`, as `/proc/PID/mem`, which ptrace's rule guards).
fn kernel_lets(uid: u32, pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata(format!("/proc/{pid}/mem")) else {
        return false;
    };
    let uids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|u| u.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    meta.uid() == uid && uids.len() == 4 && uids[..3].iter().all(|u| *u == uid)
}

fn pids_of(list: &Value, key: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = list[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {list}"))
        .iter()
        .map(|p| {
            let pid = if p.is_object() { &p["pid"] } else { p };
            pid.as_u64().expect("a pid") as u32
        })
        .collect();
    // A pid may be listed twice: its image ended by an exec (`setpriv`
    // before it runs the fixture) and the image it runs now.
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The answer to `path` for a pid no process has, with that pid written as
/// `pid`: what a hidden process must answer, byte for byte.
fn as_absent(absent: (u16, Value), missing: u32, pid: u32) -> (u16, Value) {
    let text = absent
        .1
        .to_string()
        .replace(&missing.to_string(), &pid.to_string());
    (absent.0, serde_json::from_str(&text).expect("json"))
}

/// An operator's answers: the first lists every one of `ours`, and every
/// other request succeeded (200).
fn sees_all(answers: &[(u16, Value)], ours: &[u32], who: &str) {
    let all = pids_of(&answers[0].1, "processes");
    for pid in ours {
        assert!(all.contains(pid), "{who} misses {pid}");
    }
    for (status, body) in &answers[1..] {
        assert_eq!(*status, 200, "{who}: {body}");
    }
}

/// A pid no process has now.
fn missing_pid() -> u32 {
    (3_000_000..4_000_000)
        .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .expect("a free pid")
}

#[test]
fn each_user_sees_only_the_processes_they_could_ptrace_and_operators_see_all() {
    let member = Member::create();
    let dir = TempDir::new("access");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let socket = dir.path().join("api.sock");
    let token_file = token_file(dir.path(), TOKEN);
    let tracerd = Tracerd::start(&[
        "--unix-socket",
        socket.to_str().expect("utf-8"),
        "--operators-group",
        &member.group,
        "--auth-token-file",
        token_file.to_str().expect("utf-8"),
    ]);
    let tcp = tracerd.base().trim_start_matches("http://").to_string();

    let keep = Program::build("keep", &[]);
    let exe = keep.exe.to_str().expect("utf-8");
    let setpriv = Path::new("/usr/bin/setpriv");
    let spawn_as = |uid: u32, gid: u32| {
        let mut args = as_user(uid, gid);
        args.push(exe.to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Fixture::spawn_traced(&tracerd, setpriv, &args)
    };
    let root_fx = Fixture::spawn_traced(&tracerd, &keep.exe, &[]);
    let mut nobody_fx = spawn_as(NOBODY, NOBODY);
    let member_fx = spawn_as(member.uid, NOBODY);
    // A process of nobody's that made itself non-dumpable after its first
    // allocations: the kernel no longer lets nobody look into it.
    let mut hidden_fx = Fixture::spawn(
        setpriv,
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            "import ctypes, sys\nblocks = [bytearray(4096) for _ in range(64)]\n\
             ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\nmore = [bytearray(4096) for _ in range(64)]\n\
             print('ready', flush=True)\nsys.stdin.readline()\n",
        ],
    );
    hidden_fx.expect_line("ready");
    tracerd.wait_traced(hidden_fx.pid());
    let (root_pid, nobody_pid, member_pid, hidden_pid) = (
        root_fx.pid(),
        nobody_fx.pid(),
        member_fx.pid(),
        hidden_fx.pid(),
    );
    assert!(kernel_lets(NOBODY, nobody_pid));
    assert!(!kernel_lets(NOBODY, hidden_pid));
    assert!(!kernel_lets(NOBODY, root_pid));
    let ours = [root_pid, nobody_pid, member_pid, hidden_pid];
    // nobody's allocations go on (the blocks of keep), for the views below.
    nobody_fx.step("done");

    // Root takes a snapshot (labelled); nobody takes one of their own.
    let (status, root_snap) = tracerd.post(&format!("/pid/{root_pid}/snapshots?label=root-snap"));
    assert_eq!(status, 201, "{root_snap}");
    let root_snap = root_snap["id"].as_u64().expect("id");

    let missing = missing_pid();
    for via in [Via::Tcp(&tcp), Via::Unix(&socket)] {
        // --- nobody: their own processes only.
        let (client, answers) = send_as(
            NOBODY,
            NOBODY,
            via,
            &[
                get("/processes"),
                get("/statistics"),
                get("/traces?limit=1"),
                get("/traced-memory"),
                get("/maps"),
                get("/tracing"),
                get("/scope"),
                get("/metrics"),
                (
                    "POST",
                    format!(
                        "/pid/{nobody_pid}/snapshots?label=nobody-snap-{}",
                        matches!(via, Via::Unix(_))
                    ),
                    None,
                    false,
                ),
                ("POST", format!("/pid/{nobody_pid}/reset-peak"), None, false),
            ],
        );
        let processes = answers[0].1["processes"].as_array().expect("processes");
        let listed = pids_of(&answers[0].1, "processes");
        assert_eq!(
            listed
                .iter()
                .filter(|p| ours.contains(p))
                .copied()
                .collect::<Vec<_>>(),
            vec![nobody_pid],
            "{via:?}: {}",
            answers[0].1
        );
        // Besides ours: the clients run as nobody (this one alive, earlier
        // ones ended and retained). Every one is nobody's; those alive are
        // ones the kernel lets nobody look into.
        for process in processes {
            let pid = process["pid"].as_u64().expect("pid") as u32;
            assert_eq!(process["owner_uid"], NOBODY, "{via:?}: {process}");
            // An image ended by an exec is the operators' only (its
            // /proc reading may be the next image's).
            assert_ne!(process["state"], "exec", "{via:?}: {process}");
            if process["state"] == "alive" && pid != client {
                assert!(kernel_lets(NOBODY, pid), "{via:?}: {pid} listed to nobody");
            }
        }
        // The system-wide views cover the same processes: nobody's alive
        // one among ours, and otherwise only processes nobody may look into
        // (the client itself is one, once tracerd has registered it).
        let nobodys = |pids: &[u32]| {
            pids.contains(&nobody_pid)
                && pids
                    .iter()
                    .all(|pid| !ours.contains(pid) || *pid == nobody_pid)
                && pids
                    .iter()
                    .all(|pid| *pid == client || kernel_lets(NOBODY, *pid))
        };
        assert_eq!(answers[1].0, 200, "{}", answers[1].1);
        let statistics = pids_of(&answers[1].1, "pids");
        assert!(nobodys(&statistics), "{via:?} statistics {statistics:?}");
        let traces = pids_of(&answers[2].1, "pids");
        assert!(nobodys(&traces), "{via:?} traces {traces:?}");
        let counted = answers[3].1["processes"].as_u64().expect("processes") as usize;
        assert!(
            (statistics.len().min(traces.len())..=statistics.len().max(traces.len()) + 1)
                .contains(&counted),
            "{via:?}: {}",
            answers[3].1
        );
        let by_pid = answers[4].1["live_allocs_by_pid"]
            .as_object()
            .expect("live_allocs_by_pid");
        for pid in by_pid.keys() {
            let pid: u32 = pid.parse().expect("pid");
            assert!(
                pid == client || listed.contains(&pid),
                "{via:?}: /maps shows {pid}"
            );
        }
        assert_eq!(answers[5].0, 200);
        assert_eq!(answers[6].0, 200);
        let metrics = answers[7].1.as_str().expect("metrics text");
        assert!(
            !metrics.contains(&format!("pid=\"{root_pid}\""))
                && !metrics.contains(&format!("pid=\"{nobody_pid}\"")),
            "{via:?}: per-process series for nobody"
        );
        assert!(metrics.contains("tracer_process_current_bytes{pid=\"other\",comm=\"other\"}"));
        assert_eq!(answers[8].0, 201, "{via:?}: {}", answers[8].1);
        assert_eq!(answers[8].1["owner_uid"], NOBODY, "{}", answers[8].1);
        let nobody_snap = answers[8].1["id"].as_u64().expect("id");
        assert_eq!(answers[9].0, 200, "{via:?}: {}", answers[9].1);

        // Others' processes and snapshots are answered as ones that do not
        // exist, on every route that names one.
        let mut probes = Vec::new();
        for (method, tail) in [
            ("GET", ""),
            ("GET", "/statistics"),
            ("GET", "/compare"),
            ("GET", "/traces"),
            ("GET", "/snapshots"),
            ("GET", "/traced-memory"),
            ("GET", "/tracing"),
            ("GET", "/object/0x1000"),
            ("POST", "/snapshots"),
            ("POST", "/reset-peak"),
        ] {
            for pid in [missing, root_pid, member_pid, hidden_pid] {
                probes.push((method, format!("/pid/{pid}{tail}"), None, false));
            }
        }
        let missing_snap = root_snap + 1000;
        for (method, tail) in [
            ("GET", ""),
            ("GET", "/statistics"),
            ("GET", "/traces"),
            ("GET", "/dump"),
            ("GET", "/compare?base=1"),
            ("PATCH", "?label=mine"),
            ("DELETE", ""),
        ] {
            for id in [missing_snap, root_snap] {
                probes.push((method, format!("/snapshots/{id}{tail}"), None, false));
            }
        }
        probes.push(get("/snapshots/no-such-label"));
        probes.push(get("/snapshots/root-snap"));
        probes.push(get(format!(
            "/snapshots/{nobody_snap}/compare?base={root_snap}"
        )));
        let (_, answers) = send_as(NOBODY, NOBODY, via, &probes);
        for (chunk, probe) in answers.chunks(4).zip(probes.chunks(4)).take(10) {
            assert_eq!(chunk[0].0, 404, "{via:?} {}: {}", probe[0].1, chunk[0].1);
            for (pid, answer) in [root_pid, member_pid, hidden_pid].iter().zip(&chunk[1..]) {
                assert_eq!(
                    *answer,
                    as_absent(chunk[0].clone(), missing, *pid),
                    "{via:?} {} for {pid}",
                    probe[0].1
                );
            }
        }
        let snaps = &answers[40..];
        for (pair, probe) in snaps.chunks(2).zip(probes[40..].chunks(2)).take(7) {
            assert_eq!(pair[0].0, 404, "{via:?} {}: {}", probe[0].1, pair[0].1);
            assert_eq!(
                pair[1],
                as_absent(pair[0].clone(), missing_snap as u32, root_snap as u32),
                "{via:?} {}",
                probe[1].1
            );
        }
        let labels = &answers[54..];
        assert_eq!(labels[0].0, 404);
        assert_eq!(
            labels[1].1.to_string(),
            labels[0]
                .1
                .to_string()
                .replace("no-such-label", "root-snap"),
            "{via:?}"
        );
        assert_eq!(labels[2].0, 404, "{via:?}: {}", labels[2].1);

        // What only operators may do: 403, whoever's it is.
        let (_, answers) = send_as(
            NOBODY,
            NOBODY,
            via,
            &[
                ("POST", "/tracing/stop".into(), None, false),
                ("POST", "/tracing/start".into(), None, false),
                ("PUT", "/scope?pid=1".into(), None, false),
                (
                    "POST",
                    format!("/pid/{nobody_pid}/clear-traces"),
                    None,
                    false,
                ),
                (
                    "POST",
                    format!("/pid/{nobody_pid}/tracing/stop"),
                    None,
                    false,
                ),
                (
                    "POST",
                    format!("/pid/{root_pid}/tracing/start"),
                    None,
                    false,
                ),
                (
                    "POST",
                    "/snapshots?format=tracemalloc".into(),
                    Some("x"),
                    false,
                ),
                get("/snapshots"),
                ("DELETE", format!("/snapshots/{nobody_snap}"), None, false),
            ],
        );
        for (status, body) in &answers[..7] {
            assert_eq!(*status, 403, "{via:?}: {body}");
            assert!(
                body["hint"]
                    .as_str()
                    .is_some_and(|h| h.contains(&format!("members of group {}", member.group))),
                "{body}"
            );
        }
        let listed: Vec<u64> = answers[7].1["snapshots"]
            .as_array()
            .expect("snapshots")
            .iter()
            .map(|s| s["id"].as_u64().expect("id"))
            .collect();
        assert_eq!(listed, vec![nobody_snap], "{via:?}: {}", answers[7].1);
        assert_eq!(answers[7].1["unreadable"], json!([]));
        assert_eq!(answers[8].0, 200, "{via:?}: {}", answers[8].1);

        // The same user with the token is an operator: everything.
        let (_, answers) = send_as(
            NOBODY,
            NOBODY,
            via,
            &[
                ("GET", "/processes".into(), None, true),
                ("GET", format!("/pid/{root_pid}/statistics"), None, true),
                (
                    "POST",
                    format!("/pid/{hidden_pid}/tracing/stop"),
                    None,
                    true,
                ),
                (
                    "POST",
                    format!("/pid/{hidden_pid}/tracing/start"),
                    None,
                    true,
                ),
            ],
        );
        sees_all(&answers, &ours, &format!("{via:?}: token holder"));
    }

    // --- A member of the operators' group (by /etc/group over TCP, where
    // only the uid is known; by the peer's gid over the Unix socket): all.
    for (via, gid) in [(Via::Tcp(&tcp), NOBODY), (Via::Unix(&socket), member.gid)] {
        let (_, answers) = send_as(
            member.uid,
            gid,
            via,
            &[
                get("/processes"),
                get(format!("/pid/{hidden_pid}/traces?limit=1")),
                get(format!("/snapshots/{root_snap}")),
                ("POST", format!("/pid/{root_pid}/reset-peak"), None, false),
                ("POST", format!("/pid/{root_pid}/tracing/stop"), None, false),
                (
                    "POST",
                    format!("/pid/{root_pid}/tracing/start"),
                    None,
                    false,
                ),
            ],
        );
        sees_all(&answers, &ours, &format!("{via:?}: member"));
    }

    // --- Root sees every process, and nothing was changed by the refused
    // requests: tracing is on, the scope is every process.
    let all = pids_of(&tracerd.get_ok("/processes"), "processes");
    for pid in ours {
        assert!(all.contains(&pid), "root misses {pid}");
    }
    assert_eq!(tracerd.get_ok("/tracing")["is_tracing"], true);
    assert_eq!(tracerd.get_ok("/scope")["all_processes"], true);
    let metrics = tracerd.get_text("/metrics").1;
    assert!(metrics.contains(&format!("pid=\"{root_pid}\"")));
    // Root's snapshot is still there; nobody's two were deleted by nobody.
    let snapshots = tracerd.get_ok("/snapshots");
    let ids: Vec<u64> = snapshots["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| s["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(ids, vec![root_snap], "{snapshots}");
    hidden_fx.go();
}
