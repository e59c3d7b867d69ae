//! HTTP query strings and request paths: the parameter parser of every
//! route and the path check in front of them must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_daemon::{api::Params, server::check_path};

const ALLOWED: &[&str] = &["group_by", "cumulative", "limit", "format", "base", "new"];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (path, query) = text.split_once('?').unwrap_or((text, ""));
    let _ = check_path(path, Some(query));
    if let Ok(params) = Params::parse(Some(query), ALLOWED) {
        let _ = params.group_by();
        let _ = params.flag("cumulative");
        let _ = params.limit();
        let _ = params.text();
        let _ = params.snapshot_id("base");
        let _ = params.snapshot_id("new");
    }
});
