//! The stats endpoints' provider and handlers: `/stats/summary`, `/metrics/resource` and
//! `/metrics/cadvisor`, all served from the one [`crate::stats::provider::StatsProvider`].

use std::sync::Arc;

use axum::Json;

use crate::cm::PodContainerManager;
use crate::config::Config;
use crate::container::RuntimeService;
use crate::pod_manager::PodManager;
use crate::stats::metrics::VolumeStatMetrics;

/// The stats provider, or `None` when the cgroup hierarchies cannot be found (the stats
/// endpoints then say so).
pub(super) fn stats_provider(
    cfg: &Config,
    rt: Arc<dyn RuntimeService>,
    pods: PodManager,
    cm: Arc<dyn PodContainerManager>,
    volumes: Arc<crate::volumes::VolumeManager>,
    container_changes: Arc<std::sync::atomic::AtomicU64>,
    metrics: Arc<VolumeStatMetrics>,
) -> Option<Arc<crate::stats::provider::StatsProvider>> {
    use crate::stats::{CgroupHierarchies, Collector, CollectorConfig};
    let kc = &cfg.kubelet;
    let hierarchies = match CgroupHierarchies::detect(std::path::Path::new("/sys/fs/cgroup")) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "no cgroup hierarchies for stats; /stats/summary and /metrics/resource are off");
            return None;
        }
    };
    let settings = crate::settings::stats(cfg);
    let mut config = CollectorConfig::new(hierarchies);
    config.metrics = Some(metrics);
    // volumeStatsAggPeriod paces every disk usage walk (volumes, writable layers, logs).
    config.fs_usage.interval = kc.volume_stats_agg_period.to_std();
    let collector = Collector::new(config);
    Some(Arc::new(
        crate::stats::provider::StatsProvider::new(settings, collector, rt, pods, cm, volumes)
            .with_housekeeping(crate::stats::provider::HOUSEKEEPING_INTERVAL)
            .with_container_changes(container_changes),
    ))
}

pub(super) type StatsState = Option<Arc<crate::stats::provider::StatsProvider>>;

/// `/stats/summary[?only_cpu_and_memory=true]`.
pub(super) async fn summary_handler(
    axum::extract::State(stats): axum::extract::State<StatsState>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let unavailable = |why: String| (http::StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    let Some(stats) = stats else { return unavailable("stats are not available on this node\n".into()) };
    match stats.collection().await {
        Ok(c) => {
            let summary = if crate::stats::only_cpu_and_memory(query.as_deref()) {
                c.cpu_and_memory_summary()
            } else {
                c.summary()
            };
            Json(summary).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "collecting stats");
            (http::StatusCode::INTERNAL_SERVER_ERROR, format!("failed to get node info: {e}\n")).into_response()
        }
    }
}

/// `/metrics/resource`: `scrape_error 1` when the stats cannot be collected.
pub(super) async fn resource_metrics_handler(
    axum::extract::State(stats): axum::extract::State<StatsState>,
    headers: http::HeaderMap,
) -> axum::response::Response {
    let text = match &stats {
        Some(s) => match s.collection().await {
            Ok(c) => c.resource_metrics(),
            Err(e) => {
                tracing::warn!(error = %e, "collecting stats");
                crate::stats::resource_metrics::render(None)
            }
        },
        None => crate::stats::resource_metrics::render(None),
    };
    crate::server::metrics_response(&headers, crate::stats::resource_metrics::CONTENT_TYPE, text)
}

/// `/metrics/cadvisor`: the cAdvisor families from the same collection.
pub(super) async fn cadvisor_handler(
    axum::extract::State(stats): axum::extract::State<StatsState>,
    headers: http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let Some(stats) = stats else {
        return (http::StatusCode::SERVICE_UNAVAILABLE, "stats are not available on this node\n").into_response();
    };
    match stats.collection().await {
        Ok(c) => crate::server::metrics_response(
            &headers,
            crate::stats::resource_metrics::CONTENT_TYPE,
            c.cadvisor_metrics(),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "collecting stats");
            (http::StatusCode::INTERNAL_SERVER_ERROR, format!("failed to collect stats: {e}\n")).into_response()
        }
    }
}
