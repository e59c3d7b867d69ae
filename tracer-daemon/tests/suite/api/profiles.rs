//! `format=pprof`, `collapsed` and `svg` of the statistics and compare
//! routes, judged by tools nobody here wrote: Go's `go tool pprof` reads
//! the profiles (`-top`, `-traces`, `-diff_base`) and must find tracer's
//! own JSON statistics and compare, number for number; inferno (the
//! library) reads the folded stacks; Python's XML parser reads the SVG.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use reqwest::{Method, header::CONTENT_TYPE};
use serde_json::Value;

use super::{phase2, start};
use crate::suite::support::{Fixture, Program, SharedTracerd, TempDir, Tracerd, output_ok};

mod flame;

use flame::{folded, folded_stack, well_formed};

/// GETs `path`, which must answer 200 with `content_type`; its body.
fn get_as(tracerd: &Tracerd, path: &str, content_type: &str) -> Vec<u8> {
    let response = tracerd.request(Method::GET, path);
    let status = response.status().as_u16();
    let kind = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = response.bytes().expect("body").to_vec();
    assert_eq!(
        (status, kind.as_str()),
        (200, content_type),
        "GET {path}: {}",
        String::from_utf8_lossy(&body)
    );
    body
}

/// The profile at `path` saved as `dir/name`.
pub(crate) fn save_profile(tracerd: &Tracerd, path: &str, dir: &Path, name: &str) -> PathBuf {
    let body = get_as(tracerd, path, "application/octet-stream");
    assert_eq!(&body[..2], [0x1f, 0x8b], "{path}: gzip");
    let file = dir.join(name);
    std::fs::write(&file, body).expect("write profile");
    file
}

/// `go tool pprof ARGS` (every node, sizes in bytes); its output.
pub(crate) fn pprof(dir: &Path, args: &[&str]) -> String {
    let out = output_ok(
        Command::new("go")
            .args([
                "tool",
                "pprof",
                "-unit=B",
                "-nodefraction=0",
                "-nodecount=1000000",
            ])
            .args(args)
            .env("PPROF_TMPDIR", dir)
            .env("HOME", dir),
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A value as pprof prints it with `-unit=B` (`1300B`, `-7B`, `0`) or as a
/// count (`13`).
fn value_of(text: &str) -> i64 {
    text.trim_end_matches('B')
        .parse()
        .unwrap_or_else(|_| panic!("not a pprof value: {text:?}"))
}

/// pprof's `-top` table: the total it accounts for, and each node's flat
/// value (nodes whose flat is 0 left out) by name.
pub(crate) fn top(output: &str) -> (i64, BTreeMap<String, i64>) {
    let total = output
        .lines()
        .find_map(|l| l.strip_prefix("Showing nodes accounting for "))
        .and_then(|l| l.split(" of ").nth(1))
        .and_then(|l| l.strip_suffix(" total"))
        .map(value_of)
        .unwrap_or_else(|| panic!("no total in {output}"));
    let mut flat = BTreeMap::new();
    let rows = output
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1);
    for row in rows {
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert!(fields.len() > 5, "{row:?} in {output}");
        let value = value_of(fields[0]);
        if value != 0 {
            let name = fields[5..].join(" ");
            assert!(
                flat.insert(name, value).is_none(),
                "{row:?} twice in {output}"
            );
        }
    }
    (total, flat)
}

/// pprof's `-traces`: each sample's value and its frames, most recent
/// first, sorted.
pub(crate) fn traces(output: &str) -> Vec<(i64, Vec<String>)> {
    let separator = "-----------+";
    let mut samples = Vec::new();
    let body = output.split_once(separator).map_or("", |(_, b)| b);
    for block in body.split(separator) {
        let mut lines = block.lines().skip(1).filter(|l| !l.trim().is_empty());
        let Some(first) = lines.next() else { continue };
        let (value, frame) = first
            .trim_start()
            .split_once("   ")
            .expect("value and frame");
        let mut frames = vec![frame.trim().to_string()];
        frames.extend(lines.map(|l| l.trim().to_string()));
        samples.push((value_of(value), frames));
    }
    samples.sort();
    samples
}

/// The name pprof gives a frame at line granularity (`-lines`; pprof's
/// `NodeInfo.NameComponents`): `function file:line`, `function file`
/// without a line; the fixture's and the C library's names are plain C
/// names, which pprof shows as they are. pprof shows a file name cleaned
/// as Go's `filepath.Clean` cleans it (the C library's DWARF has
/// `./libio/filedoalloc.c` and `csu/../sysdeps/...`).
///
/// A frame with no line info (JSON `"file"`: its name without the site) is
/// the function its site names, as the profile documents it
/// (`profile/pprof.rs`, docs/api.md): `FUNCTION+0xOFFSET` of
/// `FILE!FUNCTION+0xOFFSET`, else all of `FILE+0xOFFSET`, in the file
/// `FILE`: the program's `_start+0x21 /tmp/.../apifix`.
fn pprof_name(frame: &Value) -> String {
    let filename = frame["filename"].as_str().expect("filename");
    let (function, file) = match frame["file"].as_str() {
        Some(file) => {
            let site = filename
                .strip_prefix(file)
                .expect("the file starts the name");
            (site.strip_prefix('!').unwrap_or(filename), file)
        }
        None => (frame["function"].as_str().unwrap_or(""), filename),
    };
    let file = clean(file);
    let place = match frame["lineno"].as_u64().expect("lineno") {
        0 => file.to_string(),
        line => format!("{file}:{line}"),
    };
    if function.is_empty() {
        place
    } else {
        format!("{function} {place}")
    }
}

/// A path as Go's `filepath.Clean` makes it: no `.`, no `name/..`, no
/// doubled `/`.
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            ".." if rooted => {}
            _ => parts.push(part),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// POSTs a snapshot of `pid` (with `query`); its id.
fn take(tracerd: &Tracerd, pid: u32, query: &str) -> u64 {
    let (status, taken) = tracerd.post(&format!("/pid/{pid}/snapshots{query}"));
    assert_eq!(status, 201, "{taken}");
    taken["id"].as_u64().expect("id")
}

/// The fixture under a tracerd, with a snapshot after its phase 1 (`query`
/// gives it a label) and one after its phase 2: their ids.
fn two_snapshots(query: &str) -> (Program, SharedTracerd, Fixture, u64, u64) {
    let (app, tracerd, mut fx, _) = start(1);
    let id1 = take(&tracerd, fx.pid(), query);
    phase2(&mut fx);
    let id2 = take(&tracerd, fx.pid(), "");
    (app, tracerd, fx, id1, id2)
}

/// The statistics of a JSON answer.
fn stats(body: &Value) -> &Vec<Value> {
    body["statistics"].as_array().expect("statistics")
}

fn num(value: &Value, field: &str) -> i64 {
    value[field]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} of {value}"))
}

/// By pprof's name of its one frame: each `group_by=lineno` statistic's
/// `field` (0s left out).
fn by_line(body: &Value, field: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for s in stats(body) {
        let frames = s["traceback"].as_array().expect("traceback");
        assert_eq!(frames.len(), 1, "{s}");
        if num(s, field) != 0 {
            let previous = out.insert(pprof_name(&frames[0]), num(s, field));
            assert!(previous.is_none(), "two statistics named alike: {s}");
        }
    }
    out
}

/// The sum of `field` over the statistics.
fn sum(body: &Value, field: &str) -> i64 {
    stats(body).iter().map(|s| num(s, field)).sum()
}

/// The JSON of a statistics or compare route with `query` (group_by and
/// all groups).
fn json_of(tracerd: &Tracerd, route: &str, query: &str) -> Value {
    let body = tracerd.get_ok(&format!("{route}{query}limit=0"));
    assert_eq!(body["complete"], true, "{body}");
    body
}

#[test]
fn pprof_profile_reads_in_go_as_tracer_statistics() {
    let (app, tracerd, mut fx, _) = start(2);
    let pid = fx.pid();
    let dir = TempDir::new("pprof");
    let id = take(&tracerd, pid, "");
    let route = format!("/snapshots/{id}/statistics");
    let by_traceback = json_of(&tracerd, &route, "?group_by=traceback&");
    let by_lineno = json_of(&tracerd, &route, "?group_by=lineno&");
    let stored = save_profile(
        &tracerd,
        &format!("{route}?format=pprof"),
        dir.path(),
        "s.pb.gz",
    );
    // The process is paused: now is the stored snapshot.
    let live = save_profile(
        &tracerd,
        &format!("/pid/{pid}/statistics?format=pprof"),
        dir.path(),
        "live.pb.gz",
    );
    let total_bytes = sum(&by_traceback, "size");
    let total_blocks = sum(&by_traceback, "count");
    // The fixture's 13 blocks of 100 B, 5 of 200 B, 7 B and 4242 B, and the
    // C library's own (its stdout buffer).
    assert!(total_bytes > 1300 + 1000 + 7 + 4242, "{by_traceback}");
    for profile in [&stored, &live] {
        let file = profile.to_str().expect("path");
        let space = pprof(
            dir.path(),
            &["-top", "-lines", "-sample_index=inuse_space", file],
        );
        let (total, flat) = top(&space);
        assert_eq!(total, total_bytes, "{space}");
        assert_eq!(flat, by_line(&by_lineno, "size"), "{space}");
        let objects = pprof(
            dir.path(),
            &["-top", "-lines", "-sample_index=inuse_objects", file],
        );
        let (total, flat) = top(&objects);
        assert_eq!(total, total_blocks, "{objects}");
        assert_eq!(flat, by_line(&by_lineno, "count"), "{objects}");
    }
    // The fixture's lines, by name, as go prints them.
    let (_, flat) = top(&pprof(
        dir.path(),
        &["-top", "-lines", stored.to_str().expect("path")],
    ));
    let src = app.src();
    for (function, marker, bytes) in [
        ("alloc_a", "SITE_A", 1300),
        ("alloc_b", "SITE_B", 1000),
        ("rec", "SITE_REC", 7),
        ("main", "SITE_OBJ", 4242),
    ] {
        let name = format!("{function} {src}:{}", app.line(marker));
        assert_eq!(flat.get(&name), Some(&bytes), "{name} in {flat:?}");
    }
    // One sample per traceback: go's -traces are tracer's tracebacks.
    let mut expected: Vec<(i64, Vec<String>)> = stats(&by_traceback)
        .iter()
        .map(|s| {
            let frames = s["traceback"].as_array().expect("traceback");
            (num(s, "size"), frames.iter().map(pprof_name).collect())
        })
        .collect();
    expected.sort();
    let output = pprof(
        dir.path(),
        &["-traces", "-lines", stored.to_str().expect("path")],
    );
    let got = traces(&output);
    assert_eq!(got, expected, "{output}");
    // The executable is pprof's main binary.
    assert!(output.starts_with("File: apifix\n"), "{output}");
    // The recursion: four frames of rec under main.
    let rec: Vec<_> = got.iter().filter(|(size, _)| *size == 7).collect();
    assert_eq!(rec.len(), 1, "{output}");
    assert_eq!(
        rec[0].1[..5],
        [
            format!("rec {src}:{}", app.line("SITE_REC")),
            format!("rec {src}:{}", app.line("REC_CALL")),
            format!("rec {src}:{}", app.line("REC_CALL")),
            format!("rec {src}:{}", app.line("REC_CALL")),
            format!("main {src}:{}", app.line("CALL_REC")),
        ]
    );
    fx.end();
}

#[test]
fn pprof_compare_is_go_diff_base_of_the_two_sides() {
    let (app, tracerd, mut fx, id1, id2) = two_snapshots("?label=base");
    let pid = fx.pid();
    let dir = TempDir::new("pprof-diff");
    let base = save_profile(
        &tracerd,
        &format!("/snapshots/{id1}/statistics?format=pprof"),
        dir.path(),
        "base.pb.gz",
    );
    let new = save_profile(
        &tracerd,
        &format!("/snapshots/{id2}/statistics?format=pprof"),
        dir.path(),
        "new.pb.gz",
    );
    let compare = json_of(
        &tracerd,
        &format!("/snapshots/{id2}/compare"),
        &format!("?base={id1}&group_by=lineno&"),
    );
    let size_diff = by_line(&compare, "size_diff");
    let count_diff = by_line(&compare, "count_diff");
    let src = app.src();
    // Phase 2: alloc_a(3), rec(3), malloc(4242).
    assert_eq!(
        (
            size_diff.get(&format!("alloc_a {src}:{}", app.line("SITE_A"))),
            size_diff.get(&format!("rec {src}:{}", app.line("SITE_REC"))),
            size_diff.get(&format!("main {src}:{}", app.line("SITE_OBJ"))),
        ),
        (Some(&300), Some(&7), Some(&4242)),
        "{compare}"
    );
    let diff_total: i64 = size_diff.values().sum();
    // go's -diff_base of the two stored sides.
    let (base_file, new_file) = (base.to_str().expect("path"), new.to_str().expect("path"));
    let diff_base = format!("-diff_base={base_file}");
    let output = pprof(
        dir.path(),
        &[
            "-top",
            "-lines",
            "-sample_index=inuse_space",
            &diff_base,
            new_file,
        ],
    );
    assert_eq!(top(&output).1, size_diff, "{output}");
    assert!(
        output.contains(&format!("Showing nodes accounting for {diff_total}B")),
        "{output}"
    );
    let output = pprof(
        dir.path(),
        &[
            "-top",
            "-lines",
            "-sample_index=inuse_objects",
            &diff_base,
            new_file,
        ],
    );
    assert_eq!(top(&output).1, count_diff, "{output}");
    // tracer's own compare as a profile reads the same, from the stored
    // pair and from the live process (paused: now is snapshot 2).
    for (path, name) in [
        (
            format!("/snapshots/{id2}/compare?base={id1}&format=pprof"),
            "compare.pb.gz",
        ),
        (
            format!("/pid/{pid}/compare?base=base&format=pprof"),
            "live-compare.pb.gz",
        ),
    ] {
        let file = save_profile(&tracerd, &path, dir.path(), name);
        let file = file.to_str().expect("path");
        let output = pprof(dir.path(), &["-top", "-lines", file]);
        assert_eq!(top(&output).1, size_diff, "{path}: {output}");
        let output = pprof(
            dir.path(),
            &["-top", "-lines", "-sample_index=inuse_objects", file],
        );
        assert_eq!(top(&output).1, count_diff, "{path}: {output}");
    }
    fx.end();
}

#[test]
fn collapsed_and_svg_flame_graphs_sum_to_the_statistics() {
    let (app, tracerd, mut fx, id1, id2) = two_snapshots("");
    let pid = fx.pid();
    let dir = TempDir::new("flame");
    let tracebacks = |id: u64| {
        json_of(
            &tracerd,
            &format!("/snapshots/{id}/statistics"),
            "?group_by=traceback&",
        )
    };
    let (old, new) = (tracebacks(id1), tracebacks(id2));
    // Statistics: one line per traceback, root first, its bytes.
    let text = String::from_utf8(get_as(
        &tracerd,
        &format!("/snapshots/{id2}/statistics?format=collapsed"),
        "text/plain; charset=utf-8",
    ))
    .expect("utf-8");
    let mut expected: Vec<(String, Vec<i64>)> = stats(&new)
        .iter()
        .map(|s| (folded_stack(s), vec![num(s, "size")]))
        .collect();
    expected.sort();
    let lines = folded(&text, 1);
    assert_eq!(lines, expected, "{text}");
    let total: i64 = lines.iter().map(|(_, v)| v[0]).sum();
    assert_eq!(total, sum(&new, "size"));
    let src = app.src();
    let rec_stack = format!(
        "main ({src}:{call});rec ({src}:{r});rec ({src}:{r});rec ({src}:{r});rec ({src}:{site}) 7",
        call = app.line("CALL_REC"),
        r = app.line("REC_CALL"),
        site = app.line("SITE_REC"),
    );
    assert!(
        text.lines().any(|l| l.ends_with(&rec_stack)),
        "{rec_stack} in {text}"
    );
    // inferno reads it.
    let mut options = inferno::flamegraph::Options::default();
    let mut drawn = Vec::new();
    inferno::flamegraph::from_lines(&mut options, text.lines(), &mut drawn).expect("inferno");
    let drawn = well_formed(&drawn, dir.path());
    assert!(
        drawn.contains(&format!("alloc_a ({src}:{})", app.line("SITE_A"))),
        "{drawn}"
    );
    // The live process's flame graph: well formed, titled, the fixture's
    // functions in it.
    let svg = get_as(
        &tracerd,
        &format!("/pid/{pid}/statistics?format=svg"),
        "image/svg+xml",
    );
    let texts = well_formed(&svg, dir.path());
    assert!(
        texts.contains(&format!("tracer: pid {pid} (apifix): bytes in use")),
        "{texts}"
    );
    for function in ["alloc_a", "alloc_b", "rec", "main"] {
        assert!(
            texts.contains(&format!("{function} ({src}:")),
            "{function} in {texts}"
        );
    }
    // A compare: BASE NEW bytes per traceback, summing to each side's total.
    let text = String::from_utf8(get_as(
        &tracerd,
        &format!("/snapshots/{id2}/compare?base={id1}&format=collapsed"),
        "text/plain; charset=utf-8",
    ))
    .expect("utf-8");
    let lines = folded(&text, 2);
    let base_total: i64 = lines.iter().map(|(_, v)| v[0]).sum();
    let new_total: i64 = lines.iter().map(|(_, v)| v[1]).sum();
    assert_eq!(
        (base_total, new_total),
        (sum(&old, "size"), sum(&new, "size"))
    );
    assert!(
        text.lines()
            .any(|l| l.ends_with(&rec_stack.replace(" 7", " 0 7"))),
        "{text}"
    );
    let svg = get_as(
        &tracerd,
        &format!("/snapshots/{id2}/compare?base={id1}&format=svg"),
        "image/svg+xml",
    );
    let texts = well_formed(&svg, dir.path());
    assert!(
        texts.contains(&format!(
            "tracer: compare, snapshot {id1} (base) to snapshot {id2} (new): bytes in use"
        )),
        "{texts}"
    );
    assert!(
        texts.contains(&format!("rec ({src}:{})", app.line("SITE_REC"))),
        "{texts}"
    );
    fx.end();
}

#[test]
fn profile_formats_refuse_what_they_cannot_draw() {
    let (_app, tracerd, mut fx, _) = start(1);
    let pid = fx.pid();
    let id = take(&tracerd, pid, "");
    for route in [
        format!("/pid/{pid}/statistics?"),
        format!("/pid/{pid}/compare?"),
        "/statistics?".to_string(),
        "/compare?".to_string(),
        format!("/snapshots/{id}/statistics?"),
        format!("/snapshots/{id}/compare?base={id}&"),
    ] {
        let (status, body) = tracerd.get(&format!("{route}format=flame"));
        assert_eq!(status, 400, "{route}: {body}");
        assert_eq!(
            (&body["error"], &body["hint"]),
            (
                &Value::from("invalid format \"flame\""),
                &Value::from("format is one of: json, text, pprof, collapsed, svg")
            ),
            "{route}"
        );
        let (status, body) = tracerd.get(&format!("{route}format=pprof&cumulative=true"));
        assert_eq!(status, 400, "{route}: {body}");
        assert_eq!(
            body["error"],
            "cumulative=true does not apply to format=pprof, collapsed or svg"
        );
    }
    // The traces routes keep json and text.
    let (status, body) = tracerd.get(&format!("/pid/{pid}/traces?format=pprof"));
    assert_eq!(
        (status, &body["hint"]),
        (400, &Value::from("format is one of: json, text"))
    );
    fx.end();
}
