//! Dump and load in both formats: tracer's own file read back whole, and
//! tracemalloc's pickle that CPython reads and writes; refused files.

use std::process::Command;

use reqwest::Method;
use serde_json::Value;

use super::{assert_complete, enc, start};
use crate::suite::support::{TempDir, output_ok};

/// Runs Python 3.11 on `script` with `args`; returns stdout.
fn python(script: &str, args: &[&str]) -> String {
    let out = output_ok(
        Command::new(std::env::var("TRACER_PYTHON").unwrap_or_else(|_| "python3".into()))
            .arg("-c")
            .arg(script)
            .args(args),
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// CPython's statistics of a pickle. For `filename`, a site of a module
/// without lines (`FILE!FUNC+0xOFF`, `FILE+0xOFF`, line 0) is grouped by
/// its module, as tracer documents (docs/api.md: CPython groups by the
/// whole name): its frames are renamed to the module and CPython groups.
const PY_STATS: &str = r#"
import re, sys, tracemalloc
snap = tracemalloc.Snapshot.load(sys.argv[1])
print(type(snap).__module__ + "." + type(snap).__name__, snap.traceback_limit, len(snap.traces))
def module(frame):
    name, lineno = frame
    if lineno == 0:
        name = re.sub(r"(![^/]*|\+0x[0-9a-f]+)$", "", name)
    return (name, lineno)
by_module = tracemalloc.Snapshot(
    [(d, size, tuple(module(f) for f in tb), *rest) for (d, size, tb, *rest) in snap.traces._traces],
    snap.traceback_limit,
)
for key, cumulative, of in (("lineno", False, snap), ("filename", True, by_module), ("traceback", False, snap)):
    for stat in of.statistics(key, cumulative):
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
    let (_app, tracerd, fx, _) = start(2);
    let dir = TempDir::new("dump-files");
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
