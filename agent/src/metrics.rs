//! What the kubelet's own metric families (`/metrics`) share: upstream buckets, the label
//! sets more than one subsystem uses, trace exemplars, and the rewriting that makes the
//! exposition read as the Go client writes it (see `shared/reference/kubelet-1.28/metrics.txt`).
//!
//! The families themselves belong to the subsystem that records them, each in its
//! `metrics.rs` with the upstream names (`crate::pleg::metrics::PlegMetrics`, ...);
//! `crate::agent::metrics::KubeletMetrics` registers them all. This module uses only
//! `types`, so that every subsystem can use it without a cycle.
//!
//! prometheus-client appends `_total` to counters when encoding, so counters are
//! registered without it. Help texts keep the upstream `[ALPHA]` prefix so that
//! tools that diff kubelet scrapes see the same families.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// Upstream counters whose names do not end in `_total` (the Go client writes a counter's
/// name as given; prometheus-client always appends `_total`).
pub const COUNTERS_WITHOUT_TOTAL: &[&str] = &[
    "kubelet_pleg_discard_events",
    "kubelet_evictions",
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "kubelet_server_expiration_renew_errors",
];

/// Makes a Prometheus text exposition read as the Go client writes it, so existing
/// dashboards and alerts match: [`COUNTERS_WITHOUT_TOTAL`] get their upstream names back
/// (`HELP`, `TYPE` and sample lines), and `le` / `quantile` values are written as Go's
/// `strconv.FormatFloat(v, 'g', -1, 64)` does (`5`, not `5.0`; `1e+06`).
#[must_use]
pub fn with_upstream_counter_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    write_with_upstream_counter_names(&mut out, text);
    out
}

/// [`with_upstream_counter_names`] appending to `out`: one pass over the text, each line
/// copied as is unless it names one of [`COUNTERS_WITHOUT_TOTAL`] or has `le`/`quantile`
/// values to rewrite, which are written in place (no allocation per line).
pub fn write_with_upstream_counter_names(out: &mut String, text: &str) {
    out.reserve(text.len());
    for line in text.split_inclusive('\n') {
        match strip_total(line) {
            Some((prefix, name, rest)) => {
                out.push_str(prefix);
                out.push_str(name);
                if prefix.is_empty() {
                    push_with_go_float_labels(out, rest);
                } else {
                    out.push_str(rest);
                }
            }
            None => push_with_go_float_labels(out, line),
        }
    }
}

/// A `HELP`, `TYPE` or sample line of a counter in [`COUNTERS_WITHOUT_TOTAL`], split into
/// what comes before the name (`# HELP `, `# TYPE ` or nothing), the upstream name, and
/// what follows `_total`.
fn strip_total(line: &str) -> Option<(&'static str, &'static str, &str)> {
    let (prefix, named) = if let Some(r) = line.strip_prefix("# HELP ") {
        ("# HELP ", r)
    } else if let Some(r) = line.strip_prefix("# TYPE ") {
        ("# TYPE ", r)
    } else {
        ("", line)
    };
    COUNTERS_WITHOUT_TOTAL.iter().find_map(|name| {
        let rest = named.strip_prefix(name)?.strip_prefix("_total")?;
        rest.starts_with([' ', '{']).then_some((prefix, *name, rest))
    })
}

/// Appends `line` with its `le="…"` / `quantile="…"` values in Go's float format.
fn push_with_go_float_labels(out: &mut String, line: &str) {
    if line.starts_with('#') || !(line.contains("le=\"") || line.contains("quantile=\"")) {
        out.push_str(line);
        return;
    }
    let mut rest = line;
    while let Some((start, key_len)) =
        ["le=\"", "quantile=\""].iter().filter_map(|k| rest.find(k).map(|p| (p, k.len()))).min()
    {
        let value_start = start + key_len;
        let Some(len) = rest[value_start..].find('"') else { break };
        let value = &rest[value_start..value_start + len];
        out.push_str(&rest[..value_start]);
        match value.parse::<f64>() {
            Ok(v) if v.is_finite() => crate::types::prom_text::write_go_float(out, v),
            _ => out.push_str(value),
        }
        rest = &rest[value_start + len..];
    }
    out.push_str(rest);
}

/// In an `OpenMetrics` exposition, [`COUNTERS_WITHOUT_TOTAL`] are typed `unknown` with
/// samples under upstream's names (`OpenMetrics` counters must end in `_total`, and a
/// scraper would store them so): what Prometheus stores is then what it stores from the
/// upstream kubelet's text.
#[must_use]
pub fn openmetrics_with_upstream_counter_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    write_openmetrics_with_upstream_counter_names(&mut out, text);
    out
}

/// [`openmetrics_with_upstream_counter_names`] appending to `out`.
pub fn write_openmetrics_with_upstream_counter_names(out: &mut String, text: &str) {
    /// What becomes of a line naming one of [`COUNTERS_WITHOUT_TOTAL`].
    enum Fix<'a> {
        /// Its `TYPE` line: `unknown`.
        Type(&'static str),
        /// A `_total` sample: under the upstream name, followed by this.
        Sample(&'static str, &'a str),
        /// A `_created` sample: left out.
        Drop,
    }
    out.reserve(text.len());
    for line in text.split_inclusive('\n') {
        let mut fix = None;
        for name in COUNTERS_WITHOUT_TOTAL {
            let after = |suffix: &str| {
                line.strip_prefix(name).and_then(|r| r.strip_prefix(suffix)).filter(|r| r.starts_with([' ', '{']))
            };
            if line
                .strip_prefix("# TYPE ")
                .and_then(|r| r.strip_prefix(name))
                .is_some_and(|r| r.starts_with(" counter"))
            {
                fix = Some(Fix::Type(name));
            } else if let Some(rest) = after("_total") {
                fix = Some(Fix::Sample(name, rest));
            } else if after("_created").is_some() {
                fix = Some(Fix::Drop);
            }
        }
        match fix {
            None => out.push_str(line),
            Some(Fix::Type(name)) => {
                out.push_str("# TYPE ");
                out.push_str(name);
                out.push_str(" unknown\n");
            }
            Some(Fix::Sample(name, rest)) => {
                out.push_str(name);
                out.push_str(rest);
            }
            Some(Fix::Drop) => {}
        }
    }
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)`: the shortest digits, as `%e` when the
/// decimal exponent is below -4 or at least 6 (`1e+06`, `5e-05`), else plain (`3600`,
/// `0.005`).
#[must_use]
pub fn go_float(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` and `{}` both give the shortest round-trip digits.
    let e = format!("{v:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        format!("{v}")
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// Upstream `podStartupDurationBuckets` (seconds), for the pod start histograms.
pub const POD_STARTUP_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0,
    600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// `metrics.DefBuckets` of the Prometheus Go client.
pub const DEF_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The exemplar of a traced observation: the trace it belongs to, under the label name
/// Prometheus and Grafana look for (`trace_id`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceExemplar {
    pub trace_id: String,
}

/// A histogram whose observations may carry a trace id as their bucket's exemplar.
/// `OpenMetrics` shows the exemplars; Prometheus text 0.0.4 has no place for them.
pub type TracedHistogram = HistogramWithExemplars<TraceExemplar>;

/// Label set `operation_type`, shared by the CRI, pod worker and cgroup manager
/// families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation_type: String,
}

/// Label set `static` (whether the pod comes from a non-API source), shared by the pod
/// worker and sync loop families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StaticLabels {
    pub r#static: String,
}

/// A family of histograms that all have the buckets of its constructor.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Prometheus `ExponentialBuckets(start, factor, count)`.
#[must_use]
pub fn exponential_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(count);
    let mut v = start;
    for _ in 0..count {
        out.push(v);
        v *= factor;
    }
    out
}

/// A histogram with [`DEF_BUCKETS`].
#[must_use]
pub fn def_histogram() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}

/// Declares a subsystem's metric families once each: the field, its type, how it is made,
/// and the name and help it is registered under. The struct gets `new(registry)`, which
/// registers the families in the order they are declared (the exposition's order), and
/// `Default`, the same families registered nowhere (tests, or when metrics are off).
///
/// ```text
/// metric_families! {
///     /// The status manager family.
///     #[derive(Debug)]
///     pub struct StatusMetrics {
///         /// What it measures.
///         pub pod_status_sync_duration: Histogram = def_histogram(),
///             ("kubelet_pod_status_sync_duration_seconds", "[ALPHA] Duration ...");
///     }
/// }
/// ```
macro_rules! metric_families {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field_vis:vis $field:ident : $ty:ty = $init:expr, ($metric:literal, $help:literal);
            )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$field_meta])* $field_vis $field: $ty, )*
        }

        impl $name {
            /// Creates the families and registers them into `registry` (the `/metrics` one).
            pub fn new(registry: &mut ::prometheus_client::registry::Registry) -> Self {
                let m = Self::default();
                $( registry.register($metric, $help, m.$field.clone()); )*
                m
            }
        }

        impl Default for $name {
            /// Families registered nowhere (tests, or when metrics are off).
            fn default() -> Self {
                Self { $( $field: $init, )* }
            }
        }
    };
}
pub(crate) use metric_families;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_go_writes_them() {
        for (v, go) in [
            (5.0, "5"),
            (0.005, "0.005"),
            (3600.0, "3600"),
            (100_000.0, "100000"),
            (1e6, "1e+06"),
            (1_234_567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00005, "5e-05"),
            (2.5, "2.5"),
            (-1.0, "-1"),
            (0.0, "0"),
        ] {
            assert_eq!(go_float(v), go, "{v}");
        }
        let text =
            "# TYPE h histogram\nh_bucket{le=\"5.0\"} 1\nh_bucket{op=\"x\",le=\"+Inf\"} 2\ns{quantile=\"0.5\"} 1\n";
        assert_eq!(
            with_upstream_counter_names(text),
            "# TYPE h histogram\nh_bucket{le=\"5\"} 1\nh_bucket{op=\"x\",le=\"+Inf\"} 2\ns{quantile=\"0.5\"} 1\n"
        );
    }

    #[test]
    fn openmetrics_keeps_upstream_names_of_counters_without_total() {
        let text = "# HELP kubelet_evictions x.\n# TYPE kubelet_evictions counter\nkubelet_evictions_total{eviction_signal=\"memory.available\"} 2\nkubelet_evictions_created{eviction_signal=\"memory.available\"} 1.5e9\n# EOF\n";
        assert_eq!(
            openmetrics_with_upstream_counter_names(text),
            "# HELP kubelet_evictions x.\n# TYPE kubelet_evictions unknown\nkubelet_evictions{eviction_signal=\"memory.available\"} 2\n# EOF\n"
        );
    }

    #[test]
    fn counters_without_total_keep_upstream_names() {
        let text = "# HELP kubelet_pleg_discard_events_total [ALPHA] x.\n# TYPE kubelet_pleg_discard_events_total counter\nkubelet_pleg_discard_events_total 3\nkubelet_pleg_discard_events_totalx 1\nkubelet_started_pods_total 2\n";
        assert_eq!(
            with_upstream_counter_names(text),
            "# HELP kubelet_pleg_discard_events [ALPHA] x.\n# TYPE kubelet_pleg_discard_events counter\nkubelet_pleg_discard_events 3\nkubelet_pleg_discard_events_totalx 1\nkubelet_started_pods_total 2\n"
        );
    }

    #[test]
    fn runtime_buckets_match_upstream() {
        let b = exponential_buckets(0.005, 2.5, 14);
        assert_eq!(b.len(), 14);
        assert!((b[13] - 0.005 * 2.5f64.powi(13)).abs() < 1e-9);
    }
}
