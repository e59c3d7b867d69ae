//! `/proc/PID/stat` text (its comm field is chosen by the traced program):
//! the start time and ppid parsers.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = tracer_daemon::sys::procfs::parse_stat_start_time(text);
    let _ = tracer_daemon::sys::procfs::parse_stat_ppid(text);
});
