//! Wiring: builds every subsystem from a [`Config`] and runs them until shutdown
//! (upstream `cmd/kubelet/app` + `Kubelet.Run`), in two stages. [`build`] makes every
//! subsystem and connects them: it waits for the container runtime, reads checkpoints and
//! binds sockets, but spawns none of the agent's tasks. [`Agent::spawn`] then starts them
//! under one tracker; one cancellation token stops them all, and they get a grace period to
//! finish. Stopping the agent leaves pods running, as the kubelet does: a restart adopts
//! them.
//!
//! Beside this file: `api_clients` (the clients of the API server, their certificate
//! rotation and reconnection), `stats_handlers` (the stats provider and the stats
//! endpoints) and `adapters` (small adapters that join two subsystems).

mod adapters;
mod api_clients;
mod stats_handlers;

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::cm::{CgroupConfig, CgroupfsPodContainerManager, PodContainerManager};
use crate::config::Config;
use crate::container::{Backoff, RemoteRuntime, RuntimeService};
use crate::event_api::{EventApiServer, EventBus};
use crate::events::{EventRecorder, MemoryRecorder};
use crate::metrics::KubeletMetrics;
use crate::pleg::PodLifecycleEventGenerator;
use crate::pleg::evented::{CgroupIndex, EventedPleg};
use crate::pleg::relist::{GenericPleg, RELIST_PERIOD, RELIST_THRESHOLD};
use crate::pod_manager::PodManager;
use crate::pod_workers::{PodWorkers, SyncDeps};
use crate::runtime::RuntimeManager;
use crate::runtime::manager::RuntimeManagerConfig;
use crate::server::{Endpoints, HealthCheck, Server, ServerSettings};
use crate::sources::PodUpdate;
use crate::sources::file::FileSource;
use crate::status::{StatusManager, StatusProvider};
use crate::sync_loop::SyncLoop;
use crate::types::pod::FILE_SOURCE;
use adapters::{GcPods, PlegHealth, PodsView, observed_sink};
use api_clients::{Api, ApiClients};
use stats_handlers::{StatsState, cadvisor_handler, resource_metrics_handler, stats_provider, summary_handler};

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

/// A long-lived task: its future is made by [`build`] and first polled once
/// [`Agent::spawn`] has spawned it.
type Task = futures::future::BoxFuture<'static, ()>;

/// `future`, run in `span`, as a [`Task`].
fn task(future: impl Future<Output = ()> + Send + 'static, span: tracing::Span) -> Task {
    Box::pin(future.instrument(span))
}

/// The agent as [`build`] leaves it: every subsystem made and connected, none of its
/// tasks started. After the tracker, the shutdown token and the slot for a fatal error,
/// the fields are the tasks, in the order [`Agent::spawn`] starts them (the server last).
pub struct Agent {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    fatal: Fatal,
    /// `rotateCertificates`: the client certificate's rotation.
    client_certificate: Option<Task>,
    /// `serverTLSBootstrap`: the serving certificate's requests.
    serving_certificate: Option<Task>,
    /// Posts events to the API server (API mode).
    events: Option<Task>,
    runtime_state: Task,
    /// The stats' disk usage walks and housekeeping (when there are stats).
    stats: Vec<Task>,
    static_pods: Option<Task>,
    api: Option<ApiTasks>,
    status_writer: Option<Task>,
    /// The evented PLEG, or the relisting PLEG alone.
    pleg: Task,
    event_api: Option<Task>,
    image_gc: Option<Task>,
    container_gc: Task,
    /// Node-pressure eviction (when there are stats).
    eviction: Option<EvictionTasks>,
    container_logs: Option<Task>,
    node_shutdown: Option<Task>,
    cpu_manager: Task,
    sync_loop: Task,
    server: Server,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").finish_non_exhaustive()
    }
}

/// The tasks of API mode.
struct ApiTasks {
    /// Resets the clients' connections when a heartbeat fails.
    connections: Task,
    /// The watch of the node's pods.
    pods: Task,
    mirror_pods: Task,
    /// Registration, node status and the Lease.
    node_status: Task,
}

/// The eviction manager's task and the kernel's memory-pressure watchers that wake it.
struct EvictionTasks {
    manager: Task,
    /// What the kernel's memory-pressure watchers need; `None` with
    /// `--eviction-kernel-signals=false`.
    kernel_signals: Option<(crate::pressure::PressureSignals, crate::pressure::MemcgThresholdSettings)>,
}

/// Runs the agent until `shutdown` is cancelled (or a task stops it with an error, which
/// is returned): [`build`], then [`Agent::spawn`], then [`Running::wait`].
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), Error> {
    // The build holds every subsystem across its awaits: on the heap, not in the
    // caller's future.
    Box::pin(build(cfg, shutdown)).await?.spawn().wait().await
}

/// Builds the agent: every subsystem, made from `cfg` and connected to the others. The
/// order keeps the start-up effects in theirs: the container runtime answers and the node's
/// cgroups exist before the pods' subsystems are made, the device manager starts (from the
/// containers running now) before the runtime manager takes it as a hook, and the eviction
/// manager is made before the node status and the sync loop, which take it. It spawns
/// none of the agent's tasks ([`Agent::spawn`] does); what runs from here on is what a
/// subsystem starts itself when started (the device manager's registration socket, the
/// eBPF sensors' reader). The tasks and the pod workers stop on `shutdown`.
pub async fn build(mut cfg: Config, shutdown: CancellationToken) -> Result<Agent, Error> {
    let tracker = TaskTracker::new();
    let fatal = Fatal::new(shutdown.clone());
    // /configz shows the configuration as given; reservedSystemCPUs then replaces the
    // reserved cpu everywhere else (upstream's server.go).
    let configz = cfg.kubelet.to_configz_json();
    crate::settings::apply_reserved_system_cpus(&mut cfg.kubelet);
    let mut api = api_clients::connect(&cfg).await?;
    let mode = if api.is_some() { "API server" } else { "standalone: static pods only" };
    tracing::info!(node = %cfg.node_name, config = ?cfg.config_file, mode, "starting swiftlet");
    // The node IP: --node-ip, else (API mode) the host's primary address, as hostIP (the
    // node status looks for the host's address anew each time).
    let explicit_node_ip: Option<std::net::IpAddr> =
        cfg.node_ip.as_deref().and_then(|s| s.split(',').next()).and_then(|s| s.trim().parse().ok());
    let node_ip = explicit_node_ip.or_else(|| api.as_ref().and_then(|_| crate::node::facts::default_node_ip()));
    let host_ip = if api.is_some() { node_ip.map(|ip| ip.to_string()) } else { cfg.node_ip.clone() };
    let mut registry = Registry::default();
    let metrics = Arc::new(KubeletMetrics::new(&mut registry, &cfg.node_name));
    registry.register_collector(Box::new(crate::process_metrics::ProcessCollector::default()));
    let client_certificate = api.as_mut().and_then(|a| a.rotation.take()).map(|rotation| {
        rotation.manager.register(&mut registry);
        let (rotating, fatal) = ((rotation.task)(shutdown.clone()), fatal.clone());
        task(
            async move {
                if let Err(e) = rotating.await {
                    fatal.fail(e);
                }
            },
            tracing::info_span!("client_certificate"),
        )
    });
    // The node's addresses as the API server last took them: the serving certificate's names.
    let (observed_addresses, addresses) = tokio::sync::watch::channel(Vec::new());
    let (serving_slot, serving_certificate) = match (&api, cfg.kubelet.server_tls_bootstrap) {
        (Some(api), true) => {
            let (slot, task) = serving_certificate(&cfg, addresses, &api.clients, &mut registry, &shutdown);
            (Some(slot), Some(task))
        }
        (None, true) => {
            tracing::warn!(
                "serverTLSBootstrap needs an API server (--kubeconfig) to request the serving certificate; \
                 serving tlsCertFile or a self-signed certificate"
            );
            (None, None)
        }
        _ => (None, None),
    };
    let eviction_metrics = crate::eviction::EvictionMetrics::new(&mut registry);
    let resize_metrics = crate::allocation::ResizeMetrics::new(&mut registry);
    let eviction_config = crate::eviction::EvictionConfig::from_settings(&crate::settings::eviction(&cfg.kubelet))?;

    let (rt, runtime_name, runtime_state) = runtime(&cfg, &metrics, &shutdown).await?;
    let mut node = node_resources(&cfg, &mut registry)?;
    let (memory_events, recorder, events) = event_recorder(&cfg, api.as_ref().map(|a| &a.clients), &shutdown);
    if node.allocatable_enforced {
        recorder.record(
            crate::events::node_ref(&cfg.node_name),
            crate::events::EventType::Normal,
            "NodeAllocatableEnforced",
            "Updated Node Allocatable limit across pods".to_owned(),
        );
    }
    let base = Base { cfg, rt, metrics, recorder, tracker, shutdown };
    let mut pods =
        pods(&base, &mut node, api.as_ref(), runtime_name, host_ip, &runtime_state, resize_metrics, &mut registry)
            .await?;
    let runtime_state_task =
        task(runtime_state.clone().run(base.rt.clone(), base.shutdown.clone()), tracing::info_span!("runtime_state"));
    let event_bus = EventBus::default();
    let event_api = match &base.cfg.swiftlet.event_api_socket {
        Some(socket) => Some(EventApiServer::new(socket.clone(), event_bus.clone()).bind().await?),
        None => None,
    };
    // Kernel memory-pressure signals (PSI, memcg thresholds, eBPF reclaim) wake the
    // eviction manager.
    let (pressure, pressure_rx) = crate::pressure::PressureSignals::channel();
    let (pleg_tx, pleg_rx) = mpsc::channel(1000);
    let pleg = pleg(&base, &node, &pods, event_bus, &pressure, pleg_tx);

    let stats_source = stats_provider(
        &base.cfg,
        base.rt.clone(),
        pods.pod_manager.clone(),
        node.cm.clone(),
        pods.runtime.volumes().clone(),
        pods.cache.changes(),
        base.metrics.clone(),
    );
    let mut stats_tasks = Vec::new();
    if let Some(stats) = &stats_source {
        // `kubelet_container_log_filesystem_used_bytes`, from the latest collection.
        let latest = Arc::clone(stats);
        registry.register_collector(Box::new(crate::stats::log_metrics::LogMetricsCollector::new(Arc::new(
            move || latest.latest(),
        ))));
        // Walks writable layers and volumes in the background; scrapes read its cache.
        stats_tasks.push(task(stats.fs_usage().run(base.shutdown.clone()), tracing::info_span!("fs_usage")));
        stats_tasks.push(task(
            stats.clone().run_housekeeping(base.shutdown.clone()),
            tracing::info_span!("stats_housekeeping"),
        ));
    }
    let server = server(
        &base,
        api.as_ref(),
        &pods,
        registry,
        &pleg.health,
        &memory_events,
        &stats_source,
        configz,
        serving_slot,
    )?;

    let (update_tx, update_rx) = mpsc::channel::<PodUpdate>(16);
    let kc = &base.cfg.kubelet;
    let static_pods = (!kc.static_pod_path.is_empty()).then(|| {
        let src = FileSource::new(
            kc.static_pod_path.clone().into(),
            base.cfg.node_name.clone(),
            kc.file_check_frequency.to_std(),
            base.recorder.clone(),
        );
        task(src.run(update_tx.clone(), base.shutdown.clone()), tracing::info_span!("static_pods"))
    });
    // Graceful node shutdown (`crate::nodeshutdown`); off without grace periods.
    let mut node_shutdown = crate::nodeshutdown::Manager::from_settings(
        &crate::settings::node_shutdown(kc),
        &base.cfg.root_dir,
        crate::eviction::adapters::AgentPods {
            manager: pods.pod_manager.clone(),
            workers: pods.workers.clone(),
            status: pods.status.clone(),
        },
        pods.workers.clone(),
    )
    .map(|m| {
        m.with_metrics(base.metrics.clone())
            .with_recorder(base.recorder.clone() as Arc<dyn EventRecorder>, &base.cfg.node_name)
    });
    let shutdown_status = node_shutdown.as_ref().map(crate::nodeshutdown::Manager::status);

    let gc = garbage_collection(&base, &pods).await;
    // Before the node status and the sync loop, which take it.
    let (eviction, eviction_tasks) = if let Some(stats) = &stats_source {
        let (manager, tasks) =
            eviction(&base, &pods, &gc, stats, eviction_config, eviction_metrics, pressure, pressure_rx);
        (Some(manager), Some(tasks))
    } else {
        tracing::warn!("no stats: node-pressure eviction is off");
        (None, None)
    };
    let (node_handle, api_tasks) = match api.take() {
        Some(api) => {
            let mode = api_mode(
                &base,
                api,
                &node,
                &pods,
                explicit_node_ip,
                &runtime_state,
                &pleg.health,
                shutdown_status.clone(),
                eviction.clone(),
                observed_addresses,
                update_tx.clone(),
            );
            node_shutdown = node_shutdown.map(|m| m.with_node_sync(mode.sync_now));
            (Some(mode.node), Some(mode.tasks))
        }
        None => (None, None),
    };
    drop(update_tx);
    let status_writer =
        pods.status_writer.take().map(|w| task(w.run(base.shutdown.clone()), tracing::info_span!("status_writer")));
    let event_api = event_api.map(|api| {
        // An error of the event API's server ends its task only.
        let api = api.run(base.shutdown.clone());
        task(
            async move {
                let _ = api.await;
            },
            tracing::info_span!("event_api"),
        )
    });
    // Validation made sure containerLogMaxSize is a quantity.
    let container_logs = match crate::settings::log_rotation(&base.cfg.kubelet) {
        Ok(policy) => {
            let logs = Arc::new(crate::logs::rotation::ContainerLogManager::new(base.rt.clone(), policy));
            Some(task(logs.run(base.shutdown.clone()), tracing::info_span!("container_logs")))
        }
        Err(e) => {
            tracing::error!(error = %e, "container log rotation is off");
            None
        }
    };
    let (pod_manager_view, status_view) = (pods.pod_manager.clone(), pods.status.clone());
    let sources = pods.pod_manager.clone();
    let managers = node.managers;
    managers.topology.set_sources_ready(Box::new(move || sources.sources_handled()));
    let Base { cfg: _, rt, metrics, recorder, tracker, shutdown } = base;
    let cpu_manager = task(
        managers.cpu.run(
            rt.clone(),
            crate::cm::resource_managers::active_pods(pod_manager_view, status_view),
            shutdown.clone(),
        ),
        tracing::info_span!("cpu_manager"),
    );
    let sync_loop = SyncLoop {
        pod_manager: pods.pod_manager,
        workers: pods.workers,
        cache: pods.cache.clone(),
        runtime: pods.runtime,
        cm: node.cm,
        metrics,
        node: node_handle,
        status: pods.status.clone(),
        recorder: recorder.clone(),
        rejected: std::sync::Mutex::default(),
        eviction,
        admit_handlers: {
            let mut handlers: Vec<Arc<dyn crate::lifecycle::admission::PodAdmitHandler>> =
                vec![Arc::new(managers.topology)];
            handlers.push(Arc::new(crate::runtime::security_context::AppArmorAdmitHandler::new(pods.apparmor_enabled)));
            handlers.push(Arc::new(crate::lifecycle::admission::SupplementalGroupsPolicyAdmitHandler(
                runtime_state.clone(),
            )));
            handlers.extend(shutdown_status.map(|s| Arc::new(s) as _));
            handlers
        },
        update_plugin_resources: Some(Arc::new(pods.devices.clone())),
        tracker: tracker.clone(),
        housekeeping_pass: std::sync::Mutex::default(),
    };
    let sync_loop =
        task(sync_loop.run(update_rx, pleg_rx, pods.probe_updates, shutdown.clone()), tracing::info_span!("sync_loop"));
    let node_shutdown = node_shutdown.map(|m| task(m.run(shutdown.clone()), tracing::info_span!("node_shutdown")));
    Ok(Agent {
        tracker,
        shutdown,
        fatal,
        client_certificate,
        serving_certificate,
        events,
        runtime_state: runtime_state_task,
        stats: stats_tasks,
        static_pods,
        api: api_tasks,
        status_writer,
        pleg: pleg.task,
        event_api,
        image_gc: gc.image_gc_task,
        container_gc: gc.container_gc_task,
        eviction: eviction_tasks,
        container_logs,
        node_shutdown,
        cpu_manager,
        sync_loop,
        server,
    })
}

/// What most steps of [`build`] take.
struct Base {
    cfg: Config,
    rt: Arc<dyn RuntimeService>,
    metrics: Arc<KubeletMetrics>,
    recorder: Arc<dyn EventRecorder>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

/// The container runtime, once it answers: the client, its name, and its state (its
/// readiness, network readiness and features, asked now and every 5 s once spawned).
async fn runtime(
    cfg: &Config,
    metrics: &Arc<KubeletMetrics>,
    shutdown: &CancellationToken,
) -> Result<(Arc<dyn RuntimeService>, String, Arc<crate::container::runtime_state::RuntimeState>), Error> {
    let kc = &cfg.kubelet;
    let endpoint = kc.container_runtime_endpoint.clone();
    let remote = RemoteRuntime::new(&endpoint, kc.runtime_request_timeout.to_std(), metrics.clone())
        .map_err(|source| Error::Runtime { endpoint: endpoint.clone(), source })?;
    let runtime_name = connect_runtime(&remote, &endpoint, shutdown).await?;
    let rt: Arc<dyn RuntimeService> = Arc::new(remote);
    let runtime_state = Arc::new(crate::container::runtime_state::RuntimeState::default());
    runtime_state.update(rt.as_ref()).await;
    Ok((rt, runtime_name, runtime_state))
}

/// The node's resources: what the machine is, the resource managers and the cgroups.
struct NodeResources {
    machine: crate::node::MachineFacts,
    /// Hint providers of the topology manager (admission) and container lifecycle hooks
    /// of the runtime manager (container creation).
    managers: crate::cm::resource_managers::ResourceManagers,
    cm: Arc<dyn PodContainerManager>,
    kubepods_dirs: crate::cm::cgroupfs::KubepodsDirs,
    /// Node allocatable is enforced on the pods' cgroup.
    allocatable_enforced: bool,
}

/// Checks swap, sets the host's container resource options, detects the machine, builds
/// the resource managers and makes the node's cgroups (before any pod's).
fn node_resources(cfg: &Config, registry: &mut Registry) -> Result<NodeResources, Error> {
    let kc = &cfg.kubelet;
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
    let managers = crate::cm::resource_managers::build(
        &crate::settings::resource_managers(kc),
        &cfg.root_dir,
        std::path::Path::new("/sys"),
        registry,
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
    Ok(NodeResources { machine, managers, cm, kubepods_dirs, allocatable_enforced })
}

/// The event recorder: in memory (`/events`), and in API mode also posted to the API
/// server by the returned task.
fn event_recorder(
    cfg: &Config,
    api: Option<&ApiClients>,
    shutdown: &CancellationToken,
) -> (MemoryRecorder, Arc<dyn EventRecorder>, Option<Task>) {
    let memory_events = MemoryRecorder::new(&cfg.node_name);
    match api {
        Some(c) => {
            let (r, posting) = crate::events::ApiRecorder::new(memory_events.clone(), c.events.clone());
            let stop = shutdown.clone();
            let posting = task(
                async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = posting => {}
                    }
                },
                tracing::info_span!("events"),
            );
            (memory_events, Arc::new(r), Some(posting))
        }
        None => (memory_events.clone(), Arc::new(memory_events), None),
    }
}

/// What runs pods: the runtime manager and everything it holds, the pod manager, the
/// status manager and the pod workers.
struct Pods {
    runtime: Arc<RuntimeManager>,
    pod_manager: PodManager,
    status: Arc<dyn StatusProvider>,
    /// Writes pod status to the API server (API mode).
    status_writer: Option<crate::status::api::StatusWriter>,
    workers: PodWorkers,
    devices: crate::cm::devicemanager::DeviceManager,
    probe_updates: Option<mpsc::UnboundedReceiver<crate::prober::ProbeUpdate>>,
    prober_metrics: Arc<crate::prober::metrics::ProberMetrics>,
    startup: Arc<crate::pod_startup::PodStartupTracker>,
    /// What the node knows of the runtime's pods: the PLEG's listing and the exits the
    /// kernel saw first, the start calls under way, the change counter the stats provider
    /// watches (`crate::container::cache`).
    cache: Arc<crate::container::cache::RuntimeCache>,
    /// Whether the host has apparmor enabled, read once as upstream's validator does at
    /// start-up.
    apparmor_enabled: bool,
}

/// Builds the runtime manager (with the allocations, probes, images, volumes and the
/// device manager, which starts here from the containers running now), the pod manager,
/// the status manager and the pod workers.
#[expect(clippy::too_many_arguments, reason = "one step of build, given what the steps before made")]
async fn pods(
    base: &Base,
    node: &mut NodeResources,
    api: Option<&Api>,
    runtime_name: String,
    host_ip: Option<String>,
    runtime_state: &Arc<crate::container::runtime_state::RuntimeState>,
    resize_metrics: crate::allocation::ResizeMetrics,
    registry: &mut Registry,
) -> Result<Pods, Error> {
    let Base { cfg, rt, metrics, recorder, tracker, shutdown } = base;
    let kc = &cfg.kubelet;
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
    let object_source: Arc<dyn crate::volumes::source::ObjectSource> = match api {
        Some(a) => Arc::new(crate::api_objects::KubeObjectSource::new(a.clients.main.clone())),
        None => Arc::new(crate::volumes::source::NoApiServer),
    };
    let cache = Arc::new(crate::container::cache::RuntimeCache::default());
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
        .with_metrics(crate::cm::devicemanager::metrics::DevicePluginMetrics::new(registry));
    devices.start(crate::cm::devicemanager::running_containers(rt.as_ref()).await)?;
    node.managers.topology.add_hint_provider(Arc::new(devices.clone()));
    let apparmor_enabled = crate::runtime::security_context::apparmor_enabled_on_host();
    let start_concurrency = crate::settings::runtime_start_concurrency(cfg);
    let runtime = Arc::new(RuntimeManager::new(crate::runtime::manager::RuntimeManagerDeps {
        rt: rt.clone(),
        cm: node.cm.clone(),
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
        cache: cache.clone(),
        probes: probes.clone(),
        runtime_name: runtime_name.clone(),
        startup: startup.clone(),
        container_hooks: vec![node.managers.cpu.clone(), node.managers.memory.clone(), Arc::new(devices.clone())],
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
    if api.is_some() {
        sources.push(crate::types::pod::API_SOURCE);
    }
    let pod_manager = PodManager::new(&sources);
    let (status, status_writer): (Arc<dyn StatusProvider>, _) = match api {
        Some(a) => {
            let (m, w) =
                crate::status::api::ApiStatusManager::new(a.clients.main.clone(), pod_manager.clone(), metrics.clone());
            (Arc::new(m), Some(w))
        }
        None => (Arc::new(StatusManager::default()), None),
    };
    let workers = PodWorkers::new(
        Arc::new(SyncDeps {
            runtime: runtime.clone(),
            cm: node.cm.clone(),
            status: status.clone(),
            metrics: metrics.clone(),
            recorder: recorder.clone() as Arc<dyn EventRecorder>,
            runtime_name,
            sync_frequency: kc.sync_frequency.to_std(),
            host_ip,
            runtime_state: Some(runtime_state.clone()),
        }),
        tracker.clone(),
        shutdown.clone(),
    );
    Ok(Pods {
        runtime,
        pod_manager,
        status,
        status_writer,
        workers,
        devices,
        probe_updates,
        prober_metrics,
        startup,
        cache,
        apparmor_enabled,
    })
}

/// The PLEG the agent runs, known by its trait alone (`/healthz` asks it), and its task.
struct Pleg {
    health: Arc<PlegHealth>,
    task: Task,
}

/// The evented PLEG when asked for and the kernel lets us (the eBPF sensors load here);
/// else the 1 s relist alone. Either writes the runtime cache; its events go to `events`.
fn pleg(
    base: &Base,
    node: &NodeResources,
    pods: &Pods,
    bus: EventBus,
    pressure: &crate::pressure::PressureSignals,
    events: mpsc::Sender<crate::pleg::PodLifecycleEvent>,
) -> Pleg {
    let Base { cfg, rt, metrics, shutdown, .. } = base;
    let sensors = if cfg.swiftlet.evented_pleg {
        crate::pleg::sensors::start(&node.kubepods_dirs, cfg.swiftlet.evented_pleg_ring_buffer_bytes, shutdown)
    } else {
        Err("disabled by --evented-pleg=false".to_string())
    };
    let pleg: Arc<dyn PodLifecycleEventGenerator> = match sensors {
        Ok(running) => {
            let relist = GenericPleg::new(
                rt.clone(),
                metrics.clone(),
                pods.cache.clone(),
                cfg.swiftlet.pleg_relist_period,
                RELIST_THRESHOLD,
            );
            let mut index = CgroupIndex::default();
            if let Some(d) = &node.kubepods_dirs.cgroup2 {
                index.scan(crate::pleg::evented::CGROUP2_HIERARCHY, d);
            }
            let memory_hierarchy = crate::pleg::sensors::memory_hierarchy_id();
            if let Some(d) = &node.kubepods_dirs.memory_v1 {
                index.scan(memory_hierarchy, d);
            }
            pods.startup.set_first_execs_reported(true);
            let sink = observed_sink(bus, pods.pod_manager.clone(), pods.cache.clone(), pods.startup.clone());
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
                GenericPleg::new(rt.clone(), metrics.clone(), pods.cache.clone(), RELIST_PERIOD, RELIST_THRESHOLD)
                    .with_fallback_reason(why),
            )
        }
    };
    let task = task(pleg.start(events, shutdown.clone()), tracing::info_span!("pleg"));
    Pleg { health: Arc::new(PlegHealth(pleg)), task }
}

/// The HTTPS API, the read-only port and `/healthz`, with every endpoint.
#[expect(clippy::too_many_arguments, reason = "one step of build, given what the steps before made")]
fn server(
    base: &Base,
    api: Option<&Api>,
    pods: &Pods,
    registry: Registry,
    pleg_health: &Arc<PlegHealth>,
    memory_events: &MemoryRecorder,
    stats: &StatsState,
    configz: serde_json::Value,
    serving_slot: Option<crate::server::ServingSlot>,
) -> Result<Server, Error> {
    let Base { cfg, rt, metrics, .. } = base;
    let events_view = memory_events.clone();
    let endpoints =
        Endpoints::new(
            Arc::new(PodsView { manager: pods.pod_manager.clone(), status: pods.status.clone() }),
            Arc::new(registry),
        )
        .health_check(pleg_health.clone())
        .http_metrics(metrics.clone())
        .metrics_endpoint("/metrics/probes", pods.prober_metrics.registry())
        .route(
            "/events",
            get(move || {
                let items = events_view.list();
                async move {
                    Json(serde_json::json!({"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}))
                }
            }),
        )
        .debugging_handlers(crate::settings::debugging_handlers(rt.clone(), &cfg.kubelet))
        .route("/stats/summary", get(summary_handler).with_state(stats.clone()))
        .route("/metrics/resource", get(resource_metrics_handler).with_state(stats.clone()))
        .route("/metrics/cadvisor", get(cadvisor_handler).with_state(stats.clone()));
    // Webhook authentication and authorization ask the API server (TokenReview,
    // SubjectAccessReview); standalone, the server refuses those settings.
    let endpoints = match api {
        Some(a) => endpoints.api_client(a.clients.main.clone()),
        None => endpoints,
    };
    let mut server_settings = ServerSettings { configz, ..crate::settings::server(cfg)? };
    server_settings.tls.bootstrap = serving_slot;
    Ok(Server::new(server_settings, endpoints)?)
}

/// Image and container garbage collection, and their tasks.
struct GarbageCollection {
    image_gc: Option<Arc<crate::images::gc::ImageGcManager>>,
    image_gc_task: Option<Task>,
    container_gc: Arc<crate::gc::ContainerGc>,
    container_gc_task: Task,
}

/// Builds image GC (which asks the runtime for its sandbox image when no flag names one)
/// and container GC.
async fn garbage_collection(base: &Base, pods: &Pods) -> GarbageCollection {
    let Base { cfg, rt, metrics, recorder, shutdown, .. } = base;
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
    let (image_gc, image_gc_task) = match crate::images::gc::ImageGcManager::new(
        rt.clone(),
        Arc::new(crate::images::gc::Statvfs),
        crate::settings::image_gc(&cfg.kubelet),
        metrics.clone(),
    ) {
        Ok(gc) => {
            let mut gc =
                gc.with_recorder(recorder.clone(), &cfg.node_name).with_period(crate::settings::image_gc_period(cfg));
            if let Some(image) = &sandbox_image {
                tracing::info!(%image, "image GC keeps the sandbox image");
                gc = gc.with_sandbox_image(image);
            } else {
                tracing::warn!(
                    "the runtime did not name its sandbox image; set --pod-infra-container-image so image GC keeps it"
                );
            }
            let gc = Arc::new(gc);
            let task = task(gc.clone().run(shutdown.clone()), tracing::info_span!("image_gc"));
            (Some(gc), Some(task))
        }
        Err(e) => {
            tracing::error!(error = %e, "image GC is off");
            (None, None)
        }
    };
    let gc_pods = Arc::new(GcPods { manager: pods.pod_manager.clone(), workers: pods.workers.clone() });
    let container_gc = Arc::new(crate::gc::ContainerGc::new(rt.clone(), gc_pods, crate::settings::container_gc(cfg)));
    let container_gc_task = task(
        container_gc.clone().run(crate::gc::CONTAINER_GC_PERIOD, shutdown.clone()),
        tracing::info_span!("container_gc"),
    );
    GarbageCollection { image_gc, image_gc_task, container_gc, container_gc_task }
}

/// The node-pressure eviction manager: it reads the stats, kills through the pod workers
/// and reclaims through the garbage collectors, and is woken by `pressure`'s signals.
#[expect(clippy::too_many_arguments, reason = "one step of build, given what the steps before made")]
fn eviction(
    base: &Base,
    pods: &Pods,
    gc: &GarbageCollection,
    stats: &Arc<crate::stats::provider::StatsProvider>,
    config: crate::eviction::EvictionConfig,
    metrics: crate::eviction::EvictionMetrics,
    pressure: crate::pressure::PressureSignals,
    signals: mpsc::Receiver<crate::pressure::PressureSignal>,
) -> (Arc<crate::eviction::EvictionManager>, EvictionTasks) {
    use crate::eviction::adapters::{AgentKiller, AgentPods, AgentReclaimer, AgentStats};
    let Base { cfg, recorder, shutdown, .. } = base;
    let manager = Arc::new(crate::eviction::EvictionManager::new(
        config,
        crate::eviction::Dependencies {
            stats: Arc::new(AgentStats { provider: stats.clone(), root_dir: cfg.root_dir.clone() }),
            pods: Arc::new(AgentPods {
                manager: pods.pod_manager.clone(),
                workers: pods.workers.clone(),
                status: pods.status.clone(),
            }),
            killer: Arc::new(AgentKiller { workers: pods.workers.clone() }),
            reclaimer: Arc::new(AgentReclaimer { containers: gc.container_gc.clone(), images: gc.image_gc.clone() }),
            recorder: recorder.clone(),
            metrics,
            node_name: cfg.node_name.clone(),
        },
    ));
    let tasks = EvictionTasks {
        manager: task(manager.clone().run(signals, shutdown.clone()), tracing::info_span!("eviction")),
        kernel_signals: cfg
            .swiftlet
            .eviction_kernel_signals
            .then(|| (pressure, crate::settings::memcg_thresholds(&cfg.kubelet))),
    };
    (manager, tasks)
}

/// API mode's node manager and tasks.
struct ApiMode {
    /// The node as registered, for the sync loop's admission.
    node: Arc<std::sync::RwLock<Option<k8s_openapi::api::core::v1::Node>>>,
    /// Asks the node manager for a node status update now (node shutdown does).
    sync_now: Arc<tokio::sync::Notify>,
    tasks: ApiTasks,
}

/// API mode: the watch of the node's pods (into `updates`), mirror pods, and the node
/// manager (registration, node status with the eviction manager's pressure, the Lease),
/// whose failed heartbeats make the clients reconnect.
#[expect(clippy::too_many_arguments, reason = "one step of build, given what the steps before made")]
fn api_mode(
    base: &Base,
    api: Api,
    node: &NodeResources,
    pods: &Pods,
    explicit_node_ip: Option<std::net::IpAddr>,
    runtime_state: &Arc<crate::container::runtime_state::RuntimeState>,
    pleg_health: &Arc<PlegHealth>,
    shutdown_status: Option<crate::nodeshutdown::ShutdownStatus>,
    eviction: Option<Arc<crate::eviction::EvictionManager>>,
    observed_addresses: tokio::sync::watch::Sender<Vec<k8s_openapi::api::core::v1::NodeAddress>>,
    updates: mpsc::Sender<PodUpdate>,
) -> ApiMode {
    let Base { cfg, rt, metrics, shutdown, .. } = base;
    let client = &api.clients.main;
    let mirrors = crate::mirror::MirrorStore::default();
    let heartbeat_failed = Arc::new(tokio::sync::Notify::new());
    let connections = api.reconnector.generation.subscribe();
    let reconnect =
        task(api.reconnector.run(heartbeat_failed.clone(), shutdown.clone()), tracing::info_span!("api_connections"));
    let watch = task(
        crate::sources::api::run(
            client.clone(),
            cfg.node_name.clone(),
            updates,
            mirrors.clone(),
            pods.startup.clone(),
            metrics.clone(),
            connections.clone(),
            shutdown.clone(),
        ),
        tracing::info_span!("api_pods"),
    );
    let health = pleg_health.clone();
    let manager = crate::node::NodeManager::new(
        api.clients.heartbeat.clone(),
        node_settings(cfg, explicit_node_ip),
        node.machine.clone(),
        rt.clone(),
        Arc::new(move || health.check().map_err(|e| format!("PLEG is not healthy: {e}"))),
    )
    .with_runtime_state(runtime_state.clone())
    .with_shutdown_status(shutdown_status.map(|s| Arc::new(move || s.check()) as crate::node::HealthFn))
    .with_heartbeat_failures(heartbeat_failed)
    .with_node_watch(client.clone(), connections)
    .with_pressure(Arc::new(move || {
        eviction.as_ref().map_or_else(crate::node::Pressure::default, |m| crate::node::Pressure {
            memory: m.is_under_memory_pressure(),
            disk: m.is_under_disk_pressure(),
            pid: m.is_under_pid_pressure(),
        })
    }))
    .with_extended_resources({
        let devices = pods.devices.clone();
        Arc::new(move || devices.extended_resources())
    })
    .with_observed_addresses(observed_addresses);
    let mirror_pods = task(
        crate::mirror::run(
            client.clone(),
            pods.pod_manager.clone(),
            mirrors,
            manager.current_handle(),
            pods.status.clone(),
            crate::sync_loop::HOUSEKEEPING_PERIOD,
            shutdown.clone(),
        ),
        tracing::info_span!("mirror_pods"),
    );
    ApiMode {
        node: manager.current_handle(),
        sync_now: manager.sync_now_handle(),
        tasks: ApiTasks {
            connections: reconnect,
            pods: watch,
            mirror_pods,
            node_status: task(manager.run(shutdown.clone()), tracing::info_span!("node_status")),
        },
    }
}

/// `serverTLSBootstrap`: the serving certificate manager (signer
/// `kubernetes.io/kubelet-serving`, the names of the node's `addresses` as last
/// reported), which requests through the main client, and the slot through which the
/// HTTPS API serves its pair. A valid pair from an earlier run is served at once; without
/// one, handshakes fail until the first certificate is issued (upstream likewise).
fn serving_certificate(
    cfg: &Config,
    addresses: tokio::sync::watch::Receiver<Vec<k8s_openapi::api::core::v1::NodeAddress>>,
    api: &ApiClients,
    registry: &mut Registry,
    shutdown: &CancellationToken,
) -> (crate::server::ServingSlot, Task) {
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
    let requests = task(
        manager.run_applying(api.main.clone(), shutdown.clone(), move |pair| {
            served.set(pair.certified.clone());
            tracing::info!("the HTTPS API serves the new serving certificate");
        }),
        tracing::info_span!("serving_certificate"),
    );
    (slot, requests)
}

impl Agent {
    /// Starts every task under the agent's tracker, in the order the agent has always
    /// started them (the sync loop and the server last).
    pub fn spawn(self) -> Running {
        let Self {
            tracker,
            shutdown,
            fatal,
            client_certificate,
            serving_certificate,
            events,
            runtime_state,
            stats,
            static_pods,
            api,
            status_writer,
            pleg,
            event_api,
            image_gc,
            container_gc,
            eviction,
            container_logs,
            node_shutdown,
            cpu_manager,
            sync_loop,
            server,
        } = self;
        let spawn = |task: Task| {
            tracker.spawn(task);
        };
        client_certificate.into_iter().chain(serving_certificate).chain(events).for_each(spawn);
        spawn(runtime_state);
        stats.into_iter().chain(static_pods).for_each(spawn);
        if let Some(api) = api {
            [api.connections, api.pods, api.mirror_pods, api.node_status].into_iter().for_each(spawn);
        }
        status_writer.into_iter().for_each(spawn);
        spawn(pleg);
        event_api.into_iter().chain(image_gc).for_each(spawn);
        spawn(container_gc);
        if let Some(eviction) = eviction {
            spawn(eviction.manager);
            match eviction.kernel_signals {
                Some((signals, settings)) => crate::pressure::spawn_watchers(&tracker, &signals, &settings, &shutdown),
                None => {
                    tracing::info!("--eviction-kernel-signals=false: memory pressure is seen by the 10 s pass only");
                }
            }
        }
        container_logs.into_iter().chain(node_shutdown).for_each(spawn);
        spawn(cpu_manager);
        spawn(sync_loop);
        let server_shutdown = shutdown.clone();
        let server =
            tracker.spawn(async move { server.run(server_shutdown).await }.instrument(tracing::info_span!("server")));
        Running { tracker, shutdown, fatal, server }
    }
}

/// The agent with every task started.
#[derive(Debug)]
pub struct Running {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    fatal: Fatal,
    server: tokio::task::JoinHandle<crate::server::Result<()>>,
}

impl Running {
    /// Waits for `shutdown` (or the server's end), then gives every task
    /// [`SHUTDOWN_GRACE`] to finish; returns the error a task stopped the agent with, or
    /// the server's.
    pub async fn wait(self) -> Result<(), Error> {
        let Self { tracker, shutdown, fatal, server } = self;
        let server_result = tokio::select! {
            () = shutdown.cancelled() => None,
            r = server => Some(r),
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
}

#[cfg(test)]
mod tests {
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
