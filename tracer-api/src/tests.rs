//! The typed answers against the `json!` objects tracerd built before,
//! byte for byte, and the file header's leniency.
use std::collections::BTreeMap;

use serde_json::json;

use super::*;

fn wire<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(&to_wire(value).unwrap()).unwrap()
}

fn view() -> ProcessView {
    ProcessView {
        pid: 42,
        generation: 3,
        ppid: Some(1),
        comm: "app".into(),
        exe: None,
        nspid: Some(42),
        cgroup: Some("/a".into()),
        container_id: None,
        owner_uid: None,
        state: ProcessState::Exited,
        first_seen_ms: 10,
        ended_ms: Some(20),
        current: 100,
        peak: 200,
        blocks: 3,
        allocs: 9,
        frees: 6,
        unknown_frees: 0,
        drops: 0,
        cut_tracebacks: 1,
        complete: false,
    }
}

#[test]
fn a_process_is_sent_in_its_declared_order_and_in_a_list_sorted() {
    let direct = serde_json::to_string(&view()).unwrap();
    assert!(direct.starts_with(r#"{"pid":42,"generation":3,"ppid":1,"comm":"app","exe":null"#));
    assert!(direct.ends_with(r#""cut_tracebacks":1,"complete":false}"#));
    let status = ProcessStatus {
        view: view(),
        is_tracing: true,
        traceback_limit: 8,
        exact: None,
        watch: None,
    };
    let list = ProcessList {
        processes: vec![status.clone()],
        exact: "demand".into(),
        watched: Vec::new(),
    };
    assert_eq!(
        wire(&list),
        json!({ "exact": "demand", "processes": [status], "watched": [] }).to_string()
    );
    let back: ProcessList = serde_json::from_str(&wire(&list)).unwrap();
    assert_eq!(back, list);
    assert!(!back.processes[0].view.state.is_alive());
}

#[test]
fn small_answers_are_the_json_objects_they_were() {
    let by_source: serde_json::Map<String, serde_json::Value> =
        [("glibc".to_string(), json!({"current": 5, "peak": 6}))]
            .into_iter()
            .collect();
    let old = json!({"pid": 42, "current": 1, "peak": 2, "blocks": 3, "state": "alive",
                     "by_source": by_source});
    let typed = TracedMemory {
        blocks: 3,
        by_source: BTreeMap::from([(
            "glibc".to_string(),
            SourceMemory {
                current: 5,
                peak: 6,
            },
        )]),
        current: 1,
        peak: 2,
        pid: 42,
        state: ProcessState::Alive,
    };
    assert_eq!(wire(&typed), old.to_string());
    let old = json!({"pid": 42, "cleared_blocks": 7, "current": 1, "peak": 2, "blocks": 3});
    let typed = ClearedTraces {
        blocks: 3,
        cleared_blocks: 7,
        current: 1,
        peak: 2,
        pid: 42,
    };
    assert_eq!(wire(&typed), old.to_string());
    let old = json!({"pid": 42, "current": 1, "peak": 2});
    let typed = PeakReset {
        current: 1,
        peak: 2,
        pid: 42,
    };
    assert_eq!(wire(&typed), old.to_string());
    let old = json!({"error": "no", "hint": "yes"});
    let typed = ErrorBody {
        error: "no".into(),
        hint: "yes".into(),
    };
    assert_eq!(wire(&typed), old.to_string());
    let frame = Frame {
        filename: "a.c".into(),
        lineno: 3,
        ..Frame::default()
    };
    let old = json!({"pid": 42, "address": 4096, "size": 8, "traceback": [frame],
                     "total_nframe": null, "text": "a.c:3: 8 B", "allocator_frames": "keep"});
    let typed = ObjectTraceback {
        address: 4096,
        allocator_frames: AllocatorFrames::Keep,
        pid: 42,
        size: 8,
        text: "a.c:3: 8 B".into(),
        total_nframe: None,
        traceback: vec![frame],
    };
    assert_eq!(wire(&typed), old.to_string());
}

#[test]
fn a_tracing_state_leaves_out_what_it_has_not() {
    let state = TracingState {
        pid: None,
        is_tracing: true,
        traceback_limit: 8,
        max_nframe: 64,
        processes: None,
        started: Some(false),
    };
    let text = serde_json::to_string(&state).unwrap();
    assert_eq!(
        text,
        r#"{"is_tracing":true,"traceback_limit":8,"max_nframe":64,"started":false}"#
    );
    assert_eq!(serde_json::from_str::<TracingState>(&text).unwrap(), state);
}

fn summary() -> SnapshotSummary {
    SnapshotSummary {
        id: 3,
        pid: Some(42),
        kind: SnapshotKind::Taken,
        label: Some("before".into()),
        taken_at_ms: 5,
        traces: 2,
        size: 64,
        current: 64,
        peak: 128,
        traceback_limit: 8,
        comm: None,
        allocator_frames: Some(AllocatorFrames::Drop),
        owner_uid: None,
        completeness: Completeness {
            complete: false,
            drops: 4,
            drops_by_pid: BTreeMap::from([(9, 1), (42, 3)]),
            cut_tracebacks: 0,
            cut_tracebacks_by_pid: BTreeMap::new(),
        },
        this_run: true,
        persisted: false,
        bytes: 900,
    }
}

#[test]
fn statistics_of_each_target_are_the_json_objects_they_were() {
    let statistic = Statistic {
        count: 2,
        label: None,
        size: 64,
        text: "a.c:3: size=64 B, count=2, average=32 B".into(),
        traceback: vec![Frame {
            filename: "a.c".into(),
            lineno: 3,
            function: Some("main".into()),
            ..Frame::default()
        }],
    };
    let completeness = summary().completeness;
    let targets = [
        (
            StatisticsTarget::Process {
                allocator_frames: AllocatorFrames::Drop,
                pid: 42,
                process: Some(view()),
                totals: Totals::PerStack,
            },
            json!({"pid": 42, "process": view(), "allocator_frames": "drop", "totals": "per_stack"}),
        ),
        (
            StatisticsTarget::Process {
                allocator_frames: AllocatorFrames::Drop,
                pid: 42,
                process: None,
                totals: Totals::PerBlock,
            },
            json!({"pid": 42, "process": null, "allocator_frames": "drop", "totals": "per_block"}),
        ),
        (
            StatisticsTarget::System {
                allocator_frames: AllocatorFrames::Keep,
                current: 1,
                peak: 2,
                pids: vec![42, 43],
                totals: Totals::PerBlock,
            },
            json!({"pids": [42, 43], "current": 1, "peak": 2, "allocator_frames": "keep",
                   "totals": "per_block"}),
        ),
        (
            StatisticsTarget::Stored {
                snapshot: summary(),
            },
            json!({"snapshot": summary()}),
        ),
    ];
    for (target, head) in targets {
        let answer = StatisticsAnswer {
            target,
            completeness: completeness.clone(),
            cumulative: false,
            filters: BTreeMap::from([("include".to_string(), vec!["a.c".to_string()])]),
            group_by: "lineno".into(),
            limit: 10,
            statistics: vec![statistic.clone()],
            total: 1,
            traceback_limit: 8,
            traces: 2,
        };
        // As render.rs builds it: the head, then the query, the counts,
        // the completeness and the statistics.
        let mut old = head.as_object().unwrap().clone();
        old.insert("group_by".into(), json!("lineno"));
        old.insert("cumulative".into(), json!(false));
        old.insert("filters".into(), json!({"include": ["a.c"]}));
        old.insert("limit".into(), json!(10));
        old.insert("total".into(), json!(1));
        old.insert("traces".into(), json!(2));
        old.insert("traceback_limit".into(), json!(8));
        if let serde_json::Value::Object(fields) = json!(completeness) {
            old.extend(fields);
        }
        old.insert("statistics".into(), json!([statistic]));
        let old = serde_json::Value::Object(old).to_string();
        assert_eq!(wire(&answer), old);
        let back: StatisticsAnswer = serde_json::from_str(&old).unwrap();
        assert_eq!(back, answer);
    }
}

#[test]
fn a_compare_reads_back_with_its_sides() {
    let text = r#"{"base":{"complete":true,"cut_tracebacks":0,"cut_tracebacks_by_pid":{},"drops":0,"drops_by_pid":{},"id":3,"kind":"snapshot","label":null,"snapshot_kind":"taken","taken_at_ms":5},"complete":true,"cumulative":false,"filters":{},"group_by":"lineno","limit":10,"new":{"allocator_frames":"drop","at_ms":9,"complete":true,"cut_tracebacks":0,"cut_tracebacks_by_pid":{},"drops":0,"drops_by_pid":{},"kind":"now"},"pid":42,"statistics":[{"count":1,"count_diff":1,"size":8,"size_diff":-8,"text":"t","traceback":[{"filename":"a.c","lineno":1}]}],"total":1}"#;
    let answer: CompareAnswer = serde_json::from_str(text).unwrap();
    assert_eq!(
        answer.base.kind,
        SideKind::Snapshot {
            id: 3,
            snapshot_kind: SnapshotKind::Taken,
            label: Some(None),
            taken_at_ms: 5,
            allocator_frames: None,
            since_ms: None,
        }
    );
    assert!(answer.base.completeness.complete);
    assert_eq!(answer.statistics[0].size_diff, -8);
    assert_eq!(wire(&answer), text);
}

#[test]
fn a_file_header_is_the_object_the_store_wrote_and_reads_leniently() {
    let completeness = summary().completeness;
    let mut old = json!({
        "id": 3, "pid": 42, "start_time": 77, "gen": 2, "taken_at_ms": 5,
        "traced_memory": [64, 128], "kind": "auto", "label": null, "comm": "app",
        "source_format": null, "allocator_frames": "keep", "owner_uid": 1000,
    });
    if let (Some(map), serde_json::Value::Object(fields)) =
        (old.as_object_mut(), json!(completeness))
    {
        map.extend(fields);
    }
    let header = SnapshotHeader {
        allocator_frames: Some(AllocatorFrames::Keep),
        comm: Some("app".into()),
        id: Some(3),
        kind: Some(SnapshotKind::Auto),
        label: None,
        pid: Some(42),
        taken_at_ms: Some(5),
        traced_memory: Some([64, 128]),
        store: Some(StoreHeader {
            generation: Some(2),
            owner_uid: Some(1000),
            source_format: None,
            start_time: Some(77),
        }),
        completeness,
    };
    assert_eq!(header.to_meta().to_string(), old.to_string());
    assert_eq!(SnapshotHeader::from_meta(&old), header);
    // A dump's header has none of the store's own fields.
    let dump = SnapshotHeader {
        store: None,
        ..header.clone()
    };
    assert!(dump.to_meta().get("gen").is_none());
    assert!(dump.to_meta().get("label").is_some());
    // What does not parse reads as absent, a bad element as 0.
    let odd = json!({"id": "x", "kind": "new", "pid": 1u64 << 40, "traced_memory": [5, "y"],
                     "allocator_frames": 3});
    let read = SnapshotHeader::from_meta(&odd);
    assert_eq!(read.id, None);
    assert_eq!(read.kind, None);
    assert_eq!(read.pid, None);
    assert_eq!(read.traced_memory, Some([5, 0]));
    assert_eq!(read.allocator_frames, None);
    assert!(
        SnapshotHeader::from_meta(&json!({}))
            .traced_memory
            .is_none()
    );
}

#[test]
fn compare_sides_are_what_tracerd_built_as_json() {
    let complete = Completeness {
        complete: true,
        ..Completeness::default()
    };
    let side = |kind: SideKind| CompareSide {
        kind,
        completeness: complete.clone(),
    };
    let tail = r#""complete":true,"cut_tracebacks":0,"cut_tracebacks_by_pid":{},"drops":0,"drops_by_pid":{}"#;
    let cases = [
        (
            side(SideKind::Snapshot {
                id: 3,
                snapshot_kind: SnapshotKind::Taken,
                label: Some(None),
                taken_at_ms: 5,
                allocator_frames: Some(Some(AllocatorFrames::Drop)),
                since_ms: None,
            }),
            format!(
                r#"{{"allocator_frames":"drop",{tail},"id":3,"kind":"snapshot","label":null,"snapshot_kind":"taken","taken_at_ms":5}}"#
            ),
        ),
        (
            side(SideKind::Snapshot {
                id: 3,
                snapshot_kind: SnapshotKind::Auto,
                label: None,
                taken_at_ms: 5,
                allocator_frames: None,
                since_ms: Some(7),
            }),
            format!(
                r#"{{{tail},"id":3,"kind":"snapshot","since_ms":7,"snapshot_kind":"auto","taken_at_ms":5}}"#
            ),
        ),
        (
            side(SideKind::TracingStart {
                at_ms: 1,
                since_ms: None,
            }),
            format!(r#"{{"at_ms":1,{tail},"kind":"tracing_start"}}"#),
        ),
        (
            side(SideKind::Now {
                at_ms: 9,
                allocator_frames: AllocatorFrames::Keep,
            }),
            format!(r#"{{"allocator_frames":"keep","at_ms":9,{tail},"kind":"now"}}"#),
        ),
        (
            side(SideKind::Since {
                since_ms: 4,
                processes: vec![
                    SincePart {
                        pid: 7,
                        kind: SideKind::TracingStart {
                            at_ms: 2,
                            since_ms: None,
                        },
                    },
                    SincePart {
                        pid: 8,
                        kind: SideKind::Snapshot {
                            id: 1,
                            snapshot_kind: SnapshotKind::Auto,
                            label: None,
                            taken_at_ms: 3,
                            allocator_frames: None,
                            since_ms: None,
                        },
                    },
                ],
            }),
            format!(
                r#"{{{tail},"kind":"since","processes":[{{"at_ms":2,"kind":"tracing_start","pid":7}},{{"id":1,"kind":"snapshot","pid":8,"snapshot_kind":"auto","taken_at_ms":3}}],"since_ms":4}}"#
            ),
        ),
    ];
    for (side, text) in cases {
        assert_eq!(wire(&side), text);
        let back: CompareSide = serde_json::from_str(&text).unwrap();
        assert_eq!(back, side);
    }
}
