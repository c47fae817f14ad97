//! Graceful node shutdown's metric families: upstream's
//! `kubelet_graceful_shutdown_start_time_seconds` and
//! `kubelet_graceful_shutdown_end_time_seconds` (upstream's help text of both says
//! "start"), set by [`super::Manager`].

use std::sync::atomic::AtomicU64;

use crate::metrics::metric_families;
use prometheus_client::metrics::gauge::Gauge;

metric_families! {
    /// The graceful node shutdown families.
    #[derive(Debug)]
    pub struct ShutdownMetrics {
        /// `kubelet_graceful_shutdown_start_time_seconds`: when the last shutdown started, Unix seconds.
        pub graceful_shutdown_start_time: Gauge<f64, AtomicU64> = Gauge::default(),
            ("kubelet_graceful_shutdown_start_time_seconds", "[ALPHA] Last graceful shutdown start time since unix epoch in seconds");
        /// `kubelet_graceful_shutdown_end_time_seconds`: when the last shutdown ended, Unix seconds.
        pub graceful_shutdown_end_time: Gauge<f64, AtomicU64> = Gauge::default(),
            ("kubelet_graceful_shutdown_end_time_seconds", "[ALPHA] Last graceful shutdown start time since unix epoch in seconds");
    }
}
