//! Root integration tests of the routes of issue 4 through the real tracerd
//! (real eBPF) tracing C fixtures compiled here: filters, group_by function
//! and module, system-wide views, stored snapshots as resources, automatic
//! snapshots and `since=`, dump/load in both formats (with CPython reading
//! and writing the tracemalloc files), start/stop/clear/reset, object
//! tracebacks, source lines, tracer memory, and every bad parameter.
mod common;

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use common::{C_PRELUDE, Fixture, TempDir, Tracerd, compile_c, line_of};
use reqwest::Method;
use serde_json::{Value, json};

const FIXTURE: &str = r#"
static void *keep[4096];
static int nkeep;
__attribute__((noinline)) static void alloc_a(int n) {
    for (int i = 0; i < n; i++)
        keep[nkeep++] = malloc(100); /* SITE_A */
}
__attribute__((noinline)) static void alloc_b(int n) {
    for (int i = 0; i < n; i++)
        keep[nkeep++] = calloc(10, 20); /* SITE_B */
}
__attribute__((noinline)) static void rec(int depth) {
    if (depth == 0) {
        keep[nkeep++] = malloc(7); /* SITE_REC */
        return;
    }
    rec(depth - 1); /* REC_CALL */
}
int main(void) {
    say("ready");
    wait_go();
    alloc_a(10); /* CALL_A */
    alloc_b(5); /* CALL_B */
    say("phase1");
    wait_go();
    alloc_a(3); /* CALL_A2 */
    rec(3); /* CALL_REC */
    void *p = malloc(4242); /* SITE_OBJ */
    keep[nkeep++] = p;
    printf("%p\n", p);
    fflush(stdout);
    say("phase2");
    wait_go();
    alloc_b(2); /* CALL_B2 */
    say("phase3");
    wait_go();
    return 0;
}
"#;

struct App {
    _dir: TempDir,
    exe: PathBuf,
    src: String,
    source: String,
}

impl App {
    fn build(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let source = format!("{C_PRELUDE}{FIXTURE}");
        let exe = compile_c(dir.path(), "apifix", &source, &[]);
        let src = dir
            .path()
            .join("apifix.c")
            .to_str()
            .expect("utf-8 path")
            .to_string();
        Self {
            _dir: dir,
            exe,
            src,
            source,
        }
    }

    fn line(&self, marker: &str) -> u32 {
        line_of(&self.source, marker)
    }

    /// Starts the fixture and runs it to the end of phase 2 (or 1).
    fn run(&self, tracerd: &Tracerd, phases: u32) -> (Fixture, Option<u64>) {
        let mut fx = Fixture::spawn(&self.exe, &[], &[]);
        fx.expect_line("ready");
        tracerd.wait_traced(fx.pid());
        fx.go();
        fx.expect_line("phase1");
        let mut address = None;
        if phases >= 2 {
            fx.go();
            let line = fx.read_line();
            address =
                Some(u64::from_str_radix(line.trim_start_matches("0x"), 16).expect("address"));
            fx.expect_line("phase2");
        }
        (fx, address)
    }
}

fn enc(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Asserts that `body` says its data is complete: no drop.
fn assert_complete(body: &Value) {
    assert_eq!(
        (&body["complete"], &body["drops"], &body["drops_by_pid"]),
        (&json!(true), &json!(0), &json!({})),
        "{body}"
    );
}

fn texts(body: &Value) -> Vec<String> {
    body["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| s["text"].as_str().expect("text").to_string())
        .collect()
}

#[test]
fn filters_select_traces_like_filter_traces() {
    let app = App::build("filters");
    let tracerd = Tracerd::start(&[]);
    let (fx, _) = app.run(&tracerd, 2);
    let pid = fx.pid();
    let src = &app.src;
    let inc = enc(src);
    let stats = |query: &str| {
        let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?limit=0&{query}"));
        assert_eq!(status, 200, "{query}: {body}");
        texts(&body)
    };
    let (a, b, r, o) = (
        app.line("SITE_A"),
        app.line("SITE_B"),
        app.line("SITE_REC"),
        app.line("SITE_OBJ"),
    );
    let all = vec![
        format!("{src}:{o}: size=4242 B, count=1, average=4242 B"),
        format!("{src}:{a}: size=1300 B, count=13, average=100 B"),
        format!("{src}:{b}: size=1000 B, count=5, average=200 B"),
        format!("{src}:{r}: size=7 B, count=1, average=7 B"),
    ];
    assert_eq!(stats(&format!("include={inc}")), all);
    // A glob, as fnmatch matches it.
    assert_eq!(stats(&format!("include={}", enc("*/apifix.[c]"))), all);
    // One line, and exclusion of one line.
    assert_eq!(
        stats(&format!("include={}", enc(&format!("{src}:{a}")))),
        all[1..2]
    );
    assert_eq!(
        stats(&format!(
            "include={inc}&exclude={}",
            enc(&format!("{src}:{a}"))
        )),
        [all[0].clone(), all[2].clone(), all[3].clone()]
    );
    // all_frames: the traces that went through the recursive call.
    let rec_call = app.line("REC_CALL");
    assert_eq!(
        stats(&format!(
            "include={}&all_frames=true",
            enc(&format!("{src}:{rec_call}"))
        )),
        all[3..4]
    );
    assert!(
        stats(&format!("include={}", enc(&format!("{src}:{rec_call}")))).is_empty(),
        "not the most recent frame"
    );
    // Domains: the pid. Inclusive filters are alternatives (a trace
    // matching any one is kept), so include + domain is the union: every
    // trace of the pid, libc's own allocations (stdio buffers) included.
    let everything = stats("");
    assert!(everything.len() > all.len(), "{everything:?}");
    assert_eq!(stats(&format!("domain={pid}")), everything);
    assert_eq!(stats(&format!("include={inc}&domain={pid}")), everything);
    assert!(stats(&format!("include={inc}&exclude_domain={pid}")).is_empty());
    assert_eq!(
        stats(&format!("include={}", enc(&format!("{src}@{pid}")))),
        all
    );
    assert!(stats(&format!("include={}", enc(&format!("{src}@{}", pid + 1)))).is_empty());
    // Two inclusive filters: either matches.
    assert_eq!(
        stats(&format!(
            "include={}&include={}",
            enc(&format!("{src}:{a}")),
            enc(&format!("{src}:{r}"))
        )),
        [all[1].clone(), all[3].clone()]
    );
    // The JSON echoes the filters and counts the traces kept.
    let (_, body) = tracerd.get(&format!(
        "/pid/{pid}/statistics?include={inc}&exclude_domain=1"
    ));
    assert_eq!(
        body["filters"],
        json!({"include": [src], "exclude_domain": ["1"]})
    );
    assert_eq!(body["traces"], 20);
}

#[test]
fn group_by_function_and_module_with_cumulative() {
    let app = App::build("groups");
    let tracerd = Tracerd::start(&[]);
    let (fx, _) = app.run(&tracerd, 2);
    let pid = fx.pid();
    let inc = enc(&app.src);
    let get = |query: &str| {
        let (status, body) = tracerd.get(&format!(
            "/pid/{pid}/statistics?limit=0&include={inc}&{query}"
        ));
        assert_eq!(status, 200, "{body}");
        body
    };
    let body = get("group_by=function");
    assert_complete(&body);
    assert_eq!(body["process"]["complete"], true);
    assert_eq!(
        texts(&body),
        [
            "main: size=4242 B, count=1, average=4242 B",
            "alloc_a: size=1300 B, count=13, average=100 B",
            "alloc_b: size=1000 B, count=5, average=200 B",
            "rec: size=7 B, count=1, average=7 B",
        ]
    );
    assert_eq!(body["statistics"][1]["label"], "alloc_a");
    assert_eq!(body["statistics"][1]["traceback"][0]["function"], "alloc_a");
    assert_eq!(
        body["statistics"][1]["traceback"][0]["filename"],
        app.src.as_str()
    );
    // Cumulative: every frame's function, recursion counted per frame;
    // libc's start-up functions tie with main (ties sort by label, so
    // "main" comes before "_start" and "__libc_...").
    let cumulative = texts(&get("group_by=function&cumulative=true"));
    assert_eq!(cumulative[0], "main: size=6549 B, count=20, average=327 B");
    let tail: Vec<&str> = cumulative
        .iter()
        .rev()
        .take(3)
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail,
        [
            "rec: size=28 B, count=4, average=7 B",
            "alloc_b: size=1000 B, count=5, average=200 B",
            "alloc_a: size=1300 B, count=13, average=100 B",
        ]
    );
    for middle in &cumulative[1..cumulative.len() - 3] {
        assert!(
            middle.ends_with(": size=6549 B, count=20, average=327 B"),
            "{middle}"
        );
    }
    let exe = app.exe.to_str().expect("path");
    assert_eq!(
        texts(&get("group_by=module")),
        [format!("{exe}: size=6549 B, count=20, average=327 B")]
    );
    // compare by function: phase 3 adds two calloc blocks in alloc_b.
    let mut fx = fx;
    let (status, base) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{base}");
    assert_complete(&base);
    fx.go();
    fx.expect_line("phase3");
    let (status, body) = tracerd.get(&format!(
        "/pid/{pid}/compare?group_by=function&limit=1&include={inc}"
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        texts(&body),
        ["alloc_b: size=1400 B (+400 B), count=7 (+2), average=200 B"]
    );
    assert_eq!(body["base"]["id"], base["id"]);
    assert_eq!(body["complete"], true);
    assert_complete(&body["base"]);
    assert_complete(&body["new"]);
    let id = base["id"].as_u64().expect("id");
    let (status, body) = tracerd.get(&format!("/snapshots/{id}/statistics?limit=1"));
    assert_eq!(status, 200, "{body}");
    assert_complete(&body);
    assert_complete(&body["snapshot"]);
}

#[test]
fn system_wide_views_have_one_domain_per_process() {
    let app = App::build("system");
    let tracerd = Tracerd::start(&[]);
    let (one, _) = app.run(&tracerd, 2);
    let (two, _) = app.run(&tracerd, 2);
    let (p1, p2) = (one.pid(), two.pid());
    let a = app.line("SITE_A");
    let (status, body) = tracerd.get(&format!(
        "/statistics?include={}&limit=0",
        enc(&format!("{}:{a}", app.src))
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        texts(&body),
        [format!(
            "{}:{a}: size=2600 B, count=26, average=100 B",
            app.src
        )]
    );
    let pids: Vec<u64> = body["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert!(
        pids.contains(&u64::from(p1)) && pids.contains(&u64::from(p2)),
        "{pids:?}"
    );
    // Other processes of the host may lose events; these two lose none.
    for pid in [p1, p2] {
        assert_eq!(body["drops_by_pid"].get(pid.to_string()), None, "{body}");
    }
    assert_eq!(body["complete"], body["drops"] == 0, "{body}");
    // Traces carry their pid as domain.
    let o = app.line("SITE_OBJ");
    let (status, body) = tracerd.get(&format!(
        "/traces?limit=0&include={}",
        enc(&format!("{}:{o}", app.src))
    ));
    assert_eq!(status, 200, "{body}");
    let mut domains: Vec<u64> = body["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .filter_map(|t| t["domain"].as_u64())
        .collect();
    domains.sort_unstable();
    let mut expected = vec![u64::from(p1), u64::from(p2)];
    expected.sort_unstable();
    assert_eq!(domains, expected);
    assert_eq!(body["traces"][0]["size"], 4242);
    // A Filter with a domain keeps one process's traces of the file.
    let one_file = enc(&format!("{}@{p1}", app.src));
    let (_, body) = tracerd.get(&format!(
        "/statistics?include={one_file}&limit=0&group_by=filename"
    ));
    assert_eq!(
        texts(&body),
        [format!(
            "{}:0: size=6549 B, count=20, average=327 B",
            app.src
        )]
    );
    // System-wide traced memory covers both.
    let (status, memory) = tracerd.get("/traced-memory");
    assert_eq!(status, 200);
    assert!(
        memory["current"].as_u64().expect("current") >= 2 * 6549,
        "{memory}"
    );
    // A stored system-wide snapshot, then a system-wide compare.
    let (status, snap) = tracerd.send(Method::POST, "/snapshots?label=sys-base", None);
    assert_eq!(status, 201, "{snap}");
    assert_eq!(snap["pid"], Value::Null);
    let (mut one, mut two) = (one, two);
    one.go();
    one.expect_line("phase3");
    two.go();
    two.expect_line("phase3");
    let b = app.line("SITE_B");
    let (status, body) = tracerd.get(&format!(
        "/compare?include={}",
        enc(&format!("{}:{b}", app.src))
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["base"]["label"], "sys-base");
    assert_eq!(
        texts(&body),
        [format!(
            "{}:{b}: size=2800 B (+800 B), count=14 (+4), average=200 B",
            app.src
        )]
    );
}

#[test]
fn stored_snapshots_are_resources_with_labels() {
    let app = App::build("resources");
    let tracerd = Tracerd::start(&[]);
    let mut fx = Fixture::spawn(&app.exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    fx.go();
    fx.expect_line("phase1");
    let (status, first) = tracerd.post(&format!("/pid/{pid}/snapshots?label=before"));
    assert_eq!(status, 201, "{first}");
    assert_eq!(
        (
            first["kind"].as_str(),
            first["label"].as_str(),
            first["pid"].as_u64()
        ),
        (Some("taken"), Some("before"), Some(u64::from(pid)))
    );
    let id1 = first["id"].as_u64().expect("id");
    fx.go();
    fx.read_line();
    fx.expect_line("phase2");
    let (status, second) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    let id2 = second["id"].as_u64().expect("id");
    // By id and by label.
    let (status, by_label) = tracerd.get("/snapshots/before");
    assert_eq!(status, 200);
    assert_eq!(by_label, tracerd.get(&format!("/snapshots/{id1}")).1);
    let inc = enc(&app.src);
    let (status, body) = tracerd.get(&format!(
        "/snapshots/{id2}/compare?base=before&include={inc}&limit=0"
    ));
    assert_eq!(status, 200, "{body}");
    let src = &app.src;
    let (a, r, o) = (
        app.line("SITE_A"),
        app.line("SITE_REC"),
        app.line("SITE_OBJ"),
    );
    assert_eq!(
        texts(&body),
        [
            format!("{src}:{o}: size=4242 B (+4242 B), count=1 (+1), average=4242 B"),
            format!("{src}:{a}: size=1300 B (+300 B), count=13 (+3), average=100 B"),
            format!("{src}:{r}: size=7 B (+7 B), count=1 (+1), average=7 B"),
            format!(
                "{src}:{}: size=1000 B (+0 B), count=5 (+0), average=200 B",
                app.line("SITE_B")
            ),
        ]
    );
    let (status, body) = tracerd.get(&format!(
        "/snapshots/{id1}/statistics?include={inc}&group_by=traceback&limit=1"
    ));
    assert_eq!(status, 200);
    assert_eq!(body["statistics"][0]["size"], 1000);
    assert_eq!(body["snapshot"]["label"], "before");
    // Traces, paged: the same traces in the same order, page by page.
    let (_, all) = tracerd.get(&format!("/snapshots/{id2}/traces?include={inc}&limit=0"));
    assert_eq!(all["total"], 20);
    let mut paged = Vec::new();
    for offset in (0..20).step_by(6) {
        let (status, page) = tracerd.get(&format!(
            "/snapshots/{id2}/traces?include={inc}&offset={offset}&limit=6"
        ));
        assert_eq!(status, 200);
        assert_eq!(page["total"], 20);
        paged.extend(page["traces"].as_array().expect("traces").iter().cloned());
    }
    assert_eq!(Value::Array(paged), all["traces"]);
    let (_, past) = tracerd.get(&format!("/snapshots/{id2}/traces?offset=100"));
    assert_eq!(past["traces"], json!([]));
    // Labels: unique, renamable, removable.
    let (status, err) = tracerd.send(
        Method::PATCH,
        &format!("/snapshots/{id2}?label=before"),
        None,
    );
    assert_eq!(status, 409, "{err}");
    assert_eq!(
        err["error"],
        format!("label \"before\" is already used by snapshot {id1}")
    );
    let (status, renamed) = tracerd.send(
        Method::PATCH,
        &format!("/snapshots/{id2}?label=after"),
        None,
    );
    assert_eq!((status, renamed["label"].as_str()), (200, Some("after")));
    let (status, cleared) = tracerd.send(Method::PATCH, "/snapshots/after?label=", None);
    assert_eq!((status, cleared["label"].clone()), (200, Value::Null));
    // Listing, per pid and for all.
    let (_, list) = tracerd.get(&format!("/pid/{pid}/snapshots"));
    let ids: Vec<u64> = list["snapshots"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["id"].as_u64())
        .collect();
    assert_eq!(ids, [id1, id2]);
    let (_, list) = tracerd.get(&format!("/snapshots?pid={pid}&kind=taken"));
    assert_eq!(list["snapshots"].as_array().map(Vec::len), Some(2));
    // Delete.
    let (status, deleted) = tracerd.send(Method::DELETE, &format!("/snapshots/{id1}"), None);
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["deleted"]["id"], id1);
    let (status, err) = tracerd.get(&format!("/snapshots/{id1}"));
    assert_eq!(status, 404);
    assert_eq!(err["error"], format!("no snapshot with id {id1}"));
    let (status, _) = tracerd.get("/snapshots/before/statistics");
    assert_eq!(status, 404);
}

#[test]
fn compare_since_uses_automatic_snapshots() {
    let app = App::build("since");
    let tracerd = Tracerd::start(&["--snapshot-interval", "1", "--snapshot-retention", "30"]);
    let mut fx = Fixture::spawn(&app.exe, &[], &[]);
    fx.expect_line("ready");
    let pid = fx.pid();
    tracerd.wait_traced(pid);
    fx.go();
    fx.expect_line("phase1");
    let phase1_ms = unix_ms();
    // A young process: since=1h goes back to the start of its tracing.
    let (status, body) = tracerd.get(&format!(
        "/pid/{pid}/compare?since=1h&include={}&limit=0",
        enc(&app.src)
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["base"]["kind"], "tracing_start");
    // Wait for an automatic snapshot taken after phase 1, then until it is
    // more than a second old, so that since=1s reaches back to it (or to a
    // later one, still before phase 2).
    let deadline = Instant::now() + Duration::from_secs(60);
    let auto_ms = loop {
        let (_, list) = tracerd.get(&format!("/pid/{pid}/snapshots"));
        let found = list["snapshots"].as_array().and_then(|l| {
            l.iter()
                .filter(|s| s["kind"] == "auto")
                .filter_map(|s| s["taken_at_ms"].as_u64())
                .find(|&ms| ms > phase1_ms)
        });
        if let Some(ms) = found {
            break ms;
        }
        assert!(Instant::now() < deadline, "no automatic snapshot: {list}");
        std::thread::sleep(Duration::from_millis(100));
    };
    while unix_ms() < auto_ms + 1200 {
        std::thread::sleep(Duration::from_millis(50));
    }
    fx.go();
    fx.read_line();
    fx.expect_line("phase2");
    let (status, body) = tracerd.get(&format!(
        "/pid/{pid}/compare?since=1s&include={}&limit=0",
        enc(&app.src)
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["base"]["kind"], "snapshot", "{}", body["base"]);
    assert_eq!(body["base"]["snapshot_kind"], "auto");
    let src = &app.src;
    let (a, r, o) = (
        app.line("SITE_A"),
        app.line("SITE_REC"),
        app.line("SITE_OBJ"),
    );
    assert_eq!(
        texts(&body)[..3],
        [
            format!("{src}:{o}: size=4242 B (+4242 B), count=1 (+1), average=4242 B"),
            format!("{src}:{a}: size=1300 B (+300 B), count=13 (+3), average=100 B"),
            format!("{src}:{r}: size=7 B (+7 B), count=1 (+1), average=7 B"),
        ]
    );
    // Automatic snapshots are resources too, and not the default base.
    let (_, list) = tracerd.get("/snapshots?kind=auto");
    let auto_id = list["snapshots"][0]["id"]
        .as_u64()
        .expect("an auto snapshot");
    let (status, body) = tracerd.get(&format!("/snapshots/{auto_id}"));
    assert_eq!((status, body["kind"].as_str()), (200, Some("auto")));
    let (_, body) = tracerd.get(&format!("/pid/{pid}/compare?limit=1"));
    assert_eq!(body["base"]["kind"], "tracing_start");
    // base and since together are refused.
    let (status, err) = tracerd.get(&format!("/pid/{pid}/compare?since=1m&base={auto_id}"));
    assert_eq!(status, 400);
    assert_eq!(
        err["hint"],
        "give base (a snapshot id or label) or since (e.g. 10m), not both"
    );
}

fn unix_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(now.expect("clock after 1970").as_millis()).expect("ms fit")
}

/// Runs Python 3.11 on `script` with `args`; returns stdout.
fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new(std::env::var("TRACER_PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

const PY_STATS: &str = r#"
import sys, tracemalloc
snap = tracemalloc.Snapshot.load(sys.argv[1])
print(type(snap).__module__ + "." + type(snap).__name__, snap.traceback_limit, len(snap.traces))
for key, cumulative in (("lineno", False), ("filename", True), ("traceback", False)):
    for stat in snap.statistics(key, cumulative):
        print(stat)
"#;

const PY_TAKE: &str = r#"
import sys, tracemalloc
tracemalloc.start(5)
def grow(n):
    return [bytes(1000 + i % 3) for i in range(n)]
def outer():
    return grow(50)
keep = outer()
keep2 = {i: str(i) * 20 for i in range(30)}
snap = tracemalloc.take_snapshot()
snap.dump(sys.argv[1])
"#;

#[test]
fn dump_and_load_in_both_formats_with_cpython() {
    let app = App::build("dump");
    let dir = TempDir::new("dump-files");
    let tracerd = Tracerd::start(&[]);
    let (fx, _) = app.run(&tracerd, 2);
    let pid = fx.pid();
    let (_, snap) = tracerd.post(&format!("/pid/{pid}/snapshots?label=live"));
    let id = snap["id"].as_u64().expect("id");
    let stats_text = |id: u64| {
        let mut all = Vec::new();
        for q in [
            "group_by=lineno",
            "group_by=filename&cumulative=true",
            "group_by=traceback",
        ] {
            let (status, text) = tracerd.get_text(&format!(
                "/snapshots/{id}/statistics?limit=0&format=text&{q}"
            ));
            assert_eq!(status, 200, "{text}");
            all.extend(text.lines().map(str::to_string));
        }
        all
    };
    let ours = stats_text(id);
    // tracer's format: dump, load back, same statistics and traces.
    let (status, file) = tracerd.get_bytes(&format!("/snapshots/{id}/dump"));
    assert_eq!(status, 200);
    assert_eq!(&file[..8], b"\x89TRSNAP\n");
    let (status, loaded) = tracerd.send(
        Method::POST,
        "/snapshots?label=reloaded",
        Some(file.clone()),
    );
    assert_eq!(status, 201, "{loaded}");
    assert_eq!(
        (loaded["kind"].as_str(), loaded["pid"].clone()),
        (Some("loaded"), Value::Null)
    );
    assert_complete(&loaded);
    let reloaded = loaded["id"].as_u64().expect("id");
    assert_eq!(stats_text(reloaded), ours);
    assert_eq!(loaded["traces"], snap["traces"]);
    assert_eq!(loaded["taken_at_ms"], snap["taken_at_ms"]);
    // tracemalloc's format: Python's Snapshot.load() reads it; equal statistics.
    let (status, pickle) = tracerd.get_bytes(&format!("/snapshots/{id}/dump?format=tracemalloc"));
    assert_eq!(status, 200);
    let path = dir.path().join("ours.pickle");
    std::fs::write(&path, &pickle).expect("write");
    let printed = python(PY_STATS, &[path.to_str().expect("path")]);
    let mut lines = printed.lines();
    assert_eq!(
        lines.next(),
        Some(format!("tracemalloc.Snapshot 16 {}", snap["traces"]).as_str())
    );
    assert_eq!(lines.map(str::to_string).collect::<Vec<_>>(), ours);
    // A snapshot Python took of itself: loaded here, every route works.
    let theirs = dir.path().join("theirs.pickle");
    python(PY_TAKE, &[theirs.to_str().expect("path")]);
    let bytes = std::fs::read(&theirs).expect("pickle");
    let (status, body) = tracerd.send(
        Method::POST,
        "/snapshots?format=tracemalloc&label=python",
        Some(bytes.clone()),
    );
    assert_eq!(status, 201, "{body}");
    // tracemalloc knows no loss: a file of its is complete.
    assert_complete(&body);
    let py_id = body["id"].as_u64().expect("id");
    let expected = python(PY_STATS, &[theirs.to_str().expect("path")]);
    let mut expected = expected.lines();
    let header = expected.next().expect("header");
    assert_eq!(header, format!("tracemalloc.Snapshot 5 {}", body["traces"]));
    assert_eq!(
        stats_text(py_id),
        expected.map(str::to_string).collect::<Vec<_>>()
    );
    // Python ran the code with -c: its frames are in "<string>".
    let (status, body) = tracerd.get(&format!(
        "/snapshots/{py_id}/traces?limit=2&include={}",
        enc("<string>")
    ));
    assert_eq!(status, 200);
    assert_eq!(body["traces"].as_array().map(Vec::len), Some(2));
    // Refused files: clear errors, nothing stored.
    let before = tracerd.get("/snapshots").1["snapshots"]
        .as_array()
        .map(Vec::len);
    let cases: Vec<(Vec<u8>, &str, &str)> = vec![
        (file[..file.len() / 2].to_vec(), "", "corrupt or truncated tracer snapshot: CRC-32 is"),
        (b"hello".to_vec(), "", "not a tracer snapshot: wrong magic bytes"),
        (bytes.clone(), "", "this looks like a Python pickle: load it with format=tracemalloc"),
        (bytes[..bytes.len() - 10].to_vec(), "format=tracemalloc&", "not a tracemalloc snapshot pickle:"),
        (b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.".to_vec(), "format=tracemalloc&", "it refers to posix.system"),
        (file.clone(), "format=tracemalloc&", "it does not start with a PROTO opcode"),
    ];
    for (body, query, message) in cases {
        let (status, err) = tracerd.send(
            Method::POST,
            &format!("/snapshots?{query}label=x"),
            Some(body),
        );
        assert_eq!(status, 400, "{err}");
        assert!(
            err["error"].as_str().expect("error").contains(message),
            "{err} lacks {message:?}"
        );
        assert!(!err["hint"].as_str().expect("hint").is_empty());
    }
    assert_eq!(
        tracerd.get("/snapshots").1["snapshots"]
            .as_array()
            .map(Vec::len),
        before
    );
}

#[test]
fn start_stop_clear_and_reset_peak() {
    let app = App::build("tracing");
    let tracerd = Tracerd::start(&[]);
    let (mut fx, _) = app.run(&tracerd, 1);
    let pid = fx.pid();
    let inc = enc(&app.src);
    let (status, state) = tracerd.get(&format!("/pid/{pid}/tracing"));
    assert_eq!(status, 200);
    assert_eq!(
        state,
        json!({"pid": pid, "is_tracing": true, "traceback_limit": 16, "max_nframe": 16})
    );
    // stop: no snapshot, traced memory (0, 0), as tracemalloc when stopped.
    let (status, state) = tracerd.post(&format!("/pid/{pid}/tracing/stop"));
    assert_eq!((status, state["is_tracing"].clone()), (200, json!(false)));
    let (status, err) = tracerd.get(&format!("/pid/{pid}/statistics"));
    assert_eq!(status, 409);
    assert_eq!(
        err["hint"],
        format!("start it with POST /pid/{pid}/tracing/start")
    );
    let (_, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    assert_eq!(
        (memory["current"].as_u64(), memory["peak"].as_u64()),
        (Some(0), Some(0))
    );
    // Allocations while stopped are not reported after start.
    fx.go();
    fx.read_line();
    fx.expect_line("phase2");
    let (status, state) = tracerd.post(&format!("/pid/{pid}/tracing/start?nframe=1"));
    assert_eq!(status, 200, "{state}");
    assert_eq!(
        (state["started"].clone(), state["traceback_limit"].clone()),
        (json!(true), json!(1))
    );
    let (_, again) = tracerd.post(&format!("/pid/{pid}/tracing/start?nframe=3"));
    assert_eq!(
        (again["started"].clone(), again["traceback_limit"].clone()),
        (json!(false), json!(1)),
        "start while tracing changes nothing"
    );
    let (_, body) = tracerd.get(&format!("/pid/{pid}/statistics?include={inc}"));
    assert_eq!(body["statistics"], json!([]));
    let (_, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    assert!(
        memory["current"].as_u64().expect("current") < 1000,
        "cleared at start: {memory}"
    );
    fx.go();
    fx.expect_line("phase3");
    let b = app.line("SITE_B");
    let (_, body) = tracerd.get(&format!(
        "/pid/{pid}/statistics?include={inc}&group_by=traceback"
    ));
    assert_eq!(
        texts(&body),
        [format!(
            "{}:{b}: size=400 B, count=2, average=200 B",
            app.src
        )]
    );
    assert_eq!(
        body["statistics"][0]["traceback"].as_array().map(Vec::len),
        Some(1),
        "nframe=1"
    );
    assert_eq!(body["traceback_limit"], 1);
    let (_, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    let current = memory["current"].as_u64().expect("current");
    assert!((400..1000).contains(&current), "{memory}");
    // clear_traces: nothing left, current 0; reset_peak: peak = current.
    let (status, cleared) = tracerd.post(&format!("/pid/{pid}/clear-traces"));
    assert_eq!(status, 200, "{cleared}");
    assert!(cleared["cleared_blocks"].as_u64().expect("count") >= 2);
    assert_eq!(
        (cleared["current"].as_u64(), cleared["peak"].as_u64()),
        (Some(0), Some(0))
    );
    let (_, body) = tracerd.get(&format!("/pid/{pid}/statistics"));
    assert_eq!(body["statistics"], json!([]));
    let (status, peak) = tracerd.post(&format!("/pid/{pid}/reset-peak"));
    assert_eq!(status, 200);
    assert_eq!(peak["peak"], peak["current"]);
    // System-wide stop and start.
    let (status, state) = tracerd.post("/tracing/stop");
    assert_eq!((status, state["is_tracing"].clone()), (200, json!(false)));
    assert_eq!(tracerd.get("/statistics").0, 409);
    assert_eq!(tracerd.get(&format!("/pid/{pid}/statistics")).0, 409);
    let (status, state) = tracerd.post("/tracing/start");
    assert_eq!(
        (
            status,
            state["is_tracing"].clone(),
            state["traceback_limit"].clone()
        ),
        (200, json!(true), json!(16))
    );
    assert_eq!(tracerd.get("/statistics").0, 200);
    // Bad nframe: the range, as tracemalloc's ValueError says it.
    for bad in ["0", "17", "x", "-1"] {
        let (status, err) = tracerd.post(&format!("/pid/{pid}/tracing/start?nframe={bad}"));
        assert_eq!(status, 400, "{bad}: {err}");
    }
    tracerd.post(&format!("/pid/{pid}/tracing/stop"));
    let (_, err) = tracerd.post(&format!("/pid/{pid}/tracing/start?nframe=0"));
    assert_eq!(
        err["error"],
        "the number of frames must be in range [1; 16], got 0"
    );
    assert_eq!(err["hint"], "nframe is 1 to 16 (tracerd's --nframe)");
}

#[test]
fn object_traceback_source_lines_and_tracer_memory() {
    let app = App::build("object");
    let tracerd = Tracerd::start(&[]);
    let (fx, address) = app.run(&tracerd, 2);
    let pid = fx.pid();
    let address = address.expect("the fixture printed an address");
    let o = app.line("SITE_OBJ");
    let (status, body) = tracerd.get(&format!("/pid/{pid}/object/{address:#x}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["size"], 4242);
    assert_eq!(body["traceback"][0]["filename"], app.src.as_str());
    assert_eq!(body["traceback"][0]["lineno"], o);
    assert_eq!(body["traceback"][0]["function"], "main");
    // Decimal works too; a wrong address is a 404.
    assert_eq!(tracerd.get(&format!("/pid/{pid}/object/{address}")).0, 200);
    let (status, err) = tracerd.get(&format!("/pid/{pid}/object/{:#x}", address + 8));
    assert_eq!(status, 404, "{err}");
    assert_eq!(
        err["error"],
        format!("no traced block of pid {pid} starts at {:#x}", address + 8)
    );
    // Traceback.format() with source lines, as linecache reads them.
    let (status, text) = tracerd.get_text(&format!(
        "/pid/{pid}/object/{address:#x}?format=text&source=true&tb_limit=1"
    ));
    assert_eq!(status, 200);
    assert_eq!(
        text,
        format!(
            "  File \"{}\", line {o}\n    void *p = malloc(4242); /* SITE_OBJ */\n",
            app.src
        )
    );
    let r = app.line("SITE_REC");
    let rec_call = app.line("REC_CALL");
    let (status, text) = tracerd.get_text(&format!(
        "/pid/{pid}/statistics?group_by=traceback&format=text&source=true&tb_limit=3&most_recent_first=true&include={}",
        enc(&format!("{}:{r}", app.src))
    ));
    assert_eq!(status, 200);
    let src = &app.src;
    let lines: Vec<&str> = text.lines().collect();
    // The statistic's str() shows the oldest frame (libc's start-up code).
    assert!(
        lines[0].ends_with(": size=7 B, count=1, average=7 B"),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[1..],
        [
            &format!("  File \"{src}\", line {r}") as &str,
            "    keep[nkeep++] = malloc(7); /* SITE_REC */",
            &format!("  File \"{src}\", line {rec_call}"),
            "    rec(depth - 1); /* REC_CALL */",
            &format!("  File \"{src}\", line {rec_call}"),
            "    rec(depth - 1); /* REC_CALL */",
        ]
    );
    // get_tracemalloc_memory(): the maps' kernel memory and tracerd's RSS.
    let (status, memory) = tracerd.get("/tracing/memory");
    assert_eq!(status, 200);
    let kernel = memory["kernel_maps"].as_u64().expect("kernel_maps");
    let rss = memory["daemon_rss"].as_u64().expect("daemon_rss");
    assert!(kernel > 1 << 20, "{memory}");
    assert!(rss > 1 << 20, "{memory}");
    assert_eq!(memory["total"].as_u64(), Some(kernel + rss));
    assert!(
        memory["maps"].as_array().map_or(0, Vec::len) >= 5,
        "{memory}"
    );
    let (status, system) = tracerd.get("/tracing");
    assert_eq!(status, 200);
    assert_eq!(
        system,
        json!({"is_tracing": true, "traceback_limit": 16, "max_nframe": 16, "processes": []})
    );
}

/// Every route, every bad parameter: the status and the hint.
#[test]
fn bad_parameters_name_the_valid_values() {
    let app = App::build("bad");
    let tracerd = Tracerd::start(&[]);
    let (fx, _) = app.run(&tracerd, 1);
    let pid = fx.pid();
    let (_, snap) = tracerd.post(&format!("/pid/{pid}/snapshots?label=one"));
    let id = snap["id"].as_u64().expect("id");
    let missing = 4_000_000_000u32;
    let cases: Vec<(Method, String, u16, &str)> = vec![
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
            "format is one of: json, text",
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
    ];
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while tracerd.get(&format!("/pid/{pid}")).1["state"] == "alive" {
        assert!(Instant::now() < deadline, "exit not seen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, err) = tracerd.post(&format!("/pid/{pid}/clear-traces"));
    assert_eq!(status, 409, "{err}");
    assert_eq!(
        err["error"],
        format!("pid {pid} has exited: its blocks are gone")
    );
    assert_eq!(tracerd.get(&format!("/pid/{pid}/statistics")).0, 200);
}
