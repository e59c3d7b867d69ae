//! The query routes through the real tracerd (real eBPF) tracing
//! `fixtures/apifix.c`: filters, group_by function and module, system-wide
//! views, stored snapshots as resources, automatic snapshots and `since=`,
//! dump/load in both formats (with CPython reading and writing the
//! tracemalloc files), start/stop/clear/reset, object tracebacks, source
//! lines, tracer memory, every bad parameter, and the profile formats
//! (pprof, folded stacks, flame graphs).

mod bounds;
mod cancel;
mod cheap;
mod control;
mod dump;
mod errors;
mod filters;
mod openapi;
pub(crate) mod profiles;
mod snapshots;
mod ui;

use serde_json::{Value, json};

use super::support::{Fixture, Program, SharedTracerd, Tracerd};

/// `fixtures/apifix.c`, compiled.
fn app() -> Program {
    Program::build("apifix", &[])
}

/// `fixtures/apifix.c` under the shared tracerd of default flags
/// ([`Tracerd::shared`]: the test reads its own process and snapshots
/// only), run to the end of phase 1, or of phase 2 (with the address it
/// printed).
fn start(phases: u32) -> (Program, SharedTracerd, Fixture, Option<u64>) {
    let app = app();
    let tracerd = Tracerd::shared(&[]);
    let (fx, address) = run(&app, &tracerd, phases);
    (app, tracerd, fx, address)
}

/// [`start`] under a tracerd of its own (default flags), for a test that
/// changes what others would read (its snapshots' labels, a fuzzer's
/// requests).
fn start_alone(phases: u32) -> (Program, Tracerd, Fixture, Option<u64>) {
    let app = app();
    let tracerd = Tracerd::start(&[]);
    let (fx, address) = run(&app, &tracerd, phases);
    (app, tracerd, fx, address)
}

/// Starts the fixture under `tracerd` and runs it to the end of phase 1, or
/// of phase 2 (then with the address of the block it printed).
fn run(app: &Program, tracerd: &Tracerd, phases: u32) -> (Fixture, Option<u64>) {
    let mut fx = Fixture::spawn_traced(tracerd, &app.exe, &[]);
    fx.step("phase1");
    let address = (phases >= 2).then(|| phase2(&mut fx));
    (fx, address)
}

/// Runs phase 2 of the fixture; returns the address of the block it
/// printed (its `SITE_OBJ`).
fn phase2(fx: &mut Fixture) -> u64 {
    fx.go();
    let line = fx.read_line();
    let address = u64::from_str_radix(line.trim_start_matches("0x"), 16).expect("address");
    fx.expect_line("phase2");
    address
}

fn enc(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Asserts that `body` says its data is complete: no drop.
fn assert_complete(body: &Value) {
    assert_eq!(
        (&body["complete"], &body["drops"], &body["drops_by_pid"]),
        (&json!(true), &json!(0), &json!({})),
        "{body}"
    );
}

/// The `text` (tracemalloc's `str()`) of every statistic of `body`.
fn texts(body: &Value) -> Vec<String> {
    body["statistics"]
        .as_array()
        .expect("statistics")
        .iter()
        .map(|s| s["text"].as_str().expect("text").to_string())
        .collect()
}
