//! tracerd.toml: any file content is either a valid configuration or a
//! ConfigError, never a panic; a valid one survives a round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_daemon::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(config) = Config::from_toml_str(text, "fuzz") {
        let again = config.to_toml().expect("a valid config serializes");
        let back = Config::from_toml_str(&again, "round trip").expect("and parses back");
        assert_eq!(back, config);
    }
});
