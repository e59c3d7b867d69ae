//! Allocator wrappers: frame 0 is the first frame outside the allocation
//! machinery (`allocator_frames`, dropped by default), `allocator_frames=keep`
//! shows the wrapper's own line, and a stored snapshot keeps what it was
//! taken with. `fixtures/wrappers.c` allocates through an `xmalloc` and an
//! `xstrdup` of its own (frame pointers: exact without any unwinder) and,
//! when this machine has libglib-2.0.so.0, through glib's `g_malloc` and
//! `g_strdup`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::suite::support::{Fixture, Program, Tracerd, stat_at};

/// `(filename, lineno)` of a JSON frame.
fn place(frame: &Value) -> (String, u64) {
    (
        frame["filename"].as_str().unwrap_or("").to_string(),
        frame["lineno"].as_u64().unwrap_or(0),
    )
}

/// libglib-2.0.so.0 as the compiler finds it, if this machine has it.
fn glib() -> Option<PathBuf> {
    let out = Command::new("cc")
        .arg("-print-file-name=libglib-2.0.so.0")
        .output()
        .expect("run cc");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (path.is_absolute() && path.exists()).then_some(path)
}

/// The fixture, with glib when there is one.
fn build() -> (Program, bool) {
    match glib() {
        Some(lib) => {
            let lib = lib.to_str().expect("utf-8 path").to_string();
            (
                Program::build("wrappers", &["-pthread", "-DWITH_GLIB", &lib]),
                true,
            )
        }
        None => (Program::build("wrappers", &["-pthread"]), false),
    }
}

/// The fixture under a tracerd of its own, past its allocations (waiting
/// for its last go). Dropped in order: the fixture, tracerd, the program.
struct Traced {
    fx: Fixture,
    tracerd: Tracerd,
    prog: Program,
    pid: u32,
    /// The address of its first name block.
    address: u64,
}

impl Traced {
    /// Starts tracerd with `flags`, then `prog` until it has allocated.
    fn start(prog: Program, flags: &[&str]) -> Self {
        let tracerd = Tracerd::start(flags);
        let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
        fx.go();
        let said = fx.read_line();
        let hex = said
            .strip_prefix("name 0x")
            .unwrap_or_else(|| panic!("fixture said {said:?}"));
        let address = u64::from_str_radix(hex, 16).expect("hex address");
        fx.expect_line("done");
        let pid = fx.pid();
        Self {
            fx,
            tracerd,
            prog,
            pid,
            address,
        }
    }

    /// The line of the fixture's `/* marker */`.
    fn line(&self, marker: &str) -> u32 {
        self.prog.line(&format!("/* {marker} */"))
    }

    /// `(filename, lineno)` of the fixture's `/* marker */`, as frames say.
    fn place(&self, marker: &str) -> (String, u64) {
        (self.prog.src().to_string(), u64::from(self.line(marker)))
    }
}

/// `(count, size)` of the statistic whose frame 0 is `file:line`, if any.
fn at(stats: &Value, file: &Path, line: u32) -> Option<(u64, u64)> {
    stat_at(stats, file, line).map(|s| {
        (
            s["count"].as_u64().expect("count"),
            s["size"].as_u64().expect("size"),
        )
    })
}

/// The tracebacks of the traces of `size` bytes (`GET
/// /pid/{pid}/traces?limit=0{query}`).
fn traces_of_size(tracerd: &Tracerd, pid: u32, query: &str, size: u64) -> Vec<Vec<Value>> {
    let body = tracerd.get_ok(&format!("/pid/{pid}/traces?limit=0{query}"));
    body["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .filter(|t| t["size"] == size)
        .map(|t| t["traceback"].as_array().expect("frames").clone())
        .collect()
}

/// `get_object_traceback()` of the block at `address`: its frames and
/// `total_nframe`.
fn object(tracerd: &Tracerd, pid: u32, address: u64, query: &str) -> (Vec<Value>, u64) {
    let body = tracerd.get_ok(&format!("/pid/{pid}/object/{address:#x}{query}"));
    assert_eq!(
        body["allocator_frames"],
        if query.contains("keep") {
            "keep"
        } else {
            "drop"
        }
    );
    (
        body["traceback"].as_array().expect("frames").clone(),
        body["total_nframe"].as_u64().expect("total_nframe"),
    )
}

#[test]
fn blocks_from_wrappers_are_counted_at_the_users_line() {
    let mut t = Traced::start(build().0, &[]);
    let (tracerd, pid, file) = (&t.tracerd, t.pid, &t.prog.source);
    let stat = |stats: &Value, marker: &str| at(stats, file, t.line(marker));

    let body = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    assert_eq!(body["allocator_frames"], "drop");
    let stats = &body["statistics"];
    assert_eq!(stat(stats, "USER_TABLE"), Some((3, 900)), "{body}");
    assert_eq!(stat(stats, "USER_NAME"), Some((2, 42)), "{body}");
    assert_eq!(stat(stats, "USER_DIRECT"), Some((1, 77)), "{body}");
    assert_eq!(stat(stats, "XMALLOC"), None, "{body}");
    assert_eq!(stat(stats, "XSTRDUP"), None, "{body}");

    let body = tracerd.get_ok(&format!(
        "/pid/{pid}/statistics?group_by=lineno&limit=0&allocator_frames=keep"
    ));
    assert_eq!(body["allocator_frames"], "keep");
    let stats = &body["statistics"];
    // Tables and names alike come from xmalloc's call of malloc.
    assert_eq!(stat(stats, "XMALLOC"), Some((5, 942)), "{body}");
    assert_eq!(stat(stats, "USER_DIRECT"), Some((1, 77)), "{body}");
    assert_eq!(stat(stats, "USER_TABLE"), None, "{body}");
    assert_eq!(stat(stats, "USER_NAME"), None, "{body}");

    // The names' whole tracebacks: the wrappers are dropped before nframe
    // counts, and total_nframe counts what is left.
    let kept = traces_of_size(tracerd, pid, "&allocator_frames=keep", 21);
    let dropped = traces_of_size(tracerd, pid, "", 21);
    assert_eq!((kept.len(), dropped.len()), (2, 2));
    assert_eq!(kept[0], kept[1]);
    assert_eq!(dropped[0], dropped[1]);
    let (kept, dropped) = (&kept[0], &dropped[0]);
    let head = |frames: &[Value], n: usize| -> Vec<((String, u64), String)> {
        frames
            .iter()
            .take(n)
            .map(|f| (place(f), f["function"].as_str().unwrap_or("").to_string()))
            .collect()
    };
    let frame = |marker: &str, function: &str| (t.place(marker), function.to_string());
    assert_eq!(
        head(kept, 4),
        [
            frame("XMALLOC", "xmalloc"),
            frame("XSTRDUP", "xstrdup"),
            frame("USER_NAME", "make_name"),
            frame("MAIN_NAME", "main"),
        ]
    );
    assert_eq!(
        head(dropped, 2),
        [frame("USER_NAME", "make_name"), frame("MAIN_NAME", "main")]
    );
    assert_eq!(dropped[..], kept[2..]);
    let (object_kept, kept_total) = object(tracerd, pid, t.address, "?allocator_frames=keep");
    let (object_dropped, dropped_total) = object(tracerd, pid, t.address, "");
    assert_eq!(&object_kept, kept);
    assert_eq!(&object_dropped, dropped);
    assert_eq!(dropped_total, kept_total - 2);
    t.fx.end();
}

#[test]
fn nframe_counts_the_frames_after_the_wrappers() {
    // nframe 3: the kernel walks the two wrapper frames (xmalloc, xstrdup)
    // beyond them, so that three frames remain once they are dropped.
    let mut t = Traced::start(build().0, &["--nframe", "3"]);
    let places = |frames: &[Value]| frames.iter().map(place).collect::<Vec<_>>();
    let (kept, kept_total) = object(&t.tracerd, t.pid, t.address, "?allocator_frames=keep");
    assert_eq!(
        places(&kept),
        [t.place("XMALLOC"), t.place("XSTRDUP"), t.place("USER_NAME")]
    );
    let (frames, total) = object(&t.tracerd, t.pid, t.address, "");
    assert_eq!(frames.len(), 3);
    assert_eq!(
        places(&frames[..2]),
        [t.place("USER_NAME"), t.place("MAIN_NAME")]
    );
    assert_eq!(frames[2]["function"], "__libc_start_call_main");
    // total_nframe counts the frames after the drop.
    assert_eq!(total, kept_total - 2);
    t.fx.end();
}

#[test]
fn glib_wrapper_frames_are_dropped_from_the_front() {
    let (prog, with_glib) = build();
    if !with_glib {
        // This machine has no libglib-2.0.so.0: the xmalloc tests cover
        // wrappers, there is no glib to call.
        return;
    }
    let mut t = Traced::start(prog, &[]);
    let in_glib = |f: &Value| {
        f["function"].as_str().is_some_and(|n| n.starts_with("g_"))
            && f["module"]
                .as_str()
                .is_some_and(|m| m.contains("/libglib-2.0.so.0"))
    };
    // glib is built without frame pointers here: until tracerd unwinds
    // with .eh_frame, the walk skips g_malloc's caller (make_glib_block) or
    // stops in glib. What holds either way: with keep, frame 0 is g_malloc
    // in libglib; with drop, the traceback is the kept one after its
    // leading glib frames (its last frame if all are glib's).
    for (size, count) in [(4444u64, 2usize), (1237, 2)] {
        let kept = traces_of_size(&t.tracerd, t.pid, "&allocator_frames=keep", size);
        let dropped = traces_of_size(&t.tracerd, t.pid, "", size);
        assert_eq!((kept.len(), dropped.len()), (count, count), "{size} bytes");
        for (kept, dropped) in kept.iter().zip(&dropped) {
            assert_eq!(kept[0]["function"], "g_malloc", "{kept:?}");
            assert!(in_glib(&kept[0]), "{kept:?}");
            let glib_frames = kept.iter().take_while(|f| in_glib(f)).count();
            let expected: Vec<&Value> = if glib_frames == kept.len() {
                kept.last().into_iter().collect()
            } else {
                kept[glib_frames..].iter().collect()
            };
            let got: Vec<&Value> = dropped.iter().take(expected.len()).collect();
            assert_eq!(got, expected, "{size} bytes: kept {kept:?}");
        }
    }
    // g_malloc's blocks start in the fixture: at make_glib_block's line
    // once tracerd unwinds through glib, at main's call of it until then.
    for dropped in traces_of_size(&t.tracerd, t.pid, "", 4444) {
        let first = place(&dropped[0]);
        assert!(
            first == t.place("GLIB_MALLOC") || first == t.place("MAIN_GLIB_MALLOC"),
            "{dropped:?}"
        );
    }
    t.fx.end();
}

#[test]
fn a_stored_snapshot_keeps_the_allocator_frames_it_was_taken_with() {
    let mut t = Traced::start(build().0, &[]);
    let (tracerd, pid, file) = (&t.tracerd, t.pid, &t.prog.source);
    let stat = |stats: &Value, marker: &str| at(stats, file, t.line(marker));

    let (status, kept) = tracerd.post(&format!(
        "/pid/{pid}/snapshots?label=with-wrappers&allocator_frames=keep"
    ));
    assert_eq!(status, 201, "{kept}");
    assert_eq!(kept["allocator_frames"], "keep");
    let (status, dropped) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{dropped}");
    assert_eq!(dropped["allocator_frames"], "drop");
    let (kept_id, dropped_id) = (
        kept["id"].as_u64().expect("id"),
        dropped["id"].as_u64().expect("id"),
    );
    let (status, system) = tracerd.post("/snapshots?allocator_frames=keep");
    assert_eq!(status, 201, "{system}");
    assert_eq!(system["allocator_frames"], "keep");

    // Each stored snapshot answers as it was taken.
    let body = tracerd.get_ok(&format!("/snapshots/{kept_id}/statistics?limit=0"));
    assert_eq!(body["snapshot"]["allocator_frames"], "keep");
    assert_eq!(stat(&body["statistics"], "XMALLOC"), Some((5, 942)));
    let body = tracerd.get_ok(&format!("/snapshots/{dropped_id}/statistics?limit=0"));
    assert_eq!(stat(&body["statistics"], "USER_TABLE"), Some((3, 900)));
    assert_eq!(stat(&body["statistics"], "USER_NAME"), Some((2, 42)));
    assert_eq!(
        tracerd.get_ok(&format!("/snapshots/{kept_id}"))["allocator_frames"],
        "keep"
    );

    // Routes that read a stored snapshot refuse the parameter, saying why.
    for path in [
        format!("/snapshots/{kept_id}/statistics?allocator_frames=drop"),
        format!("/snapshots/{kept_id}/traces?allocator_frames=keep"),
        format!("/snapshots/{kept_id}/compare?base={dropped_id}&allocator_frames=keep"),
        format!("/snapshots/{kept_id}?allocator_frames=keep"),
        format!("/pid/{pid}/compare?new={kept_id}&allocator_frames=keep"),
    ] {
        let (status, body) = tracerd.get(&path);
        assert_eq!(status, 400, "{path}: {body}");
        let error = body["error"].as_str().expect("error");
        assert!(
            error.starts_with("allocator_frames applies only when a snapshot is taken"),
            "{path}: {error}"
        );
    }
    // A bad value names the valid ones.
    let (status, body) = tracerd.get(&format!("/pid/{pid}/statistics?allocator_frames=all"));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"], "invalid allocator_frames \"all\"");
    assert!(
        body["hint"]
            .as_str()
            .is_some_and(|h| h.starts_with("allocator_frames is one of: keep, drop")),
        "{body}"
    );

    // A compare never mixes the two; the default base is taken alike.
    let (status, body) = tracerd.get(&format!("/pid/{pid}/compare?base={kept_id}"));
    assert_eq!(status, 409, "{body}");
    let (status, body) = tracerd.get(&format!("/snapshots/{dropped_id}/compare?base={kept_id}"));
    assert_eq!(status, 409, "{body}");
    let body = tracerd.get_ok(&format!("/pid/{pid}/compare?allocator_frames=keep&limit=0"));
    assert_eq!(body["base"]["id"], kept_id, "{body}");
    assert_eq!(body["base"]["allocator_frames"], "keep");
    let xmalloc = stat_at(&body["statistics"], file, t.line("XMALLOC")).expect("xmalloc's line");
    assert_eq!(
        (xmalloc["count"].as_u64(), xmalloc["count_diff"].as_i64()),
        (Some(5), Some(0))
    );
    let body = tracerd.get_ok(&format!("/pid/{pid}/compare?limit=0"));
    assert_eq!(body["base"]["id"], dropped_id, "{body}");

    // get_object_traceback() of a name, both ways.
    let (dropped, _) = object(tracerd, pid, t.address, "");
    let (kept, _) = object(tracerd, pid, t.address, "?allocator_frames=keep");
    assert_eq!(place(&dropped[0]), t.place("USER_NAME"));
    assert_eq!(place(&kept[0]), t.place("XMALLOC"));
    t.fx.end();
}
