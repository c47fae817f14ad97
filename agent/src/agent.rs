//! Wiring: builds every subsystem from a [`Config`] and runs them until shutdown
//! (upstream `cmd/kubelet/app` + `Kubelet.Run`). One cancellation token stops every
//! task; tasks are tracked and given a grace period to finish. Stopping the agent
//! leaves pods running, as the kubelet does: a restart adopts them.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::cm::{CgroupConfig, CgroupfsPodContainerManager, PodContainerManager};
use crate::config::Config;
use crate::events::{EventRecorder, MemoryRecorder};
use crate::metrics::KubeletMetrics;
use crate::pleg::PodLifecycleEventGenerator;
use crate::pleg::relist::{GenericPleg, RELIST_PERIOD, RELIST_THRESHOLD};
use crate::pod_manager::PodManager;
use crate::pod_workers::{PodWorkers, SyncDeps};
use crate::runtime::manager::RuntimeManagerConfig;
use crate::runtime::{Backoff, RemoteRuntime, RuntimeManager, RuntimeService};
use crate::server::{Endpoints, HealthCheck, PodsProvider, Server, ServerSettings};
use crate::sources::file::FileSource;
use crate::sources::{FILE_SOURCE, PodUpdate};
use crate::status::{StatusManager, StatusProvider};
use crate::sync_loop::SyncLoop;

/// How long tasks get to finish after shutdown is asked.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long the agent waits for the container runtime at start.
const RUNTIME_WAIT: Duration = Duration::from_mins(1);

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "API server mode (--kubeconfig {0}) is not supported by this swiftlet version yet; run without --kubeconfig for standalone static pods"
    )]
    ApiServerMode(String),
    #[error("container runtime at {endpoint} is not reachable: {source}")]
    Runtime {
        endpoint: String,
        #[source]
        source: crate::runtime::Error,
    },
    #[error("container manager: {0}")]
    ContainerManager(#[from] crate::cm::Error),
    #[error("cgroups: {0}")]
    Cgroups(#[from] crate::cm::cgroupfs::Error),
    #[error("server: {0}")]
    Server(#[from] crate::server::Error),
}

/// `/pods`: desired pods with their latest status, as the kubelet serves them.
#[derive(Debug)]
struct PodsView {
    manager: PodManager,
    status: Arc<StatusManager>,
}

impl PodsProvider for PodsView {
    fn pods(&self) -> Vec<Pod> {
        self.manager
            .pods()
            .into_iter()
            .map(|mut p| {
                if let Some(s) = p.metadata.uid.as_deref().and_then(|u| self.status.get(u)) {
                    p.status = Some(s);
                }
                p
            })
            .collect()
    }
}

/// `/healthz` check `pleg`.
#[derive(Debug)]
struct PlegHealth(GenericPleg);

impl HealthCheck for PlegHealth {
    fn name(&self) -> &'static str {
        "pleg"
    }

    fn check(&self) -> Result<(), String> {
        self.0.healthy()
    }
}

async fn connect_runtime(rt: &RemoteRuntime, endpoint: &str, shutdown: &CancellationToken) -> Result<String, Error> {
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

/// Runs the agent until `shutdown` is cancelled.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), Error> {
    if let Some(k) = &cfg.kubeconfig {
        return Err(Error::ApiServerMode(k.display().to_string()));
    }
    let kc = &cfg.kubelet;
    tracing::info!(node = %cfg.node_name, config = ?cfg.config_file, "starting swiftlet (standalone: static pods only)");
    let mut registry = Registry::default();
    let metrics = Arc::new(KubeletMetrics::new(&mut registry, &cfg.node_name));

    let endpoint = kc.container_runtime_endpoint.clone();
    let remote = RemoteRuntime::new(&endpoint, kc.runtime_request_timeout.to_std(), metrics.clone())
        .map_err(|source| Error::Runtime { endpoint: endpoint.clone(), source })?;
    let runtime_name = connect_runtime(&remote, &endpoint, &shutdown).await?;
    let rt: Arc<dyn RuntimeService> = Arc::new(remote);

    let cm: Arc<dyn PodContainerManager> = Arc::new(CgroupfsPodContainerManager::new(CgroupConfig {
        cgroup_root: if kc.cgroup_root.is_empty() { "/".into() } else { kc.cgroup_root.clone() },
        cgroups_per_qos: kc.cgroups_per_qos,
        cgroup_driver: kc.cgroup_driver.clone(),
        pod_pids_limit: kc.pod_pids_limit,
        cpu_cfs_quota: kc.cpu_cfs_quota,
        ..CgroupConfig::default()
    })?);
    cm.ensure_node_cgroups()?;

    let recorder = Arc::new(MemoryRecorder::new(&cfg.node_name));
    let crash_max = kc
        .crash_loop_back_off
        .max_container_restart_period
        .map_or(crate::runtime::backoff::MAX, crate::config::GoDuration::to_std);
    let runtime = Arc::new(RuntimeManager::new(
        rt.clone(),
        cm.clone(),
        metrics.clone(),
        RuntimeManagerConfig {
            pod_logs_dir: kc.pod_logs_dir.clone().into(),
            root_dir: cfg.root_dir.clone(),
            node_name: cfg.node_name.clone(),
            host_ip: cfg.node_ip.clone(),
        },
        Backoff::new(
            crate::runtime::backoff::INITIAL.min(crash_max),
            crash_max,
            Arc::new(crate::runtime::backoff::SystemClock),
        ),
        Backoff::default(),
    ));
    let status = Arc::new(StatusManager::default());
    let sources: Vec<&'static str> = if kc.static_pod_path.is_empty() { vec![] } else { vec![FILE_SOURCE] };
    let pod_manager = PodManager::new(&sources);
    let tracker = TaskTracker::new();
    let workers = PodWorkers::new(
        Arc::new(SyncDeps {
            runtime: runtime.clone(),
            cm: cm.clone(),
            status: status.clone(),
            metrics: metrics.clone(),
            recorder: recorder.clone() as Arc<dyn EventRecorder>,
            runtime_name,
            sync_frequency: kc.sync_frequency.to_std(),
            host_ip: cfg.node_ip.clone(),
        }),
        tracker.clone(),
        shutdown.clone(),
    );
    let pleg = GenericPleg::new(rt.clone(), metrics.clone(), RELIST_PERIOD, RELIST_THRESHOLD);

    let events_view = recorder.clone();
    let endpoints = Endpoints::new(
        Arc::new(PodsView { manager: pod_manager.clone(), status: status.clone() }),
        Arc::new(registry),
    )
    .health_check(Arc::new(PlegHealth(pleg.clone())))
    .route(
        "/events",
        get(move || {
            let items = events_view.list();
            async move {
                Json(serde_json::json!({"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}))
            }
        }),
    );
    let server = Server::new(ServerSettings::from_config(&cfg)?, endpoints)?;

    let (update_tx, update_rx) = mpsc::channel::<PodUpdate>(16);
    let (pleg_tx, pleg_rx) = mpsc::channel(1000);
    if !kc.static_pod_path.is_empty() {
        let src = FileSource::new(
            kc.static_pod_path.clone().into(),
            cfg.node_name.clone(),
            kc.file_check_frequency.to_std(),
            recorder.clone(),
        );
        tracker.spawn(src.run(update_tx.clone(), shutdown.clone()).instrument(tracing::info_span!("static_pods")));
    }
    drop(update_tx);
    tracker.spawn(pleg.clone().run(pleg_tx, shutdown.clone()).instrument(tracing::info_span!("pleg")));
    let sync_loop = SyncLoop { pod_manager, workers, pleg, runtime, cm, metrics };
    tracker.spawn(sync_loop.run(update_rx, pleg_rx, shutdown.clone()).instrument(tracing::info_span!("sync_loop")));
    let server_shutdown = shutdown.clone();
    let server_task =
        tokio::spawn(async move { server.run(server_shutdown).await }.instrument(tracing::info_span!("server")));

    let server_result = tokio::select! {
        () = shutdown.cancelled() => None,
        r = server_task => Some(r),
    };
    shutdown.cancel();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait()).await.is_err() {
        tracing::warn!("some tasks did not stop within {SHUTDOWN_GRACE:?}");
    }
    if let Some(Ok(Err(e))) = server_result {
        return Err(e.into());
    }
    tracing::info!("swiftlet stopped");
    Ok(())
}
