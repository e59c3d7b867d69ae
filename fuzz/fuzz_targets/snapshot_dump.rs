//! tracer's own snapshot files (POST /snapshots, the state directory). The
//! input is decoded as it is, and again with a valid CRC-32 appended, so
//! that mutations reach the decoder past the checksum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_model::{crc32, decode, encode};

fuzz_target!(|data: &[u8]| {
    let _ = decode(data);
    let mut fixed = data.to_vec();
    fixed.extend_from_slice(&crc32(data).to_le_bytes());
    if let Ok(decoded) = decode(&fixed) {
        // What decodes re-encodes to something that decodes the same.
        let again = encode(&decoded.snapshot, &decoded.meta);
        let back = decode(&again).expect("a re-encoded snapshot decodes");
        assert_eq!(back.snapshot.traces().len(), decoded.snapshot.traces().len());
    }
});
