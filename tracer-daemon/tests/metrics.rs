//! `/metrics` through the real tracerd: per-process values equal to the
//! API's, self-metrics, call-site gauges, every metric documented, and a
//! real Prometheus (Debian's package) scraping tracerd and answering a query
//! with the same bytes as `/pid/{pid}/traced-memory`.
mod common;

use std::{
    collections::BTreeSet,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{C_PRELUDE, Fixture, TempDir, Tracerd, compile_c, line_of};
use serde_json::Value;

/// Holds 1000 blocks of 4096 bytes from one line, then waits.
const KEEP: &str = r#"
int main(void) {
    static void *keep[1000];
    say("ready");
    wait_go();
    for (int i = 0; i < 1000; i++)
        keep[i] = malloc(4096); /* KEEP_SITE */
    say("done");
    wait_go();
    return keep[0] == NULL;
}
"#;

/// The value of the sample `name{labels...}` whose labels include all of
/// `want`, from OpenMetrics text.
fn sample(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => rest.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let ok = want
            .iter()
            .all(|(k, v)| labels.split(',').any(|pair| pair == format!("{k}=\"{v}\"")));
        if ok { value.trim().parse().ok() } else { None }
    })
}

fn scrape(tracerd: &Tracerd) -> String {
    let response = tracerd
        .client
        .get(format!("{}/metrics", tracerd.base))
        .send()
        .expect("GET /metrics");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    response.text().expect("body")
}

fn keep_fixture(dir: &TempDir) -> (Fixture, u32, std::path::PathBuf, u32) {
    let source = format!("{C_PRELUDE}{KEEP}");
    let exe = compile_c(dir.path(), "keepmetrics", &source, &[]);
    let line = line_of(&source, "KEEP_SITE");
    let fx = Fixture::spawn(&exe, &[], &[]);
    let pid = fx.pid();
    (fx, pid, dir.path().join("keepmetrics.c"), line)
}

#[test]
fn metrics_give_each_process_the_values_of_the_api() {
    let dir = TempDir::new("metrics");
    let tracerd = Tracerd::start(&[
        "--metrics-top-processes",
        "10000",
        "--max-live-blocks",
        "2000000",
        "--bpf-stats",
        "true",
    ]);
    let (mut fx, pid, _, _) = keep_fixture(&dir);
    fx.expect_line("ready");
    tracerd.wait_traced(pid);
    fx.go();
    fx.expect_line("done");

    let (status, process) = tracerd.get(&format!("/pid/{pid}"));
    assert_eq!(status, 200);
    let (status, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    assert_eq!(status, 200);
    let text = scrape(&tracerd);
    let pid_s = pid.to_string();
    let labels = [("pid", pid_s.as_str()), ("comm", "keepmetrics")];
    let value =
        |name: &str| sample(&text, name, &labels).unwrap_or_else(|| panic!("{name} for pid {pid}"));
    assert_eq!(
        value("tracer_process_current_bytes"),
        memory["current"].as_f64().expect("current")
    );
    assert_eq!(
        value("tracer_process_peak_bytes"),
        memory["peak"].as_f64().expect("peak")
    );
    assert_eq!(
        value("tracer_process_live_blocks"),
        process["blocks"].as_f64().expect("blocks")
    );
    assert_eq!(
        value("tracer_process_allocations_total"),
        process["allocs"].as_f64().expect("allocs")
    );
    assert_eq!(
        value("tracer_process_frees_total"),
        process["frees"].as_f64().expect("frees")
    );
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
        sample(&text, "tracer_snapshot_store_snapshots", &[]),
        Some(0.0)
    );
    let (status, _) = tracerd.post(&format!("/pid/{pid}/snapshots"));
    assert_eq!(status, 201);
    assert_eq!(
        sample(&scrape(&tracerd), "tracer_snapshot_store_snapshots", &[]),
        Some(1.0)
    );
    fx.go();
    assert!(fx.finish().success());
}

/// Holds `argv[1]` blocks of 4096 bytes from one line, then waits.
const KEEP_N: &str = r#"
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 0;
    void **keep = calloc(n, sizeof(void *));
    say("ready");
    wait_go();
    for (int i = 0; i < n; i++)
        keep[i] = malloc(4096);
    say("done");
    wait_go();
    return keep == NULL;
}
"#;

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
    let dir = TempDir::new("topn");
    let exe = compile_c(dir.path(), "keepn", &format!("{C_PRELUDE}{KEEP_N}"), &[]);
    let mut fixtures: Vec<Fixture> = ["1000", "300", "100"]
        .iter()
        .map(|n| Fixture::spawn(&exe, &[n], &[]))
        .collect();
    for fx in &mut fixtures {
        fx.expect_line("ready");
    }
    let pids: Vec<String> = fixtures.iter().map(|fx| fx.pid().to_string()).collect();
    let scope = pids.join(",");
    let tracerd = Tracerd::start(&["--metrics-top-processes", "1", "--scope-pid", &scope]);
    // Tracing is attached to the three before tracerd is ready; each is
    // known from its first allocation on.
    for fx in &mut fixtures {
        fx.go();
        fx.expect_line("done");
    }
    let current = |pid: &str| {
        let (status, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
        assert_eq!(status, 200, "{memory}");
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
        fx.go();
        assert!(fx.finish().success());
    }
}

#[test]
fn call_site_gauges_show_the_allocating_line_when_enabled() {
    let dir = TempDir::new("callsites");
    let tracerd = Tracerd::start(&[
        "--metrics-top-processes",
        "10000",
        "--metrics-call-sites",
        "3",
    ]);
    let (mut fx, pid, file, line) = keep_fixture(&dir);
    fx.expect_line("ready");
    tracerd.wait_traced(pid);
    fx.go();
    fx.expect_line("done");
    let text = scrape(&tracerd);
    let pid_s = pid.to_string();
    let line_s = line.to_string();
    let labels = [
        ("pid", pid_s.as_str()),
        ("filename", file.to_str().expect("utf-8")),
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
    fx.go();
    assert!(fx.finish().success());

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
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
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
        let deadline = Instant::now() + Duration::from_secs(60);
        while !client
            .get(format!("{}/-/ready", prometheus.base))
            .send()
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(Instant::now() < deadline, "prometheus not ready in 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        prometheus
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(self.child.id().to_string())
                    .status();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn prometheus_scrapes_tracerd_and_reads_back_a_processs_current_bytes() {
    let dir = TempDir::new("prom-fixture");
    let tracerd = Tracerd::start(&["--metrics-top-processes", "10000"]);
    let (mut fx, pid, _, _) = keep_fixture(&dir);
    fx.expect_line("ready");
    tracerd.wait_traced(pid);
    fx.go();
    fx.expect_line("done");
    let (status, memory) = tracerd.get(&format!("/pid/{pid}/traced-memory"));
    assert_eq!(status, 200);
    let current = memory["current"].as_u64().expect("current");

    let target = tracerd.base.trim_start_matches("http://");
    let prometheus = Prometheus::start(target);
    let client = reqwest::blocking::Client::new();
    let query = format!("tracer_process_current_bytes{{pid=\"{pid}\"}}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let value = loop {
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
            break result["value"][1].as_str().expect("value").to_string();
        }
        assert!(
            Instant::now() < deadline,
            "prometheus has no sample for pid {pid} after 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(value, current.to_string());
    fx.go();
    assert!(fx.finish().success());
}
