//! Graceful node shutdown's metric families: upstream's
//! `kubelet_graceful_shutdown_start_time_seconds` and
//! `kubelet_graceful_shutdown_end_time_seconds` (upstream's help text of both says
//! "start"), set by [`super::Manager`].

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The graceful node shutdown families.
#[derive(Debug)]
pub struct ShutdownMetrics {
    /// `kubelet_graceful_shutdown_start_time_seconds`: when the last shutdown started, Unix seconds.
    pub graceful_shutdown_start_time: Gauge<f64, AtomicU64>,
    /// `kubelet_graceful_shutdown_end_time_seconds`: when the last shutdown ended, Unix seconds.
    pub graceful_shutdown_end_time: Gauge<f64, AtomicU64>,
}

impl ShutdownMetrics {
    /// Creates the families and registers them into `registry` (the `/metrics` one).
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        // Upstream's help of both says "start".
        registry.register(
            "kubelet_graceful_shutdown_start_time_seconds",
            "[ALPHA] Last graceful shutdown start time since unix epoch in seconds",
            m.graceful_shutdown_start_time.clone(),
        );
        registry.register(
            "kubelet_graceful_shutdown_end_time_seconds",
            "[ALPHA] Last graceful shutdown start time since unix epoch in seconds",
            m.graceful_shutdown_end_time.clone(),
        );
        m
    }
}

impl Default for ShutdownMetrics {
    /// Families registered nowhere (tests, or when metrics are off).
    fn default() -> Self {
        Self { graceful_shutdown_start_time: Gauge::default(), graceful_shutdown_end_time: Gauge::default() }
    }
}
