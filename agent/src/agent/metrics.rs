//! The composition of the `kubelet_*` families on `/metrics`: the wiring creates one
//! [`KubeletMetrics`], which registers each subsystem's families into the `/metrics`
//! registry, and hands each subsystem its own part (`Arc<PlegMetrics>`, ...).
//!
//! Each subsystem owns the struct of the families it records (their upstream names are
//! in each struct's module): [`RuntimeOperationMetrics`] (CRI calls), [`PlegMetrics`],
//! [`ShutdownMetrics`], [`PodWorkerMetrics`], [`RuntimeMetrics`] (runtime manager),
//! [`SyncLoopMetrics`] (housekeeping counts), [`StatusMetrics`], [`SourceMetrics`],
//! [`HttpMetrics`], [`ImageMetrics`], [`PodStartupMetrics`] and [`VolumeStatMetrics`];
//! the eviction, prober, resize, resource manager and device plugin families were already their
//! modules' own. The composition lives here, in the wiring, rather than in
//! `crate::metrics`: it names every subsystem, and the subsystems use `crate::metrics`
//! (shared buckets, label sets, the upstream-name rewriting of the exposition), so
//! `crate::metrics` holding it would be a cycle among top-level modules. It stays (rather
//! than each part being registered in the build steps) so that registering the
//! families, `kubelet_node_name` and the test fixture of the whole set are in one place.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::container::metrics::RuntimeOperationMetrics;
use crate::images::metrics::ImageMetrics;
use crate::nodeshutdown::metrics::ShutdownMetrics;
use crate::pleg::metrics::PlegMetrics;
use crate::pod_startup::metrics::PodStartupMetrics;
use crate::pod_workers::metrics::PodWorkerMetrics;
use crate::runtime::metrics::RuntimeMetrics;
use crate::server::metrics::HttpMetrics;
use crate::sources::metrics::SourceMetrics;
use crate::stats::metrics::VolumeStatMetrics;
use crate::status::metrics::StatusMetrics;
use crate::sync_loop::metrics::SyncLoopMetrics;

/// Label set `node` of `kubelet_node_name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

/// Every `kubelet_*` family of the agent's own on `/metrics`, by the subsystem that
/// records it.
#[derive(Debug)]
pub struct KubeletMetrics {
    /// `kubelet_runtime_operations*`: the CRI client.
    pub cri: Arc<RuntimeOperationMetrics>,
    /// `kubelet_pleg_*`, `kubelet_running_*`, `kubelet_evented_pleg_*`.
    pub pleg: Arc<PlegMetrics>,
    /// `kubelet_graceful_shutdown_*`.
    pub shutdown: Arc<ShutdownMetrics>,
    /// `kubelet_pod_worker_*`, `kubelet_restarted_pods`, `kubelet_orphaned_runtime_pods`,
    /// `kubelet_cgroup_manager_duration_seconds`.
    pub pod_workers: Arc<PodWorkerMetrics>,
    /// `kubelet_started_*`, `kubelet_run_podsandbox_duration_seconds`,
    /// `kubelet_lifecycle_handler_http_fallbacks`, `kubelet_containers_per_pod_count`.
    pub runtime: Arc<RuntimeMetrics>,
    /// `kubelet_desired_pods`, `kubelet_active_pods`, `kubelet_working_pods`,
    /// `kubelet_managed_ephemeral_containers`, `kubelet_orphan_pod_cleaned_volumes*`.
    pub sync_loop: Arc<SyncLoopMetrics>,
    /// `kubelet_node_name{node}`: always 1.
    pub node_name: Family<NodeLabels, Gauge>,
    /// `kubelet_pod_status_sync_duration_seconds`.
    pub status: Arc<StatusMetrics>,
    /// `kubelet_mirror_pods`.
    pub sources: Arc<SourceMetrics>,
    /// `kubelet_http_*`.
    pub http: Arc<HttpMetrics>,
    /// `kubelet_image_pull_duration_seconds`, `kubelet_image_garbage_collected`.
    pub images: Arc<ImageMetrics>,
    /// `kubelet_pod_start_*`.
    pub pod_startup: Arc<PodStartupMetrics>,
    /// `kubelet_volume_metric_collection_duration_seconds`.
    pub stats: Arc<VolumeStatMetrics>,
}

impl KubeletMetrics {
    /// Creates the families and registers them into `registry`, subsystem by subsystem.
    pub fn new(registry: &mut Registry, node_name: &str) -> Self {
        let cri = Arc::new(RuntimeOperationMetrics::new(registry));
        let pleg = Arc::new(PlegMetrics::new(registry));
        let shutdown = Arc::new(ShutdownMetrics::new(registry));
        let pod_workers = Arc::new(PodWorkerMetrics::new(registry));
        let runtime = Arc::new(RuntimeMetrics::new(registry));
        let sync_loop = Arc::new(SyncLoopMetrics::new(registry));
        let node_name_family = Family::<NodeLabels, Gauge>::default();
        node_name_family.get_or_create(&NodeLabels { node: node_name.to_string() }).set(1);
        registry.register(
            "kubelet_node_name",
            "[ALPHA] The node's name. The count is always 1",
            node_name_family.clone(),
        );
        Self {
            cri,
            pleg,
            shutdown,
            pod_workers,
            runtime,
            sync_loop,
            node_name: node_name_family,
            status: Arc::new(StatusMetrics::new(registry)),
            sources: Arc::new(SourceMetrics::new(registry)),
            http: Arc::new(HttpMetrics::new(registry)),
            images: Arc::new(ImageMetrics::new(registry)),
            pod_startup: Arc::new(PodStartupMetrics::new(registry)),
            stats: Arc::new(VolumeStatMetrics::new(registry)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::metrics::{ImageGcReasonLabels, ImageSizeLabels};
    use crate::metrics::{
        COUNTERS_WITHOUT_TOTAL, OperationLabels, StaticLabels, TraceExemplar, go_float,
        openmetrics_with_upstream_counter_names, with_upstream_counter_names,
    };
    use crate::pleg::metrics::{ContainerStateLabels, KernelEventLabels, RuntimeEventKindLabels};
    use crate::runtime::metrics::{ContainerTypeLabels, RuntimeHandlerLabels, StartedContainerErrorLabels};
    use crate::server::metrics::HttpLabels;
    use crate::sync_loop::metrics::WorkingPodLabels;

    #[test]
    fn families_have_upstream_names_and_counter_suffixes() {
        let mut reg = Registry::default();
        let m = KubeletMetrics::new(&mut reg, "node-a");
        m.cri.observe_runtime_operation("list_podsandbox", 0.01, true);
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &reg).unwrap();
        assert!(out.contains("kubelet_runtime_operations_total{operation_type=\"list_podsandbox\"} 1"));
        assert!(out.contains("kubelet_runtime_operations_errors_total{operation_type=\"list_podsandbox\"} 1"));
        assert!(
            out.contains(
                "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.0125\",operation_type=\"list_podsandbox\"} 1"
            ) || out.contains(
                "kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"list_podsandbox\",le=\"0.0125\"} 1"
            )
        );
        assert!(out.contains("kubelet_node_name{node=\"node-a\"} 1"));
        assert!(out.contains("# TYPE kubelet_pleg_relist_duration_seconds histogram"));
    }

    /// Upstream `kubelet_*` and `process_*` families of `/metrics` that swiftlet does not
    /// serve, each with the reason (the README lists them too).
    const NOT_SERVED: &[(&str, &str)] = &[
        ("kubelet_evented_pleg_connection_error_count", "upstream's CRI-events PLEG; swiftlet's is eBPF"),
        ("kubelet_evented_pleg_connection_latency_seconds", "upstream's CRI-events PLEG; swiftlet's is eBPF"),
        ("kubelet_evented_pleg_connection_success_count", "upstream's CRI-events PLEG; swiftlet's is eBPF"),
    ];

    /// (family as upstream names it, type, label names) from an exposition.
    fn families(text: &str) -> std::collections::BTreeMap<String, (String, std::collections::BTreeSet<String>)> {
        let mut out = std::collections::BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                out.insert(name.to_string(), (kind.to_string(), std::collections::BTreeSet::new()));
            } else if !line.starts_with('#') && !line.is_empty() {
                let name_end = line.find(['{', ' ']).unwrap();
                let sample = &line[..name_end];
                let family = out
                    .keys()
                    .filter(|f| {
                        sample == f.as_str()
                            || ["_bucket", "_sum", "_count"].iter().any(|s| sample.strip_suffix(s) == Some(f.as_str()))
                    })
                    .max_by_key(|f| f.len())
                    .cloned();
                if let (Some(f), Some(labels)) = (family, line[name_end..].strip_prefix('{')) {
                    let labels = &labels[..labels.find('}').unwrap()];
                    for kv in labels.split(',').filter(|kv| !kv.is_empty()) {
                        let key = kv.split('=').next().unwrap();
                        out.get_mut(&f).unwrap().1.insert(key.to_string());
                    }
                }
            }
        }
        out
    }

    #[test]
    fn families_match_the_reference_inventory() {
        let mut reg = Registry::default();
        let m = KubeletMetrics::new(&mut reg, "node-a");
        let _resource_managers = crate::cm::metrics::ResourceManagerMetrics::new(&mut reg);
        reg.register_collector(Box::new(crate::process_metrics::ProcessCollector::default()));
        let collection = std::sync::Arc::new(crate::stats::synthetic::collection(crate::stats::synthetic::Shape {
            pods: 1,
            devices: 0,
            interfaces: 0,
        }));
        reg.register_collector(Box::new(crate::stats::log_metrics::LogMetricsCollector::new(std::sync::Arc::new(
            move || Some(std::sync::Arc::clone(&collection)),
        ))));
        sample_every_family(&m);
        let mut ours = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut ours, &reg).unwrap();
        let ours = families(&with_upstream_counter_names(&ours));

        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/reference/kubelet-1.28/metrics.txt");
        let reference = std::fs::read_to_string(path).unwrap();
        let mut problems = Vec::new();
        for line in reference.lines().filter(|l| !l.starts_with('#')) {
            let cols: Vec<&str> = line.split('\t').collect();
            let (name, kind, labels) = (cols[0], cols[1], cols[2]);
            if !(name.starts_with("kubelet_") || name.starts_with("process_")) {
                continue;
            }
            let want: std::collections::BTreeSet<String> =
                labels.split(',').filter(|l| *l != "-" && *l != "le" && *l != "quantile").map(str::to_string).collect();
            match ours.get(name) {
                None if NOT_SERVED.iter().any(|(n, _)| *n == name) => {}
                None => problems.push(format!("{name}: not served and not listed as such")),
                Some((k, _)) if k != kind => problems.push(format!("{name}: type {k}, upstream {kind}")),
                Some((_, got)) => {
                    let got: std::collections::BTreeSet<String> = got.iter().filter(|l| *l != "le").cloned().collect();
                    if got != want {
                        problems.push(format!("{name}: labels {got:?}, upstream {want:?}"));
                    }
                }
            }
        }
        for (name, _) in NOT_SERVED {
            if ours.contains_key(*name) {
                problems.push(format!("{name} is served now: take it off NOT_SERVED and the README"));
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
    }

    /// The rewriting as it was first written (a `String` per line, `format!` per float),
    /// kept to check that the one-pass rewriting writes the same bytes.
    fn obvious_upstream_names(text: &str) -> String {
        let mut out = String::new();
        for line in text.split_inclusive('\n') {
            let mut line = line.to_owned();
            for name in COUNTERS_WITHOUT_TOTAL {
                for prefix in ["# HELP ", "# TYPE ", ""] {
                    if let Some(rest) = line.strip_prefix(&format!("{prefix}{name}_total"))
                        && rest.starts_with([' ', '{'])
                    {
                        line = format!("{prefix}{name}{rest}");
                    }
                }
            }
            if !line.starts_with('#') {
                let mut fixed = String::new();
                let mut rest = line.as_str();
                while let Some((start, key)) =
                    ["le=\"", "quantile=\""].iter().filter_map(|k| rest.find(k).map(|p| (p, k.len()))).min()
                {
                    let Some(len) = rest[start + key..].find('"') else { break };
                    let value = &rest[start + key..start + key + len];
                    fixed.push_str(&rest[..start + key]);
                    match value.parse::<f64>() {
                        Ok(v) if v.is_finite() => fixed.push_str(&go_float(v)),
                        _ => fixed.push_str(value),
                    }
                    rest = &rest[start + key + len..];
                }
                fixed.push_str(rest);
                line = fixed;
            }
            out.push_str(&line);
        }
        out
    }

    /// The `OpenMetrics` rewriting as first written.
    fn obvious_openmetrics_names(text: &str) -> String {
        let mut out = String::new();
        for line in text.split_inclusive('\n') {
            let mut fixed = None;
            for name in COUNTERS_WITHOUT_TOTAL {
                if line.starts_with(&format!("# TYPE {name} counter")) {
                    fixed = Some(format!("# TYPE {name} unknown\n"));
                } else if let Some(rest) =
                    line.strip_prefix(&format!("{name}_total")).filter(|r| r.starts_with([' ', '{']))
                {
                    fixed = Some(format!("{name}{rest}"));
                } else if line.strip_prefix(&format!("{name}_created")).is_some_and(|r| r.starts_with([' ', '{'])) {
                    fixed = Some(String::new());
                }
            }
            out.push_str(fixed.as_deref().unwrap_or(line));
        }
        out
    }

    #[test]
    fn one_pass_rewriting_writes_what_the_obvious_one_did() {
        let mut reg = Registry::default();
        let m = KubeletMetrics::new(&mut reg, "node-a");
        let eviction = crate::eviction::EvictionMetrics::new(&mut reg);
        eviction
            .evictions
            .get_or_create(&crate::eviction::metrics::SignalLabels { eviction_signal: "memory.available".into() })
            .inc();
        m.pleg.pleg_discard_events.inc();
        for (i, op) in ["list_podsandbox", "version", "image_status"].iter().enumerate() {
            m.cri.observe_runtime_operation(op, 0.003 * i as f64, i == 1);
        }
        m.pod_startup.pod_start_duration.observe(1.5, Some(TraceExemplar { trace_id: "abc".into() }), None);
        m.pleg.evented_pleg_event_latency.observe(0.000_2);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &reg).unwrap();
        // Lines the registry does not write: a HELP text and labels that look like `le`,
        // an unclosed value, a TYPE line that only starts like a counter's.
        text.push_str("# HELP kubelet_evictions_total help with le=\"5.0\"\n");
        text.push_str(
            "x{file=\"5.0\",le=\"1e6\",quantile=\"0.50\"} 1\nx{handle=\"nan\",le=\"+Inf\"} 2\ny{le=\"3.0 1\n",
        );
        text.push_str("kubelet_evictions_total{le=\"2.0\"} 1\n# TYPE kubelet_evictions counterish\n");
        assert_eq!(with_upstream_counter_names(&text), obvious_upstream_names(&text));
        let mut open = String::new();
        prometheus_client::encoding::text::encode(&mut open, &reg).unwrap();
        open.push_str("# TYPE kubelet_evictions counterish\nkubelet_pleg_discard_events_created 1\n");
        assert_eq!(openmetrics_with_upstream_counter_names(&open), obvious_openmetrics_names(&open));
    }

    /// One sample in each labelled family, so that every family and its label names show.
    fn sample_every_family(m: &KubeletMetrics) {
        m.cri.observe_runtime_operation("list_podsandbox", 0.01, true);
        m.pod_workers
            .pod_worker_duration
            .get_or_create(&OperationLabels { operation_type: "sync".into() })
            .observe(0.1);
        m.pod_workers
            .cgroup_manager_duration
            .get_or_create(&OperationLabels { operation_type: "update".into() })
            .observe(0.1);
        m.pleg.running_containers.get_or_create(&ContainerStateLabels { container_state: "running".into() }).set(1);
        m.runtime.started_containers.get_or_create(&ContainerTypeLabels { container_type: "container".into() }).inc();
        m.runtime
            .started_containers_errors
            .get_or_create(&StartedContainerErrorLabels {
                code: "RunContainerError".into(),
                container_type: "container".into(),
            })
            .inc();
        m.sync_loop.desired_pods.get_or_create(&StaticLabels { r#static: "false".into() }).set(1);
        m.sync_loop.active_pods.get_or_create(&StaticLabels { r#static: "true".into() }).set(2);
        m.pod_workers.restarted_pods.get_or_create(&StaticLabels { r#static: "false".into() }).inc();
        m.sync_loop
            .working_pods
            .get_or_create(&WorkingPodLabels {
                lifecycle: "sync".into(),
                config: "desired".into(),
                r#static: "false".into(),
            })
            .set(1);
        let http = HttpLabels {
            method: "GET".into(),
            path: "pods".into(),
            server_type: "readwrite".into(),
            long_running: "false".into(),
        };
        m.http.http_requests.get_or_create(&http).inc();
        m.http.http_inflight_requests.get_or_create(&http).set(0);
        m.http.http_requests_duration.get_or_create(&http).observe(0.01);
        m.runtime
            .run_podsandbox_duration
            .get_or_create(&RuntimeHandlerLabels { runtime_handler: String::new() })
            .observe(0.5);
        m.images
            .image_pull_duration
            .get_or_create(&ImageSizeLabels { image_size_in_bytes: "0-10MB".into() })
            .observe(1.0);
        m.images.image_garbage_collected.get_or_create(&ImageGcReasonLabels { reason: "age".into() }).inc();
        m.stats.observe_volume_stat_duration("du", std::time::Duration::from_millis(3));
        m.pleg.evented_pleg_kernel_events.get_or_create(&KernelEventLabels { kind: "exit".into() }).inc();
        m.pleg
            .evented_pleg_runtime_event_lag
            .get_or_create(&RuntimeEventKindLabels { kind: "stopped".into() })
            .observe(0.002);
    }

    /// The registry renders the families it rendered before the split into per-subsystem
    /// structs: names, types, help texts, label names and bucket layouts, line for line
    /// (sorted: the registration order is not part of what scrapers see).
    #[test]
    fn families_render_as_before_the_split() {
        let mut reg = Registry::default();
        let m = KubeletMetrics::new(&mut reg, "node-a");
        sample_every_family(&m);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &reg).unwrap();
        let sorted = |t: &str| {
            let mut lines: Vec<String> = t.lines().map(str::to_owned).collect();
            lines.sort();
            lines
        };
        let before = include_str!("kubelet_metrics.snapshot.txt");
        assert_eq!(sorted(&text), sorted(before));
        assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE ")).count(), 50);
    }
}
