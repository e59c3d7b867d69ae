//! HTTP query strings and request paths: the parameter parser of every
//! route (filters included) and the path check in front of them must never
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_daemon::http::{limits::check_path, params::Params};

const ALLOWED: &[&str] = &[
    "group_by", "cumulative", "limit", "format", "base", "new", "label", "include", "exclude",
    "all_frames", "domain", "exclude_domain", "source", "tb_limit", "most_recent_first",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (path, query) = text.split_once('?').unwrap_or((text, ""));
    let _ = check_path(path, Some(query));
    if let Ok(params) = Params::parse(Some(query), ALLOWED) {
        let _ = params.group_by();
        let _ = params.flag("cumulative");
        let _ = params.limit();
        let text = params.text();
        let _ = params.snapshot_ref("base");
        let _ = params.snapshot_ref("new");
        let _ = params.label();
        let _ = params.filters();
        if let Ok(text) = text {
            let _ = params.text_options(text);
        }
    }
});
