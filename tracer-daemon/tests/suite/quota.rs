//! Snapshot quotas through the real tracerd: automatic
//! snapshots fill `max_snapshots`, a snapshot taken on request evicts the
//! oldest automatic ones, a `POST` beyond what eviction can free is a 507
//! naming the quota, and `/metrics` shows the store and the state
//! directory's size as the files on disk have it.

use std::{path::Path, time::Duration};

use reqwest::Method;
use serde_json::{Value, json};

use super::support::{Fixture, Program, TempDir, Tracerd, poll, sample};

/// (automatic ids, other ids) of `GET /snapshots`, oldest first.
fn listed(tracerd: &Tracerd) -> (Vec<u64>, Vec<u64>) {
    let list = tracerd.get_ok("/snapshots");
    let mut autos = Vec::new();
    let mut others = Vec::new();
    for s in list["snapshots"].as_array().expect("snapshots") {
        let id = s["id"].as_u64().expect("id");
        if s["kind"] == "auto" {
            autos.push(id);
        } else {
            others.push(id);
        }
    }
    (autos, others)
}

/// Sum of the sizes of the regular files under `dir`, recursively.
fn files_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let meta = std::fs::symlink_metadata(entry.path()).expect("stat");
        if meta.is_dir() {
            total += files_bytes(&entry.path());
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    total
}

/// Takes 4 snapshots of `pid` into a store full of automatic ones: each
/// evicts the oldest automatic snapshot, and those held stay the newest.
/// The ids taken.
fn take_four_evicting_the_oldest(tracerd: &Tracerd, pid: u32) -> Vec<u64> {
    let mut taken = Vec::new();
    for round in 0..4 {
        let (before, _) = listed(tracerd);
        let (status, summary) = tracerd.post(&format!("/pid/{pid}/snapshots"));
        assert_eq!(status, 201, "round {round}: {summary}");
        let id = summary["id"].as_u64().expect("id");
        taken.push(id);
        let (after, others) = listed(tracerd);
        assert_eq!(others, taken);
        assert!(
            !after.contains(&before[0]),
            "round {round}: the oldest automatic snapshot {} stays: {before:?} -> {after:?}",
            before[0]
        );
        // Those held are the newest: every automatic id between the oldest
        // held and the last id is held (ids are handed out in order).
        if let Some(&oldest) = after.first() {
            let last = after.iter().chain(&taken).max().copied().unwrap_or(0);
            let expected: Vec<u64> = (oldest..=last).filter(|i| !taken.contains(i)).collect();
            assert_eq!(after, expected, "round {round}");
        }
        assert_eq!(after.len() + taken.len(), 4, "round {round}: {after:?}");
    }
    taken
}

#[test]
fn a_full_store_evicts_the_oldest_automatic_snapshots_then_answers_507() {
    let state = TempDir::new("quota-state");
    let prog = Program::build("keepmetrics", &[]);
    let mut fx = Fixture::spawn_ready(&prog.exe, &[]);
    let pid = fx.pid();
    let pid_s = pid.to_string();
    let tracerd = Tracerd::start_at(
        state.path(),
        &[
            "--scope-pid",
            &pid_s,
            "--snapshot-interval",
            "1",
            "--max-snapshots",
            "4",
        ],
    );
    fx.step("done");
    // Automatic snapshots fill the store, then each new one evicts the
    // oldest: 4 automatic snapshots held, the newest ones.
    poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let (autos, _) = listed(&tracerd);
        if autos.len() == 4 && autos[0] >= 3 {
            Ok(())
        } else {
            Err(format!("automatic snapshots: {autos:?}"))
        }
    });

    let taken = take_four_evicting_the_oldest(&tracerd, pid);
    assert_eq!(listed(&tracerd), (Vec::new(), taken.clone()));

    // Nothing left to evict: a 507 naming the quota, nothing stored.
    let (status, body) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 507, "{body}");
    assert_eq!(
        body,
        json!({
            "error": "snapshot quota reached: max_snapshots is 4, and the snapshots that are never evicted automatically (taken, loaded, labelled) number 4",
            "hint": "delete stored snapshots (GET /snapshots lists them with their bytes, DELETE /snapshots/{id} removes one), or raise max_snapshots (--max-snapshots, TRACERD_MAX_SNAPSHOTS); the snapshot was not stored",
        })
    );
    // Automatic snapshots are refused too (and take no id) while it is full.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(listed(&tracerd), (Vec::new(), taken.clone()));

    let text = tracerd
        .request(Method::GET, "/metrics")
        .text()
        .expect("metrics");
    let metric = |name: &str, labels: &[(&str, &str)]| {
        sample(&text, name, labels).unwrap_or_else(|| panic!("{name} {labels:?}"))
    };
    let last = *taken.last().expect("taken");
    // Every id but the 4 taken ones was an automatic snapshot, evicted.
    assert_eq!(
        metric("tracer_snapshot_store_evictions_total", &[]),
        (last - 4) as f64
    );
    assert_eq!(
        metric("tracer_snapshot_store_refused_total", &[("kind", "taken")]),
        1.0
    );
    assert!(metric("tracer_snapshot_store_refused_total", &[("kind", "auto")]) >= 1.0);
    assert_eq!(
        metric("tracer_snapshot_store_snapshots", &[("kind", "taken")]),
        4.0
    );
    assert_eq!(
        metric("tracer_snapshot_store_snapshots", &[("kind", "auto")]),
        0.0
    );
    assert_eq!(
        metric(
            "tracer_snapshot_store_quota",
            &[("setting", "max_snapshots")]
        ),
        4.0
    );
    // A snapshot's bytes are its file's size.
    let mut files = 0;
    for id in &taken {
        let summary = tracerd.get_ok(&format!("/snapshots/{id}"));
        let size = std::fs::metadata(state.path().join(format!("snapshots/{id}.tsnap")))
            .expect("snapshot file")
            .len();
        assert_eq!(summary["bytes"].as_u64(), Some(size), "{summary}");
        files += size;
    }
    assert_eq!(
        metric("tracer_snapshot_store_bytes", &[("kind", "taken")]),
        files as f64
    );
    assert_eq!(
        metric("tracer_state_dir_bytes", &[]),
        files_bytes(state.path()) as f64
    );
    assert!(files_bytes(state.path()) > files, "next-id is counted too");

    // Room again once one is deleted.
    assert_eq!(
        tracerd
            .send(Method::DELETE, &format!("/snapshots/{}", taken[0]), None)
            .0,
        200
    );
    let (status, body) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201, "{body}");
    let _: Value = body;
    fx.end();
}
