//! Stored snapshots as resources: ids and labels, compare between two,
//! paged traces, rename and delete; automatic snapshots and `since=`.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::{app, enc, phase2, run, start_alone, texts};
use crate::suite::support::{Program, Tracerd, poll, snapshot_ids};

#[test]
fn stored_snapshots_are_resources_with_labels() {
    let (app, tracerd, mut fx, _) = start_alone(1);
    let pid = fx.pid();
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
    phase2(&mut fx);
    let (status, second) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    let id2 = second["id"].as_u64().expect("id");
    // By id and by label.
    let (status, by_label) = tracerd.get("/snapshots/before");
    assert_eq!(status, 200);
    assert_eq!(by_label, tracerd.get(&format!("/snapshots/{id1}")).1);
    let inc = enc(app.src());
    let body = tracerd.get_ok(&format!(
        "/snapshots/{id2}/compare?base=before&include={inc}&limit=0"
    ));
    let mut expected = phase2_diff(&app);
    expected.push(format!(
        "{}:{}: size=1000 B (+0 B), count=5 (+0), average=200 B",
        app.src(),
        app.line("SITE_B")
    ));
    assert_eq!(texts(&body), expected);
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
    let ids = snapshot_ids(&list);
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
    let app = app();
    let tracerd = Tracerd::start(&["--snapshot-interval", "1", "--snapshot-retention", "30"]);
    let (mut fx, _) = run(&app, &tracerd, 1);
    let pid = fx.pid();
    let phase1_ms = unix_ms();
    // A young process: since=1h goes back to the start of its tracing.
    let body = tracerd.get_ok(&format!(
        "/pid/{pid}/compare?since=1h&include={}&limit=0",
        enc(app.src())
    ));
    assert_eq!(body["base"]["kind"], "tracing_start");
    // Wait for an automatic snapshot taken after phase 1, then until it is
    // more than a second old, so that since=1s reaches back to it (or to a
    // later one, still before phase 2).
    let auto_ms = poll(Duration::from_secs(60), Duration::from_millis(100), || {
        let (_, list) = tracerd.get(&format!("/pid/{pid}/snapshots"));
        list["snapshots"]
            .as_array()
            .and_then(|l| {
                l.iter()
                    .filter(|s| s["kind"] == "auto")
                    .filter_map(|s| s["taken_at_ms"].as_u64())
                    .find(|&ms| ms > phase1_ms)
            })
            .ok_or_else(|| format!("no automatic snapshot: {list}"))
    });
    while unix_ms() < auto_ms + 1200 {
        std::thread::sleep(Duration::from_millis(50));
    }
    phase2(&mut fx);
    let body = tracerd.get_ok(&format!(
        "/pid/{pid}/compare?since=1s&include={}&limit=0",
        enc(app.src())
    ));
    assert_eq!(body["base"]["kind"], "snapshot", "{}", body["base"]);
    assert_eq!(body["base"]["snapshot_kind"], "auto");
    assert_eq!(texts(&body)[..3], phase2_diff(&app));
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

/// The first lines of `compare_to` after phase 2, against phase 1: what
/// phase 2 allocated, largest first.
fn phase2_diff(app: &Program) -> Vec<String> {
    let src = app.src();
    let (a, r, o) = (
        app.line("SITE_A"),
        app.line("SITE_REC"),
        app.line("SITE_OBJ"),
    );
    vec![
        format!("{src}:{o}: size=4242 B (+4242 B), count=1 (+1), average=4242 B"),
        format!("{src}:{a}: size=1300 B (+300 B), count=13 (+3), average=100 B"),
        format!("{src}:{r}: size=7 B (+7 B), count=1 (+1), average=7 B"),
    ]
}
