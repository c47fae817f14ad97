//! Wiring: builds every subsystem from a [`Config`] and runs them until shutdown
//! (upstream `cmd/kubelet/app` + `Kubelet.Run`), in two stages. [`build`] makes every
//! subsystem and connects them: it waits for the container runtime, reads checkpoints and
//! binds sockets, but spawns none of the agent's tasks. [`Agent::spawn`] then starts them
//! under one tracker; one cancellation token stops them all, and they get a grace period to
//! finish. Stopping the agent leaves pods running, as the kubelet does: a restart adopts
//! them.
//!
//! This file holds [`build`] and the [`Agent`] it returns; each step of the build is a
//! module beside it, in the order [`build`] takes them: `api_clients` (the clients of the
//! API server, their certificate rotation and reconnection), `runtime` (the container
//! runtime, waited for), `node` (the machine, the resource managers, the node's cgroups),
//! `pods` (the event recorder, the runtime manager, the pod manager, the status manager,
//! the pod workers), `pleg`, `stats_handlers` (the stats provider and the stats
//! endpoints), `serve` (the HTTPS API and its serving certificate), `housekeeping`
//! (garbage collection and eviction), `api_mode` (the watch of the node's pods, mirror
//! pods, the node manager) and `spawn` ([`Agent::spawn`], [`Running`]). `adapters` holds
//! the small adapters that join two subsystems.

mod adapters;
mod api_clients;
mod api_mode;
mod housekeeping;
pub mod metrics;
mod node;
mod pleg;
mod pods;
mod runtime;
mod serve;
mod spawn;
mod stats_handlers;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::config::Config;
use crate::container::RuntimeService;
use crate::event_api::{EventApiServer, EventBus};
use crate::events::EventRecorder;
use crate::server::Server;
use crate::sources::PodUpdate;
use crate::sources::file::FileSource;
use crate::sync_loop::SyncLoop;
use api_mode::ApiTasks;
use housekeeping::EvictionTasks;
use metrics::KubeletMetrics;
pub use spawn::Running;
use stats_handlers::stats_provider;

/// How long tasks get to finish after shutdown is asked. SIGTERM must end the agent
/// within 2 s (pods are left running, as the kubelet leaves them); this, the span
/// export's [`crate::telemetry::SHUTDOWN_TIMEOUT`] and the blocking pool's wait in `main`
/// fit in that.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

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
    #[error("cgroup driver: {0}")]
    CgroupDriver(String),
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
    /// The DRA manager's checkpoint could not be restored.
    #[error("DRA manager: {0}")]
    Dra(#[from] crate::dra::Error),
    #[error("pod allocations: {0}")]
    Allocation(#[from] crate::allocation::Error),
    /// The user namespace mappings (upstream's kubelet does not start either).
    #[error("user namespace manager: {0}")]
    UserNamespaces(String),
    #[error("{0}")]
    ResourceManagers(#[from] crate::cm::resource_managers::Error),
    /// An `allowedUnsafeSysctls` entry that is not a namespaced sysctl (pattern).
    #[error("{0}")]
    Sysctls(String),
    /// `rotateCertificates`: the client certificate expired and no new one could be had
    /// (upstream exits here too, so that a restart bootstraps new credentials).
    #[error(
        "no valid client certificate for {0:?} and none could be obtained; exiting so that a restart can \
         bootstrap new credentials"
    )]
    CredentialsLapsed(Duration),
    /// The root directory or one of the directories under it could not be set up.
    #[error("error configuring root directory {path}: {message}")]
    RootDir { path: String, message: String },
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
    /// Plugins registering under `<root-dir>/plugins_registry` (CSI drivers).
    plugin_manager: Task,
    node_shutdown: Option<Task>,
    cpu_manager: Task,
    sync_loop: Task,
    server: Server,
}

/// The plugin manager with the CSI and DRA drivers' handlers, DRA's reconcile loop, and
/// in API mode the node's
/// `CSINode` object created at start (upstream creates it before any driver registers),
/// retried until the node exists.
fn plugin_manager(base: &Base, pods: &pods::Pods, registry: &mut Registry) -> Task {
    let mut manager = crate::pluginmanager::PluginManager::new(base.cfg.root_dir.join("plugins_registry"))
        .with_metrics(crate::pluginmanager::metrics::PluginManagerMetrics::new(registry));
    let csi = pods.runtime.volumes().csi().clone();
    manager.add_handler(crate::pluginmanager::CSI_PLUGIN, csi.clone());
    let dra = pods.runtime.dra().cloned();
    if let Some(dra) = &dra {
        manager.add_handler(crate::pluginmanager::DRA_PLUGIN, Arc::new(dra.clone()));
    }
    let shutdown = base.shutdown.clone();
    // Upstream's DRA reconcile loop: claims of pods no longer active are unprepared, once
    // the pod sources are ready.
    let reconcile_dra = {
        let shutdown = shutdown.clone();
        let pod_manager = pods.pod_manager.clone();
        async move {
            let Some(dra) = dra else { return };
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(crate::dra::RECONCILE_PERIOD) => {}
                }
                if pod_manager.sources_ready() {
                    dra.unprepare_inactive(&pod_manager.uids()).await;
                }
            }
        }
    };
    let init_csi_node = {
        let shutdown = shutdown.clone();
        async move {
            loop {
                match csi.node_info().init().await {
                    Ok(()) => return,
                    Err(e) => tracing::debug!(error = %e, "CSINode not written yet; retrying"),
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
                }
            }
        }
    };
    task(
        async move {
            tokio::join!(init_csi_node, reconcile_dra, manager.run(shutdown));
        },
        tracing::info_span!("plugin_manager"),
    )
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").finish_non_exhaustive()
    }
}

/// Runs the agent until `shutdown` is cancelled (or a task stops it with an error, which
/// is returned): [`build`], then [`Agent::spawn`], then [`Running::wait`].
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), Error> {
    // The build holds every subsystem across its awaits: on the heap, not in the
    // caller's future.
    Box::pin(build(cfg, shutdown)).await?.spawn().wait().await
}

/// The root directory and the directories under it that others look for (upstream's
/// setupDataDirs): the root made rshared ([`crate::volumes::mounter::make_rshared`]) before
/// anything is mounted below it, then `pods`, `plugins` and `plugins_registry`.
fn setup_data_dirs(root: &std::path::Path) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt as _;
    let fail = |e: std::io::Error| Error::RootDir { path: root.display().to_string(), message: e.to_string() };
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(root).map_err(fail)?;
    if crate::volumes::mounter::make_rshared(root).map_err(fail)? {
        tracing::info!(root = %root.display(), "bind-mounted the root directory with shared mount propagation");
    }
    for dir in ["pods", "plugins", "plugins_registry"] {
        std::fs::DirBuilder::new().recursive(true).mode(0o750).create(root.join(dir)).map_err(fail)?;
    }
    Ok(())
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
    // Checked first: a bad `allowedUnsafeSysctls` stops the agent, as upstream's.
    let sysctls =
        crate::lifecycle::sysctl::SysctlAllowlist::new(&cfg.kubelet.allowed_unsafe_sysctls).map_err(Error::Sysctls)?;
    crate::settings::apply_reserved_system_cpus(&mut cfg.kubelet);
    setup_data_dirs(&cfg.root_dir)?;
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
            let (slot, task) = serve::serving_certificate(&cfg, addresses, &api.clients, &mut registry, &shutdown);
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

    let (rt, runtime_name, runtime_state) = runtime::connect(&cfg, &metrics.cri, &shutdown).await?;
    cfg.kubelet.cgroup_driver = runtime::cgroup_driver(rt.as_ref(), &cfg.kubelet.cgroup_driver, &mut registry).await?;
    let mut node = node::resources(&cfg, &mut registry)?;
    let (memory_events, recorder, events) = pods::event_recorder(&cfg, api.as_ref().map(|a| &a.clients), &shutdown);
    if node.allocatable_enforced {
        recorder.record(
            crate::events::node_ref(&cfg.node_name),
            crate::events::EventType::Normal,
            "NodeAllocatableEnforced",
            "Updated Node Allocatable limit across pods".to_owned(),
        );
    }
    // The event API's bus: what the PLEG sees, and the agent's records.
    let bus = EventBus::default();
    let base = Base { cfg, rt, metrics, recorder, tracker, shutdown, bus };
    let mut pods = pods::build(
        &base,
        &mut node,
        api.as_ref(),
        runtime_name,
        host_ip,
        &runtime_state,
        resize_metrics,
        &mut registry,
    )
    .await?;
    let runtime_state_task =
        task(runtime_state.clone().run(base.rt.clone(), base.shutdown.clone()), tracing::info_span!("runtime_state"));
    let plugin_manager = plugin_manager(&base, &pods, &mut registry);
    // `volume_manager_total_volumes`, counted at scrape time.
    registry.register_collector(Box::new(crate::volumes::metrics::total_volumes::TotalVolumesCollector::new(
        pods.runtime.volumes().clone(),
    )));
    let event_api = match &base.cfg.swiftlet.event_api_socket {
        Some(socket) => Some(EventApiServer::new(socket.clone(), base.bus.clone()).bind().await?),
        None => None,
    };
    // Kernel memory-pressure signals (PSI, memcg thresholds, eBPF reclaim) wake the
    // eviction manager.
    let (pressure, pressure_rx) = crate::pressure::PressureSignals::channel();
    let (pleg_tx, pleg_rx) = mpsc::channel(1000);
    let pleg = pleg::build(&base, &node, &pods, base.bus.clone(), &pressure, pleg_tx);

    let stats_source = stats_provider(
        &base.cfg,
        base.rt.clone(),
        pods.pod_manager.clone(),
        node.cm.clone(),
        pods.runtime.volumes().clone(),
        pods.cache.changes(),
        base.metrics.stats.clone(),
    );
    let mut stats_tasks = Vec::new();
    if let Some(stats) = &stats_source {
        // `kubelet_container_log_filesystem_used_bytes`, from the latest collection.
        let latest = Arc::clone(stats);
        registry.register_collector(Box::new(crate::stats::log_metrics::LogMetricsCollector::new(Arc::new(
            move || latest.latest(),
        ))));
        // `kubelet_volume_stats_*` of the volumes from claims.
        let latest = Arc::clone(stats);
        registry.register_collector(Box::new(crate::stats::volume_metrics::VolumeStatsCollector::new(Arc::new(
            move || latest.latest(),
        ))));
        // Walks writable layers and volumes in the background; scrapes read its cache.
        stats_tasks.push(task(stats.fs_usage().run(base.shutdown.clone()), tracing::info_span!("fs_usage")));
        stats_tasks.push(task(
            stats.clone().run_housekeeping(base.shutdown.clone()),
            tracing::info_span!("stats_housekeeping"),
        ));
    }
    let server = serve::server(
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
        {
            let active = crate::eviction::adapters::AgentPods {
                manager: pods.pod_manager.clone(),
                workers: pods.workers.clone(),
                status: pods.status.clone(),
            };
            // Node shutdown copies the pods it kills (once, at shutdown).
            Arc::new(move || {
                crate::eviction::ActivePods::active_pods(&active).into_iter().map(Arc::unwrap_or_clone).collect()
            })
        },
        Arc::new(crate::nodeshutdown::adapters::AgentTerminator { workers: pods.workers.clone() }),
    )
    .map(|m| {
        m.with_metrics(base.metrics.shutdown.clone())
            .with_recorder(base.recorder.clone() as Arc<dyn EventRecorder>, &base.cfg.node_name)
    });
    let shutdown_status = node_shutdown.as_ref().map(crate::nodeshutdown::Manager::status);

    let gc = housekeeping::garbage_collection(&base, &pods).await;
    // Before the node status and the sync loop, which take it.
    let (eviction, eviction_tasks) = if let Some(stats) = &stats_source {
        let (manager, tasks) =
            housekeeping::eviction(&base, &pods, &gc, stats, eviction_config, eviction_metrics, pressure, pressure_rx);
        (Some(manager), Some(tasks))
    } else {
        tracing::warn!("no stats: node-pressure eviction is off");
        (None, None)
    };
    let (node_handle, api_tasks) = match api.take() {
        Some(api) => {
            let mode = api_mode::build(
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
    let Base { cfg: _, rt, metrics, recorder, tracker, shutdown, bus: _ } = base;
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
        metrics: metrics.sync_loop.clone(),
        pleg_metrics: metrics.pleg.clone(),
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
            handlers.push(Arc::new(sysctls));
            handlers.push(Arc::new(crate::lifecycle::declared_features::DeclaredFeaturesAdmitHandler));
            handlers.extend(shutdown_status.map(|s| Arc::new(s) as _));
            handlers
        },
        update_plugin_resources: Some(Arc::new(pods.devices.clone())),
        tracker: tracker.clone(),
        housekeeping_pass: std::sync::Mutex::default(),
    };
    let sync_loop = task(
        sync_loop.run(update_rx, pleg_rx, pods.probe_updates, Some(pods.health_updates), shutdown.clone()),
        tracing::info_span!("sync_loop"),
    );
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
        plugin_manager,
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
    /// The event API's bus (`crate::event_api`): the PLEG's events and the agent's
    /// records (the status the pod workers compute, the PLEG dispatch, the eviction
    /// decision) go there, whether or not the event API serves it.
    bus: EventBus,
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
