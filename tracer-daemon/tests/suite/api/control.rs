//! tracemalloc's module functions over HTTP: `start(nframe)`, `stop()`,
//! `clear_traces()`, `reset_peak()`, `get_object_traceback()` with
//! `Traceback.format()` and source lines, and `get_tracemalloc_memory()`.

use serde_json::json;

use super::{enc, phase2, start, texts};

#[test]
fn start_stop_clear_and_reset_peak() {
    let (app, tracerd, mut fx, _) = start(1);
    let pid = fx.pid();
    let inc = enc(app.src());
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
    phase2(&mut fx);
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
    fx.step("phase3");
    let b = app.line("SITE_B");
    let (_, body) = tracerd.get(&format!(
        "/pid/{pid}/statistics?include={inc}&group_by=traceback"
    ));
    assert_eq!(
        texts(&body),
        [format!(
            "{}:{b}: size=400 B, count=2, average=200 B",
            app.src()
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
    let (app, tracerd, fx, address) = start(2);
    let pid = fx.pid();
    let address = address.expect("the fixture printed an address");
    let o = app.line("SITE_OBJ");
    let body = tracerd.get_ok(&format!("/pid/{pid}/object/{address:#x}"));
    assert_eq!(body["size"], 4242);
    assert_eq!(body["traceback"][0]["filename"], app.src());
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
            app.src()
        )
    );
    let r = app.line("SITE_REC");
    let rec_call = app.line("REC_CALL");
    let (status, text) = tracerd.get_text(&format!(
        "/pid/{pid}/statistics?group_by=traceback&format=text&source=true&tb_limit=3&most_recent_first=true&include={}",
        enc(&format!("{}:{r}", app.src()))
    ));
    assert_eq!(status, 200);
    let src = app.src();
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
