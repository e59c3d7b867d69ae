//! tracer's own snapshot files (POST /snapshots, the state directory).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tracer_daemon::model::decode(data);
});
