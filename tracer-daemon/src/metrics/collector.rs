//! The metrics read from the service at each scrape: per-process traced
//! memory (the same numbers as the API's, from
//! [`Service::processes`](crate::service::Service::processes)), optional
//! per-call-site gauges, and tracer's own health.
use std::{
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};
use tracer_model::GroupBy;

use super::MetricsOptions;
use crate::capture::kernel::MapUsage;
use crate::service::{ProcessView, Service, Target};

mod own;

/// How long a reading of the kernel maps' entries is reused before a new
/// one is taken: counting them walks every key (in batches for
/// `LIVE_ALLOCS`), which many scrapers at once must not repeat.
pub const MAP_USAGE_MAX_AGE: Duration = Duration::from_secs(5);

/// Reads the service's state at each scrape.
pub(super) struct ServiceCollector {
    service: Arc<Service>,
    options: MetricsOptions,
    /// The last map reading and when it was taken (shared with the thread
    /// that takes the next one).
    map_usage: Arc<std::sync::Mutex<Option<(Instant, MapUsage)>>>,
    /// Whether a thread is taking a new map reading.
    map_usage_refreshing: Arc<std::sync::atomic::AtomicBool>,
}

impl fmt::Debug for ServiceCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceCollector")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Totals of the processes not labelled one by one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OtherTotals {
    /// How many processes are summed.
    pub processes: u64,
    /// Sum of current bytes.
    pub current: u64,
    /// Sum of peak bytes.
    pub peak: u64,
    /// Sum of live blocks.
    pub blocks: u64,
    /// Sum of allocations.
    pub allocs: u64,
    /// Sum of frees.
    pub frees: u64,
    /// Sum of unknown frees.
    pub unknown_frees: u64,
    /// Sum of drops.
    pub drops: u64,
    /// Sum of cut tracebacks.
    pub cut_tracebacks: u64,
}

/// Splits live processes into the `n` largest by current bytes (ties: lower
/// pid first) and the sum of the rest.
pub fn top_processes(mut views: Vec<ProcessView>, n: usize) -> (Vec<ProcessView>, OtherTotals) {
    views.sort_by(|a, b| b.current.cmp(&a.current).then(a.pid.cmp(&b.pid)));
    let rest = if views.len() > n {
        views.split_off(n)
    } else {
        Vec::new()
    };
    let mut other = OtherTotals::default();
    for view in &rest {
        other.processes += 1;
        other.current += view.current;
        other.peak += view.peak;
        other.blocks += view.blocks;
        other.allocs += view.allocs;
        other.frees += view.frees;
        other.unknown_frees += view.unknown_frees;
        other.drops += view.drops;
        other.cut_tracebacks += view.cut_tracebacks;
    }
    (views, other)
}

/// Maps an eBPF counter (`tracer_common::Counter::ALL` names) to the metric
/// it feeds: a drop reason, the unknown frees, or an event kind.
pub fn counter_metric(name: &str) -> CounterMetric {
    match name {
        "drop_live_full" => CounterMetric::Drop("live_map_full"),
        "drop_inflight_full" => CounterMetric::Drop("inflight_map_full"),
        "drop_procs_full" => CounterMetric::Drop("procs_map_full"),
        "drop_stack" => CounterMetric::Drop("stack_store_full"),
        "drop_events" => CounterMetric::Drop("event_ring_full"),
        "drop_stack_preempted" => CounterMetric::Drop("stack_scratch_preempted"),
        "drop_share" => CounterMetric::Drop("process_share"),
        "drop_stack_share" => CounterMetric::Drop("process_stack_share"),
        "drop_mmap_regions" => CounterMetric::Drop("mmap_regions_full"),
        "unknown_frees" => CounterMetric::UnknownFrees,
        "cut_tracebacks" => CounterMetric::CutTracebacks,
        other => match other.strip_prefix("drop_") {
            Some(reason) => CounterMetric::DropNamed(reason.to_string()),
            None => CounterMetric::Event(other.to_string()),
        },
    }
}

/// Where an eBPF counter goes in `/metrics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterMetric {
    /// `tracer_drops_total{reason}`.
    Drop(&'static str),
    /// `tracer_drops_total{reason}` for a counter added later.
    DropNamed(String),
    /// `tracer_unknown_frees_total`.
    UnknownFrees,
    /// `tracer_cut_tracebacks_total`.
    CutTracebacks,
    /// `tracer_events_total{kind}`.
    Event(String),
}

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// A gauge family: one unlabelled sample, or one sample per label set.
fn gauge<N: Copy>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels<'_>, N)],
) -> fmt::Result
where
    ConstGauge<N>: EncodeMetric,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    if let [(labels, value)] = samples
        && labels.is_empty()
    {
        return ConstGauge::new(*value).encode(family);
    }
    for (labels, value) in samples {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A counter family, as [`gauge`]; `name` without `_total`:
/// prometheus-client appends it to counters.
fn counter<N: Copy>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels<'_>, N)],
) -> fmt::Result
where
    ConstCounter<N>: EncodeMetric,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    if let [(labels, value)] = samples
        && labels.is_empty()
    {
        return ConstCounter::new(*value).encode(family);
    }
    for (labels, value) in samples {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

fn as_gauge(samples: Vec<(Labels<'_>, u64)>) -> Vec<(Labels<'_>, i64)> {
    samples.into_iter().map(|(l, v)| (l, signed(v))).collect()
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A call site of a labelled process: (index in the labels, filename,
/// lineno, bytes, blocks).
type SiteRow = (usize, String, String, u64, u64);

/// One labelled process's identity as label values.
struct ProcLabels {
    pid: String,
    comm: String,
}

impl Collector for ServiceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let views: Vec<ProcessView> = self
            .service
            .processes(crate::service::Viewer::Operator)
            .into_iter()
            .map(|status| status.view)
            .collect();
        let ended = views.iter().filter(|v| !v.state.is_alive()).count();
        let live: Vec<ProcessView> = views.into_iter().filter(|v| v.state.is_alive()).collect();
        let live_count = live.len();
        let (top, other) = top_processes(live, self.options.top_processes);

        let labels: Vec<ProcLabels> = top
            .iter()
            .map(|v| ProcLabels {
                pid: v.pid.to_string(),
                comm: v.comm.clone(),
            })
            .chain((other.processes > 0).then(|| ProcLabels {
                pid: "other".into(),
                comm: "other".into(),
            }))
            .collect();
        let per_process =
            |value: &dyn Fn(&ProcessView) -> u64, other_value: u64| -> Vec<(Labels<'_>, u64)> {
                let mut samples: Vec<(Labels<'_>, u64)> = top
                    .iter()
                    .zip(&labels)
                    .map(|(v, l)| {
                        (
                            vec![("pid", l.pid.as_str()), ("comm", l.comm.as_str())],
                            value(v),
                        )
                    })
                    .collect();
                if let Some(l) = labels.get(top.len()) {
                    samples.push((
                        vec![("pid", l.pid.as_str()), ("comm", l.comm.as_str())],
                        other_value,
                    ));
                }
                samples
            };

        gauge(
            &mut encoder,
            "tracer_process_current_bytes",
            "Traced memory now, get_traced_memory()[0]: bytes in live blocks, requested sizes",
            &as_gauge(per_process(&|v| v.current, other.current)),
        )?;
        gauge(
            &mut encoder,
            "tracer_process_peak_bytes",
            "Peak of traced memory since tracing began or reset_peak, get_traced_memory()[1], in bytes",
            &as_gauge(per_process(&|v| v.peak, other.peak)),
        )?;
        gauge(
            &mut encoder,
            "tracer_process_live_blocks",
            "Live blocks (traces) now",
            &as_gauge(per_process(&|v| v.blocks, other.blocks)),
        )?;
        counter(
            &mut encoder,
            "tracer_process_allocations",
            "Allocations recorded since tracing of the process image began",
            &per_process(&|v| v.allocs, other.allocs),
        )?;
        counter(
            &mut encoder,
            "tracer_process_frees",
            "Frees of traced blocks since tracing of the process image began",
            &per_process(&|v| v.frees, other.frees),
        )?;
        counter(
            &mut encoder,
            "tracer_process_unknown_frees",
            "Frees of pointers that were not traced blocks (allocated before tracing, or dropped)",
            &per_process(&|v| v.unknown_frees, other.unknown_frees),
        )?;
        counter(
            &mut encoder,
            "tracer_process_drops",
            "Events of the process lost because a kernel map was full: its data is incomplete when > 0",
            &per_process(&|v| v.drops, other.drops),
        )?;
        counter(
            &mut encoder,
            "tracer_process_cut_tracebacks",
            "Blocks of the process recorded with a cut traceback (stack not stored, or its walk stopped for want of mappings): its tracebacks are not all whole when > 0",
            &per_process(&|v| v.cut_tracebacks, other.cut_tracebacks),
        )?;
        gauge(
            &mut encoder,
            "tracer_processes",
            "Process images known: alive (traced now) or ended (kept for exited_retention)",
            &[
                (vec![("state", "alive")], signed(live_count as u64)),
                (vec![("state", "ended")], signed(ended as u64)),
            ],
        )?;

        if self.options.call_sites > 0 {
            self.encode_call_sites(&mut encoder, &top, &labels)?;
        }
        self.encode_self(&mut encoder)
    }
}

impl ServiceCollector {
    pub(super) fn new(service: Arc<Service>, options: MetricsOptions) -> Self {
        let collector = Self {
            service,
            options,
            map_usage: Arc::default(),
            map_usage_refreshing: Arc::default(),
        };
        // The first reading, taken while the maps are still small, so that
        // no scrape waits for a walk of millions of blocks.
        collector.refresh_map_usage();
        collector
    }

    /// The maps' entries, walked (through the kernel side's own
    /// descriptors, no lock of tracerd's) at most once per
    /// [`MAP_USAGE_MAX_AGE`]: scrapes meanwhile reuse the reading. Once it
    /// is older, a scrape answers with it and a thread of its own takes
    /// the next one (the walk of millions of live blocks takes a second),
    /// so that no scrape waits for a walk (but one before the first
    /// reading, taken at start, is in): a reading is at most one scrape
    /// interval old.
    fn map_usage(&self) -> MapUsage {
        let lock = |cache: &std::sync::Mutex<Option<(Instant, MapUsage)>>| {
            cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        };
        match lock(&self.map_usage) {
            Some((at, usage)) if at.elapsed() < MAP_USAGE_MAX_AGE => usage,
            Some((_, usage)) => {
                self.refresh_map_usage();
                usage
            }
            None => {
                let usage = self.service.map_usage();
                *self
                    .map_usage
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((Instant::now(), usage.clone()));
                usage
            }
        }
    }

    /// Takes a new map reading on a thread of its own, unless one is being
    /// taken.
    fn refresh_map_usage(&self) {
        use std::sync::atomic::Ordering;
        if self.map_usage_refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let service = Arc::clone(&self.service);
        let cache = Arc::clone(&self.map_usage);
        let refreshing = Arc::clone(&self.map_usage_refreshing);
        let spawned = std::thread::Builder::new()
            .name("map-usage".into())
            .spawn(move || {
                let usage = service.map_usage();
                *cache
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((Instant::now(), usage));
                refreshing.store(false, Ordering::Release);
            });
        if let Err(err) = spawned {
            tracing::warn!(%err, "cannot start the map usage reading");
            self.map_usage_refreshing.store(false, Ordering::Release);
        }
    }

    fn encode_call_sites(
        &self,
        encoder: &mut DescriptorEncoder,
        top: &[ProcessView],
        labels: &[ProcLabels],
    ) -> fmt::Result {
        let mut rows: Vec<SiteRow> = Vec::new();
        for (index, view) in top.iter().enumerate() {
            // As the API answers: nothing while its tracing is stopped.
            let Ok(now) = self.service.grouped_now(
                crate::service::Viewer::Operator,
                Target::Process(view.pid),
                crate::snapshot::AllocatorFrames::Drop,
            ) else {
                continue;
            };
            let Ok(stats) = now.snapshot.statistics(GroupBy::Lineno, false) else {
                continue;
            };
            for stat in stats.iter().take(self.options.call_sites) {
                let (filename, lineno) = match stat.traceback.frames().first() {
                    Some(frame) => (frame.filename.to_string(), frame.lineno.to_string()),
                    None => (tracer_model::UNKNOWN_FILENAME.to_string(), "0".to_string()),
                };
                rows.push((index, filename, lineno, stat.size, stat.count));
            }
        }
        let samples = |value: &dyn Fn(&SiteRow) -> u64| -> Vec<(Labels<'_>, i64)> {
            rows.iter()
                .filter_map(|row| {
                    let l = labels.get(row.0)?;
                    Some((
                        vec![
                            ("pid", l.pid.as_str()),
                            ("comm", l.comm.as_str()),
                            ("filename", row.1.as_str()),
                            ("lineno", row.2.as_str()),
                        ],
                        signed(value(row)),
                    ))
                })
                .collect()
        };
        gauge(
            encoder,
            "tracer_call_site_current_bytes",
            "Bytes in live blocks allocated at one call site (statistics group_by=lineno), largest sites of each labelled process",
            &samples(&|row| row.3),
        )?;
        gauge(
            encoder,
            "tracer_call_site_live_blocks",
            "Live blocks allocated at one call site (statistics group_by=lineno)",
            &samples(&|row| row.4),
        )
    }
}

#[cfg(test)]
mod tests;
