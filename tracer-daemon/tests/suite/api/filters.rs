//! Which traces a view holds: `include`/`exclude` filters (globs, lines,
//! `all_frames`, domains) as `Snapshot.filter_traces()` keeps them, grouping
//! by function and module (cumulative too), and the system-wide views with
//! one domain per process.

use reqwest::Method;
use serde_json::{Value, json};

use super::{app, assert_complete, enc, run, start, texts};
use crate::suite::support::Tracerd;

#[test]
fn filters_select_traces_like_filter_traces() {
    let (app, tracerd, fx, _) = start(2);
    let pid = fx.pid();
    let src = app.src();
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
    let (app, tracerd, fx, _) = start(2);
    let pid = fx.pid();
    let inc = enc(app.src());
    let get = |query: &str| {
        tracerd.get_ok(&format!(
            "/pid/{pid}/statistics?limit=0&include={inc}&{query}"
        ))
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
    assert_eq!(body["statistics"][1]["traceback"][0]["filename"], app.src());
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
    fx.step("phase3");
    let body = tracerd.get_ok(&format!(
        "/pid/{pid}/compare?group_by=function&limit=1&include={inc}"
    ));
    assert_eq!(
        texts(&body),
        ["alloc_b: size=1400 B (+400 B), count=7 (+2), average=200 B"]
    );
    assert_eq!(body["base"]["id"], base["id"]);
    assert_eq!(body["complete"], true);
    assert_complete(&body["base"]);
    assert_complete(&body["new"]);
    let id = base["id"].as_u64().expect("id");
    let body = tracerd.get_ok(&format!("/snapshots/{id}/statistics?limit=1"));
    assert_complete(&body);
    assert_complete(&body["snapshot"]);
}

#[test]
fn system_wide_views_have_one_domain_per_process() {
    let app = app();
    let tracerd = Tracerd::shared(&[]);
    let (one, _) = run(&app, &tracerd, 2);
    let (two, _) = run(&app, &tracerd, 2);
    let (p1, p2) = (one.pid(), two.pid());
    let a = app.line("SITE_A");
    let body = tracerd.get_ok(&format!(
        "/statistics?include={}&limit=0",
        enc(&format!("{}:{a}", app.src()))
    ));
    assert_eq!(
        texts(&body),
        [format!(
            "{}:{a}: size=2600 B, count=26, average=100 B",
            app.src()
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
    // Other processes of the host may lose events, and those running
    // before tracerd have their tracebacks cut until their tables are
    // compiled (this test's own process); these two lose nothing.
    for pid in [p1, p2] {
        assert_eq!(body["drops_by_pid"].get(pid.to_string()), None, "{body}");
        assert_eq!(
            body["cut_tracebacks_by_pid"].get(pid.to_string()),
            None,
            "{body}"
        );
    }
    assert_eq!(
        body["complete"],
        body["drops"] == 0 && body["cut_tracebacks"] == 0,
        "{body}"
    );
    // Traces carry their pid as domain.
    let o = app.line("SITE_OBJ");
    let body = tracerd.get_ok(&format!(
        "/traces?limit=0&include={}",
        enc(&format!("{}:{o}", app.src()))
    ));
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
    let one_file = enc(&format!("{}@{p1}", app.src()));
    let (_, body) = tracerd.get(&format!(
        "/statistics?include={one_file}&limit=0&group_by=filename"
    ));
    assert_eq!(
        texts(&body),
        [format!(
            "{}:0: size=6549 B, count=20, average=327 B",
            app.src()
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
    one.step("phase3");
    two.step("phase3");
    let b = app.line("SITE_B");
    let body = tracerd.get_ok(&format!(
        "/compare?include={}",
        enc(&format!("{}:{b}", app.src()))
    ));
    assert_eq!(body["base"]["label"], "sys-base");
    assert_eq!(
        texts(&body),
        [format!(
            "{}:{b}: size=2800 B (+800 B), count=14 (+4), average=200 B",
            app.src()
        )]
    );
}
