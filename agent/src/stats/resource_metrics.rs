//! `/metrics/resource`: the kubelet's resource metrics collector
//! (`pkg/kubelet/metrics/collectors/resource_metrics.go`) over the CPU-and-memory Summary,
//! written as Prometheus text exposition 0.0.4 the way the Go client writes it.
//!
//! - Families, types, label names and help texts are those of kubelet 1.28 (see
//!   `tests/fixtures/reference/kubelet-1.28/metrics-resource.txt`; all `[ALPHA]` there),
//!   plus the swap usage families newer kubelets add (`node_swap_usage_bytes`,
//!   `pod_swap_usage_bytes`, `container_swap_usage_bytes`, with their upstream help texts),
//!   emitted when swap stats exist. Not emitted: `container_swap_limit_bytes` and
//!   `resource_scrape_error` (newer upstream only).
//! - Samples carry the stats' time as a millisecond timestamp, as upstream's
//!   `NewLazyMetricWithTimestamp` does; `container_start_time_seconds` and `scrape_error`
//!   have none. The node's swap sample is stamped with the node memory time, as upstream.
//! - Families are sorted by name, samples by label values (label names sorted), families
//!   without samples are left out, values are formatted as Go's
//!   `strconv.FormatFloat(v, 'g', -1, 64)` (`1.6e+07`, `0.01328234`), all as the Go client's
//!   registry and text encoder do. A repeated label set (two pods of one name) keeps the
//!   first sample, where the Go registry would fail the family.
//!
//! prometheus-client is not used: it cannot attach sample timestamps.

use super::summary::{CpuStats, MemoryStats, Summary, SwapStats, Time};
use crate::types::prom_text::{escape_help, escape_label, write_go_float, write_i64};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One metric family of a text endpoint (this one's and `/metrics/cadvisor`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// Name.
    pub name: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// Help text (here with the stability prefix).
    pub help: &'static str,
    /// Label names, sorted.
    pub labels: &'static [&'static str],
}

const CONTAINER: &[&str] = &["container", "namespace", "pod"];
const POD: &[&str] = &["namespace", "pod"];

/// Every family the endpoint can serve, sorted by name.
pub const FAMILIES: [Family; 11] = [
    Family {
        name: "container_cpu_usage_seconds_total",
        kind: "counter",
        help: "[ALPHA] Cumulative cpu time consumed by the container in core-seconds",
        labels: CONTAINER,
    },
    Family {
        name: "container_memory_working_set_bytes",
        kind: "gauge",
        help: "[ALPHA] Current working set of the container in bytes",
        labels: CONTAINER,
    },
    Family {
        name: "container_start_time_seconds",
        kind: "gauge",
        help: "[ALPHA] Start time of the container since unix epoch in seconds",
        labels: CONTAINER,
    },
    Family {
        name: "container_swap_usage_bytes",
        kind: "gauge",
        help: "[ALPHA] Current amount of the container swap usage in bytes. Reported only on non-windows systems",
        labels: CONTAINER,
    },
    Family {
        name: "node_cpu_usage_seconds_total",
        kind: "counter",
        help: "[ALPHA] Cumulative cpu time consumed by the node in core-seconds",
        labels: &[],
    },
    Family {
        name: "node_memory_working_set_bytes",
        kind: "gauge",
        help: "[ALPHA] Current working set of the node in bytes",
        labels: &[],
    },
    Family {
        name: "node_swap_usage_bytes",
        kind: "gauge",
        help: "[ALPHA] Current swap usage of the node in bytes. Reported only on non-windows systems",
        labels: &[],
    },
    Family {
        name: "pod_cpu_usage_seconds_total",
        kind: "counter",
        help: "[ALPHA] Cumulative cpu time consumed by the pod in core-seconds",
        labels: POD,
    },
    Family {
        name: "pod_memory_working_set_bytes",
        kind: "gauge",
        help: "[ALPHA] Current working set of the pod in bytes",
        labels: POD,
    },
    Family {
        name: "pod_swap_usage_bytes",
        kind: "gauge",
        help: "[ALPHA] Current amount of the pod swap usage in bytes. Reported only on non-windows systems",
        labels: POD,
    },
    Family {
        name: "scrape_error",
        kind: "gauge",
        help: "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
        labels: &[],
    },
];

#[derive(Debug)]
struct Sample {
    /// Label values in the family's (sorted) label order.
    values: Vec<String>,
    value: f64,
    timestamp_ms: Option<i64>,
}

fn ns_to_seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn sample(values: &[&str], value: f64, time: Option<&Time>) -> Sample {
    Sample {
        values: values.iter().map(|v| (*v).to_owned()).collect(),
        value,
        timestamp_ms: time.and_then(Time::unix_millis),
    }
}

/// The stats of one node, pod or container that its cpu, working set and swap families show.
struct Usage<'a> {
    cpu: Option<&'a CpuStats>,
    memory: Option<&'a MemoryStats>,
    swap: Option<&'a SwapStats>,
}

impl Usage<'_> {
    /// Pushes the samples there are into `families` (cpu, working set, swap), each stamped
    /// with its stats' time (the swap sample with `swap_time` when given).
    fn push(&self, samples: &mut [Vec<Sample>], families: [usize; 3], labels: &[&str], swap_time: Option<&Time>) {
        let [cpu_family, memory_family, swap_family] = families;
        if let Some(cpu) = self.cpu
            && let Some(ns) = cpu.usage_core_nano_seconds
        {
            samples[cpu_family].push(sample(labels, ns_to_seconds(ns), Some(&cpu.time)));
        }
        if let Some(m) = self.memory
            && let Some(ws) = m.working_set_bytes
        {
            samples[memory_family].push(sample(labels, ws as f64, Some(&m.time)));
        }
        if let Some(sw) = self.swap
            && let Some(u) = sw.swap_usage_bytes
        {
            samples[swap_family].push(sample(labels, u as f64, Some(swap_time.unwrap_or(&sw.time))));
        }
    }
}

/// Renders the endpoint from the CPU-and-memory Summary, or `None` when it could not be
/// produced (then only `scrape_error 1`, as upstream).
#[must_use]
pub fn render(summary: Option<&Summary>) -> String {
    let mut samples: Vec<Vec<Sample>> = FAMILIES.iter().map(|_| Vec::new()).collect();
    let idx = |name: &str| FAMILIES.iter().position(|f| f.name == name).expect("known family");
    let scrape_error = if summary.is_some() { 0.0 } else { 1.0 };
    if let Some(s) = summary {
        // The cpu, working set and swap families of a node, pod or container.
        let usage_families = |kind: &str| {
            [
                idx(&format!("{kind}_cpu_usage_seconds_total")),
                idx(&format!("{kind}_memory_working_set_bytes")),
                idx(&format!("{kind}_swap_usage_bytes")),
            ]
        };
        let (node_families, pod_families, container_families) =
            (usage_families("node"), usage_families("pod"), usage_families("container"));
        let node = &s.node;
        // The node's swap sample is stamped with the node memory time, as upstream.
        let usage = Usage { cpu: node.cpu.as_ref(), memory: node.memory.as_ref(), swap: node.swap.as_ref() };
        usage.push(&mut samples, node_families, &[], node.memory.as_ref().map(|m| &m.time));
        for pod in &s.pods {
            let (name, ns) = (pod.pod_ref.name.as_str(), pod.pod_ref.namespace.as_str());
            for c in &pod.containers {
                let labels = [c.name.as_str(), ns, name];
                if c.start_time.unix_millis().is_some_and(|ms| ms >= 1000)
                    && let Some(secs) = c.start_time.unix_seconds_f64()
                {
                    samples[idx("container_start_time_seconds")].push(sample(&labels, secs, None));
                }
                let usage = Usage { cpu: c.cpu.as_ref(), memory: c.memory.as_ref(), swap: c.swap.as_ref() };
                usage.push(&mut samples, container_families, &labels, None);
            }
            let usage = Usage { cpu: pod.cpu.as_ref(), memory: pod.memory.as_ref(), swap: pod.swap.as_ref() };
            usage.push(&mut samples, pod_families, &[ns, name], None);
        }
    }
    samples[idx("scrape_error")].push(sample(&[], scrape_error, None));

    let mut out = String::with_capacity(256 + samples.iter().map(Vec::len).sum::<usize>() * 160);
    for (family, mut rows) in FAMILIES.iter().zip(samples) {
        if rows.is_empty() {
            continue;
        }
        rows.sort_by(|a, b| a.values.cmp(&b.values).then(a.timestamp_ms.cmp(&b.timestamp_ms)));
        rows.dedup_by(|later, earlier| later.values == earlier.values);
        write_family_header(&mut out, family.name, family.help, family.kind);
        for row in &rows {
            write_sample(
                &mut out,
                family.name,
                family.labels.iter().copied().zip(row.values.iter().map(String::as_str)),
                row.value,
                row.timestamp_ms,
            );
        }
    }
    out
}

/// `# HELP` and `# TYPE` lines of a family.
pub(crate) fn write_family_header(out: &mut String, name: &str, help: &str, kind: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    escape_help(out, help);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind);
    out.push('\n');
}

/// One sample line: `name{labels} value [timestamp_ms]`, Go-formatted.
pub(crate) fn write_sample<'a>(
    out: &mut String,
    name: &str,
    labels: impl Iterator<Item = (&'a str, &'a str)>,
    value: f64,
    timestamp_ms: Option<i64>,
) {
    out.push_str(name);
    let mut first = true;
    for (label, v) in labels {
        out.push(if first { '{' } else { ',' });
        first = false;
        out.push_str(label);
        out.push_str("=\"");
        escape_label(out, v);
        out.push('"');
    }
    if !first {
        out.push('}');
    }
    out.push(' ');
    write_go_float(out, value);
    if let Some(ts) = timestamp_ms {
        out.push(' ');
        write_i64(out, ts);
    }
    out.push('\n');
}
