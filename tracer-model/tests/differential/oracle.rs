//! Runs a CPython oracle script from `tests/differential/support/` with
//! one JSON request on stdin and returns its JSON answer. The interpreter
//! is `python3` (3.11; override with `TRACER_PYTHON`).

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

/// The Python interpreter the oracles run under.
pub fn python() -> String {
    std::env::var("TRACER_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Path of a script in `tests/differential/support/`.
pub fn script(name: &str) -> String {
    format!(
        "{}/tests/differential/support/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Runs `tests/differential/support/{name}` with `request` on stdin;
/// panics with the script's stderr if it fails. Checks that the answer
/// came from 3.11.
pub fn run(name: &str, request: &Value) -> Value {
    let python = python();
    let mut child = Command::new(&python)
        .arg(script(name))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python} (set TRACER_PYTHON): {e}"));
    let body = serde_json::to_vec(request).expect("request serializes");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // Write from another thread: the oracle may fill stdout first.
    let writer = std::thread::spawn(move || stdin.write_all(&body));
    let output = child.wait_with_output().expect("oracle runs");
    writer
        .join()
        .expect("writer thread")
        .expect("request written");
    assert!(
        output.status.success(),
        "oracle {name} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: Value = serde_json::from_slice(&output.stdout).expect("oracle prints JSON");
    let version = &answer["version"];
    assert_eq!(
        (version[0].as_u64(), version[1].as_u64()),
        (Some(3), Some(11)),
        "the reference is CPython 3.11; got Python {version}"
    );
    answer
}
