//! tracerd's own metrics: the eBPF programs' events and drops, the kernel
//! maps and unwind tables, the orphan sweeps, the symbolizer, the snapshot
//! store and the process itself.
use std::{fmt, time::Duration};

use prometheus_client::encoding::DescriptorEncoder;

use super::{CounterMetric, Labels, ServiceCollector, counter, counter_metric, gauge, signed};
use crate::capture::kernel::MapUsage;

impl ServiceCollector {
    /// tracerd's own metrics, in this order: events and drops, kernel maps
    /// and programs, sweeps, symbolizer, snapshot store, the process.
    pub(super) fn encode_self(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        let usage = self.map_usage();
        let counters = self.service.counters();
        let programs = self.service.program_stats();
        encode_events(encoder, &counters)?;
        self.encode_kernel(encoder, &usage, &programs)?;
        self.encode_sweeps(encoder)?;
        self.encode_exact(encoder)?;
        self.encode_symbolizer(encoder)?;
        self.encode_store(encoder)?;
        self.encode_process(encoder)
    }

    /// The kernel maps' entries and capacities, the unwind tables, and the
    /// eBPF programs' run time and runs.
    fn encode_kernel(
        &self,
        encoder: &mut DescriptorEncoder,
        usage: &MapUsage,
        programs: &[(String, Duration, u64)],
    ) -> fmt::Result {
        gauge(
            encoder,
            "tracer_bpf_map_entries",
            "Entries now in each kernel map",
            &usage
                .iter()
                .map(|(map, entries, _)| (vec![("map", *map)], signed(*entries)))
                .collect::<Vec<_>>(),
        )?;
        gauge(
            encoder,
            "tracer_bpf_map_max_entries",
            "Capacity of each kernel map in entries (max_entries)",
            &usage
                .iter()
                .map(|(map, _, cap)| (vec![("map", *map)], signed(*cap)))
                .collect::<Vec<_>>(),
        )?;
        let unwind = self.service.unwind_usage();
        gauge(
            encoder,
            "tracer_unwind_table_bytes",
            "Bytes the unwind tables take in the kernel: rows, pages and process mappings",
            &[(Vec::new(), signed(unwind.bytes))],
        )?;
        gauge(
            encoder,
            "tracer_unwind_files",
            "Files by the state of their unwind table: loaded, refused (walked with frame pointers), over_budget (refused for want of room), evicted (dropped for another, since start)",
            &[
                (vec![("state", "loaded")], signed(unwind.files)),
                (vec![("state", "refused")], signed(unwind.files_refused)),
                (
                    vec![("state", "over_budget")],
                    signed(unwind.files_over_budget),
                ),
                (vec![("state", "evicted")], signed(unwind.files_evicted)),
            ],
        )?;
        gauge(
            encoder,
            "tracer_bpf_stats_enabled",
            "1 while tracerd holds BPF_ENABLE_STATS on (tracer_bpf_program_* count), else 0",
            &[(Vec::new(), i64::from(self.options.bpf_stats_enabled))],
        )?;
        counter(
            encoder,
            "tracer_bpf_program_run_seconds",
            "Time the kernel spent running each eBPF program while BPF_ENABLE_STATS was on, in seconds",
            &programs
                .iter()
                .map(|(name, time, _)| (vec![("program", name.as_str())], time.as_secs_f64()))
                .collect::<Vec<_>>(),
        )?;
        counter(
            encoder,
            "tracer_bpf_program_runs",
            "Runs of each eBPF program while BPF_ENABLE_STATS was on",
            &programs
                .iter()
                .map(|(name, _, count)| (vec![("program", name.as_str())], *count))
                .collect::<Vec<_>>(),
        )
    }

    /// The orphan sweeps: how many, the last one's length and end.
    fn encode_sweeps(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        let sweep = self.service.sweep_record();
        counter(
            encoder,
            "tracer_orphan_sweeps",
            "Orphan sweeps (every 10 s: a pass over every live block in the kernel maps) that ran to their end",
            &[(Vec::new(), sweep.sweeps)],
        )?;
        gauge(
            encoder,
            "tracer_orphan_sweep_last_seconds",
            "How long the last orphan sweep took, in seconds (0 before the first)",
            &[(Vec::new(), sweep.last_took_us as f64 / 1e6)],
        )?;
        gauge(
            encoder,
            "tracer_orphan_sweep_last_end_seconds",
            "When the last orphan sweep ended, in seconds since the Unix epoch (0 before the first)",
            &[(Vec::new(), sweep.last_ended_ms as f64 / 1e3)],
        )
    }

    /// The watch and exact tracing on demand: processes watched, and
    /// processes traced exactly on demand by why.
    fn encode_exact(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        let (watched, on_demand) = self.service.exact_counts();
        gauge(
            encoder,
            "tracer_watched_processes",
            "Processes the watch reads (/proc/PID/statm at every watch_interval)",
            &[(Vec::new(), watched as f64)],
        )?;
        let samples: Vec<(super::Labels<'_>, f64)> = on_demand
            .iter()
            .map(|(reason, count)| (vec![("reason", *reason)], *count as f64))
            .collect();
        gauge(
            encoder,
            "tracer_exact_on_demand_processes",
            "Processes traced exactly on demand (exact = \"demand\"), by why: query or watch",
            &samples,
        )
    }

    /// The symbolizer's cache and loaded modules.
    fn encode_symbolizer(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        let sym = self.service.symbolizer_stats();
        gauge(
            encoder,
            "tracer_symbolizer_cache_entries",
            "Symbolized addresses (module, file offset) held in the symbolizer's cache",
            &[(Vec::new(), signed(sym.cached_addresses))],
        )?;
        gauge(
            encoder,
            "tracer_symbolizer_loaded_modules",
            "Modules whose ELF and DWARF the symbolizer keeps loaded",
            &[(Vec::new(), signed(sym.loaded_modules))],
        )?;
        counter(
            encoder,
            "tracer_symbolizer_cache_hits",
            "Addresses answered from the symbolizer's cache",
            &[(Vec::new(), sym.cache_hits)],
        )?;
        counter(
            encoder,
            "tracer_symbolizer_cache_misses",
            "Addresses that needed DWARF lookups (cache misses)",
            &[(Vec::new(), sym.cache_misses)],
        )
    }

    /// The snapshot store: snapshots and bytes by kind, quotas, evictions,
    /// refusals, and the state directory's bytes.
    fn encode_store(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        let (store, state_dir_bytes) = self.service.store_stats();
        gauge(
            encoder,
            "tracer_snapshot_store_snapshots",
            "Snapshots kept in the snapshot store, by kind (taken, auto, loaded)",
            &store
                .by_kind
                .iter()
                .map(|(kind, count, _)| (vec![("kind", kind.as_str())], signed(*count)))
                .collect::<Vec<_>>(),
        )?;
        gauge(
            encoder,
            "tracer_snapshot_store_bytes",
            "Bytes the stored snapshots count against max_snapshot_bytes, by kind: files' sizes in the state directory, automatic snapshots' compact form in memory",
            &store
                .by_kind
                .iter()
                .map(|(kind, _, bytes)| (vec![("kind", kind.as_str())], signed(*bytes)))
                .collect::<Vec<_>>(),
        )?;
        gauge(
            encoder,
            "tracer_snapshot_store_quota",
            "The snapshot store's quotas, by setting (snapshots, or bytes)",
            &[
                crate::store::Quota::Snapshots,
                crate::store::Quota::Bytes,
                crate::store::Quota::SnapshotsPerOwner,
                crate::store::Quota::BytesPerOwner,
            ]
            .map(|q| (vec![("setting", q.setting())], signed(q.of(&store.quotas)))),
        )?;
        counter(
            encoder,
            "tracer_snapshot_store_evictions",
            "Automatic snapshots evicted, oldest first, to make room under the snapshot quotas",
            &[(Vec::new(), store.evicted)],
        )?;
        counter(
            encoder,
            "tracer_snapshot_store_refused",
            "Snapshots not stored because a quota was full, by kind (a POST answered 507, or an automatic snapshot skipped)",
            &store
                .refused
                .iter()
                .map(|(kind, count)| (vec![("kind", kind.as_str())], *count))
                .collect::<Vec<_>>(),
        )?;
        if let Some(bytes) = state_dir_bytes {
            gauge(
                encoder,
                "tracer_state_dir_bytes",
                "Bytes of the regular files under the state directory (state_dir), walked at the scrape",
                &[(Vec::new(), signed(bytes))],
            )?;
        }
        Ok(())
    }

    /// The process: resident memory, start time, version.
    fn encode_process(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        gauge(
            encoder,
            "process_resident_memory_bytes",
            "tracerd's own resident memory (RSS) in bytes, from /proc/self/statm",
            &[(
                Vec::new(),
                signed(crate::sys::procfs::self_rss().unwrap_or(0)),
            )],
        )?;
        gauge(
            encoder,
            "process_start_time_seconds",
            "When tracerd started tracing, in seconds since the Unix epoch",
            &[(
                Vec::new(),
                self.service
                    .started_at()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
            )],
        )?;
        gauge(
            encoder,
            "tracer_build_info",
            "Always 1; the version of tracerd in its label",
            &[(vec![("version", env!("CARGO_PKG_VERSION"))], 1)],
        )
    }
}

/// The events seen by the eBPF programs by kind, the unknown frees, the
/// cut tracebacks and the drops by reason, from the kernel's counters.
fn encode_events(encoder: &mut DescriptorEncoder, counters: &[(&'static str, u64)]) -> fmt::Result {
    let mut events: Vec<(Labels<'_>, u64)> = Vec::new();
    let mut drops: Vec<(Labels<'_>, u64)> = Vec::new();
    let mut unknown_frees = 0;
    let mut cut_tracebacks = 0;
    let mut named: Vec<(String, u64, bool)> = Vec::new();
    for (name, value) in counters {
        match counter_metric(name) {
            CounterMetric::Drop(reason) => drops.push((vec![("reason", reason)], *value)),
            CounterMetric::UnknownFrees => unknown_frees = *value,
            CounterMetric::CutTracebacks => cut_tracebacks = *value,
            CounterMetric::DropNamed(reason) => named.push((reason, *value, true)),
            CounterMetric::Event(kind) => named.push((kind, *value, false)),
        }
    }
    for (label, value, is_drop) in &named {
        if *is_drop {
            drops.push((vec![("reason", label.as_str())], *value));
        } else {
            events.push((vec![("kind", label.as_str())], *value));
        }
    }
    counter(
        encoder,
        "tracer_events",
        "Allocator and process events seen by the eBPF programs, by kind (all processes)",
        &events,
    )?;
    counter(
        encoder,
        "tracer_unknown_frees",
        "Frees of pointers that were not traced blocks, all processes",
        &[(Vec::new(), unknown_frees)],
    )?;
    counter(
        encoder,
        "tracer_cut_tracebacks",
        "Blocks recorded with a cut traceback, all processes: their stack was not stored (tracer_drops_total's stack reasons say why) or its walk stopped for want of mappings or readable memory",
        &[(Vec::new(), cut_tracebacks)],
    )?;
    counter(
        encoder,
        "tracer_drops",
        "Events lost by the eBPF programs, by reason (a full kernel map or ring buffer)",
        &drops,
    )
}
