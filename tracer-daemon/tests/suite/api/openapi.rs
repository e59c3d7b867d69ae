//! `GET /openapi.json` judged by schemathesis (PyPI, installed by `cargo
//! xtask setup` into a venv of its own): it reads tracerd's description of
//! itself and sends every operation generated requests, valid and invalid
//! (`--mode all`), against the real tracerd tracing `fixtures/apifix.c`,
//! and checks that no answer is a 5xx (`not_a_server_error`) and that every
//! status, media type, body schema and header is one the description
//! gives. Its seed is fixed, so a run repeats; its report is printed and
//! kept (`$CARGO_TARGET_TMPDIR/schemathesis.txt`).

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tracer_daemon::http::routes::{OPENAPI_PATH, ROUTES};

use super::start_alone;
use crate::suite::support::{TempDir, kill_if_running};

/// Where `cargo xtask setup` installs schemathesis (xtask/src/setup.rs).
const SCHEMATHESIS: &str = "/opt/tracer-tests/schemathesis/bin/schemathesis";

/// schemathesis, stopped by pid when dropped (a run cut short included).
struct Judge(Child);

impl Drop for Judge {
    fn drop(&mut self) {
        kill_if_running(&mut self.0);
    }
}

#[test]
fn schemathesis_finds_no_server_error_and_nothing_the_description_does_not_give() {
    let (_app, tracerd, fx, _address) = start_alone(2);
    // A stored snapshot, so that the {id} routes have one to find.
    let (status, body) = tracerd.post(&format!("/pid/{}/snapshots?label=before", fx.pid()));
    assert_eq!(status, 201, "{body}");
    let scratch = TempDir::new("schemathesis");
    let junit = scratch.path().join("junit.xml");
    let out = scratch.path().join("out.txt");
    let log = std::fs::File::create(&out).expect("report file");
    // Nothing is excluded: this tracerd is the test's own, so fuzzing
    // POST /tracing/stop, PUT /scope with random pids, paths and cgroups,
    // clear-traces, DELETE /snapshots/{id} or loading random files changes
    // nothing another test sees (later requests of the run then meet the
    // 409s and 404s the description gives for a stopped or emptied
    // tracerd, which is part of what is judged).
    let child = Command::new(SCHEMATHESIS)
        .arg("run")
        .arg(format!("{}/openapi.json", tracerd.base()))
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance",
            "--mode",
            "all",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "20",
            "--seed",
            "7466",
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--no-color",
            "--report",
            "junit",
            "--report-junit-path",
        ])
        .arg(&junit)
        // Its cache (.schemathesis/) goes to the scratch directory.
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{SCHEMATHESIS}: {e} (installed by cargo xtask setup)")
        });
    let mut judge = Judge(child);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = judge.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "schemathesis ran past 5 minutes: {}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let report = std::fs::read_to_string(&out).expect("report");
    println!("{report}");
    let _ = std::fs::write(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("schemathesis.txt"),
        &report,
    );
    assert!(
        status.success(),
        "schemathesis failed ({status}):\n{report}"
    );
    // Every operation of the table was tested, but the one that serves
    // the description (schemathesis leaves out the schema's own URL).
    let xml = std::fs::read_to_string(&junit).expect("junit report");
    let mut tested: Vec<String> = xml
        .split("<testcase name=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next().map(str::to_string))
        .collect();
    let mut operations: Vec<String> = ROUTES
        .iter()
        .filter(|r| r.path != OPENAPI_PATH)
        .flat_map(|r| {
            r.ops
                .iter()
                .map(|op| format!("{} {}", op.method.as_str(), r.path))
        })
        .collect();
    tested.sort();
    operations.sort();
    assert_eq!(tested, operations, "{xml}");
    drop(fx);
}
