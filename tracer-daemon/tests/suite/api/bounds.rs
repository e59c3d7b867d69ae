//! Files crafted to expand when loaded: a tracer file
//! whose one traceback repeats one frame 16 million times behind a valid
//! checksum, and tracemalloc pickles of 16 million `DUP` or 8 million
//! `BINGET` (16 MB each: the test's tracerd is a debug build; 60 MB
//! files behave alike, see the model's tests). Each is
//! refused with a 413 naming the bound (24 bytes of memory per byte of
//! the file plus 64 MiB), nothing is stored, tracerd's peak memory grows
//! by less than that bound plus two copies of the body (under 512 MB),
//! and `/health` still answers.

use reqwest::Method;
use serde_json::json;

use crate::suite::support::Tracerd;

/// The bound on what loading a file of `len` bytes may cost.
fn bound(len: usize) -> u64 {
    24 * len as u64 + (64 << 20)
}

/// tracerd's peak resident memory (`VmHWM` of `/proc/PID/status`), bytes.
fn vm_hwm(pid: u32) -> u64 {
    tracer_testkit::status_kib(pid, "VmHWM").expect("VmHWM") * 1024
}

/// A tracer file (version 2, valid CRC) of one string, one frame, one
/// traceback of `depth` references to that frame and one trace.
fn repeated_frame(depth: usize) -> Vec<u8> {
    let header = json!({"format": "tracer-snapshot", "version": 2, "traceback_limit": 1,
        "sources": ["unknown"],
        "counts": {"strings": 1, "frames": 1, "tracebacks": 1, "traces": 1}})
    .to_string();
    let mut out = tracer_model::DUMP_MAGIC.to_vec();
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&u32::try_from(header.len()).expect("short").to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&[1, b'a', 0, 1, 0, 0]);
    let mut d = depth as u64;
    while d >= 0x80 {
        out.push((d as u8) | 0x80);
        d >>= 7;
    }
    out.push(d as u8);
    out.resize(out.len() + depth, 0);
    out.extend_from_slice(&[7, 100, 0, 0]);
    let crc = tracer_model::crc32(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A tracemalloc snapshot pickle of one trace tuple followed by `body`
/// inside the `_traces` list's APPENDS mark; and where `body` starts.
fn replicating(body: &[u8]) -> (Vec<u8>, usize) {
    let mut out = b"\x80\x04ctracemalloc\nSnapshot\n)\x81}(\x8c\x06tracesctracemalloc\n_Traces\n)\x81}\x8c\x07_traces](K\x01Kd\x8c\x03a.cK\x03\x86\x85\x87".to_vec();
    let at = out.len();
    out.extend_from_slice(body);
    out.extend_from_slice(b"esb\x8c\x0ftraceback_limitK\x05ub.");
    (out, at)
}

#[test]
fn files_that_expand_past_the_load_bound_are_refused_with_413() {
    // A debug build reads 16 MB of opcodes in well under its 600 s.
    let tracerd = Tracerd::start(&["--request-timeout-secs", "600"]);
    let stored = || {
        tracerd.get_ok("/snapshots")["snapshots"]
            .as_array()
            .map(Vec::len)
    };
    let before = stored();
    const N: usize = 16_000_000;
    let dump = repeated_frame(N);
    let (dup, dup_at) = replicating(&b"2".repeat(N));
    let get = replicating(&[b"\x94".as_slice(), &b"h\x00".repeat(N / 2)].concat()).0;
    let cases = [
        (
            dump,
            "",
            "tracer snapshot refused",
            format!("traceback 0 of the tracebacks section ({N} frames)"),
        ),
        (
            dup,
            "format=tracemalloc&",
            "tracemalloc pickle refused",
            format!("byte {} (opcode APPENDS)", dup_at + N),
        ),
        (
            get,
            "format=tracemalloc&",
            "tracemalloc pickle refused",
            format!("its {} traces", N / 2 + 1),
        ),
    ];
    for (body, query, what, at) in cases {
        let len = body.len();
        let start = vm_hwm(tracerd.pid());
        let (status, err) = tracerd.send(
            Method::POST,
            &format!("/snapshots?{query}label=x"),
            Some(body),
        );
        assert_eq!(status, 413, "{err}");
        assert_eq!(
            err["error"],
            format!(
                "{what}: loading this {len}-byte file would take more than {} bytes of memory (at most 24 bytes per byte of the file plus 64 MiB); it went past that at {at}",
                bound(len)
            )
        );
        assert!(
            err["hint"]
                .as_str()
                .is_some_and(|h| h.starts_with("tracerd loads a file only if it takes at most 24 bytes of memory per byte of the file plus 64 MiB")),
            "{err}"
        );
        let peak = vm_hwm(tracerd.pid());
        let grown = peak.saturating_sub(start);
        assert!(
            grown <= bound(len) + 2 * len as u64 && grown < 512 << 20,
            "VmHWM grew from {start} to {peak} bytes for a {len}-byte file"
        );
        assert_eq!(tracerd.get("/health").0, 200);
    }
    assert_eq!(stored(), before);
}
