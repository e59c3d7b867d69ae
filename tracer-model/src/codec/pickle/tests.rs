//! Reading what Python writes, round trips, and the refusal of code,
//! foreign classes, values outside the model and damaged input.
#![allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// `pickle.dumps(tracemalloc.Snapshot([(1, 100, (("a.c", 3), ("b.c",
/// 1)), 2), (2, 50, <same>, None), (1, 7, (("<unknown>", 0),), 1), (0,
/// 2**63, (("é.c", 2**32-1),), 3)], 5), 5)` from Python 3.11.
const PYTHON: &[u8] = b"\x80\x05\x95\xcc\x00\x00\x00\x00\x00\x00\x00\x8c\x0btracemalloc\x94\x8c\x08Snapshot\x94\x93\x94)\x81\x94}\x94(\x8c\x06traces\x94h\x00\x8c\x07_Traces\x94\x93\x94)\x81\x94}\x94\x8c\x07_traces\x94]\x94((K\x01Kd\x8c\x03a.c\x94K\x03\x86\x94\x8c\x03b.c\x94K\x01\x86\x94\x86\x94K\x02t\x94(K\x02K2h\x10Nt\x94(K\x01K\x07\x8c\x09<unknown>\x94K\x00\x86\x94\x85\x94K\x01t\x94(K\x00\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8c\x04\xc3\xa9.c\x94\x8a\x05\xff\xff\xff\xff\x00\x86\x94\x85\x94K\x03t\x94esb\x8c\x0ftraceback_limit\x94K\x05ub.";

#[test]
fn reads_what_python_writes() {
    let snapshot = load_tracemalloc(PYTHON).expect("parses");
    assert_eq!(snapshot.traceback_limit(), 5);
    let traces = snapshot.traces();
    assert_eq!(traces.len(), 4);
    assert_eq!((traces[0].domain, traces[0].size), (1, 100));
    let frames: Vec<String> = traces[0]
        .traceback
        .frames()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        frames,
        ["a.c:3", "b.c:1"],
        "most recent first, as tracemalloc stores them"
    );
    assert_eq!(traces[0].traceback.total_nframe(), Some(2));
    assert_eq!(traces[1].traceback.total_nframe(), None);
    assert_eq!(traces[1].traceback, traces[0].traceback);
    assert_eq!(traces[2].traceback.frames()[0].to_string(), "<unknown>:0");
    assert_eq!(traces[3].size, 1 << 63);
    assert_eq!(
        traces[3].traceback.frames()[0].to_string(),
        "é.c:4294967295"
    );
}

#[test]
fn round_trips_through_our_writer() {
    let snapshot = load_tracemalloc(PYTHON).expect("parses");
    let again = load_tracemalloc(&dump_tracemalloc(&snapshot)).expect("reads our own pickle");
    assert_eq!(again, snapshot);
    let traces = again.traces();
    assert!(Arc::ptr_eq(&traces[0].traceback, &traces[0].traceback));
    assert_eq!(traces[1].traceback.total_nframe(), None);
}

#[test]
fn refuses_code_and_foreign_classes_without_running_them() {
    // pickle.dumps(os.system) and a REDUCE of it.
    let global =
        b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.";
    assert_eq!(
        load_tracemalloc(global).unwrap_err().to_string(),
        "not a tracemalloc snapshot pickle: it refers to posix.system; only tracemalloc.Snapshot and tracemalloc._Traces are accepted (nothing is executed) (at byte 28)"
    );
    let reduce = b"\x80\x02ctracemalloc\nSnapshot\n)R.";
    assert_eq!(
        load_tracemalloc(reduce).unwrap_err().to_string(),
        "not a tracemalloc snapshot pickle: opcode REDUCE (0x52) is not one a tracemalloc snapshot uses (at byte 25)"
    );
    let proto0 = b"(lp0\n.";
    assert!(
        load_tracemalloc(proto0)
            .unwrap_err()
            .to_string()
            .contains("PROTO")
    );
    let list = b"\x80\x04]\x94.";
    assert_eq!(
        load_tracemalloc(list).unwrap_err().to_string(),
        "the pickle does not hold a tracemalloc snapshot: the pickled object is a list, not a tracemalloc.Snapshot"
    );
}

#[test]
fn values_outside_the_model_are_refused() {
    let snapshot = |trace: &[u8]| -> Vec<u8> {
        // Built by hand: Snapshot with one trace tuple given as opcodes.
        let mut out = b"\x80\x04\x8c\x0btracemalloc\x94\x8c\x08Snapshot\x93)\x81}(\x8c\x06traces\x8c\x0btracemalloc\x8c\x07_Traces\x93)\x81}\x8c\x07_traces](".to_vec();
        out.extend_from_slice(trace);
        out.extend_from_slice(b"esb\x8c\x0ftraceback_limitK\x01ub.");
        out
    };
    let ok = snapshot(b"(K\x01K\x02\x8c\x01aK\x03\x86\x85Nt");
    assert_eq!(load_tracemalloc(&ok).expect("valid").traces()[0].size, 2);
    let negative = snapshot(b"(J\xff\xff\xff\xffK\x02\x8c\x01aK\x03\x86\x85Nt");
    assert_eq!(
        load_tracemalloc(&negative).unwrap_err().to_string(),
        "the pickle does not hold a tracemalloc snapshot: trace 0 domain -1 is out of range (must be 0 to 4294967295)"
    );
    let empty = snapshot(b"(K\x01K\x02)Nt");
    assert!(
        load_tracemalloc(&empty)
            .unwrap_err()
            .to_string()
            .contains("has no frame")
    );
    let huge =
        snapshot(b"(K\x01\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8c\x01aK\x03\x86\x85Nt");
    assert!(
        load_tracemalloc(&huge)
            .unwrap_err()
            .to_string()
            .contains("size 18446744073709551616 is out of range")
    );
}

#[test]
fn truncations_and_random_bytes_are_refused_cleanly() {
    for cut in 0..PYTHON.len() {
        assert!(
            load_tracemalloc(&PYTHON[..cut]).is_err(),
            "truncated at {cut} accepted"
        );
    }
    let mut rng = StdRng::seed_from_u64(9);
    let ours = dump_tracemalloc(&load_tracemalloc(PYTHON).expect("parses"));
    for _ in 0..20_000 {
        let mut bytes = match rng.random_range(0..3) {
            0 => PYTHON.to_vec(),
            1 => ours.clone(),
            _ => {
                let mut b = vec![0x80, rng.random_range(2..6)];
                b.extend((0..rng.random_range(0..64)).map(|_| rng.random::<u8>()));
                b
            }
        };
        for _ in 0..rng.random_range(1..4) {
            if bytes.is_empty() {
                break;
            }
            let at = rng.random_range(0..bytes.len());
            match rng.random_range(0..3) {
                0 => bytes[at] = rng.random(),
                1 => bytes.truncate(at),
                _ => bytes.insert(at, rng.random()),
            }
        }
        let _ = load_tracemalloc(&bytes);
    }
    // A length prefix of 2**63 allocates nothing.
    let bomb = b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x80abc";
    assert!(
        load_tracemalloc(bomb)
            .unwrap_err()
            .to_string()
            .contains("the input ends inside an opcode")
    );
}

/// A tracemalloc snapshot pickle whose `_traces` list gets one trace
/// tuple `(1, 100, (("a.c", 3),))` and then `body` (opcodes that replicate
/// it) inside the APPENDS mark.
fn replicating(body: &[u8]) -> (Vec<u8>, usize) {
    let mut out = b"\x80\x04ctracemalloc\nSnapshot\n)\x81}(\x8c\x06tracesctracemalloc\n_Traces\n)\x81}\x8c\x07_traces](K\x01Kd\x8c\x03a.cK\x03\x86\x85\x87".to_vec();
    let body_at = out.len();
    out.extend_from_slice(body);
    out.extend_from_slice(b"esb\x8c\x0ftraceback_limitK\x05ub.");
    (out, body_at)
}

/// What loading `bytes` charges, with no limit.
fn charged(bytes: &[u8]) -> u64 {
    let mut budget = Budget::with_limit(bytes.len(), u64::MAX);
    load_with(bytes, &mut budget).expect("loads");
    budget.used()
}

use crate::codec::budget::{Budget, LOAD_BASE_BYTES, cost};
use crate::interrupt::{CheckGuard, Interrupted};

#[test]
fn replicating_opcodes_are_charged_per_copy() {
    let value = 16; // size_of::<Value>()
    // DUP: a stack slot, a list slot, a trace.
    let (one, _) = replicating(&b"2".repeat(1000));
    let (two, _) = replicating(&b"2".repeat(2000));
    assert_eq!(load_tracemalloc(&two).unwrap().traces().len(), 2001);
    assert_eq!(
        charged(&two) - charged(&one),
        1000 * (2 * value + cost::TRACE)
    );
    // MEMOIZE: a memo slot.
    let (one, _) = replicating(&b"\x94".repeat(1000));
    let (two, _) = replicating(&b"\x94".repeat(2000));
    assert_eq!(charged(&two) - charged(&one), 1000 * value);
    // BINGET: a stack slot, a list slot, a trace.
    let (one, _) = replicating(&[b"\x94".as_slice(), &b"h\x00".repeat(1000)].concat());
    let (two, _) = replicating(&[b"\x94".as_slice(), &b"h\x00".repeat(2000)].concat());
    assert_eq!(
        charged(&two) - charged(&one),
        1000 * (2 * value + cost::TRACE)
    );
}

#[test]
fn a_replicating_opcode_past_the_budget_is_refused_as_it_runs() {
    for (opcode, name, width) in [(b"2".as_slice(), "DUP", 1), (b"\x94", "MEMOIZE", 1)] {
        let (bytes, body_at) = replicating(&opcode.repeat(100_000));
        let limit = 200_000;
        let mut budget = Budget::with_limit(bytes.len(), limit);
        let err = load_with(&bytes, &mut budget).unwrap_err();
        let PickleError::OverBudget(over) = &err else {
            panic!("{err}");
        };
        // Refused at the copy that went past: one value short of the limit.
        let at: usize = over
            .at
            .strip_prefix("byte ")
            .and_then(|rest| rest.strip_suffix(&format!(" (opcode {name})")))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{}", over.at));
        assert!((body_at..body_at + 100_000 * width).contains(&at), "{at}");
        assert!(limit - budget.used() < 16, "{}", budget.used());
        assert_eq!(over.limit, limit);
    }
}

#[test]
fn a_dup_bomb_is_refused_within_the_bound() {
    // 4 MB of DUP: 64 bytes a copy, past 24 a byte plus 64 MiB.
    let (bytes, _) = replicating(&b"2".repeat(4_000_000));
    let limit = 24 * bytes.len() as u64 + LOAD_BASE_BYTES;
    assert_eq!(
        load_tracemalloc(&bytes).unwrap_err().to_string(),
        format!(
            "tracemalloc pickle refused: loading this {}-byte file would take more than {limit} bytes of memory (at most 24 bytes per byte of the file plus 64 MiB); it went past that at its 4000001 traces",
            bytes.len()
        )
    );
    let mut budget = Budget::for_input(bytes.len());
    load_with(&bytes, &mut budget).unwrap_err();
    // The stack and the list were charged (64 MB each), not the traces.
    assert!(budget.used() <= limit);
    assert!(budget.used() >= 2 * 16 * 4_000_000);
}

#[test]
fn one_deep_traceback_under_many_totals_costs_its_frames_once_per_total() {
    // One traceback tuple of `depth` frames (all one frame, by DUP) and
    // `n` traces of it, each with its own total_nframe: each trace is a
    // new traceback sharing the frames (charged for the index's copy of
    // their numbers), and nothing walks the frames again.
    let pickle = |depth: usize, n: u32| {
        let mut body = b"0(\x8c\x03a.cK\x03\x86".to_vec();
        body.extend(b"2".repeat(depth - 1));
        body.extend_from_slice(b"t\x94");
        body.push(b'0');
        for total in 0..n {
            body.extend_from_slice(b"(K\x01Kdh\x00J");
            body.extend_from_slice(&total.to_le_bytes());
            body.push(b't');
        }
        replicating(&body).0
    };
    let per_trace = |depth: usize| charged(&pickle(depth, 20)) - charged(&pickle(depth, 10));
    let tuple = 4 * 16 + 12; // four tuple slots and the tuple's entry (chunk, start, length)
    let stack = 0; // the stack is no deeper
    assert_eq!(
        per_trace(1000),
        10 * (tuple + stack + 16 + cost::TRACE + cost::TRACEBACK + 1000 * cost::SHARED_FRAME_REF)
    );
    // A 2 MB pickle of a 2-million-frame tuple is refused at its first
    // traceback, before any frame is made.
    let bytes = pickle(2_000_000, 1000);
    let err = load_tracemalloc(&bytes).unwrap_err().to_string();
    assert!(
        err.ends_with("it went past that at trace 0 (a traceback of 2000000 frames)"),
        "{err}"
    );
}

#[test]
fn an_interrupt_check_stops_the_loading() {
    fn stop() -> Result<(), Interrupted> {
        Err(Interrupted {
            reason: "the client left".into(),
        })
    }
    let (small, _) = replicating(b"");
    let (big, _) = replicating(&b"2".repeat(10_000));
    let _guard = CheckGuard::install(stop);
    // Fewer steps than one check: loads.
    assert_eq!(load_tracemalloc(&small).unwrap().traces().len(), 1);
    assert_eq!(
        load_tracemalloc(&big).unwrap_err(),
        PickleError::Interrupted(Interrupted {
            reason: "the client left".into()
        })
    );
    assert_eq!(
        load_tracemalloc(&big).unwrap_err().to_string(),
        "interrupted: the client left"
    );
}

#[test]
fn sites_cross_the_pickle_as_names_and_come_back_as_sites() {
    use crate::statistic::GroupBy;
    use crate::trace::{AllocatorFamily, Frame, FrameExtra, Trace, Traceback};
    let site = |function: Option<&str>, offset| {
        Frame::without_line("/usr/bin/node", function, offset).with_extra(FrameExtra {
            function: function.map(Arc::from),
            module: Some("/usr/bin/node".into()),
            ..FrameExtra::default()
        })
    };
    let traces: Vec<Trace> = [
        (site(Some("Allocate(unsigned long)"), 0x1f), 2000),
        (site(Some("EnsureExtension()"), 0x2a), 700),
        (site(None, 0x1a_2b30), 5),
    ]
    .into_iter()
    .map(|(frame, size)| Trace {
        source: AllocatorFamily::UNKNOWN,
        domain: 1,
        size,
        traceback: Arc::new(Traceback::new(vec![frame], Some(1))),
    })
    .collect();
    let snapshot = crate::Snapshot::new(traces, 1);
    let loaded = load_tracemalloc(&dump_tracemalloc(&snapshot)).expect("loads");
    assert_eq!(loaded, snapshot);
    let sites: Vec<(&str, Option<&str>)> = loaded
        .traces()
        .iter()
        .map(|t| {
            (
                t.traceback.frames()[0].file(),
                t.traceback.frames()[0].site(),
            )
        })
        .collect();
    assert_eq!(
        sites,
        [
            ("/usr/bin/node", Some("!Allocate(unsigned long)+0x1f")),
            ("/usr/bin/node", Some("!EnsureExtension()+0x2a")),
            ("/usr/bin/node", Some("+0x1a2b30")),
        ]
    );
    // Matched site by site against the snapshot it came from.
    let diff = loaded
        .compare_to(&snapshot, GroupBy::Lineno, false)
        .unwrap();
    assert_eq!(diff.len(), 3);
    assert!(diff.iter().all(|d| d.size_diff == 0 && d.count_diff == 0));
    let files = loaded.statistics(GroupBy::Filename, false).unwrap();
    assert_eq!(
        files.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["/usr/bin/node:0: size=2705 B, count=3, average=902 B"]
    );
}
