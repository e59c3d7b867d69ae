//! Round trips, sharing, determinism and the refusal of damaged input.
#![allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::*;
use crate::trace::{AllocatorFamily, Frame, FrameExtra, Trace, Traceback};

fn sample() -> Snapshot {
    let shared: Arc<str> = Arc::from("src/a.c");
    let rich = Frame::new(Arc::clone(&shared), 12).with_extra(FrameExtra {
        function: Some("alloc_node".into()),
        module: Some("/usr/bin/app".into()),
        address: Some(0x5555_0000_1234),
        build_id: None,
    });
    let a = Arc::new(Traceback::new(
        vec![rich.clone(), Frame::new("main.c", 7), rich],
        Some(9),
    ));
    let b = Arc::new(Traceback::new(vec![Frame::unknown()], None));
    Snapshot::new(
        vec![
            Trace {
                source: AllocatorFamily::from_name("jemalloc").expect("a source"),
                domain: 42,
                size: 256,
                traceback: Arc::clone(&a),
            },
            Trace {
                source: AllocatorFamily::from_name("mmap").expect("a source"),
                domain: 42,
                size: u64::MAX,
                traceback: b,
            },
            Trace {
                source: AllocatorFamily::UNKNOWN,
                domain: u32::MAX,
                size: 0,
                traceback: a,
            },
        ],
        16,
    )
}

#[test]
fn round_trip_keeps_traces_extras_meta_and_sharing() {
    let snapshot = sample();
    let meta = json!({"id": 7, "label": "before"});
    let bytes = encode(&snapshot, &meta);
    assert_eq!(bytes.get(..8), Some(&DUMP_MAGIC[..]));
    let decoded = decode(&bytes).expect("decodes");
    assert_eq!(decoded.meta, meta);
    assert_eq!(decoded.snapshot, snapshot);
    assert_eq!(decoded.snapshot.traceback_limit(), 16);
    let traces = decoded.snapshot.traces();
    assert!(Arc::ptr_eq(&traces[0].traceback, &traces[2].traceback));
    assert_eq!(traces[0].traceback.total_nframe(), Some(9));
    assert_eq!(traces[1].traceback.total_nframe(), None);
    let extra = traces[0].traceback.frames()[0]
        .extra
        .clone()
        .expect("extra");
    assert_eq!(extra.function.as_deref(), Some("alloc_node"));
    assert_eq!(extra.module.as_deref(), Some("/usr/bin/app"));
    assert_eq!(extra.address, Some(0x5555_0000_1234));
    // Equal re-encoding: the format is deterministic.
    assert_eq!(encode(&decoded.snapshot, &decoded.meta), bytes);
}

#[test]
fn equal_lines_with_other_extras_stay_apart() {
    let at = |address| {
        Frame::new("/usr/bin/grep", 0).with_extra(FrameExtra {
            function: None,
            module: Some("/usr/bin/grep".into()),
            address: Some(address),
            build_id: None,
        })
    };
    let one = Arc::new(Traceback::new(vec![at(0x10)], None));
    let two = Arc::new(Traceback::new(vec![at(0x20)], None));
    let snapshot = Snapshot::new(
        vec![
            Trace {
                source: AllocatorFamily::UNKNOWN,
                domain: 1,
                size: 1,
                traceback: one,
            },
            Trace {
                source: AllocatorFamily::UNKNOWN,
                domain: 1,
                size: 2,
                traceback: two,
            },
        ],
        1,
    );
    let decoded = decode(&encode(&snapshot, &json!({}))).expect("decodes");
    let addresses: Vec<Option<u64>> = decoded
        .snapshot
        .traces()
        .iter()
        .map(|t| {
            t.traceback.frames()[0]
                .extra
                .as_ref()
                .and_then(|e| e.address)
        })
        .collect();
    assert_eq!(addresses, [Some(0x10), Some(0x20)]);
}

#[test]
fn crc32_matches_zlib() {
    assert_eq!(crc32(b""), 0);
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
}

#[test]
fn corrupt_and_foreign_files_are_refused_with_reasons() {
    let bytes = encode(&sample(), &json!({}));
    let mut flipped = bytes.clone();
    flipped[30] ^= 0x40;
    assert!(matches!(decode(&flipped), Err(DumpError::Checksum { .. })));
    let mut version = bytes.clone();
    version[8] = 9;
    assert_eq!(
        decode(&version).unwrap_err().to_string(),
        "tracer snapshot format version 9 is not supported (this tracerd reads versions 1 to 3)"
    );
    let pickle = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x0btracemalloc";
    assert_eq!(
        decode(pickle).unwrap_err().to_string(),
        "not a tracer snapshot: wrong magic bytes (this looks like a Python pickle: load it with format=tracemalloc)"
    );
    assert_eq!(decode(b"").unwrap_err(), DumpError::TooShort { len: 0 });
    for cut in 0..bytes.len() {
        assert!(
            decode(&bytes[..cut]).is_err(),
            "truncated at {cut} accepted"
        );
    }
}

/// A body that is well formed except for one lie, with a valid CRC, so
/// the checks behind the checksum are exercised.
fn with_crc(mut content: Vec<u8>) -> Vec<u8> {
    let crc = crc32(&content);
    content.extend_from_slice(&crc.to_le_bytes());
    content
}

fn file(header: &Value, body: &[u8]) -> Vec<u8> {
    let header = header.to_string().into_bytes();
    let mut out = DUMP_MAGIC.to_vec();
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
    with_crc(out)
}

#[test]
fn lying_headers_and_bad_indices_are_refused_behind_a_valid_checksum() {
    let counts = |s: u64, f: u64, t: u64, n: u64| {
        json!({"format": "tracer-snapshot", "version": 1, "traceback_limit": 1,
               "counts": {"strings": s, "frames": f, "tracebacks": t, "traces": n}})
    };
    let huge = counts(u64::MAX, 0, 0, 0);
    assert!(matches!(
        decode(&file(&huge, &[])),
        Err(DumpError::Header { .. } | DumpError::Body { .. })
    ));
    let err = decode(&file(&counts(1000, 0, 0, 0), &[0])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad tracer snapshot body in strings: the header announces 1000 items but only 1 bytes are left"
    );
    // One string "a", one frame pointing at string 5.
    let body = [1, b'a', 5, 0, 0];
    let err = decode(&file(&counts(1, 1, 0, 0), &body)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad tracer snapshot body in frames: filename string index 5 out of range (there are 1)"
    );
    // Invalid UTF-8.
    let err = decode(&file(&counts(1, 0, 0, 0), &[1, 0xff])).unwrap_err();
    assert!(err.to_string().contains("string 0 is not UTF-8"), "{err}");
    // A traceback with no frame.
    let body = [1, b'a', 0, 0, 0, 0, 0];
    let err = decode(&file(&counts(1, 1, 1, 0), &body)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad tracer snapshot body in tracebacks: traceback 0 has no frame"
    );
    // Trailing bytes.
    let err = decode(&file(&counts(0, 0, 0, 0), &[7])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad tracer snapshot body in traces: 1 bytes after the last trace"
    );
    let err = decode(&file(&json!({"format": "other"}), &[])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad tracer snapshot header: format is not \"tracer-snapshot\""
    );
}

#[test]
fn random_bytes_and_mutations_never_panic() {
    let mut rng = StdRng::seed_from_u64(5);
    let valid = encode(&sample(), &json!({"x": 1}));
    for _ in 0..20_000 {
        let mut bytes = if rng.random_bool(0.5) {
            valid.clone()
        } else {
            (0..rng.random_range(0..64)).map(|_| rng.random()).collect()
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
        // Re-seal some with a valid checksum so the body checks run.
        if bytes.len() > 4 && rng.random_bool(0.5) {
            let len = bytes.len() - 4;
            bytes.truncate(len);
            bytes = with_crc(bytes);
        }
        let _ = decode(&bytes);
    }
}

#[test]
fn version_1_files_read_with_unknown_sources() {
    // strings ["a.c"]; frames [a.c:3]; tracebacks [[a.c:3], total None];
    // traces [(domain 7, 100 bytes, traceback 0)]: no source per trace.
    let header = json!({
        "format": "tracer-snapshot", "version": 1, "traceback_limit": 1,
        "counts": {"strings": 1, "frames": 1, "tracebacks": 1, "traces": 1},
        "meta": {"id": 3},
    })
    .to_string();
    let mut bytes = DUMP_MAGIC.to_vec();
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&u32::try_from(header.len()).unwrap().to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[3, b'a', b'.', b'c', 0, 3, 0, 0, 1, 0, 7, 100, 0]);
    let crc = crc32(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let decoded = decode(&bytes).expect("a version-1 file decodes");
    let traces = decoded.snapshot.traces();
    assert_eq!(traces.len(), 1);
    assert_eq!((traces[0].domain, traces[0].size), (7, 100));
    assert_eq!(traces[0].source, AllocatorFamily::UNKNOWN);
    assert_eq!(traces[0].traceback.to_string(), "a.c:3");
    // The same file as version 4 is refused, by name.
    bytes[8] = 4;
    assert_eq!(
        decode(&bytes).err().map(|e| e.to_string()).as_deref(),
        Some(
            "tracer snapshot format version 4 is not supported (this tracerd reads versions 1 to 3)"
        )
    );
}

#[test]
fn a_source_index_past_the_header_list_is_refused() {
    let mut snapshot_bytes = encode(&sample(), &json!({}));
    // Change the header's sources to one name: the traces' sources 3 and 7
    // then point past it.
    let names = serde_json::to_string(AllocatorFamily::all()).unwrap();
    let short = format!("{:<width$}", "[\"unknown\"]", width = names.len());
    let at = snapshot_bytes
        .windows(names.len())
        .position(|w| w == names.as_bytes())
        .expect("the header lists the sources");
    snapshot_bytes.splice(at..at + names.len(), short.bytes());
    let end = snapshot_bytes.len() - 4;
    let crc = crc32(&snapshot_bytes[..end]);
    snapshot_bytes[end..].copy_from_slice(&crc.to_le_bytes());
    let err = decode(&snapshot_bytes).expect_err("refused");
    assert!(err.to_string().contains("source"), "{err}");
}

/// A version-1 file of one string, one frame, one traceback of `depth`
/// references to that frame, and one trace of it: what a crafted file
/// repeats to expand.
fn one_frame_repeated(depth: usize) -> Vec<u8> {
    let header = json!({"format": "tracer-snapshot", "version": 1, "traceback_limit": 1,
        "counts": {"strings": 1, "frames": 1, "tracebacks": 1, "traces": 1}});
    let mut body = vec![1, b'a', 0, 3, 0, 0];
    let mut d = depth as u64;
    while d >= 0x80 {
        body.push((d as u8) | 0x80);
        d >>= 7;
    }
    body.push(d as u8);
    body.extend(std::iter::repeat_n(0u8, depth));
    body.extend_from_slice(&[7, 100, 0]);
    file(&header, &body)
}

use crate::codec::budget::{Budget, LOAD_BASE_BYTES, cost};
use crate::interrupt::{CheckGuard, Interrupted};

#[test]
fn every_frame_reference_is_charged() {
    let charged = |bytes: &[u8]| {
        let mut budget = Budget::with_limit(bytes.len(), u64::MAX);
        decode_with(bytes, &mut budget).unwrap();
        budget.used()
    };
    let one = one_frame_repeated(1000);
    let two = one_frame_repeated(2000);
    assert_eq!(
        decode(&two).unwrap().snapshot.traces()[0]
            .traceback
            .frames()
            .len(),
        2000
    );
    // A frame copy and the index's numbers, and the loader's number.
    assert_eq!(charged(&two) - charged(&one), 1000 * (cost::FRAME_REF + 4));
    // The whole file: header, string, frame, traceback, trace.
    let header_len = u32::from_le_bytes([one[10], one[11], one[12], one[13]]) as u64;
    assert_eq!(
        charged(&one),
        header_len * cost::HEADER_BYTE
            + 16
            + (2 + cost::STRING)
            + cost::FRAME
            + cost::TRACEBACK
            + 1000 * (cost::FRAME_REF + 4)
            + cost::TRACE
    );
}

#[test]
fn a_traceback_that_expands_past_the_bound_is_refused_before_it_is_built() {
    // 4 MB of references to one frame: 52 bytes each, past 24 a byte
    // plus 64 MiB.
    let bytes = one_frame_repeated(4_000_000);
    let limit = 24 * bytes.len() as u64 + LOAD_BASE_BYTES;
    assert_eq!(
        decode(&bytes).unwrap_err().to_string(),
        format!(
            "tracer snapshot refused: loading this {}-byte file would take more than {limit} bytes of memory (at most 24 bytes per byte of the file plus 64 MiB); it went past that at traceback 0 of the tracebacks section (4000000 frames)",
            bytes.len()
        )
    );
    // Refused before anything of the traceback was charged or made: what
    // was kept is the header, string and frame.
    let mut budget = Budget::for_input(bytes.len());
    decode_with(&bytes, &mut budget).unwrap_err();
    let header_len = u32::from_le_bytes([bytes[10], bytes[11], bytes[12], bytes[13]]) as u64;
    assert_eq!(
        budget.used(),
        header_len * cost::HEADER_BYTE + 16 + (2 + cost::STRING) + cost::FRAME + cost::TRACEBACK
    );
    // Within the bound, the same shape loads.
    let fits = one_frame_repeated(1_000_000);
    assert_eq!(
        decode(&fits).unwrap().snapshot.traces()[0]
            .traceback
            .frames()
            .len(),
        1_000_000
    );
}

#[test]
fn an_interrupt_check_stops_the_decoding() {
    fn stop() -> Result<(), Interrupted> {
        Err(Interrupted {
            reason: "the request went past its memory budget".into(),
        })
    }
    let small = encode(&sample(), &json!({}));
    let big = one_frame_repeated(10_000);
    let _guard = CheckGuard::install(stop);
    assert_eq!(decode(&small).unwrap().snapshot, sample());
    assert_eq!(
        decode(&big).unwrap_err(),
        DumpError::Interrupted(Interrupted {
            reason: "the request went past its memory budget".into()
        })
    );
}

#[test]
fn sites_and_build_ids_round_trip_and_keep_two_sites_apart() {
    let site = |function: Option<&str>, offset| {
        Frame::without_line("/usr/bin/node", function, offset).with_extra(FrameExtra {
            function: function.map(Arc::from),
            module: Some("/usr/bin/node".into()),
            address: Some(0x5555_0000_0000 + offset),
            build_id: Some("0f1e2d3c".into()),
        })
    };
    let traces: Vec<Trace> = [
        (site(Some("Allocate(unsigned long)"), 0x1f), 300),
        (site(Some("EnsureExtension()"), 0x2a), 200),
        (site(None, 0x1a_2b30), 100),
    ]
    .into_iter()
    .map(|(frame, size)| Trace {
        source: AllocatorFamily::UNKNOWN,
        domain: 1,
        size,
        traceback: Arc::new(Traceback::new(vec![frame], None)),
    })
    .collect();
    let snapshot = Snapshot::new(traces, 1);
    let bytes = encode(&snapshot, &json!({}));
    assert_eq!(bytes[8..10], DUMP_VERSION.to_le_bytes());
    let decoded = decode(&bytes).expect("decodes").snapshot;
    assert_eq!(decoded, snapshot);
    let frames: Vec<(String, &str, Option<&str>, Option<&str>)> = decoded
        .traces()
        .iter()
        .map(|t| {
            let frame = &t.traceback.frames()[0];
            let extra = frame.extra.as_deref().expect("extra");
            (
                frame.to_string(),
                frame.file(),
                frame.site(),
                extra.build_id.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        frames,
        [
            (
                "/usr/bin/node!Allocate(unsigned long)+0x1f:0".to_string(),
                "/usr/bin/node",
                Some("!Allocate(unsigned long)+0x1f"),
                Some("0f1e2d3c")
            ),
            (
                "/usr/bin/node!EnsureExtension()+0x2a:0".to_string(),
                "/usr/bin/node",
                Some("!EnsureExtension()+0x2a"),
                Some("0f1e2d3c")
            ),
            (
                "/usr/bin/node+0x1a2b30:0".to_string(),
                "/usr/bin/node",
                Some("+0x1a2b30"),
                Some("0f1e2d3c")
            ),
        ]
    );
    let stats = decoded.statistics(crate::GroupBy::Lineno, false).unwrap();
    assert_eq!(stats.len(), 3);
    let files = decoded.statistics(crate::GroupBy::Filename, false).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(
        files[0].to_string(),
        "/usr/bin/node:0: size=600 B, count=3, average=200 B"
    );
    assert_eq!(encode(&decoded, &json!({})), bytes, "deterministic");
}

#[test]
fn version_2_files_with_the_flags_of_version_3_are_refused() {
    // One string "a", one frame a:0 with flag 8 (site start 0).
    let header = json!({"format": "tracer-snapshot", "version": 2, "traceback_limit": 1,
        "counts": {"strings": 1, "frames": 1, "tracebacks": 0, "traces": 0},
        "sources": ["unknown"]});
    let header = header.to_string().into_bytes();
    let mut out = DUMP_MAGIC.to_vec();
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&[1, b'a', 0, 0, 8, 0]);
    let err = decode(&with_crc(out)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad tracer snapshot body in frames: unknown frame flags 0x8"
    );
}
