//! Content negotiation for the metrics endpoints, after the Go client: `Accept` picks
//! Prometheus text 0.0.4 or `OpenMetrics` text (`expfmt.NegotiateIncludingOpenMetrics`
//! over `goautoneg.ParseAccept`), `Accept-Encoding` picks gzip (promhttp).

use std::io::Write as _;

use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::registry::Registry;

/// An exposition format the metrics endpoints serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MetricsFormat {
    /// Prometheus text 0.0.4: the default, and all the upstream kubelet serves.
    PrometheusText,
    /// `OpenMetrics` text 1.0.0.
    OpenMetrics1,
    /// `OpenMetrics` text asked for as 0.0.1 (or without a version): the same text, under
    /// the version asked for, as the Go client answers.
    OpenMetrics0,
}

impl MetricsFormat {
    /// The `Content-Type` of a response in this format (the Go client's).
    pub(super) fn content_type(self) -> &'static str {
        match self {
            Self::PrometheusText => prometheus_text::CONTENT_TYPE,
            Self::OpenMetrics1 => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::OpenMetrics0 => "application/openmetrics-text; version=0.0.1; charset=utf-8",
        }
    }

    /// Encodes `registry` into `out`; `OpenMetrics` ends with `# EOF`.
    pub(super) fn encode(self, out: &mut String, registry: &Registry) -> std::fmt::Result {
        match self {
            Self::PrometheusText => {
                let mut text = String::new();
                prometheus_text::encode(&mut text, registry)?;
                // Upstream's few counters without `_total` keep their names; `le` as Go writes it.
                crate::metrics::write_with_upstream_counter_names(out, &text);
                Ok(())
            }
            Self::OpenMetrics1 | Self::OpenMetrics0 => {
                let mut text = String::new();
                text::encode(&mut text, registry)?;
                crate::metrics::write_openmetrics_with_upstream_counter_names(out, &text);
                Ok(())
            }
        }
    }
}

/// One media range of an `Accept` header.
#[derive(Debug)]
struct MediaRange<'a> {
    kind: String,
    subtype: String,
    version: Option<&'a str>,
    q: f32,
}

/// The ranges of `accept`, best first: by falling `q`, then concrete types before
/// wildcards (`goautoneg.ParseAccept`'s order; ties keep the header's order). Ranges with
/// `q=0` are not acceptable and left out.
fn parse_accept(accept: &str) -> Vec<MediaRange<'_>> {
    let mut ranges: Vec<MediaRange<'_>> = accept
        .split(',')
        .filter_map(|part| {
            let mut pieces = part.split(';');
            let media = pieces.next()?.trim();
            let (kind, subtype) = match media.split_once('/') {
                Some((kind, subtype)) => (kind.trim(), subtype.trim()),
                None if media == "*" => ("*", "*"),
                None => return None,
            };
            let mut range = MediaRange {
                kind: kind.to_ascii_lowercase(),
                subtype: subtype.to_ascii_lowercase(),
                version: None,
                q: 1.0,
            };
            for param in pieces {
                let Some((key, value)) = param.split_once('=') else { continue };
                match key.trim() {
                    "q" => range.q = value.trim().parse().unwrap_or(0.0),
                    "version" => range.version = Some(value.trim().trim_matches('"')),
                    _ => {}
                }
            }
            Some(range)
        })
        .filter(|range| range.q > 0.0)
        .collect();
    ranges.sort_by(|a, b| {
        b.q.total_cmp(&a.q)
            .then_with(|| (a.kind == "*").cmp(&(b.kind == "*")))
            .then_with(|| (a.subtype == "*").cmp(&(b.subtype == "*")))
    });
    ranges
}

/// The format for a request's `Accept` header (empty when absent).
pub(super) fn negotiate(accept: &str) -> MetricsFormat {
    for range in parse_accept(accept) {
        match (range.kind.as_str(), range.subtype.as_str(), range.version) {
            ("text", "plain", None | Some("0.0.4")) => return MetricsFormat::PrometheusText,
            ("application", "openmetrics-text", Some("1.0.0")) => return MetricsFormat::OpenMetrics1,
            ("application", "openmetrics-text", None | Some("0.0.1")) => return MetricsFormat::OpenMetrics0,
            _ => {}
        }
    }
    MetricsFormat::PrometheusText
}

/// Whether `Accept-Encoding` allows gzip (listed, and not with `q=0`).
pub(super) fn accepts_gzip(accept_encoding: &str) -> bool {
    accept_encoding.split(',').any(|part| {
        let mut pieces = part.split(';');
        let coding = pieces.next().unwrap_or_default().trim();
        let q = pieces
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim() == "q")
            .map_or(1.0, |(_, v)| v.trim().parse::<f32>().unwrap_or(0.0));
        coding.eq_ignore_ascii_case("gzip") && q > 0.0
    })
}

/// `data` gzip-compressed at the fastest level.
pub(super) fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder =
        flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 8 + 64), flate2::Compression::fast());
    encoder.write_all(data)?;
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use super::MetricsFormat::{OpenMetrics0, OpenMetrics1, PrometheusText};
    use super::*;

    #[test]
    fn accept_negotiation_follows_the_go_client() {
        let cases = [
            ("", PrometheusText),
            ("*/*", PrometheusText),
            ("text/plain", PrometheusText),
            ("text/plain;version=0.0.4", PrometheusText),
            ("application/openmetrics-text; version=1.0.0", OpenMetrics1),
            ("application/openmetrics-text;version=0.0.1", OpenMetrics0),
            ("application/openmetrics-text", OpenMetrics0),
            // An unknown version is passed over.
            ("application/openmetrics-text;version=2.0.0,text/plain;q=0.1", PrometheusText),
            // Prometheus 2.42's default scrape header.
            (
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                 text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                OpenMetrics1,
            ),
            // Prometheus with OpenMetrics turned off, and a q that prefers text.
            ("text/plain;version=0.0.4;q=1,*/*;q=0.1", PrometheusText),
            ("application/openmetrics-text;version=1.0.0;q=0.2,text/plain;q=0.9", PrometheusText),
            // Protobuf is not offered: the next acceptable range wins.
            (
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,\
                 application/openmetrics-text;version=1.0.0;q=0.8",
                OpenMetrics1,
            ),
            ("application/openmetrics-text;version=1.0.0;q=0", PrometheusText),
            ("Application/OpenMetrics-Text; version=1.0.0", OpenMetrics1),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn gzip_when_accepted() {
        for yes in ["gzip", "deflate, gzip", "gzip;q=0.5", "br, GZIP ;q=1"] {
            assert!(accepts_gzip(yes), "{yes}");
        }
        for no in ["", "identity", "deflate, br", "gzip;q=0", "x-gzip2"] {
            assert!(!accepts_gzip(no), "{no}");
        }
    }

    #[test]
    fn openmetrics_ends_with_eof_and_text_does_not() {
        let mut registry = Registry::default();
        registry.register(
            "up_things",
            "Things that are up",
            prometheus_client::metrics::gauge::Gauge::<i64>::default(),
        );
        let mut text = String::new();
        PrometheusText.encode(&mut text, &registry).unwrap();
        assert!(!text.contains("# EOF"), "{text}");
        let mut open = String::new();
        OpenMetrics1.encode(&mut open, &registry).unwrap();
        assert!(open.ends_with("# EOF\n"), "{open}");
        assert_eq!(OpenMetrics1.content_type(), "application/openmetrics-text; version=1.0.0; charset=utf-8");
        assert_eq!(PrometheusText.content_type(), "text/plain; version=0.0.4; charset=utf-8");
    }
}
