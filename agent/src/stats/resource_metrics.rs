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

use super::summary::{Summary, Time};
use crate::types::prom_text::{escape_help, escape_label, write_go_float, write_i64};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One metric family of the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// Name.
    pub name: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// Help text with the stability prefix.
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

/// Renders the endpoint from the CPU-and-memory Summary, or `None` when it could not be
/// produced (then only `scrape_error 1`, as upstream).
#[must_use]
pub fn render(summary: Option<&Summary>) -> String {
    let mut samples: Vec<Vec<Sample>> = FAMILIES.iter().map(|_| Vec::new()).collect();
    let idx = |name: &str| FAMILIES.iter().position(|f| f.name == name).expect("known family");
    let scrape_error = if summary.is_some() { 0.0 } else { 1.0 };
    if let Some(s) = summary {
        let node = &s.node;
        if let Some(cpu) = &node.cpu
            && let Some(ns) = cpu.usage_core_nano_seconds
        {
            samples[idx("node_cpu_usage_seconds_total")].push(sample(&[], ns_to_seconds(ns), Some(&cpu.time)));
        }
        if let Some(m) = &node.memory
            && let Some(ws) = m.working_set_bytes
        {
            samples[idx("node_memory_working_set_bytes")].push(sample(&[], ws as f64, Some(&m.time)));
        }
        if let Some(sw) = &node.swap
            && let Some(u) = sw.swap_usage_bytes
        {
            let time = node.memory.as_ref().map_or(&sw.time, |m| &m.time);
            samples[idx("node_swap_usage_bytes")].push(sample(&[], u as f64, Some(time)));
        }
        for pod in &s.pods {
            let (name, ns) = (pod.pod_ref.name.as_str(), pod.pod_ref.namespace.as_str());
            for c in &pod.containers {
                let labels = [c.name.as_str(), ns, name];
                if c.start_time.unix_millis().is_some_and(|ms| ms >= 1000)
                    && let Some(secs) = c.start_time.unix_seconds_f64()
                {
                    samples[idx("container_start_time_seconds")].push(sample(&labels, secs, None));
                }
                if let Some(cpu) = &c.cpu
                    && let Some(v) = cpu.usage_core_nano_seconds
                {
                    samples[idx("container_cpu_usage_seconds_total")].push(sample(
                        &labels,
                        ns_to_seconds(v),
                        Some(&cpu.time),
                    ));
                }
                if let Some(m) = &c.memory
                    && let Some(ws) = m.working_set_bytes
                {
                    samples[idx("container_memory_working_set_bytes")].push(sample(&labels, ws as f64, Some(&m.time)));
                }
                if let Some(sw) = &c.swap
                    && let Some(u) = sw.swap_usage_bytes
                {
                    samples[idx("container_swap_usage_bytes")].push(sample(&labels, u as f64, Some(&sw.time)));
                }
            }
            let labels = [ns, name];
            if let Some(cpu) = &pod.cpu
                && let Some(v) = cpu.usage_core_nano_seconds
            {
                samples[idx("pod_cpu_usage_seconds_total")].push(sample(&labels, ns_to_seconds(v), Some(&cpu.time)));
            }
            if let Some(m) = &pod.memory
                && let Some(ws) = m.working_set_bytes
            {
                samples[idx("pod_memory_working_set_bytes")].push(sample(&labels, ws as f64, Some(&m.time)));
            }
            if let Some(sw) = &pod.swap
                && let Some(u) = sw.swap_usage_bytes
            {
                samples[idx("pod_swap_usage_bytes")].push(sample(&labels, u as f64, Some(&sw.time)));
            }
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
