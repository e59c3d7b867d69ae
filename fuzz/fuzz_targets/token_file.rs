//! The bearer token file and the Authorization header compare.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_daemon::http::Token;

fuzz_target!(|data: &[u8]| {
    let (file, header) = data.split_at(data.len() / 2);
    if let Ok(token) = Token::parse(file) {
        let _ = token.admits(Some(header));
        let mut exact = b"Bearer ".to_vec();
        exact.extend_from_slice(file.trim_ascii());
        assert!(token.admits(Some(&exact)));
    }
});
