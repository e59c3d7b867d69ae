//! `/metrics` through the real tracerd: per-process values equal to the
//! API's, self-metrics, call-site gauges, every metric documented, and a
//! real Prometheus (Debian's package) scraping tracerd and answering a query
//! with the same bytes as `/pid/{pid}/traced-memory`.

use std::{
    collections::BTreeSet,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use reqwest::Method;
use serde_json::Value;

use super::support::{Fixture, Program, TempDir, Tracerd, free_port, poll, running, sample, stop};

/// `GET /metrics`, checked to be OpenMetrics text.
fn scrape(tracerd: &Tracerd) -> String {
    let response = tracerd.request(Method::GET, "/metrics");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    response.text().expect("body")
}

/// `fixtures/keepmetrics.c` traced by `tracerd`, run until it holds its
/// 1000 blocks of 4096 bytes.
fn keep_fixture(tracerd: &Tracerd) -> (Program, Fixture) {
    let prog = Program::build("keepmetrics", &[]);
    let mut fx = Fixture::spawn_traced(tracerd, &prog.exe, &[]);
    fx.step("done");
    (prog, fx)
}

#[test]
fn metrics_give_each_process_the_values_of_the_api() {
    let tracerd = Tracerd::start(&[
        "--metrics-top-processes",
        "10000",
        "--max-live-blocks",
        "2000000",
        "--bpf-stats",
        "true",
    ]);
    let (_prog, mut fx) = keep_fixture(&tracerd);
    let pid = fx.pid();

    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    let memory = tracerd.get_ok(&format!("/pid/{pid}/traced-memory"));
    let text = scrape(&tracerd);
    let pid_s = pid.to_string();
    let labels = [("pid", pid_s.as_str()), ("comm", "keepmetrics")];
    let value =
        |name: &str| sample(&text, name, &labels).unwrap_or_else(|| panic!("{name} for pid {pid}"));
    for (metric, api, field) in [
        ("tracer_process_current_bytes", &memory, "current"),
        ("tracer_process_peak_bytes", &memory, "peak"),
        ("tracer_process_live_blocks", &process, "blocks"),
        ("tracer_process_allocations_total", &process, "allocs"),
        ("tracer_process_frees_total", &process, "frees"),
    ] {
        assert_eq!(value(metric), api[field].as_f64().expect(field), "{metric}");
    }
    assert_eq!(value("tracer_process_drops_total"), 0.0);
    assert!(value("tracer_process_current_bytes") >= 4_096_000.0);

    assert_eq!(
        sample(
            &text,
            "tracer_bpf_map_max_entries",
            &[("map", tracer_common::MAP_LIVE_ALLOCS)]
        ),
        Some(2_000_000.0)
    );
    let malloc_runs = sample(
        &text,
        "tracer_bpf_program_runs_total",
        &[("program", tracer_common::PROBES[0].entry)],
    )
    .expect("runs");
    assert!(malloc_runs >= 1000.0, "{malloc_runs}");
    assert_eq!(sample(&text, "tracer_bpf_stats_enabled", &[]), Some(1.0));
    assert_eq!(
        sample(
            &text,
            "tracer_api_requests_total",
            &[
                ("route", "/pid/{pid}/traced-memory"),
                ("method", "GET"),
                ("status", "200")
            ]
        ),
        Some(1.0)
    );
    assert!(sample(&text, "process_resident_memory_bytes", &[]).expect("rss") > 1_000_000.0);
    assert_eq!(
        sample(
            &text,
            "tracer_snapshot_store_snapshots",
            &[("kind", "taken")]
        ),
        Some(0.0)
    );
    let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    assert_eq!(
        sample(
            &scrape(&tracerd),
            "tracer_snapshot_store_snapshots",
            &[("kind", "taken")]
        ),
        Some(1.0)
    );
    fx.end();
}

/// The value of a sample line `name{labels} value`.
fn line_value(line: &str) -> f64 {
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value in {line}"))
}

#[test]
fn beyond_the_top_n_processes_are_summed_as_other() {
    // Three processes in scope (so no other process of the host takes part),
    // holding 1000, 300 and 100 blocks of 4096 bytes.
    let prog = Program::build("keepn", &[]);
    let mut fixtures: Vec<Fixture> = ["1000", "300", "100"]
        .iter()
        .map(|n| Fixture::spawn_ready(&prog.exe, &[n]))
        .collect();
    let pids: Vec<String> = fixtures.iter().map(|fx| fx.pid().to_string()).collect();
    let scope = pids.join(",");
    let tracerd = Tracerd::start(&["--metrics-top-processes", "1", "--scope-pid", &scope]);
    // Tracing is attached to the three before tracerd is ready; each is
    // known from its first allocation on.
    for fx in &mut fixtures {
        fx.step("done");
    }
    // An image is known once tracerd handled its first allocation's event,
    // a few milliseconds after it: asked until then.
    let current = |pid: &str| {
        let memory = poll(
            Duration::from_secs(10),
            Duration::from_millis(10),
            || match tracerd.get(&format!("/pid/{pid}/traced-memory")) {
                (200, memory) => Ok(memory),
                (status, body) => Err(format!("{status} {body}")),
            },
        );
        memory["current"].as_f64().expect("current")
    };
    let (top, second, third) = (current(&pids[0]), current(&pids[1]), current(&pids[2]));
    // Their only allocations since tracerd started are the blocks.
    assert_eq!((top, second, third), (4_096_000.0, 1_228_800.0, 409_600.0));

    let text = scrape(&tracerd);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tracer_process_current_bytes{"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let top_prefix = format!(
        "tracer_process_current_bytes{{pid=\"{}\",comm=\"keepn\"}} ",
        pids[0]
    );
    assert!(lines[0].starts_with(&top_prefix), "{lines:?}");
    assert_eq!(line_value(lines[0]), top);
    assert!(
        lines[1].starts_with("tracer_process_current_bytes{pid=\"other\",comm=\"other\"} "),
        "{lines:?}"
    );
    assert_eq!(line_value(lines[1]), second + third);
    for fx in &mut fixtures {
        fx.end();
    }
}

#[test]
fn call_site_gauges_show_the_allocating_line_when_enabled() {
    let tracerd = Tracerd::start(&[
        "--metrics-top-processes",
        "10000",
        "--metrics-call-sites",
        "3",
    ]);
    let (prog, mut fx) = keep_fixture(&tracerd);
    let text = scrape(&tracerd);
    let pid_s = fx.pid().to_string();
    let line_s = prog.line("KEEP_SITE").to_string();
    let labels = [
        ("pid", pid_s.as_str()),
        ("filename", prog.src()),
        ("lineno", line_s.as_str()),
    ];
    assert_eq!(
        sample(&text, "tracer_call_site_current_bytes", &labels),
        Some(4_096_000.0)
    );
    assert_eq!(
        sample(&text, "tracer_call_site_live_blocks", &labels),
        Some(1000.0)
    );
    fx.end();

    // Every metric family a scrape shows is listed in docs/metrics.md.
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"))
            .expect("docs/metrics.md");
    let families: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(families.len() >= 25, "{families:?}");
    let missing: Vec<&&str> = families
        .iter()
        .filter(|f| !docs.contains(&format!("`{f}")))
        .collect();
    assert_eq!(
        missing,
        Vec::<&&str>::new(),
        "metric families missing from docs/metrics.md"
    );
}

/// A Prometheus server on loopback, stopped by pid on drop.
struct Prometheus {
    child: Child,
    base: String,
    _dir: TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Self {
        let dir = TempDir::new("prometheus");
        let port = free_port();
        let config = dir.path().join("prometheus.yml");
        // deploy/prometheus.yml with this test's target and a fast interval.
        let example = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus.yml"),
        )
        .expect("deploy/prometheus.yml");
        let config_text = example
            .replace("127.0.0.1:7466", target)
            .replace("scrape_interval: 15s", "scrape_interval: 1s")
            .replace("scrape_timeout: 10s", "scrape_timeout: 1s");
        assert!(config_text.contains(target));
        std::fs::write(&config, config_text).expect("write config");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run prometheus (cargo xtask setup installs Debian's package)");
        let prometheus = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let client = reqwest::blocking::Client::new();
        poll(
            Duration::from_secs(60),
            Duration::from_millis(100),
            || match client.get(format!("{}/-/ready", prometheus.base)).send() {
                Ok(r) if r.status().is_success() => Ok(()),
                _ => Err("prometheus not ready".to_string()),
            },
        );
        prometheus
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if running(&mut self.child) {
            stop(&mut self.child, "TERM", Duration::from_secs(10));
        }
    }
}

#[test]
fn prometheus_scrapes_tracerd_and_reads_back_a_processs_current_bytes() {
    let tracerd = Tracerd::start(&["--metrics-top-processes", "10000"]);
    let (_prog, mut fx) = keep_fixture(&tracerd);
    let pid = fx.pid();
    let (status, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    assert_eq!(status, 200);
    let current = memory["current"].as_u64().expect("current");

    let target = tracerd.base().trim_start_matches("http://");
    let prometheus = Prometheus::start(target);
    let client = reqwest::blocking::Client::new();
    let query = format!("tracer_process_current_bytes{{pid=\"{pid}\"}}");
    let value = poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let response: Value = client
            .get(format!("{}/api/v1/query", prometheus.base))
            .query(&[("query", query.as_str())])
            .send()
            .expect("query prometheus")
            .json()
            .expect("JSON");
        assert_eq!(response["status"], "success", "{response}");
        if let Some(result) = response["data"]["result"]
            .as_array()
            .and_then(|r| r.first())
        {
            assert_eq!(result["metric"]["comm"], "keepmetrics");
            assert_eq!(result["metric"]["job"], "tracerd");
            return Ok(result["value"][1].as_str().expect("value").to_string());
        }
        Err(format!("prometheus has no sample for pid {pid}"))
    });
    assert_eq!(value, current.to_string());
    fx.end();
}
