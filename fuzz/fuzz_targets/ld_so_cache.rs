//! `/etc/ld.so.cache` of a traced process's root (written by whoever owns
//! that root: a container image).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tracer_daemon::elf::ldso::parse_ld_so_cache(data);
});
