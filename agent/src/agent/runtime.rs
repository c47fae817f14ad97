//! The container runtime at start: connected (waited for), and its state read once.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Error;
use crate::config::Config;
use crate::container::metrics::RuntimeOperationMetrics;
use crate::container::{RemoteRuntime, RuntimeService};

/// How long the agent waits for the container runtime at start.
pub(super) const RUNTIME_WAIT: Duration = Duration::from_mins(1);

pub(super) async fn wait_for(
    rt: &RemoteRuntime,
    endpoint: &str,
    shutdown: &CancellationToken,
) -> Result<String, Error> {
    let deadline = tokio::time::Instant::now() + RUNTIME_WAIT;
    loop {
        match rt.version().await {
            Ok(v) => {
                tracing::info!(runtime = %v.runtime_name, version = %v.runtime_version, api = %v.runtime_api_version, "connected to the container runtime");
                return Ok(v.runtime_name);
            }
            Err(e) if tokio::time::Instant::now() >= deadline || shutdown.is_cancelled() => {
                return Err(Error::Runtime { endpoint: endpoint.to_string(), source: e });
            }
            Err(e) => {
                tracing::warn!(%endpoint, error = %e, "waiting for the container runtime");
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// The container runtime, once it answers: the client, its name, and its state (its
/// readiness, network readiness and features, asked now and every 5 s once spawned).
pub(super) async fn connect(
    cfg: &Config,
    metrics: &Arc<RuntimeOperationMetrics>,
    shutdown: &CancellationToken,
) -> Result<(Arc<dyn RuntimeService>, String, Arc<crate::container::runtime_state::RuntimeState>), Error> {
    let kc = &cfg.kubelet;
    let endpoint = kc.container_runtime_endpoint.clone();
    let remote = RemoteRuntime::new(&endpoint, kc.runtime_request_timeout.to_std(), metrics.clone())
        .map_err(|source| Error::Runtime { endpoint: endpoint.clone(), source })?;
    let runtime_name = wait_for(&remote, &endpoint, shutdown).await?;
    let rt: Arc<dyn RuntimeService> = Arc::new(remote);
    let runtime_state = Arc::new(crate::container::runtime_state::RuntimeState::default());
    runtime_state.update(rt.as_ref()).await;
    Ok((rt, runtime_name, runtime_state))
}

/// The Kubernetes release upstream names in `kubelet_cri_losing_support` (1.37's).
const CRI_LOSING_SUPPORT_VERSION: &str = "1.38.0";

/// The cgroup driver to run with ([`crate::container::cgroup_driver`]), logged as upstream;
/// a runtime without `RuntimeConfig` sets `kubelet_cri_losing_support`, as upstream's does.
pub(super) async fn cgroup_driver(
    rt: &dyn RuntimeService,
    configured: &str,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<String, Error> {
    use crate::container::cgroup_driver::{Source, detect};
    use prometheus_client::metrics::{family::Family, gauge::Gauge};
    let (driver, source) = detect(rt, configured).await.map_err(Error::CgroupDriver)?;
    if source.runtime_config_unimplemented() {
        let losing = Family::<Vec<(String, String)>, Gauge>::default();
        losing.get_or_create(&vec![("version".to_owned(), CRI_LOSING_SUPPORT_VERSION.to_owned())]).inc();
        registry.register(
            "kubelet_cri_losing_support",
            "[ALPHA] the Kubernetes version that the currently running CRI implementation will lose support on if \
             not upgraded.",
            losing,
        );
    }
    let said = match source {
        Source::Runtime => "Using cgroup driver setting received from the CRI runtime",
        Source::ConfigNoLinux => "the CRI runtime's configuration has no cgroup driver; using cgroupDriver",
        Source::ConfigChecked => "cgroupDriver matches the container runtime's configuration",
        Source::Config => {
            "CRI implementation should be updated to support RuntimeConfig. Falling back to using cgroupDriver from \
             kubelet config."
        }
    };
    tracing::info!(cgroup_driver = %driver, "{said}");
    Ok(driver)
}
