//! Stored snapshots survive tracerd: taken, labelled and loaded snapshots
//! are files in the state directory, written atomically, read back at start
//! after a SIGKILL; a corrupt file is refused with a clear error and
//! nothing else is lost; ids are never given twice.

use reqwest::Method;
use serde_json::Value;

use super::support::{Fixture, Program, TempDir, Tracerd, snapshot_ids};

/// Everything a client can see of one stored snapshot.
fn observe(tracerd: &Tracerd, id: u64) -> (Value, Vec<u8>, String, Value) {
    let (status, summary) = tracerd.get(&format!("/snapshots/{id}"));
    assert_eq!(status, 200, "snapshot {id}: {summary}");
    let (status, dump) = tracerd.get_bytes(&format!("/snapshots/{id}/dump"));
    assert_eq!(status, 200);
    let (status, stats) = tracerd.get_text(&format!(
        "/snapshots/{id}/statistics?group_by=traceback&limit=0&format=text"
    ));
    assert_eq!(status, 200);
    let (status, traces) = tracerd.get(&format!("/snapshots/{id}/traces?limit=0"));
    assert_eq!(status, 200);
    (summary, dump, stats, traces["traces"].clone())
}

/// The summary without what depends on the run that reads it.
fn stable(summary: &Value) -> Value {
    let mut s = summary.clone();
    if let Some(map) = s.as_object_mut() {
        map.remove("this_run");
    }
    s
}

#[test]
fn snapshots_survive_sigkill_and_a_corrupt_file_loses_nothing_else() {
    let state = TempDir::new("persist-state");
    let prog = Program::build("persist", &[]);

    let mut tracerd = Tracerd::start_at(state.path(), &[]);
    let mut fx = Fixture::spawn_traced(&tracerd, &prog.exe, &[]);
    let pid = fx.pid();
    let (status, empty) = tracerd.post(&format!("/pid/{pid}/snapshots?label=empty"));
    assert_eq!(status, 201, "{empty}");
    fx.step("allocated");
    let (_, full) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    let (_, system) = tracerd.send(Method::POST, "/snapshots?label=everything", None);
    let (_, dump) = tracerd.get_bytes(&format!("/snapshots/{}/dump", full["id"]));
    let (status, loaded) = tracerd.send(Method::POST, "/snapshots?label=copy", Some(dump));
    assert_eq!(status, 201, "{loaded}");
    let (_, pickle) = tracerd.get_bytes(&format!(
        "/snapshots/{}/dump?format=tracemalloc",
        full["id"]
    ));
    let (status, from_pickle) =
        tracerd.send(Method::POST, "/snapshots?format=tracemalloc", Some(pickle));
    assert_eq!(status, 201, "{from_pickle}");
    let (_, deleted) = tracerd.post(&format!("/pid/{pid}/snapshots?label=gone"));
    assert_eq!(tracerd.send(Method::DELETE, "/snapshots/gone", None).0, 200);
    let ids: Vec<u64> = [&empty, &full, &system, &loaded, &from_pickle]
        .iter()
        .map(|s| s["id"].as_u64().expect("id"))
        .collect();
    let before: Vec<_> = ids.iter().map(|&id| observe(&tracerd, id)).collect();
    assert!(before[1].2.contains("count=40"), "{}", before[1].2);

    // SIGKILL: no shutdown code runs.
    tracerd.kill9();
    assert!(fx.finish().success());
    let tracerd = Tracerd::start_at(state.path(), &[]);
    let (_, list) = tracerd.get("/snapshots");
    let listed = snapshot_ids(&list);
    assert_eq!(listed, ids, "every stored snapshot, and only those");
    assert_eq!(list["unreadable"], Value::Array(Vec::new()));
    for (id, (summary, dump, stats, traces)) in ids.iter().zip(&before) {
        let (summary2, dump2, stats2, traces2) = observe(&tracerd, *id);
        assert_eq!(stable(&summary2), stable(summary), "snapshot {id}");
        assert_eq!(
            summary2["this_run"], false,
            "read back from the state directory"
        );
        assert_eq!(&dump2, dump, "snapshot {id}: dump differs");
        assert_eq!(&stats2, stats, "snapshot {id}: statistics differ");
        assert_eq!(&traces2, traces, "snapshot {id}: traces differ");
    }
    assert_eq!(tracerd.get("/snapshots/empty").1["id"], empty["id"]);
    assert_eq!(tracerd.get("/snapshots/copy").1["id"], loaded["id"]);
    assert_eq!(tracerd.get("/snapshots/gone").0, 404);
    // Compare across the restart.
    let (status, body) = tracerd.get(&format!(
        "/snapshots/{}/compare?base=empty&limit=1",
        full["id"]
    ));
    assert_eq!(status, 200);
    assert_eq!(body["statistics"][0]["count_diff"], 40);
    // New ids never reuse old ones (not even the deleted one's).
    let (_, fresh) = tracerd.send(Method::POST, "/snapshots", None);
    let fresh_id = fresh["id"].as_u64().expect("id");
    assert!(
        fresh_id > deleted["id"].as_u64().expect("id"),
        "{fresh_id} reuses an id"
    );

    // A truncated file and a garbage file: refused, named, the rest intact.
    drop(tracerd);
    let files = state.path().join("snapshots");
    let victim = files.join(format!("{}.tsnap", full["id"]));
    let bytes = std::fs::read(&victim).expect("snapshot file");
    std::fs::write(&victim, &bytes[..bytes.len() - 7]).expect("truncate");
    std::fs::write(files.join("77777.tsnap"), b"not a snapshot").expect("garbage");
    let mut tracerd = Tracerd::start_at(state.path(), &[]);
    let (_, list) = tracerd.get("/snapshots");
    let listed = snapshot_ids(&list);
    let expected: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|&id| id != full["id"])
        .chain([fresh_id])
        .collect();
    assert_eq!(listed, expected);
    let unreadable = list["unreadable"].as_array().expect("unreadable");
    assert_eq!(unreadable.len(), 2, "{list}");
    assert_eq!(unreadable[0]["path"], victim.to_str().expect("path"));
    assert!(
        unreadable[0]["error"]
            .as_str()
            .expect("error")
            .starts_with("corrupt or truncated tracer snapshot: CRC-32 is"),
        "{}",
        unreadable[0]["error"]
    );
    assert_eq!(
        unreadable[1]["error"],
        "not a tracer snapshot: wrong magic bytes"
    );
    for (id, (summary, dump, ..)) in ids.iter().zip(&before) {
        if *id == full["id"] {
            assert_eq!(tracerd.get(&format!("/snapshots/{id}")).0, 404);
            continue;
        }
        let (summary2, dump2, ..) = observe(&tracerd, *id);
        assert_eq!(stable(&summary2), stable(summary));
        assert_eq!(&dump2, dump);
    }
    assert!(victim.exists(), "a refused file stays for inspection");
    tracerd.terminate();
}

#[test]
fn a_snapshot_file_removed_or_changed_under_tracerd_is_a_409_naming_it() {
    let state = TempDir::new("persist-behind");
    let mut tracerd = Tracerd::start_at(state.path(), &[]);
    let (status, a) = tracerd.send(Method::POST, "/snapshots?label=a", None);
    assert_eq!(status, 201, "{a}");
    let (status, b) = tracerd.send(Method::POST, "/snapshots?label=b", None);
    assert_eq!(status, 201, "{b}");
    let (a, b) = (a["id"].as_u64().expect("id"), b["id"].as_u64().expect("id"));
    let file = |id: u64| state.path().join(format!("snapshots/{id}.tsnap"));

    std::fs::remove_file(file(a)).expect("remove");
    let (status, body) = tracerd.get(&format!("/snapshots/{a}/statistics"));
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        body["error"],
        format!(
            "the file of snapshot {a}, {}, was removed behind tracerd's back: its traces are gone",
            file(a).display()
        )
    );
    assert_eq!(
        body["hint"],
        format!(
            "tracerd keeps a stored snapshot in its file and reads it on use: put the file back as tracerd wrote it, or drop the snapshot with DELETE /snapshots/{a} (a restart of tracerd reads the state directory anew)"
        )
    );

    let mut bytes = std::fs::read(file(b)).expect("read");
    bytes.push(0);
    std::fs::write(file(b), bytes).expect("append");
    let (status, body) = tracerd.get(&format!("/snapshots/{b}/traces"));
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        body["error"],
        format!(
            "the file of snapshot {b}, {}, changed behind tracerd's back: it was replaced or modified (its inode, length or modification time differ)",
            file(b).display()
        )
    );

    // Its summary is what tracerd keeps in RAM: shown without the file.
    let (status, summary) = tracerd.get(&format!("/snapshots/{a}"));
    assert_eq!(status, 200, "{summary}");
    assert_eq!(
        (summary["id"].as_u64(), summary["label"].as_str()),
        (Some(a), Some("a"))
    );
    assert_eq!(tracerd.send(Method::DELETE, "/snapshots/a", None).0, 200);
    assert_eq!(tracerd.get(&format!("/snapshots/{a}")).0, 404);
    assert_eq!(tracerd.get("/health").0, 200, "no panic");
    tracerd.terminate();
}
