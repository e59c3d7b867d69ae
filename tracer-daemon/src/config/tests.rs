//! Tests of the configuration: defaults, sources, ranges, the shipped file.
use super::*;
use crate::sys::procfs::page_size;
use clap::Parser as _;

fn flags(args: &[&str]) -> Flags {
    let mut argv = vec!["tracerd"];
    argv.extend_from_slice(args);
    Cli::try_parse_from(argv).expect("must succeed").flags
}

#[test]
fn defaults_are_the_documented_ones() {
    let config = Config::default();
    assert_eq!(config.api.listen.to_string(), "127.0.0.1:7466");
    assert_eq!(config.capture.nframe, 16);
    assert_eq!(config.store.state_dir, PathBuf::from("/var/lib/tracer"));
    assert_eq!(config.metrics.metrics_top_processes, 20);
    assert_eq!(config.metrics.metrics_call_sites, 0);
    config.validate().expect("must succeed");
}

#[test]
fn the_shipped_config_file_is_the_defaults() {
    let text = include_str!("../../../deploy/tracerd.toml");
    let config = Config::from_toml_str(text, "deploy/tracerd.toml").expect("must succeed");
    assert_eq!(config, Config::default());
}

#[test]
fn default_toml_round_trips() {
    let text = Config::default().to_toml().expect("must succeed");
    assert_eq!(
        Config::from_toml_str(&text, "default").expect("must succeed"),
        Config::default()
    );
}

#[test]
fn flags_override_the_file_which_overrides_defaults() {
    let dir = std::env::temp_dir().join(format!("tracer-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("must succeed");
    let file = dir.join("tracerd.toml");
    std::fs::write(&file, "nframe = 8\nmax_stacks = 1024\n").expect("must succeed");
    let path = file.to_str().expect("must succeed");
    let config = Config::load(&flags(&["--config", path, "--nframe", "20"])).expect("must succeed");
    assert_eq!(config.capture.nframe, 20);
    assert_eq!(config.maps.max_stacks, 1024);
    assert_eq!(config.maps.max_procs, 65536);
    let config = Config::load(&flags(&["--config", path])).expect("must succeed");
    assert_eq!(config.capture.nframe, 8);
    std::fs::remove_dir_all(&dir).expect("must succeed");
}

#[test]
fn out_of_range_values_are_refused_with_the_range() {
    let err = Config::load(&flags(&["--nframe", "65"])).expect_err("must fail");
    assert_eq!(
        err.to_string(),
        "nframe = 65 is out of range; valid: 1..=64"
    );
    let err = Config::from_toml_str("max_live_blocks = 10", "t").expect_err("must fail");
    assert_eq!(
        err.to_string(),
        "max_live_blocks = 10 is out of range; valid: 1024..=67108864"
    );
    let err = Config::load(&flags(&["--listen", "0.0.0.0:7466"])).expect_err("must fail");
    assert!(err.to_string().contains("needs auth_token_file"), "{err}");
    let err = Config::load(&flags(&["--state-dir", "var/lib"])).expect_err("must fail");
    assert_eq!(
        err.to_string(),
        "state_dir = \"var/lib\" is invalid: must be an absolute path"
    );
}

#[test]
fn in_flight_and_event_ring_sizes_outside_their_range_are_refused_with_it() {
    let page = page_size();
    let ring = format!(
        "a power of two multiple of the page size ({page} bytes), {page}..=1073741824 (bytes)"
    );
    let page_half = (page / 2).to_string();
    let not_power = (page * 3).to_string();
    let cases: [(&[&str], String); 8] = [
        (
            &["--max-inflight", "0"],
            "max_inflight = 0 is out of range; valid: 1..=4194304 (calls)".into(),
        ),
        (
            &["--max-inflight", "4194305"],
            "max_inflight = 4194305 is out of range; valid: 1..=4194304 (calls)".into(),
        ),
        (
            &["--inflight-slots", "0"],
            "inflight_slots = 0 is out of range; valid: a power of two, 1..=4194304".into(),
        ),
        (
            &["--inflight-slots", "3"],
            "inflight_slots = 3 is out of range; valid: a power of two, 1..=4194304".into(),
        ),
        (
            &["--inflight-slots", "8388608"],
            "inflight_slots = 8388608 is out of range; valid: a power of two, 1..=4194304".into(),
        ),
        (
            &["--events-ring-bytes", &page_half],
            format!("events_ring_bytes = {page_half} is out of range; valid: {ring}"),
        ),
        (
            &["--events-ring-bytes", &not_power],
            format!("events_ring_bytes = {not_power} is out of range; valid: {ring}"),
        ),
        (
            &["--events-ring-bytes", "2147483648"],
            format!("events_ring_bytes = 2147483648 is out of range; valid: {ring}"),
        ),
    ];
    for (args, message) in cases {
        let err = Config::load(&flags(args)).expect_err("must fail");
        assert_eq!(err.to_string(), message, "{args:?}");
    }
    let err = Config::from_toml_str("inflight_slots = 6", "t").expect_err("must fail");
    assert_eq!(
        err.to_string(),
        "inflight_slots = 6 is out of range; valid: a power of two, 1..=4194304"
    );
    // The edges are valid.
    let page = page.to_string();
    for args in [
        [
            "--max-inflight",
            "1",
            "--inflight-slots",
            "1",
            "--events-ring-bytes",
            &page,
        ],
        [
            "--max-inflight",
            "4194304",
            "--inflight-slots",
            "4194304",
            "--events-ring-bytes",
            "1073741824",
        ],
    ] {
        let config = Config::load(&flags(&args)).expect("must succeed");
        assert_eq!(config.maps.max_inflight.to_string(), args[1]);
        assert_eq!(config.maps.inflight_slots.to_string(), args[3]);
        assert_eq!(config.maps.events_ring_bytes.to_string(), args[5]);
    }
}

#[test]
fn unknown_keys_and_wrong_types_are_refused() {
    let err = Config::from_toml_str("nframes = 8", "f.toml")
        .expect_err("must fail")
        .to_string();
    assert!(
        err.starts_with("f.toml: ") && err.contains("unknown field `nframes`"),
        "{err}"
    );
    let err = Config::from_toml_str("nframe = \"8\"", "f.toml")
        .expect_err("must fail")
        .to_string();
    assert!(err.contains("invalid type"), "{err}");
}

#[test]
fn a_missing_explicit_file_is_an_error() {
    let err =
        Config::load(&flags(&["--config", "/nonexistent/tracerd.toml"])).expect_err("must fail");
    assert!(
        err.to_string()
            .starts_with("reading /nonexistent/tracerd.toml"),
        "{err}"
    );
}

#[test]
fn libc_flag_is_repeatable() {
    let config = Config::load(&flags(&["--libc", "/lib/a.so.6", "--libc", "/lib/b.so.6"]))
        .expect("must succeed");
    assert_eq!(
        config.allocators.libc,
        vec![PathBuf::from("/lib/a.so.6"), PathBuf::from("/lib/b.so.6")]
    );
}

#[test]
fn the_shipped_file_spells_out_every_allocator_frames_default() {
    let text = include_str!("../../../deploy/tracerd.toml");
    let table: toml::Table = text.parse().expect("must succeed");
    let listed: Vec<&str> = table["allocator_frames"]
        .as_array()
        .expect("allocator_frames is a list in the file")
        .iter()
        .map(|v| v.as_str().expect("a string"))
        .collect();
    assert_eq!(listed, Config::default().capture.allocator_frames);
    assert!(parse_frame_patterns(&Config::default().capture.allocator_frames).is_ok());
}

#[test]
fn an_allocator_frames_pattern_that_does_not_compile_is_refused_naming_it() {
    let err = Config::from_toml_str(
        r#"allocator_frames = ["xmalloc", "module:", "g_malloc*"]"#,
        "f.toml",
    )
    .expect_err("must fail");
    assert!(
        err.to_string().starts_with(
            r#"allocator_frames = "module:" is invalid: module: an empty glob matches nothing"#
        ),
        "{err}"
    );
    let err = Config::load(&flags(&["--allocator-frames", r"x\malloc"])).expect_err("must fail");
    assert!(
        err.to_string().starts_with(
            r#"allocator_frames = "x\\malloc" is invalid: \m: a backslash escapes only *, ? and \"#
        ),
        "{err}"
    );
}

#[test]
fn allocator_frames_flags_replace_the_defaults_and_split_on_bars() {
    let config = Config::load(&flags(&[
        "--allocator-frames",
        "my_alloc*|module:*/libmine.so",
        "--allocator-frames",
        "operator new(unsigned long, std::align_val_t)",
    ]))
    .expect("must succeed");
    assert_eq!(
        config.capture.allocator_frames,
        [
            "my_alloc*",
            "module:*/libmine.so",
            "operator new(unsigned long, std::align_val_t)"
        ]
    );
    let config = Config::from_toml_str("allocator_frames = []", "t").expect("must succeed");
    assert!(config.capture.allocator_frames.is_empty());
    assert!(
        parse_frame_patterns(&config.capture.allocator_frames)
            .expect("must succeed")
            .is_empty()
    );
}

/// Every field of every section has its line in `file.rs`'s list, once, and
/// the list names nothing else: the file's keys are exactly the sections'
/// fields (a field left out would keep its default whatever the file says).
#[test]
fn the_file_has_one_key_per_field_of_the_sections() {
    let mut config = Config::default();
    config.api.unix_socket = Some(PathBuf::from("/run/tracer.sock"));
    config.api.auth_token_file = Some(PathBuf::from("/etc/tracer/token"));
    let sections = [
        toml::Table::try_from(&config.api),
        toml::Table::try_from(&config.capture),
        toml::Table::try_from(&config.unwind),
        toml::Table::try_from(&config.maps),
        toml::Table::try_from(&config.allocators),
        toml::Table::try_from(&config.processes),
        toml::Table::try_from(&config.snapshots),
        toml::Table::try_from(&config.store),
        toml::Table::try_from(&config.metrics),
        toml::Table::try_from(&config.logging),
    ];
    let mut fields = Vec::new();
    for section in sections {
        fields.extend(section.expect("a section is a table").keys().cloned());
    }
    let count = fields.len();
    fields.sort();
    fields.dedup();
    assert_eq!(fields.len(), count, "a field name in two sections");
    let file = toml::Table::try_from(file::ConfigFile::from(&config)).expect("a table");
    let mut keys: Vec<String> = file.keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, fields);
    let back = Config::from_toml_str(&config.to_toml().expect("TOML"), "t").expect("valid");
    assert_eq!(back, config);
}
