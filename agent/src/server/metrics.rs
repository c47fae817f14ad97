//! The HTTPS API's metric families: upstream's `kubelet_http_requests_total`,
//! `kubelet_http_inflight_requests` and `kubelet_http_requests_duration_seconds`, all by
//! `method`, `path`, `server_type` and `long_running`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::{HistogramFamily, def_histogram, metric_families};

/// Label set of the `kubelet_http_*` families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub path: String,
    pub server_type: String,
    pub long_running: String,
}

metric_families! {
    /// The HTTP server families.
    #[derive(Debug)]
    pub struct HttpMetrics {
        /// `kubelet_http_requests_total`: requests received.
        pub http_requests: Family<HttpLabels, Counter> = Family::default(),
            ("kubelet_http_requests", "[ALPHA] Number of the http requests received since the server started");
        /// `kubelet_http_inflight_requests`: requests being served.
        pub http_inflight_requests: Family<HttpLabels, Gauge> = Family::default(),
            ("kubelet_http_inflight_requests", "[ALPHA] Number of the inflight http requests");
        /// `kubelet_http_requests_duration_seconds`: how long requests took.
        pub http_requests_duration: HistogramFamily<HttpLabels> = Family::new_with_constructor(def_histogram),
            ("kubelet_http_requests_duration_seconds", "[ALPHA] Duration in seconds to serve http requests");
    }
}
