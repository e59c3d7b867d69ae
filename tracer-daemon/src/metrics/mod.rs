//! Prometheus metrics at `GET /metrics` (prometheus-client, OpenMetrics text).
//!
//! Two kinds of metric live here:
//!
//! - Read at each scrape from the service ([`collector`]) and
//!   the kernel maps: per-process traced memory (the `metrics_top_processes`
//!   largest by current bytes, labelled `pid` and `comm`, the rest summed
//!   under `pid="other",comm="other"`), optional per-call-site gauges, and
//!   tracer's own health (eBPF counters, drops by reason, map use, BPF
//!   program run time, symbolizer cache, snapshot store, tracerd's memory).
//! - Kept as they happen: API requests by route and status, and their
//!   latency ([`Metrics::observe`], fed by the HTTP layer's
//!   `track_requests`).
//!
//! Per-process series name processes (pid, comm, call sites): a scrape
//! that is not an operator's gets them only with `metrics_public`; else
//! every process is summed under `pid="other"` ([`Metrics::encode`]).
//!
//! `docs/metrics.md` lists every metric; a test checks that list against
//! what a scrape shows.
use std::{fmt, sync::Arc, time::Duration};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use crate::config::Config;
use crate::service::Service;

mod collector;

pub use collector::{CounterMetric, OtherTotals, counter_metric, top_processes};

/// The content type of the OpenMetrics text format that prometheus-client
/// writes (Prometheus negotiates and parses it).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/metrics` exports beyond the fixed set.
#[derive(Clone, Copy, Debug)]
pub struct MetricsOptions {
    /// Processes labelled by pid and comm; the rest sum under `other`.
    pub top_processes: usize,
    /// Call sites per labelled process exported as gauges; 0: none.
    pub call_sites: usize,
    /// Whether `BPF_ENABLE_STATS` is on (the fd is held by the caller).
    pub bpf_stats_enabled: bool,
    /// Whether every caller gets the per-process series
    /// (`metrics_public`), not only operators.
    pub public: bool,
}

impl From<&Config> for MetricsOptions {
    /// The options of `/metrics`; `bpf_stats_enabled` as asked
    /// (`bpf_stats`): the caller sets whether the kernel agreed.
    fn from(config: &Config) -> Self {
        MetricsOptions {
            top_processes: config.metrics.metrics_top_processes as usize,
            call_sites: config.metrics.metrics_call_sites as usize,
            bpf_stats_enabled: config.metrics.bpf_stats,
            public: config.metrics.metrics_public,
        }
    }
}

/// Labels of `tracer_api_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route template (`/pid/{pid}/statistics`), never the raw path,
    /// so that the label set stays bounded; `unmatched` for a 404.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// HTTP status code.
    pub status: u16,
}

/// Labels of `tracer_api_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route template, as in [`RequestLabels`].
    pub route: String,
}

/// Labels of `tracer_requests_cancelled_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CancelLabels {
    /// Why the work stopped: `abandoned` (nobody waits for the answer:
    /// the client left or the request timed out) or `memory_budget`.
    pub reason: &'static str,
}

/// The registry and the metrics kept as events happen.
pub struct Metrics {
    /// Everything, per process: what operators scrape.
    registry: Registry,
    /// The same with no process named (every process under `other`, no
    /// call sites): what others scrape unless `metrics_public`.
    hosts: Registry,
    /// Whether others get `registry` too (`metrics_public`).
    public: bool,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RouteLabels, Histogram>,
    cancelled: Family<CancelLabels, Counter>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The API request metrics alone; [`Metrics::collect_service`] adds
    /// everything read from the service.
    pub fn new() -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let durations = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0])
        });
        let cancelled = Family::<CancelLabels, Counter>::default();
        let [registry, hosts] = [(); 2].map(|()| {
            let mut registry = Registry::default();
            registry.register(
                "tracer_api_requests",
                "HTTP API requests answered, by route template, method and status",
                requests.clone(),
            );
            registry.register(
                "tracer_api_request_duration_seconds",
                "Time from request to response head, by route template, in seconds",
                durations.clone(),
            );
            registry.register(
                "tracer_requests_cancelled",
                "Requests whose work stopped before its end, by reason: abandoned (the client left or the request timed out) or memory_budget (answered 413)",
                cancelled.clone(),
            );
            registry
        });
        Self {
            registry,
            hosts,
            public: false,
            requests,
            durations,
            cancelled,
        }
    }

    /// Counts one request whose work stopped early, by `reason` (see
    /// [`CancelLabels`]).
    pub fn cancelled(&self, reason: &'static str) {
        self.cancelled.get_or_create(&CancelLabels { reason }).inc();
    }

    /// Adds the metrics read from `service` at each scrape.
    pub fn collect_service(&mut self, service: Arc<Service>, options: MetricsOptions) {
        self.public = options.public;
        self.registry
            .register_collector(Box::new(collector::ServiceCollector::new(
                service.clone(),
                options,
            )));
        let hosts = MetricsOptions {
            top_processes: 0,
            call_sites: 0,
            ..options
        };
        self.hosts
            .register_collector(Box::new(collector::ServiceCollector::new(service, hosts)));
    }

    /// Counts one answered request.
    pub fn observe(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                method: method.to_string(),
                status,
            })
            .inc();
        self.durations
            .get_or_create(&RouteLabels {
                route: route.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Every metric in the OpenMetrics text format, as `operator` (an
    /// operator's scrape, or any with `metrics_public`) gets them: with
    /// the per-process series; else with every process summed under
    /// `pid="other"` and no call sites. Blocks (reads kernel maps): call it
    /// from `spawn_blocking`.
    ///
    /// # Errors
    /// Only if formatting into a String fails, which it does not.
    pub fn encode(&self, operator: bool) -> Result<String, fmt::Error> {
        let registry = if operator || self.public {
            &self.registry
        } else {
            &self.hosts
        };
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, registry)?;
        Ok(out)
    }
}
