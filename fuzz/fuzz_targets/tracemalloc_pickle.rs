//! Files written by Python's tracemalloc.Snapshot.dump() (untrusted pickle,
//! parsed, never executed).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tracer_model::load_tracemalloc(data);
});
