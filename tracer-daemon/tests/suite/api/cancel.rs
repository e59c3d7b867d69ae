//! Work is bounded and cancellable: the work of a
//! request whose client left stops and frees its memory, the expensive
//! routes' limit counts running work, traces are streamed in memory
//! independent of their number, and a request past its memory budget is
//! answered 413 with a hint.
use std::{io::Read as _, time::Duration};

use reqwest::blocking::Client;
use serde_json::{Value, json};

use crate::suite::support::{Fixture, Program, Tracerd, poll, sample};

/// `millions` holding `blocks` blocks of 16 bytes, traced by `tracerd`.
fn holder(tracerd: &Tracerd, blocks: u64) -> Fixture {
    let prog = Program::build("millions", &[]);
    let mut fx = Fixture::spawn_traced(tracerd, &prog.exe, &[&blocks.to_string()]);
    fx.step("done");
    let pid = fx.pid();
    poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let process = tracerd.get_ok(&format!("/pid/{pid}"));
        match process["blocks"].as_u64() {
            Some(b) if b >= blocks => Ok(()),
            other => Err(format!("{other:?} blocks of {blocks} yet")),
        }
    });
    fx
}

/// A field of tracerd's `/proc/PID/status`, in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(pid: u32, field: &str) -> u64 {
    tracer_testkit::status_kib(pid, field).unwrap_or_else(|| panic!("{field} of {pid}")) * 1024
}

fn cancelled(tracerd: &Tracerd, reason: &str) -> f64 {
    let (_, metrics) = tracerd.get_text("/metrics");
    sample(
        &metrics,
        "tracer_requests_cancelled_total",
        &[("reason", reason)],
    )
    .unwrap_or(0.0)
}

/// Sends GET `path`, reads the first bytes of its answer and leaves
/// (drops the connection); returns the status.
fn leave_after_first_bytes(client: &Client, url: &str) -> u16 {
    let mut response = client.get(url).send().expect("send");
    let status = response.status().as_u16();
    let mut first = [0u8; 64];
    response.read_exact(&mut first).expect("the first bytes");
    status
}

const MIB: u64 = 1 << 20;

#[test]
fn streamed_traces_hold_little_and_abandoned_ones_stop_and_give_their_memory_back() {
    const BLOCKS: u64 = 850_000;
    const CLIENTS: usize = 4;
    let tracerd = Tracerd::start(&["--max-expensive-requests", "4"]);
    let fx = holder(&tracerd, BLOCKS);
    let pid = fx.pid();
    let url = format!("{}/pid/{pid}/traces?limit=0", tracerd.base());

    // One read whole: every block, exactly, while tracerd's high-water
    // mark rises by little.
    let rss_before = status_bytes(tracerd.pid(), "VmRSS");
    let hwm_before = status_bytes(tracerd.pid(), "VmHWM");
    // Hundreds of MB of JSON, about a minute from the debug tracerd: the
    // client's usual 60 s would cut it (the read's time is not what is
    // tested here).
    let patient = Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .expect("http client");
    let response = patient.get(&url).send().expect("traces");
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().expect("json");
    let traces = body["traces"].as_array().expect("traces");
    // Its blocks of 16 bytes, and the few of its start (the pointer
    // array, the C library's).
    assert_eq!(body["total"], json!(traces.len()));
    let sixteen = traces.iter().filter(|t| t["size"] == 16).count() as u64;
    assert_eq!(sixteen, BLOCKS);
    assert!(traces.len() as u64 - BLOCKS < 10, "{} traces", traces.len());
    let hwm_rise = status_bytes(tracerd.pid(), "VmHWM").saturating_sub(hwm_before);
    eprintln!(
        "{BLOCKS} traces streamed ({} bytes of JSON as read): VmRSS before {} MiB, VmHWM rose {} MiB",
        serde_json::to_vec(&body).map_or(0, |b| b.len()),
        rss_before / MIB,
        hwm_rise / MIB
    );
    drop(body);
    // What rises is the snapshot's build (the kernel's entries, the raw
    // blocks, the traces and their filtered copy: 209 and 498 MiB in two
    // runs of the debug tracerd); the answer itself holds a few chunks of
    // 64 KiB. Built as one Value, as before, it took about 1.5 GB.
    assert!(hwm_rise < 800 * MIB, "VmHWM rose {} MiB", hwm_rise / MIB);

    // CLIENTS at once, each leaving after the first bytes.
    let client = Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| scope.spawn(|| leave_after_first_bytes(&client, &url)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    assert_eq!(statuses, [200; CLIENTS]);
    // Each one's work stops, and counts itself once: at its next chunk
    // once hyper dropped the body, at the latest when its chunk waited
    // request_timeout_secs (30 s) for a reader.
    let left = std::time::Instant::now();
    poll(
        Duration::from_secs(45),
        Duration::from_millis(100),
        || match cancelled(&tracerd, "abandoned") {
            n if n == CLIENTS as f64 => Ok(()),
            n => Err(format!("{n} cancelled")),
        },
    );
    eprintln!(
        "{CLIENTS} works stopped {:?} after their clients left",
        left.elapsed()
    );
    // And its memory goes back.
    let mut rss = 0;
    poll(Duration::from_secs(10), Duration::from_millis(200), || {
        rss = status_bytes(tracerd.pid(), "VmRSS");
        if rss < rss_before + 300 * MIB {
            Ok(())
        } else {
            Err(format!("VmRSS {} MiB", rss / MIB))
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(cancelled(&tracerd, "abandoned"), CLIENTS as f64);
    assert_eq!(cancelled(&tracerd, "memory_budget"), 0.0);
    eprintln!(
        "{CLIENTS} abandoned traces?limit=0: VmRSS {} MiB (before {} MiB)",
        rss / MIB,
        rss_before / MIB
    );
}

#[test]
fn an_abandoned_expensive_request_gives_its_permit_back_once_its_work_stopped() {
    let tracerd = Tracerd::start(&["--max-expensive-requests", "1"]);
    let fx = holder(&tracerd, 300_000);
    let pid = fx.pid();
    let status = leave_after_first_bytes(
        tracerd.client(),
        &format!("{}/pid/{pid}/traces?limit=0", tracerd.base()),
    );
    assert_eq!(status, 200);
    // The one permit is the abandoned work's until it stops; then the
    // next expensive request is served.
    let mut answered = 0;
    poll(Duration::from_secs(10), Duration::from_millis(20), || {
        answered = tracerd.get(&format!("/pid/{pid}/statistics?limit=1")).0;
        if answered == 429 {
            Err("the permit is still held".to_string())
        } else {
            Ok(())
        }
    });
    assert_eq!(answered, 200);
    assert_eq!(cancelled(&tracerd, "abandoned"), 1.0);
}

#[test]
fn a_request_past_its_memory_budget_is_a_413_that_says_how_to_ask_for_less() {
    let tracerd = Tracerd::start(&["--request-memory-budget", &(16 * MIB).to_string()]);
    let fx = holder(&tracerd, 850_000);
    let pid = fx.pid();
    let (status, body) = tracerd.get(&format!("/pid/{pid}/traces?limit=10"));
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        body,
        json!({
            "error": "the answer needs more than the request memory budget of 16777216 bytes",
            "hint": "ask for less: page the traces with limit= and offset=, narrow them with \
                     filters (filename=, lineno=, allocator=, domain=, ...; exclude_ for the \
                     opposite), take text with format=text, or ask an operator to raise \
                     request_memory_budget",
        })
    );
    assert_eq!(cancelled(&tracerd, "memory_budget"), 1.0);
    assert_eq!(cancelled(&tracerd, "abandoned"), 0.0);
    // A small process's answer fits.
    assert_eq!(tracerd.get("/processes").0, 200);
}
