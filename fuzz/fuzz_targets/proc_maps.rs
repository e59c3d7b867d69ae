//! `/proc/PID/maps` text (paths are chosen by the traced program).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = tracer_daemon::sys::procfs::parse_maps(text);
});
