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
use crate::config::{Config, KubeletConfiguration};
use crate::container::{Backoff, RemoteRuntime, RuntimeService};
use crate::event_api::{EventApiServer, EventBus, NodeEvent, NodeEventKind};
use crate::events::{EventRecorder, MemoryRecorder};
use crate::metrics::KubeletMetrics;
use crate::pleg::PodLifecycleEventGenerator;
use crate::pleg::evented::{CgroupIndex, EventedPleg, Observed, ObservedKind, ObservedSink};
use crate::pleg::relist::{GenericPleg, RELIST_PERIOD, RELIST_THRESHOLD};
use crate::pod_manager::PodManager;
use crate::pod_workers::{PodWorkers, SyncDeps};
use crate::runtime::RuntimeManager;
use crate::runtime::manager::RuntimeManagerConfig;
use crate::server::{Endpoints, HealthCheck, PodsProvider, Server, ServerSettings};
use crate::sources::PodUpdate;
use crate::sources::file::FileSource;
use crate::status::{StatusManager, StatusProvider};
use crate::sync_loop::SyncLoop;
use crate::types::pod::FILE_SOURCE;

/// How long tasks get to finish after shutdown is asked. SIGTERM must end the agent
/// within 2 s (pods are left running, as the kubelet leaves them); this, the span
/// export's [`crate::telemetry::SHUTDOWN_TIMEOUT`] and the blocking pool's wait in `main`
/// fit in that.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// How long the agent waits for the container runtime at start.
const RUNTIME_WAIT: Duration = Duration::from_mins(1);

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("client certificate: {0}")]
    Certificate(#[from] crate::certificate::Error),
    #[error("container runtime at {endpoint} is not reachable: {source}")]
    Runtime {
        endpoint: String,
        #[source]
        source: crate::container::Error,
    },
    #[error("container manager: {0}")]
    ContainerManager(#[from] crate::cm::Error),
    #[error("cgroups: {0}")]
    Cgroups(#[from] crate::cm::cgroupfs::Error),
    #[error("server: {0}")]
    Server(#[from] crate::server::Error),
    #[error("event API: {0}")]
    EventApi(#[from] crate::event_api::Error),
    #[error("{0}")]
    Eviction(#[from] crate::eviction::thresholds::Errors),
    #[error("device manager: {0}")]
    DeviceManager(#[from] crate::cm::devicemanager::Error),
    #[error("pod allocations: {0}")]
    Allocation(#[from] crate::allocation::Error),
    #[error("{0}")]
    ResourceManagers(#[from] crate::cm::resource_managers::Error),
    /// `rotateCertificates`: the client certificate expired and no new one could be had
    /// (upstream exits here too, so that a restart bootstraps new credentials).
    #[error(
        "no valid client certificate for {0:?} and none could be obtained; exiting so that a restart can \
         bootstrap new credentials"
    )]
    CredentialsLapsed(Duration),
}

/// A task's reason for the agent to stop with an error: it ends the agent through the
/// shutdown token (every task drains, spans are exported) and [`run`] returns it, so
/// that `main` exits non-zero; nothing calls `process::exit` from a task.
#[derive(Debug, Clone)]
struct Fatal {
    reason: Arc<std::sync::Mutex<Option<Error>>>,
    shutdown: CancellationToken,
}

impl Fatal {
    fn new(shutdown: CancellationToken) -> Self {
        Self { reason: Arc::default(), shutdown }
    }

    /// Stops the agent with `reason` (the first reason given wins).
    fn fail(&self, reason: Error) {
        tracing::error!(error = %reason, "stopping the agent");
        self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(reason);
        self.shutdown.cancel();
    }

    fn take(&self) -> Option<Error> {
        self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// `/pods`: desired pods with their latest status, as the kubelet serves them.
#[derive(Debug)]
struct PodsView {
    manager: PodManager,
    status: Arc<dyn StatusProvider>,
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

/// `/healthz` check `pleg`; its note says which PLEG runs and, for a fallback, why.
#[derive(Debug)]
struct PlegHealth(Arc<dyn PodLifecycleEventGenerator>);

impl HealthCheck for PlegHealth {
    fn name(&self) -> &'static str {
        "pleg"
    }

    fn check(&self) -> Result<(), String> {
        self.0.healthy()
    }

    fn detail(&self) -> Option<String> {
        Some(self.0.describe())
    }
}

/// The stats provider, or `None` when the cgroup hierarchies cannot be found (the stats
/// endpoints then say so).
fn stats_provider(
    cfg: &Config,
    rt: Arc<dyn RuntimeService>,
    pods: PodManager,
    cm: Arc<dyn PodContainerManager>,
    volumes: Arc<crate::volumes::VolumeManager>,
    container_changes: Arc<std::sync::atomic::AtomicU64>,
    metrics: Arc<KubeletMetrics>,
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
    let root = if kc.cgroup_root.is_empty() || kc.cgroup_root == "/" { String::new() } else { kc.cgroup_root.clone() };
    let settings = crate::stats::provider::StatsSettings {
        node_name: cfg.node_name.clone(),
        root_dir: cfg.root_dir.clone(),
        pod_logs_dir: kc.pod_logs_dir.clone().into(),
        pods_cgroup: kc.cgroups_per_qos.then(|| format!("{root}/kubepods")),
    };
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

type StatsState = Option<Arc<crate::stats::provider::StatsProvider>>;

/// `/stats/summary[?only_cpu_and_memory=true]`.
async fn summary_handler(
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
async fn resource_metrics_handler(
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
async fn cadvisor_handler(
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

/// What the container GC needs to know of pods: gone = neither desired nor being worked on.
#[derive(Debug)]
struct GcPods {
    manager: PodManager,
    workers: crate::pod_workers::PodWorkers,
}

impl crate::gc::PodPresence for GcPods {
    fn sources_ready(&self) -> bool {
        self.manager.sources_ready()
    }

    fn is_gone(&self, pod_uid: &str) -> bool {
        self.manager.get(pod_uid).is_none() && !self.workers.known_uids().contains(pod_uid)
    }
}

/// Publishes what the evented PLEG observed on the node event API, with the pod's and
/// container's names.
/// A container's first exec also goes into its pod's start trace.
fn observed_sink(
    bus: EventBus,
    pods: PodManager,
    cache: Arc<crate::container::cache::RuntimeCache>,
    startup: Arc<crate::pod_startup::PodStartupTracker>,
) -> ObservedSink {
    // Runs for every kernel event: looks up the two names, copies neither the pod nor the
    // runtime's pods.
    Arc::new(move |o: Observed| {
        let (pod_namespace, pod_name) = pods.namespace_and_name(&o.pod_uid).unwrap_or_default();
        let container_name = if o.container_name.is_empty() {
            cache.container_name(&o.pod_uid, &o.container_id).unwrap_or_default()
        } else {
            o.container_name.clone()
        };
        if o.kind == ObservedKind::ContainerStarted {
            startup.first_exec(
                &o.pod_uid,
                &container_name,
                &o.container_id,
                crate::container::exits::wall_time_of(o.kernel_time_ns),
            );
        }
        let kind = match o.kind {
            ObservedKind::ContainerStarted => NodeEventKind::ContainerStarted,
            ObservedKind::ContainerDied => NodeEventKind::ContainerDied,
            ObservedKind::OomKilled => NodeEventKind::ContainerOomKilled,
            ObservedKind::CgroupCreated => NodeEventKind::CgroupCreated,
            ObservedKind::CgroupRemoved => NodeEventKind::CgroupRemoved,
            ObservedKind::MemoryPressure => NodeEventKind::MemoryPressure,
        };
        bus.publish(NodeEvent {
            pod_uid: o.pod_uid,
            pod_namespace,
            pod_name,
            container_id: o.container_id,
            container_name,
            kernel_time_ns: Some(o.kernel_time_ns),
            exit_code: o.exit_code,
            signal: o.signal,
            oom_killed: o.kind == ObservedKind::OomKilled,
            ..NodeEvent::new(kind)
        });
    })
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

/// The node manager's settings from the configuration.
fn node_settings(cfg: &Config, node_ip: Option<std::net::IpAddr>) -> crate::node::NodeSettings {
    let kc = &cfg.kubelet;
    crate::node::NodeSettings {
        node_name: cfg.node_name.clone(),
        // As upstream: the hostname is --hostname-override when given (which is also
        // the node name without a cloud provider).
        hostname: cfg.node_name.clone(),
        node_ip,
        labels: cfg.node_labels.clone(),
        taints: kc.register_with_taints.clone(),
        max_pods: kc.max_pods,
        port: kc.port,
        kube_reserved: kc.kube_reserved.clone(),
        system_reserved: kc.system_reserved.clone(),
        eviction_hard: kc.eviction_hard.clone(),
        update_frequency: kc.node_status_update_frequency.to_std(),
        report_frequency: kc.node_status_report_frequency.to_std(),
        lease_duration_secs: kc.node_lease_duration_seconds,
        kubelet_version: format!("v1.37.0-swiftlet.{}", env!("CARGO_PKG_VERSION")),
    }
}

/// The agent's clients of the API server, built from one kubeconfig as upstream builds
/// its three (`cmd/kubelet/app/server.go`): pods, pod status, mirror pods, volumes' objects
/// and webhook reviews go through `main`, limited by `kubeAPIQPS` / `kubeAPIBurst`; events
/// through a client of their own limited by `eventRecordQPS` / `eventBurst`, so a burst of
/// events never holds back a status write; node status and the Lease through `heartbeat`,
/// never throttled (a node must not look dead because its pods were busy), whose requests
/// time out after the shorter of `nodeStatusUpdateFrequency` and the lease duration. The
/// node's registration goes through `heartbeat` too (upstream's uses the main client): the
/// node manager does both, and a registration is a handful of requests. The watch on the
/// node goes through `main` (see [`crate::node::watch`]).
#[derive(Clone)]
struct ApiClients {
    main: kube::Client,
    events: kube::Client,
    heartbeat: kube::Client,
}

/// What the three clients are built from: the kubeconfig's `kube::Config` and the two
/// token buckets, kept across rebuilds (a rotated certificate keeps the request budget).
#[derive(Clone)]
struct ApiClientsBase {
    path: std::path::PathBuf,
    config: kube::Config,
    main_bucket: Arc<crate::api_throttle::TokenBucket>,
    events_bucket: Arc<crate::api_throttle::TokenBucket>,
    heartbeat_timeout: Option<Duration>,
    /// The Lease renewal interval (a quarter of the lease duration).
    renew_interval: Duration,
}

impl ApiClientsBase {
    async fn load(path: &std::path::Path, kc: &KubeletConfiguration) -> Result<Self, Error> {
        let err = |message: String| Error::Kubeconfig { path: path.display().to_string(), message };
        let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| err(e.to_string()))?;
        let lease = Duration::from_secs(u64::try_from(kc.node_lease_duration_seconds).unwrap_or(0));
        Ok(Self {
            path: path.to_path_buf(),
            config,
            main_bucket: Arc::new(crate::api_throttle::TokenBucket::new(kc.kube_api_qps as f32, kc.kube_api_burst)),
            events_bucket: Arc::new(crate::api_throttle::TokenBucket::new(kc.event_record_qps as f32, kc.event_burst)),
            heartbeat_timeout: Some(kc.node_status_update_frequency.to_std().min(lease)).filter(|t| !t.is_zero()),
            renew_interval: lease / 4,
        })
    }

    /// The three clients, with `pair` as the client certificate when given.
    fn build(&self, pair: Option<&crate::certificate::store::Pair>) -> Result<ApiClients, Error> {
        let err = |message: String| Error::Kubeconfig { path: self.path.display().to_string(), message };
        let mut config = self.config.clone();
        if let Some(pair) = pair {
            use base64::Engine as _;
            let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
            config.auth_info.client_certificate = None;
            config.auth_info.client_key = None;
            config.auth_info.client_certificate_data = Some(b64(&pair.cert_pem));
            config.auth_info.client_key_data = Some(b64(&pair.key_pem).into());
        }
        let client = |config: kube::Config, bucket: Option<&Arc<crate::api_throttle::TokenBucket>>| {
            let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| err(e.to_string()))?;
            Ok::<_, Error>(match bucket {
                Some(bucket) => builder.with_layer(&crate::api_throttle::ThrottleLayer(bucket.clone())).build(),
                None => builder.build(),
            })
        };
        // The heartbeat client's requests time out after the period (upstream's
        // `heartbeatClientConfig.Timeout`), counted from each request. Its sockets' read
        // timeout is longer, counted from each write: a connection idle between two
        // renewals stays in the pool (had it timed out on its own, every renewal would go
        // over a new connection), and a response whose body stalls is still cut. Reusing
        // the connection is what lets a failed renewal show that the network has
        // black-holed the agent's connections (see `Reconnector`), as upstream's
        // heartbeats share the agent's one connection.
        let heartbeat = match self.heartbeat_timeout {
            Some(timeout) => {
                let mut c = config.clone();
                c.read_timeout = Some((timeout * 2).max(self.renew_interval + timeout));
                c.write_timeout = Some(timeout);
                c.reset_reader_on_write = true;
                kube::client::ClientBuilder::try_from(c)
                    .map_err(|e| err(e.to_string()))?
                    .with_layer(&tower::timeout::TimeoutLayer::new(timeout))
                    .build()
            }
            None => client(config.clone(), None)?,
        };
        Ok(ApiClients {
            main: client(config.clone(), Some(&self.main_bucket))?,
            events: client(config, Some(&self.events_bucket))?,
            heartbeat,
        })
    }
}

impl ApiClients {
    #[cfg(test)]
    async fn from_kubeconfig(path: &std::path::Path, kc: &KubeletConfiguration) -> Result<Self, Error> {
        ApiClientsBase::load(path, kc).await?.build(None)
    }
}

/// The API clients when `rotateCertificates` is on: each is a
/// [`crate::certificate::rotation::RotatingClient`], rebuilt with every new pair.
struct RotatingApiClients {
    clients: ApiClients,
    reconnector: Reconnector,
    manager: Arc<crate::certificate::rotation::CertManager>,
    /// The rotation, until shutdown; an error when the certificate lapsed for good.
    task: Box<dyn FnOnce(CancellationToken) -> futures::future::BoxFuture<'static, Result<(), Error>> + Send>,
}

impl RotatingApiClients {
    async fn new(
        path: &std::path::Path,
        kc: &KubeletConfiguration,
        cert_dir: &std::path::Path,
        node: &str,
    ) -> Result<Self, Error> {
        use crate::certificate::rotation::{CLIENT, CertManager};
        let base = ApiClientsBase::load(path, kc).await?;
        let store = crate::certificate::bootstrap::client_store(
            cert_dir,
            crate::certificate::bootstrap::kubeconfig_cert_files(path),
        );
        // Without a certificate (a token kubeconfig), one is requested at once with the
        // kubeconfig's credentials and used from then on, as upstream.
        let current = match store.current()? {
            Some(pair) => Some(pair),
            None => match crate::certificate::bootstrap::kubeconfig_client_cert(path) {
                Ok(pair) => Some(pair),
                Err(e) => {
                    tracing::info!(reason = %e, "rotateCertificates: no client certificate yet; requesting one");
                    None
                }
            },
        };
        let first = base.build(current.as_ref())?;
        let ns = base.config.default_namespace.clone();
        let manager = CertManager::new(CLIENT, store, node, None, current);
        let (clients, reconnector) = {
            let (base, manager) = (base.clone(), manager.clone());
            Reconnector::over(first, &ns, move || base.build(manager.current().as_deref()))
        };
        let (run_manager, watcher, requester) = (manager.clone(), manager.clone(), clients.main.clone());
        let cells = reconnector.clone();
        let task = Box::new(move |shutdown: CancellationToken| {
            Box::pin(async move {
                let rotation = run_manager.run_applying(requester, shutdown, |pair| match base.build(Some(pair)) {
                    Ok(next) => {
                        cells.swap(next);
                        tracing::info!("the API clients use the new client certificate");
                    }
                    Err(e) => tracing::error!(error = %e, "the new client certificate does not load"),
                });
                let lapsed = watcher.without_valid_certificate_for(
                    crate::certificate::rotation::EXIT_WITHOUT_CERTIFICATE,
                    Duration::from_secs(10),
                );
                tokio::select! {
                    () = rotation => Ok(()),
                    // Upstream's klog.Fatal in its rotating transport: the pods keep
                    // running in the runtime, and the restarted agent bootstraps anew.
                    () = lapsed => Err(Error::CredentialsLapsed(crate::certificate::rotation::EXIT_WITHOUT_CERTIFICATE)),
                }
            }) as futures::future::BoxFuture<'static, Result<(), Error>>
        });
        Ok(Self { clients, reconnector, manager, task })
    }
}

/// The API clients' connections, all dropped at once when a heartbeat fails (upstream's
/// `closeAllConns`): each client is a [`crate::certificate::rotation::RotatingClient`]
/// cell, rebuilt (new connection pools) and swapped. A network that black-holes
/// connections (half-open: nothing moves, nothing closes) would otherwise keep new
/// requests on dead pooled connections until their read timeout, minutes later.
/// Requests under way finish or time out on their old connection; the pod watch starts
/// again on a new one when told through [`Reconnector::generation`].
#[derive(Clone)]
struct Reconnector {
    cells: [crate::certificate::rotation::RotatingClient; 3],
    rebuild: Arc<dyn Fn() -> Result<ApiClients, Error> + Send + Sync>,
    generation: tokio::sync::watch::Sender<u64>,
}

impl Reconnector {
    /// The least time between two resets: heartbeats retried every 200 ms during an
    /// outage must not rebuild the clients (and relist the pods) each time.
    const MIN_INTERVAL: Duration = Duration::from_secs(5);

    /// The clients every component uses (with `ns` as their default namespace), sending
    /// through `first` until [`Reconnector::swap`]; `rebuild` makes a fresh set for
    /// [`Reconnector::reset`].
    fn over(
        first: ApiClients,
        ns: &str,
        rebuild: impl Fn() -> Result<ApiClients, Error> + Send + Sync + 'static,
    ) -> (ApiClients, Self) {
        use crate::certificate::rotation::RotatingClient;
        let cells =
            [RotatingClient::new(first.main), RotatingClient::new(first.events), RotatingClient::new(first.heartbeat)];
        let clients =
            ApiClients { main: cells[0].client(ns), events: cells[1].client(ns), heartbeat: cells[2].client(ns) };
        (clients, Self { cells, rebuild: Arc::new(rebuild), generation: tokio::sync::watch::Sender::new(0) })
    }

    /// Plain clients made resettable.
    fn plain(base: ApiClientsBase, ns: &str) -> Result<(ApiClients, Self), Error> {
        let first = base.build(None)?;
        Ok(Self::over(first, ns, move || base.build(None)))
    }

    /// Every later request of every clone of the clients goes through `next`.
    fn swap(&self, next: ApiClients) {
        self.cells[0].swap(next.main);
        self.cells[1].swap(next.events);
        self.cells[2].swap(next.heartbeat);
    }

    /// Rebuilds the clients and bumps the generation.
    fn reset(&self) {
        match (self.rebuild)() {
            Ok(next) => {
                self.swap(next);
                self.generation.send_modify(|g| *g += 1);
            }
            Err(e) => tracing::error!(error = %e, "cannot rebuild the API clients"),
        }
    }

    /// Resets on each heartbeat failure, at most every [`Reconnector::MIN_INTERVAL`].
    async fn run(self, failed: Arc<tokio::sync::Notify>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = failed.notified() => {}
            }
            tracing::warn!("a heartbeat failed; leaving every connection to the API server for new ones");
            self.reset();
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Self::MIN_INTERVAL) => {}
            }
        }
    }
}

/// `serverTLSBootstrap`: the serving certificate manager (signer
/// `kubernetes.io/kubelet-serving`, the names of the node's `addresses` as last
/// reported), started on the main client, and the slot through which the HTTPS API
/// serves its pair. A valid pair from an earlier run is served at once; without one,
/// handshakes fail until the first certificate is issued (upstream likewise).
fn start_serving_certificate(
    cfg: &Config,
    addresses: tokio::sync::watch::Receiver<Vec<k8s_openapi::api::core::v1::NodeAddress>>,
    api: &ApiClients,
    registry: &mut Registry,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> crate::server::ServingSlot {
    use crate::certificate::rotation::{CertManager, SERVING};
    let kc = &cfg.kubelet;
    let non_empty = |s: &str| (!s.is_empty()).then(|| std::path::PathBuf::from(s));
    let fallback = non_empty(&kc.tls_cert_file).zip(non_empty(&kc.tls_private_key_file));
    let store = crate::certificate::store::FileStore::new(&cfg.cert_dir, SERVING.prefix, fallback);
    let initial = match store.current() {
        Ok(Some(pair)) if !pair.expired_at(std::time::SystemTime::now()) => Some(pair),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "the stored serving certificate does not load; requesting a new one");
            None
        }
    };
    let slot = crate::server::ServingSlot::default();
    if let Some(pair) = &initial {
        slot.set(pair.certified.clone());
    }
    let manager = CertManager::new(SERVING, store, &cfg.node_name, Some(addresses), initial);
    manager.register(registry);
    let served = slot.clone();
    tracker.spawn(
        manager
            .run_applying(api.main.clone(), shutdown.clone(), move |pair| {
                served.set(pair.certified.clone());
                tracing::info!("the HTTPS API serves the new serving certificate");
            })
            .instrument(tracing::info_span!("serving_certificate")),
    );
    slot
}

/// Runs the agent until `shutdown` is cancelled (or a task stops it with an error, which
/// is returned). Every long-lived task runs under one tracker and stops on `shutdown`;
/// they get [`SHUTDOWN_GRACE`] to finish.
pub async fn run(mut cfg: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let tracker = TaskTracker::new();
    let fatal = Fatal::new(shutdown.clone());
    // /configz shows the configuration as given; reservedSystemCPUs then replaces the
    // reserved cpu everywhere else (upstream's server.go).
    let configz = cfg.kubelet.to_configz_json();
    crate::settings::apply_reserved_system_cpus(&mut cfg.kubelet);
    let kc = &cfg.kubelet;
    if let (Some(path), Some(bootstrap)) = (&cfg.kubeconfig, &cfg.bootstrap_kubeconfig) {
        crate::certificate::bootstrap::load_client_cert(path, bootstrap, &cfg.cert_dir, &cfg.node_name).await?;
    }
    let mut rotation = None;
    let mut reconnector = None;
    let clients = match &cfg.kubeconfig {
        Some(path) if kc.rotate_certificates => {
            let rotating = RotatingApiClients::new(path, kc, &cfg.cert_dir, &cfg.node_name).await?;
            let clients = rotating.clients.clone();
            reconnector = Some(rotating.reconnector.clone());
            rotation = Some(rotating);
            Some(clients)
        }
        Some(path) => {
            let base = ApiClientsBase::load(path, kc).await?;
            let ns = base.config.default_namespace.clone();
            let (clients, r) = Reconnector::plain(base, &ns)?;
            reconnector = Some(r);
            Some(clients)
        }
        None => None,
    };
    let mode = if clients.is_some() { "API server" } else { "standalone: static pods only" };
    tracing::info!(node = %cfg.node_name, config = ?cfg.config_file, mode, "starting swiftlet");
    // The node IP: --node-ip, else (API mode) the host's primary address, as hostIP (the
    // node status looks for the host's address anew each time).
    let explicit_node_ip: Option<std::net::IpAddr> =
        cfg.node_ip.as_deref().and_then(|s| s.split(',').next()).and_then(|s| s.trim().parse().ok());
    let node_ip = explicit_node_ip.or_else(|| clients.as_ref().and_then(|_| crate::node::facts::default_node_ip()));
    let host_ip = if clients.is_some() { node_ip.map(|ip| ip.to_string()) } else { cfg.node_ip.clone() };
    let mut registry = Registry::default();
    let metrics = Arc::new(KubeletMetrics::new(&mut registry, &cfg.node_name));
    registry.register_collector(Box::new(crate::process_metrics::ProcessCollector::default()));
    if let Some(rotation) = rotation.take() {
        rotation.manager.register(&mut registry);
        let (task, fatal) = ((rotation.task)(shutdown.clone()), fatal.clone());
        tracker.spawn(
            async move {
                if let Err(e) = task.await {
                    fatal.fail(e);
                }
            }
            .instrument(tracing::info_span!("client_certificate")),
        );
    }
    // The node's addresses as the API server last took them: the serving certificate's names.
    let (observed_addresses, addresses) = tokio::sync::watch::channel(Vec::new());
    let serving_slot = match (&clients, kc.server_tls_bootstrap) {
        (Some(api), true) => Some(start_serving_certificate(&cfg, addresses, api, &mut registry, &tracker, &shutdown)),
        (None, true) => {
            tracing::warn!(
                "serverTLSBootstrap needs an API server (--kubeconfig) to request the serving certificate; \
                 serving tlsCertFile or a self-signed certificate"
            );
            None
        }
        _ => None,
    };
    let eviction_metrics = crate::eviction::EvictionMetrics::new(&mut registry);
    let resize_metrics = crate::allocation::ResizeMetrics::new(&mut registry);
    let eviction_config = crate::eviction::EvictionConfig::from_settings(&crate::settings::eviction(kc))?;
    // Kernel memory-pressure signals (PSI, memcg thresholds, eBPF reclaim) wake the
    // eviction manager; it is made once the stats and pod workers exist.
    let (pressure, pressure_rx) = crate::pressure::PressureSignals::channel();
    let eviction: Arc<std::sync::OnceLock<Arc<crate::eviction::EvictionManager>>> = Arc::default();

    let endpoint = kc.container_runtime_endpoint.clone();
    let remote = RemoteRuntime::new(&endpoint, kc.runtime_request_timeout.to_std(), metrics.clone())
        .map_err(|source| Error::Runtime { endpoint: endpoint.clone(), source })?;
    let runtime_name = connect_runtime(&remote, &endpoint, &shutdown).await?;
    let rt: Arc<dyn RuntimeService> = Arc::new(remote);
    // The runtime's readiness, network readiness and features, asked now and every 5 s.
    let runtime_state = Arc::new(crate::container::runtime_state::RuntimeState::default());
    runtime_state.update(rt.as_ref()).await;

    if kc.fail_swap_on {
        // No /proc/swaps: no swap (as upstream's `IsSwapOn`).
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_else(|e| {
            tracing::warn!(error = %e, "failSwapOn: cannot read /proc/swaps; assuming swap is off");
            String::new()
        });
        crate::cm::check_swap(&swaps)?;
    }
    // Container resources follow cpuCFSQuota, singleProcessOOMKill and swapBehavior.
    crate::cm::resources::ContainerResourceOptions::init_host(&crate::settings::container_resources(kc));
    // What the node is, once: node allocatable below and the Node object (API mode).
    let machine = crate::node::MachineFacts::detect(&cfg.root_dir);
    // The resource managers: hint providers of the topology manager (admission) and
    // container lifecycle hooks of the runtime manager (container creation).
    let mut managers = crate::cm::resource_managers::build(
        &crate::settings::resource_managers(kc),
        &cfg.root_dir,
        std::path::Path::new("/sys"),
        &mut registry,
    )?;
    let cgroups = CgroupfsPodContainerManager::new(CgroupConfig {
        cgroup_root: if kc.cgroup_root.is_empty() { "/".into() } else { kc.cgroup_root.clone() },
        cgroups_per_qos: kc.cgroups_per_qos,
        cgroup_driver: kc.cgroup_driver.clone(),
        pod_pids_limit: kc.pod_pids_limit,
        cpu_cfs_quota: kc.cpu_cfs_quota,
        enforcement: crate::cm::allocatable::plan(
            &crate::settings::allocatable(kc),
            &crate::cm::allocatable::Capacity::detect(machine.cpus, machine.memory_bytes, machine.hugepages.clone()),
        ),
        ..CgroupConfig::default()
    })?
    .with_unquoted_pods({
        let cpu = managers.cpu.clone();
        Arc::new(move |uid| cpu.pod_runs_without_quota(uid))
    });
    let kubepods_dirs = cgroups.kubepods_dirs();
    let allocatable_enforced = cgroups.config().enforcement.pods.is_some();
    let cm: Arc<dyn PodContainerManager> = Arc::new(cgroups);
    cm.ensure_node_cgroups()?;

    let memory_events = MemoryRecorder::new(&cfg.node_name);
    let recorder: Arc<dyn EventRecorder> = match &clients {
        Some(c) => {
            let (r, task) = crate::events::ApiRecorder::new(memory_events.clone(), c.events.clone());
            let stop = shutdown.clone();
            tracker.spawn(
                async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = task => {}
                    }
                }
                .instrument(tracing::info_span!("events")),
            );
            Arc::new(r)
        }
        None => Arc::new(memory_events.clone()),
    };
    if allocatable_enforced {
        recorder.record(
            crate::events::node_ref(&cfg.node_name),
            crate::events::EventType::Normal,
            "NodeAllocatableEnforced",
            "Updated Node Allocatable limit across pods".to_owned(),
        );
    }
    // In-place resize: the allocations admitted pods run with (checkpointed).
    let allocation = Arc::new(
        crate::allocation::AllocationManager::new(
            &cfg.root_dir,
            crate::allocation::NodeResizeConfig {
                static_cpu_policy: kc.cpu_manager_policy.eq_ignore_ascii_case("static"),
                static_memory_policy: kc.memory_manager_policy.eq_ignore_ascii_case("static"),
            },
            resize_metrics,
        )?
        .with_recorder(recorder.clone()),
    );
    let crash_max = kc
        .crash_loop_back_off
        .max_container_restart_period
        .map_or(crate::container::backoff::MAX, crate::config::GoDuration::to_std);
    // ConfigMaps, Secrets and tokens for volumes and env: from the API server, or none.
    let object_source: Arc<dyn crate::volumes::source::ObjectSource> = match &clients {
        Some(c) => Arc::new(crate::api_objects::KubeObjectSource::new(c.main.clone())),
        None => Arc::new(crate::volumes::source::NoApiServer),
    };
    // What the node knows of the runtime's pods: the PLEG's listing and the exits the
    // kernel saw first, the start calls under way, the change counter the stats provider
    // watches (`crate::container::cache`).
    let runtime_cache = Arc::new(crate::container::cache::RuntimeCache::default());
    // Startup, liveness and readiness probes; their own registry for /metrics/probes.
    let prober_metrics = Arc::new(crate::prober::metrics::ProberMetrics::new());
    let probes = crate::prober::ProbeManager::new(
        Arc::new(crate::prober::runner::HandlerRunner::new(rt.clone())),
        recorder.clone(),
        prober_metrics.clone(),
    );
    let probe_updates = probes.take_updates();
    let startup = Arc::new(crate::pod_startup::PodStartupTracker::new(metrics.clone()));
    // The device manager joins the resource managers.
    let devices = crate::cm::devicemanager::DeviceManager::new(&cfg.root_dir)?
        .with_metrics(crate::cm::devicemanager::metrics::DevicePluginMetrics::new(&mut registry));
    devices.start(crate::cm::devicemanager::running_containers(rt.as_ref()).await)?;
    managers.topology.add_hint_provider(Arc::new(devices.clone()));
    // Read once, as upstream's AppArmor validator does at start-up.
    let apparmor_enabled = crate::runtime::security_context::apparmor_enabled_on_host();
    let start_concurrency = crate::settings::runtime_start_concurrency(&cfg);
    let runtime = Arc::new(RuntimeManager::new(crate::runtime::manager::RuntimeManagerDeps {
        rt: rt.clone(),
        cm: cm.clone(),
        metrics: metrics.clone(),
        cfg: RuntimeManagerConfig {
            pod_logs_dir: kc.pod_logs_dir.clone().into(),
            root_dir: cfg.root_dir.clone(),
            node_name: cfg.node_name.clone(),
            host_ip: host_ip.clone(),
        },
        backoff: Backoff::new(
            crate::container::backoff::INITIAL.min(crash_max),
            crash_max,
            Arc::new(crate::container::backoff::TokioClock::new()),
        ),
        images: Arc::new(
            crate::images::puller::ImageManager::new(rt.clone(), crate::settings::image_puller(kc), metrics.clone())
                .with_recorder(recorder.clone())
                .with_startup_tracker(startup.clone()),
        ),
        recorder: recorder.clone(),
        volumes: Arc::new(crate::volumes::VolumeManager::new(cfg.root_dir.clone(), object_source)),
        dns: crate::runtime::manager::dns::DnsSettings {
            cluster_dns: kc.cluster_dns.clone(),
            cluster_domain: kc.cluster_domain.clone(),
            resolv_conf: kc.resolv_conf.clone(),
        },
        cache: runtime_cache.clone(),
        probes: probes.clone(),
        runtime_name: runtime_name.clone(),
        startup: startup.clone(),
        container_hooks: vec![managers.cpu.clone(), managers.memory.clone(), Arc::new(devices.clone())],
        allocation: allocation.clone(),
        start_concurrency,
        security: crate::runtime::security_context::SecuritySettings::new(
            kc.seccomp_default,
            &cfg.root_dir,
            apparmor_enabled,
        ),
    }));
    match start_concurrency {
        0 => tracing::info!("--runtime-start-concurrency=0: sandbox and container starts are not limited"),
        n => tracing::info!(limit = n, "at most {n} sandbox starts and {n} container starts reach the runtime at once"),
    }
    let mut sources: Vec<&'static str> = if kc.static_pod_path.is_empty() { vec![] } else { vec![FILE_SOURCE] };
    if clients.is_some() {
        sources.push(crate::types::pod::API_SOURCE);
    }
    let pod_manager = PodManager::new(&sources);
    let (status, status_writer): (Arc<dyn StatusProvider>, _) = match &clients {
        Some(c) => {
            let (m, w) =
                crate::status::api::ApiStatusManager::new(c.main.clone(), pod_manager.clone(), metrics.clone());
            (Arc::new(m), Some(w))
        }
        None => (Arc::new(StatusManager::default()), None),
    };
    tracker.spawn(
        runtime_state.clone().run(rt.clone(), shutdown.clone()).instrument(tracing::info_span!("runtime_state")),
    );
    let workers = PodWorkers::new(
        Arc::new(SyncDeps {
            runtime: runtime.clone(),
            cm: cm.clone(),
            status: status.clone(),
            metrics: metrics.clone(),
            recorder: recorder.clone() as Arc<dyn EventRecorder>,
            runtime_name,
            sync_frequency: kc.sync_frequency.to_std(),
            host_ip: host_ip.clone(),
            runtime_state: Some(runtime_state.clone()),
        }),
        tracker.clone(),
        shutdown.clone(),
    );
    let event_bus = EventBus::default();
    let event_api = match &cfg.swiftlet.event_api_socket {
        Some(socket) => Some(EventApiServer::new(socket.clone(), event_bus.clone()).bind().await?),
        None => None,
    };
    // The evented PLEG when asked for and the kernel lets us; else the 1 s relist alone.
    let sensors = if cfg.swiftlet.evented_pleg {
        crate::pleg::sensors::start(&kubepods_dirs, cfg.swiftlet.evented_pleg_ring_buffer_bytes, &shutdown)
    } else {
        Err("disabled by --evented-pleg=false".to_string())
    };
    let pleg: Arc<dyn PodLifecycleEventGenerator> = match sensors {
        Ok(running) => {
            let relist = GenericPleg::new(
                rt.clone(),
                metrics.clone(),
                runtime_cache.clone(),
                cfg.swiftlet.pleg_relist_period,
                RELIST_THRESHOLD,
            );
            let mut index = CgroupIndex::default();
            if let Some(d) = &kubepods_dirs.cgroup2 {
                index.scan(crate::pleg::evented::CGROUP2_HIERARCHY, d);
            }
            let memory_hierarchy = crate::pleg::sensors::memory_hierarchy_id();
            if let Some(d) = &kubepods_dirs.memory_v1 {
                index.scan(memory_hierarchy, d);
            }
            startup.set_first_execs_reported(true);
            let sink = observed_sink(event_bus.clone(), pod_manager.clone(), runtime_cache.clone(), startup.clone());
            let evented = EventedPleg::new(
                relist,
                rt.clone(),
                metrics.clone(),
                cfg.swiftlet.pleg_relist_period,
                index,
                memory_hierarchy,
                Some(sink),
            );
            let evented =
                if cfg.swiftlet.eviction_kernel_signals { evented.with_pressure(pressure.clone()) } else { evented };
            tracing::info!(
                safety_relist = ?cfg.swiftlet.pleg_relist_period,
                ring_buffer_bytes = cfg.swiftlet.evented_pleg_ring_buffer_bytes,
                "evented PLEG: container lifecycle from the kernel (eBPF)"
            );
            // Loading parsed the kernel's BTF; give that memory back.
            crate::memory::trim();
            Arc::new(evented.with_sensors(running))
        }
        Err(why) => {
            tracing::warn!(reason = %why, "evented PLEG unavailable; running the {}s relisting PLEG", RELIST_PERIOD.as_secs());
            metrics.evented_pleg_active.set(0);
            Arc::new(
                GenericPleg::new(rt.clone(), metrics.clone(), runtime_cache.clone(), RELIST_PERIOD, RELIST_THRESHOLD)
                    .with_fallback_reason(why),
            )
        }
    };
    let pleg_health = Arc::new(PlegHealth(pleg.clone()));

    let events_view = memory_events.clone();
    let stats_source = stats_provider(
        &cfg,
        rt.clone(),
        pod_manager.clone(),
        cm.clone(),
        runtime.volumes().clone(),
        runtime_cache.changes(),
        metrics.clone(),
    );
    if let Some(stats) = &stats_source {
        // `kubelet_container_log_filesystem_used_bytes`, from the latest collection.
        let latest = Arc::clone(stats);
        registry.register_collector(Box::new(crate::stats::log_metrics::LogMetricsCollector::new(Arc::new(
            move || latest.latest(),
        ))));
        // Walks writable layers and volumes in the background; scrapes read its cache.
        tracker.spawn(stats.fs_usage().run(shutdown.clone()).instrument(tracing::info_span!("fs_usage")));
        tracker.spawn(
            stats.clone().run_housekeeping(shutdown.clone()).instrument(tracing::info_span!("stats_housekeeping")),
        );
    }
    let endpoints = Endpoints::new(
        Arc::new(PodsView { manager: pod_manager.clone(), status: status.clone() }),
        Arc::new(registry),
    )
    .health_check(pleg_health.clone())
    .http_metrics(metrics.clone())
    .metrics_endpoint("/metrics/probes", prober_metrics.registry())
    .route(
        "/events",
        get(move || {
            let items = events_view.list();
            async move {
                Json(serde_json::json!({"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}))
            }
        }),
    )
    .debugging_handlers(crate::settings::debugging_handlers(rt.clone(), kc))
    .route("/stats/summary", get(summary_handler).with_state(stats_source.clone()))
    .route("/metrics/resource", get(resource_metrics_handler).with_state(stats_source.clone()))
    .route("/metrics/cadvisor", get(cadvisor_handler).with_state(stats_source.clone()));
    // Webhook authentication and authorization ask the API server (TokenReview,
    // SubjectAccessReview); standalone, the server refuses those settings.
    let endpoints = match &clients {
        Some(c) => endpoints.api_client(c.main.clone()),
        None => endpoints,
    };
    let mut server_settings = ServerSettings { configz, ..crate::settings::server(&cfg)? };
    server_settings.tls.bootstrap = serving_slot;
    let server = Server::new(server_settings, endpoints)?;

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
    // Graceful node shutdown (`crate::nodeshutdown`); off without grace periods.
    let mut node_shutdown = crate::nodeshutdown::Manager::from_settings(
        &crate::settings::node_shutdown(kc),
        &cfg.root_dir,
        crate::eviction::adapters::AgentPods {
            manager: pod_manager.clone(),
            workers: workers.clone(),
            status: status.clone(),
        },
        workers.clone(),
    )
    .map(|m| m.with_metrics(metrics.clone()).with_recorder(recorder.clone() as Arc<dyn EventRecorder>, &cfg.node_name));
    let shutdown_status = node_shutdown.as_ref().map(crate::nodeshutdown::Manager::status);
    let mut node_handle = None;
    if let Some(api) = &clients {
        let client = &api.main;
        let mirrors = crate::mirror::MirrorStore::default();
        let heartbeat_failed = Arc::new(tokio::sync::Notify::new());
        let connections = match reconnector.take() {
            Some(r) => {
                let generation = r.generation.subscribe();
                tracker.spawn(
                    r.run(heartbeat_failed.clone(), shutdown.clone())
                        .instrument(tracing::info_span!("api_connections")),
                );
                generation
            }
            None => tokio::sync::watch::Sender::new(0).subscribe(),
        };
        tracker.spawn(
            crate::sources::api::run(
                client.clone(),
                cfg.node_name.clone(),
                update_tx.clone(),
                mirrors.clone(),
                startup.clone(),
                metrics.clone(),
                connections.clone(),
                shutdown.clone(),
            )
            .instrument(tracing::info_span!("api_pods")),
        );
        let health = pleg_health.clone();
        let node = crate::node::NodeManager::new(
            api.heartbeat.clone(),
            node_settings(&cfg, explicit_node_ip),
            machine.clone(),
            rt.clone(),
            Arc::new(move || health.check().map_err(|e| format!("PLEG is not healthy: {e}"))),
        )
        .with_runtime_state(runtime_state.clone())
        .with_shutdown_status(shutdown_status.clone().map(|s| Arc::new(move || s.check()) as crate::node::HealthFn))
        .with_heartbeat_failures(heartbeat_failed)
        .with_node_watch(client.clone(), connections)
        .with_pressure({
            let eviction = eviction.clone();
            Arc::new(move || {
                eviction.get().map_or_else(crate::node::Pressure::default, |m| crate::node::Pressure {
                    memory: m.is_under_memory_pressure(),
                    disk: m.is_under_disk_pressure(),
                    pid: m.is_under_pid_pressure(),
                })
            })
        })
        .with_extended_resources({
            let devices = devices.clone();
            Arc::new(move || devices.extended_resources())
        })
        .with_observed_addresses(observed_addresses.clone());
        node_handle = Some(node.current_handle());
        node_shutdown = node_shutdown.map(|m| m.with_node_sync(node.sync_now_handle()));
        tracker.spawn(
            crate::mirror::run(
                client.clone(),
                pod_manager.clone(),
                mirrors,
                node.current_handle(),
                status.clone(),
                crate::sync_loop::HOUSEKEEPING_PERIOD,
                shutdown.clone(),
            )
            .instrument(tracing::info_span!("mirror_pods")),
        );
        tracker.spawn(node.run(shutdown.clone()).instrument(tracing::info_span!("node_status")));
    }
    if let Some(w) = status_writer {
        tracker.spawn(w.run(shutdown.clone()).instrument(tracing::info_span!("status_writer")));
    }
    drop(update_tx);
    tracker.spawn(pleg.start(pleg_tx, shutdown.clone()).instrument(tracing::info_span!("pleg")));
    if let Some(api) = event_api {
        tracker.spawn(api.run(shutdown.clone()).instrument(tracing::info_span!("event_api")));
    }
    // Image GC keeps the sandbox image: the flag's, else the runtime's own.
    let sandbox_image = match &cfg.pod_infra_container_image {
        Some(image) => Some(image.clone()),
        None => match rt.status(true).await {
            Ok(status) => crate::container::sandbox_image_of(&status),
            Err(e) => {
                tracing::warn!(error = %e, "runtime status");
                None
            }
        },
    };
    let image_gc = match crate::images::gc::ImageGcManager::new(
        rt.clone(),
        Arc::new(crate::images::gc::Statvfs),
        crate::settings::image_gc(kc),
        metrics.clone(),
    ) {
        Ok(gc) => {
            let mut gc =
                gc.with_recorder(recorder.clone(), &cfg.node_name).with_period(crate::settings::image_gc_period(&cfg));
            if let Some(image) = &sandbox_image {
                tracing::info!(%image, "image GC keeps the sandbox image");
                gc = gc.with_sandbox_image(image);
            } else {
                tracing::warn!(
                    "the runtime did not name its sandbox image; set --pod-infra-container-image so image GC keeps it"
                );
            }
            let gc = Arc::new(gc);
            tracker.spawn(gc.clone().run(shutdown.clone()).instrument(tracing::info_span!("image_gc")));
            Some(gc)
        }
        Err(e) => {
            tracing::error!(error = %e, "image GC is off");
            None
        }
    };
    let gc_pods = Arc::new(GcPods { manager: pod_manager.clone(), workers: workers.clone() });
    let gc = Arc::new(crate::gc::ContainerGc::new(rt.clone(), gc_pods, crate::settings::container_gc(&cfg)));
    tracker.spawn(
        gc.clone()
            .run(crate::gc::CONTAINER_GC_PERIOD, shutdown.clone())
            .instrument(tracing::info_span!("container_gc")),
    );
    if let Some(provider) = &stats_source {
        {
            use crate::eviction::adapters::{AgentKiller, AgentPods, AgentReclaimer, AgentStats};
            let manager = Arc::new(crate::eviction::EvictionManager::new(
                eviction_config,
                crate::eviction::Dependencies {
                    stats: Arc::new(AgentStats { provider: provider.clone(), root_dir: cfg.root_dir.clone() }),
                    pods: Arc::new(AgentPods {
                        manager: pod_manager.clone(),
                        workers: workers.clone(),
                        status: status.clone(),
                    }),
                    killer: Arc::new(AgentKiller { workers: workers.clone() }),
                    reclaimer: Arc::new(AgentReclaimer { containers: gc.clone(), images: image_gc.clone() }),
                    recorder: recorder.clone(),
                    metrics: eviction_metrics,
                    node_name: cfg.node_name.clone(),
                },
            ));
            let _ = eviction.set(manager.clone());
            tracker.spawn(manager.run(pressure_rx, shutdown.clone()).instrument(tracing::info_span!("eviction")));
            if cfg.swiftlet.eviction_kernel_signals {
                crate::pressure::spawn_watchers(&tracker, &pressure, &crate::settings::memcg_thresholds(kc), &shutdown);
            } else {
                tracing::info!("--eviction-kernel-signals=false: memory pressure is seen by the 10 s pass only");
            }
        }
    } else {
        tracing::warn!("no stats: node-pressure eviction is off");
    }
    // Validation made sure containerLogMaxSize is a quantity.
    match crate::settings::log_rotation(kc) {
        Ok(policy) => {
            let logs = Arc::new(crate::logs::rotation::ContainerLogManager::new(rt.clone(), policy));
            tracker.spawn(logs.run(shutdown.clone()).instrument(tracing::info_span!("container_logs")));
        }
        Err(e) => tracing::error!(error = %e, "container log rotation is off"),
    }
    let (pod_manager_view, status_view) = (pod_manager.clone(), status.clone());
    let sources = pod_manager.clone();
    managers.topology.set_sources_ready(Box::new(move || sources.sources_handled()));
    let sync_loop = SyncLoop {
        pod_manager,
        workers,
        cache: runtime_cache.clone(),
        runtime,
        cm,
        metrics,
        node: node_handle,
        status: status.clone(),
        recorder: recorder.clone(),
        rejected: std::sync::Mutex::default(),
        eviction,
        admit_handlers: {
            let mut handlers: Vec<Arc<dyn crate::lifecycle::admission::PodAdmitHandler>> =
                vec![Arc::new(managers.topology)];
            handlers.push(Arc::new(crate::runtime::security_context::AppArmorAdmitHandler::new(apparmor_enabled)));
            handlers.push(Arc::new(crate::lifecycle::admission::SupplementalGroupsPolicyAdmitHandler(
                runtime_state.clone(),
            )));
            handlers.extend(shutdown_status.map(|s| Arc::new(s) as _));
            handlers
        },
        update_plugin_resources: Some(Arc::new(devices.clone())),
        tracker: tracker.clone(),
        housekeeping_pass: std::sync::Mutex::default(),
    };
    if let Some(m) = node_shutdown {
        tracker.spawn(m.run(shutdown.clone()).instrument(tracing::info_span!("node_shutdown")));
    }
    tracker.spawn(
        managers
            .cpu
            .run(rt.clone(), crate::cm::resource_managers::active_pods(pod_manager_view, status_view), shutdown.clone())
            .instrument(tracing::info_span!("cpu_manager")),
    );
    tracker.spawn(
        sync_loop.run(update_rx, pleg_rx, probe_updates, shutdown.clone()).instrument(tracing::info_span!("sync_loop")),
    );
    let server_shutdown = shutdown.clone();
    let server_task =
        tracker.spawn(async move { server.run(server_shutdown).await }.instrument(tracing::info_span!("server")));

    let server_result = tokio::select! {
        () = shutdown.cancelled() => None,
        r = server_task => Some(r),
    };
    shutdown.cancel();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait()).await.is_err() {
        tracing::warn!("some tasks did not stop within {SHUTDOWN_GRACE:?}");
    }
    if let Some(e) = fatal.take() {
        return Err(e);
    }
    if let Some(Ok(Err(e))) = server_result {
        return Err(e.into());
    }
    tracing::info!("swiftlet stopped");
    Ok(())
}

#[cfg(test)]
mod api_clients_tests {
    use super::*;

    /// A kubeconfig for plain HTTP to 127.0.0.1:`port`, no credentials.
    fn plain_kubeconfig(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: t\n\
                 clusters: [{{name: t, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
                 users: [{{name: t, user: {{}}}}]\n\
                 contexts: [{{name: t, context: {{cluster: t, user: t}}}}]\n"
            ),
        )
        .unwrap();
        path
    }

    /// The agent's clients, configured by `kc`, of a plain-HTTP server that answers `{}` to
    /// everything (and the folder holding their kubeconfig).
    async fn clients_of_answering_server(kc: &KubeletConfiguration) -> (tempfile::TempDir, ApiClients) {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, axum::Router::new().fallback(|| async { "{}" })).await });
        let path = plain_kubeconfig(dir.path(), port);
        let clients = ApiClients::from_kubeconfig(&path, kc).await.unwrap();
        (dir, clients)
    }

    fn get(client: &kube::Client) -> impl std::future::Future<Output = kube::Result<String>> + 'static {
        let client = client.clone();
        async move { client.request_text(http::Request::get("/api/v1/namespaces").body(Vec::new()).unwrap()).await }
    }

    /// A server that answers one request per connection and then holds it (a black-holed
    /// connection): its port and the count of connections it accepted.
    async fn answer_once_then_hold() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut seen = Vec::new();
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        let Ok(n) = conn.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                    }
                    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
                    // Then nothing moves on this connection, and it stays open.
                    std::future::pending::<()>().await;
                    drop(conn);
                });
            }
        });
        (port, connections)
    }

    /// The heartbeat client keeps its connection between renewals further apart than its
    /// timeout, and a request on it that gets no answer fails after the timeout. Found by
    /// the black-holed-connections e2e test: with the timeout as the sockets' read timeout,
    /// an idle connection timed out on its own, every renewal went over a new connection,
    /// and no renewal ever failed on a black-holed one.
    #[tokio::test]
    async fn heartbeats_reuse_their_idle_connection_and_time_out_on_it() {
        let (port, connections) = answer_once_then_hold().await;
        let dir = tempfile::tempdir().unwrap();
        let kc = KubeletConfiguration {
            node_status_update_frequency: crate::config::GoDuration::from_millis(500),
            node_lease_duration_seconds: 2,
            ..KubeletConfiguration::default()
        };
        let clients = ApiClients::from_kubeconfig(&plain_kubeconfig(dir.path(), port), &kc).await.unwrap();
        get(&clients.heartbeat).await.unwrap();
        // Idle for longer than the timeout, as between two renewals.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let second = tokio::time::timeout(Duration::from_secs(5), get(&clients.heartbeat))
            .await
            .expect("a heartbeat without an answer did not time out");
        assert!(second.is_err(), "answered on a new connection instead of the pooled one: {second:?}");
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// A reset leaves the pooled connections: a server that answers one request per
    /// connection and then holds it (a black-holed connection) stalls the next request
    /// on the pooled connection; after a reset, it goes out on a new one.
    #[tokio::test]
    async fn a_reset_leaves_pooled_connections_for_new_ones() {
        let (port, connections) = answer_once_then_hold().await;
        let dir = tempfile::tempdir().unwrap();
        let path = plain_kubeconfig(dir.path(), port);
        let base = ApiClientsBase::load(&path, &KubeletConfiguration::default()).await.unwrap();
        let (clients, reconnector) = Reconnector::plain(base, "default").unwrap();
        let mut generation = reconnector.generation.subscribe();
        get(&clients.main).await.unwrap();
        let stalled = tokio::time::timeout(Duration::from_millis(500), get(&clients.main)).await;
        assert!(stalled.is_err(), "the pooled connection answered: {stalled:?}");
        reconnector.reset();
        assert!(generation.has_changed().unwrap(), "the pod watch is not told");
        generation.mark_unchanged();
        tokio::time::timeout(Duration::from_secs(5), get(&clients.main)).await.expect("still stalled").unwrap();
        // The copies every component holds use the new pool too.
        tokio::time::timeout(Duration::from_secs(5), get(&clients.events)).await.expect("events stalled").unwrap();
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn events_and_heartbeats_do_not_wait_for_the_pod_clients_tokens() {
        let kc = KubeletConfiguration { kube_api_qps: 1, kube_api_burst: 1, ..KubeletConfiguration::default() };
        let (_dir, clients) = clients_of_answering_server(&kc).await;
        // The pod client spends its one token, then four more requests queue for ~4 s.
        get(&clients.main).await.unwrap();
        let queued: Vec<_> = (0..4).map(|_| tokio::spawn(get(&clients.main))).collect();
        tokio::task::yield_now().await;
        // Events (eventBurst 100) and heartbeats (never throttled) go out at once; had they
        // shared the pod client's bucket, each would wait behind the queue.
        let others = async {
            for _ in 0..5 {
                get(&clients.events).await.unwrap();
                get(&clients.heartbeat).await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(2), others)
            .await
            .expect("events and heartbeats waited for the pod client's tokens");
        assert!(queued.iter().any(|q| !q.is_finished()), "the pod client was not limited to kubeAPIQPS");
        for q in queued {
            q.abort();
        }
    }

    #[tokio::test]
    async fn event_client_is_limited_by_event_record_qps() {
        let kc = KubeletConfiguration { event_record_qps: 1, event_burst: 1, ..KubeletConfiguration::default() };
        let (_dir, clients) = clients_of_answering_server(&kc).await;
        get(&clients.events).await.unwrap();
        let second = tokio::spawn(get(&clients.events));
        // The pod client (kubeAPIQPS 50) is not held back by the events' empty bucket.
        tokio::time::timeout(Duration::from_secs(2), get(&clients.main)).await.unwrap().unwrap();
        assert!(!second.is_finished(), "the second event went out without waiting for a token");
        second.await.unwrap().unwrap();
    }
}

#[cfg(test)]
mod fatal_tests {
    use super::*;

    /// A task's fatal error ends the agent through its shutdown token (so every task
    /// drains and spans are exported) and is what `run` returns, the first one winning.
    #[test]
    fn a_fatal_error_stops_the_agent_through_its_shutdown() {
        let shutdown = CancellationToken::new();
        let fatal = Fatal::new(shutdown.clone());
        assert!(fatal.take().is_none());
        fatal.clone().fail(Error::CredentialsLapsed(Duration::from_mins(5)));
        fatal.fail(Error::CredentialsLapsed(Duration::from_secs(1)));
        assert!(shutdown.is_cancelled());
        assert!(matches!(fatal.take(), Some(Error::CredentialsLapsed(d)) if d == Duration::from_mins(5)));
    }
}
