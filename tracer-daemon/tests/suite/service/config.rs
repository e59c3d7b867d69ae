//! Configuration: invalid values refused at start with the valid range,
//! `config default` and `config check`, and the precedence of flags over
//! environment over file.

use super::{Running, run_tracerd, workspace_file};
use crate::suite::support::TempDir;

#[test]
fn invalid_values_are_refused_at_start_with_the_valid_range() {
    let out = run_tracerd(&["--nframe", "0"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracerd: nframe = 0 is out of range; valid: 1..=64\n"
    );
    let out = run_tracerd(&[], &[("TRACERD_MAX_STACKS", "100")]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracerd: max_stacks = 100 is out of range; valid: 256..=4194304\n"
    );
    let out = run_tracerd(&["--max-expensive-requests", "0"], &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracerd: max_expensive_requests = 0 is out of range; valid: 1..=1024\n"
    );
}

#[test]
fn config_default_prints_the_shipped_file_and_check_validates() {
    let out = run_tracerd(&["config", "default"], &[]);
    assert!(out.status.success());
    let printed: toml::Table = String::from_utf8_lossy(&out.stdout).parse().expect("TOML");
    let shipped_text = std::fs::read_to_string(workspace_file("deploy/tracerd.toml"))
        .expect("deploy/tracerd.toml");
    let shipped: toml::Table = shipped_text.parse().expect("TOML");
    assert_eq!(
        printed, shipped,
        "deploy/tracerd.toml must hold exactly the defaults"
    );

    let shipped_path = workspace_file("deploy/tracerd.toml");
    let out = run_tracerd(
        &["config", "check", shipped_path.to_str().expect("utf-8")],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = TempDir::new("config-check");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "nframe = 16\nmax_live_blocks = 12\n").expect("write");
    let out = run_tracerd(&["config", "check", bad.to_str().expect("utf-8")], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracerd: max_live_blocks = 12 is out of range; valid: 1024..=67108864\n"
    );
    std::fs::write(&bad, "nframes = 16\n").expect("write");
    let out = run_tracerd(&["config", "check", bad.to_str().expect("utf-8")], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field `nframes`"));
}

#[test]
fn flags_beat_environment_which_beats_the_file() {
    let dir = TempDir::new("precedence");
    let file = dir.path().join("tracerd.toml");
    std::fs::write(&file, "nframe = 8\n").expect("write");
    let config = file.to_str().expect("utf-8");
    let nframe = |args: &[&str], env: &[(&str, &str)]| {
        let running = Running::start(args, env);
        let (status, health) = running.get("/health");
        assert_eq!(status, 200, "{health}");
        health["nframe"].as_u64().expect("nframe")
    };
    assert_eq!(
        nframe(
            &["--config", config, "--nframe", "20"],
            &[("TRACERD_NFRAME", "12")]
        ),
        20
    );
    assert_eq!(
        nframe(&["--config", config], &[("TRACERD_NFRAME", "12")]),
        12
    );
    assert_eq!(nframe(&[], &[("TRACERD_CONFIG", config)]), 8);
}
