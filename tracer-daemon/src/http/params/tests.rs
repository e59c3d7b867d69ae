//! Tests of `params`.
use super::*;
use axum::http::StatusCode;
use std::collections::BTreeSet;

#[test]
fn unknown_parameter_names_the_valid_ones() {
    let err = Params::parse(Some("group=lineno"), &[spec::PAGE]).unwrap_err();
    assert_eq!(err.status, StatusCode::BAD_REQUEST);
    assert_eq!(err.error, "unknown parameter \"group\"");
    assert_eq!(err.hint, "valid parameters: offset, limit");
}

#[test]
fn bad_values_name_the_valid_ones() {
    let params = Params::parse(
        Some("group_by=line&cumulative=yes&limit=-1&format=xml"),
        &[spec::STATS, spec::STATS_FORMAT],
    )
    .unwrap();
    assert_eq!(
        params.group_by().unwrap_err().hint,
        "group_by is one of: filename, lineno, traceback, function, module"
    );
    assert_eq!(
        params.flag("cumulative").unwrap_err().hint,
        "cumulative is one of: true, false, 1, 0"
    );
    assert_eq!(
        params.limit().unwrap_err().hint,
        "limit is a whole number >= 0 (0 means all)"
    );
    assert_eq!(
        params.text().unwrap_err().hint,
        "format is one of: json, text"
    );
    assert_eq!(
        params.format().unwrap_err().hint,
        "format is one of: json, text, pprof, collapsed, svg"
    );
}

#[test]
fn format_names_each_output_and_the_profiles_draw_stacks() {
    let formats: Vec<(Format, bool)> = ["json", "text", "pprof", "collapsed", "svg"]
        .iter()
        .map(|v| {
            let format = Params::parse(Some(&format!("format={v}")), &[spec::STATS_FORMAT])
                .unwrap()
                .format()
                .unwrap();
            (format, format.is_profile())
        })
        .collect();
    assert_eq!(
        formats,
        [
            (Format::Json, false),
            (Format::Text, false),
            (Format::Pprof, true),
            (Format::Collapsed, true),
            (Format::Svg, true),
        ]
    );
    assert_eq!(
        Params::parse(None, &[spec::STATS_FORMAT])
            .unwrap()
            .format()
            .unwrap(),
        Format::Json
    );
}

#[test]
fn defaults_apply_when_absent() {
    let params = Params::parse(None, &[spec::STATS]).unwrap();
    assert_eq!(params.group_by().unwrap(), GroupBy::Lineno);
    assert_eq!(params.limit().unwrap(), DEFAULT_LIMIT);
    assert!(!params.flag("cumulative").unwrap());
    assert_eq!(params.snapshot_ref("new").unwrap(), None);
    assert!(params.filters().unwrap().is_empty());
}

#[test]
fn repeated_parameter_is_refused_unless_repeatable() {
    let err = Params::parse(Some("limit=1&limit=2"), &[spec::PAGE]).unwrap_err();
    assert_eq!(err.error, "parameter \"limit\" given twice");
    let params = Params::parse(
        Some("include=a.c&include=b.c&domain=1&domain=2"),
        &[spec::FILTERS],
    )
    .unwrap();
    assert_eq!(params.filters().unwrap().len(), 4);
}

#[test]
fn filters_parse_pattern_line_and_domain_from_the_right() {
    assert_eq!(
        parse_filter("include", "/srv/*.c:88@1234").unwrap(),
        ("/srv/*.c".into(), Some(88), Some(1234))
    );
    assert_eq!(
        parse_filter("include", "a.c:12").unwrap(),
        ("a.c".into(), Some(12), None)
    );
    assert_eq!(
        parse_filter("include", "a.c@7").unwrap(),
        ("a.c".into(), None, Some(7))
    );
    assert_eq!(
        parse_filter("include", "lib@2x.c").unwrap(),
        ("lib@2x.c".into(), None, None)
    );
    assert_eq!(
        parse_filter("include", "c:\\x").unwrap(),
        ("c:\\x".into(), None, None)
    );
    assert_eq!(
        parse_filter("exclude", "a.c:").unwrap(),
        ("a.c:".into(), None, None)
    );
    let err = parse_filter("include", "a.c:99999999999").unwrap_err();
    assert_eq!(
        err.error,
        "invalid include \"a.c:99999999999\": the line number does not fit in 32 bits"
    );
    assert!(
        err.hint.starts_with("include is PATTERN[:LINENO][@DOMAIN]"),
        "{}",
        err.hint
    );
    let params = Params::parse(Some("domain=x"), &[spec::FILTERS]).unwrap();
    assert_eq!(
        params.filters().unwrap_err().hint,
        "domain is a domain (a pid, 0 to 4294967295); repeat it for more"
    );
}

#[test]
fn durations_and_references() {
    assert_eq!(parse_duration("10m").unwrap().as_secs(), 600);
    assert_eq!(parse_duration("1h30m").unwrap().as_secs(), 5400);
    assert_eq!(parse_duration("45").unwrap().as_secs(), 45);
    assert_eq!(parse_duration("2d").unwrap().as_secs(), 172_800);
    for bad in ["", "10x", "m", "10m5", "-1m", "99999999999999999999d"] {
        assert_eq!(
            parse_duration(bad).unwrap_err().status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
    assert_eq!(parse_ref("base", "12").unwrap(), SnapshotRef::Id(12));
    assert_eq!(
        parse_ref("base", "before").unwrap(),
        SnapshotRef::Label("before".into())
    );
    assert_eq!(
        parse_ref("base", "0").unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        parse_ref("base", "a b").unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(parse_address("0x10").unwrap(), 16);
    assert_eq!(parse_address("16").unwrap(), 16);
    assert_eq!(
        parse_address("0xzz").unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
}

#[test]
fn source_needs_text() {
    let params = Params::parse(
        Some("source=true"),
        &[spec::STATS_FORMAT, spec::TEXT_OPTIONS],
    )
    .unwrap();
    let err = params.text_options(false).unwrap_err();
    assert_eq!(err.hint, "add format=text (JSON always has every frame)");
    let params = Params::parse(
        Some("format=text&source=1&tb_limit=-2"),
        &[spec::STATS_FORMAT, spec::TEXT_OPTIONS],
    )
    .unwrap();
    let options = params.text_options(params.text().unwrap()).unwrap();
    assert_eq!(
        options,
        TextOptions {
            tracebacks: true,
            source: true,
            tb_limit: Some(-2),
            most_recent_first: false
        }
    );
}

#[test]
fn pid_must_be_positive() {
    assert_eq!(parse_pid("12").unwrap(), 12);
    assert_eq!(parse_pid("0").unwrap_err().status, StatusCode::BAD_REQUEST);
    assert_eq!(
        parse_pid("abc").unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(parse_pid("4294967295").unwrap(), u32::MAX);
    for bad in [
        "+1",
        "01",
        "00",
        "-1",
        " 1",
        "1 ",
        "4294967296",
        "",
        "1e3",
        "0x10",
    ] {
        let err = parse_pid(bad).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(err.error, format!("invalid pid {bad:?}"));
    }
    for bad in ["pid=%2B1", "pid=01"] {
        assert!(parse_scope(Some(bad)).is_err(), "{bad}");
    }
}

#[test]
fn scope_queries_parse_and_refuse_bad_values() {
    let scope = parse_scope(Some("pid=12&pid=13&exe=/usr/bin/app&cgroup=/system.slice")).unwrap();
    assert_eq!(scope.pids, BTreeSet::from([12, 13]));
    assert_eq!(scope.exes, BTreeSet::from([PathBuf::from("/usr/bin/app")]));
    assert!(parse_scope(None).unwrap().is_all());
    let err = parse_scope(Some("process=1")).unwrap_err();
    assert_eq!(err.status, StatusCode::BAD_REQUEST);
    assert!(
        err.hint.starts_with("valid parameters: pid, exe, cgroup"),
        "{}",
        err.hint
    );
    assert!(
        parse_scope(Some("pid=-1"))
            .unwrap_err()
            .hint
            .starts_with("pid is a positive integer")
    );
    assert!(parse_scope(Some("exe=relative")).is_err());
}

#[test]
fn allocator_frames_is_keep_or_drop_and_drop_by_default() {
    let parse = |q| Params::parse(Some(q), &[spec::NOW]).unwrap();
    assert_eq!(
        Params::parse(None, &[spec::NOW])
            .unwrap()
            .allocator_frames()
            .unwrap(),
        AllocatorFrames::Drop
    );
    assert_eq!(
        parse("allocator_frames=keep").allocator_frames().unwrap(),
        AllocatorFrames::Keep
    );
    assert_eq!(
        parse("allocator_frames=drop").allocator_frames().unwrap(),
        AllocatorFrames::Drop
    );
    let err = parse("allocator_frames=yes")
        .allocator_frames()
        .unwrap_err();
    assert_eq!(err.status, StatusCode::BAD_REQUEST);
    assert_eq!(err.error, "invalid allocator_frames \"yes\"");
    assert!(
        err.hint
            .starts_with("allocator_frames is one of: keep, drop"),
        "{}",
        err.hint
    );
}

#[test]
fn allocator_frames_on_a_stored_snapshot_says_why_it_is_refused() {
    assert!(refuse_allocator_frames(Some("group_by=lineno")).is_ok());
    assert!(refuse_allocator_frames(None).is_ok());
    let err = refuse_allocator_frames(Some("limit=3&allocator_frames=keep")).unwrap_err();
    assert_eq!(err.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        err.error,
        "allocator_frames applies only when a snapshot is taken, and this route reads a stored snapshot"
    );
    assert!(
        err.hint
            .starts_with("a stored snapshot keeps the allocator frames it was taken with")
    );
}

#[test]
fn the_documented_words_are_the_parsers_words() {
    assert_eq!(Format::VALID, spec::STATS_FORMATS.join(", "));
    for word in spec::GROUP_BY {
        let params = Params::parse(Some(&format!("group_by={word}")), &[spec::STATS]).unwrap();
        params.group_by().unwrap();
    }
    for word in spec::ALLOCATOR_FRAMES_VALUES {
        assert_eq!(
            AllocatorFrames::parse(word).map(AllocatorFrames::as_str),
            Some(word)
        );
    }
    assert_eq!(
        AllocatorFrames::VALID,
        spec::ALLOCATOR_FRAMES_VALUES.join(", ")
    );
    let text = Params::parse(Some("format=text"), &[spec::TEXT_FORMAT]).unwrap();
    assert!(text.text().unwrap());
    let json = Params::parse(Some("format=json"), &[spec::TEXT_FORMAT]).unwrap();
    assert!(!json.text().unwrap());
}
