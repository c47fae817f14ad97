//! The event recorder and what runs pods: the runtime manager with everything it holds,
//! the pod manager, the status manager and the pod workers.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::api_clients::{Api, ApiClients};
use super::node::NodeResources;
use super::{Base, Error, Task, task};
use crate::config::Config;
use crate::container::Backoff;
use crate::events::{EventRecorder, MemoryRecorder};
use crate::pod_manager::PodManager;
use crate::pod_workers::{PodWorkers, SyncDeps};
use crate::runtime::RuntimeManager;
use crate::status::{StatusManager, StatusProvider};
use crate::types::pod::FILE_SOURCE;

/// The event recorder: in memory (`/events`), and in API mode also posted to the API
/// server by the returned task.
pub(super) fn event_recorder(
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
pub(super) struct Pods {
    pub(super) runtime: Arc<RuntimeManager>,
    pub(super) pod_manager: PodManager,
    pub(super) status: Arc<dyn StatusProvider>,
    /// Writes pod status to the API server (API mode).
    pub(super) status_writer: Option<crate::status::api::StatusWriter>,
    pub(super) workers: PodWorkers,
    pub(super) devices: crate::cm::devicemanager::DeviceManager,
    pub(super) probe_updates: Option<mpsc::UnboundedReceiver<crate::prober::ProbeUpdate>>,
    /// UIDs of pods whose devices changed health (the device manager's).
    pub(super) health_updates: mpsc::UnboundedReceiver<Vec<String>>,
    pub(super) prober_metrics: Arc<crate::prober::metrics::ProberMetrics>,
    pub(super) startup: Arc<crate::pod_startup::PodStartupTracker>,
    /// What the node knows of the runtime's pods: the PLEG's listing and the exits the
    /// kernel saw first, the start calls under way, the change counter the stats provider
    /// watches (`crate::container::cache`).
    pub(super) cache: Arc<crate::container::cache::RuntimeCache>,
    /// Whether the host has apparmor enabled, read once as upstream's validator does at
    /// start-up.
    pub(super) apparmor_enabled: bool,
}

/// The user namespace manager: `userNamespaces.idsPerPod` ids per pod, cut from the
/// `kubelet` user's subordinate ids (or every id from `idsPerPod` up), the ranges of the
/// pods on disk read back.
fn user_namespaces(
    cfg: &crate::config::Config,
    runtime_state: &Arc<crate::container::runtime_state::RuntimeState>,
) -> Result<crate::runtime::userns::UsernsManager, Error> {
    use crate::runtime::userns;
    let kc = &cfg.kubelet;
    let ids = kc
        .user_namespaces
        .as_ref()
        .and_then(|u| u.ids_per_pod)
        .filter(|n| *n != 0)
        .map_or(Ok(userns::UNIT), u32::try_from)
        .map_err(|_| Error::UserNamespaces("userNamespaces.idsPerPod must not be more than 4294967295".into()))?;
    let mapping = userns::kubelet_mappings(ids).map_err(|e| Error::UserNamespaces(format!("kubelet mappings: {e}")))?;
    let max_pods = u32::try_from(kc.max_pods).unwrap_or(0);
    userns::UsernsManager::new(&cfg.root_dir.join("pods"), ids, mapping, max_pods, runtime_state.clone())
        .map_err(Error::UserNamespaces)
}

/// Builds the runtime manager (with the allocations, probes, images, volumes and the
/// device manager, which starts here from the containers running now), the pod manager,
/// the status manager and the pod workers.
#[expect(clippy::too_many_arguments, reason = "one step of build, given what the steps before made")]
pub(super) async fn build(
    base: &Base,
    node: &mut NodeResources,
    api: Option<&Api>,
    runtime_name: String,
    host_ip: Option<String>,
    runtime_state: &Arc<crate::container::runtime_state::RuntimeState>,
    resize_metrics: crate::allocation::ResizeMetrics,
    registry: &mut Registry,
) -> Result<Pods, Error> {
    let Base { cfg, rt, metrics, recorder, tracker, shutdown, bus } = base;
    let kc = &cfg.kubelet;
    // In-place resize: the allocations admitted pods run with (checkpointed).
    let allocation = Arc::new(
        crate::allocation::AllocationManager::new(&cfg.root_dir, crate::settings::node_resize(kc), resize_metrics)?
            .with_recorder(recorder.clone()),
    );
    let crash_max = crate::settings::crash_loop_max(kc);
    // ConfigMaps, Secrets and tokens for volumes and env: from the API server, or none.
    let object_source: Arc<dyn crate::volumes::source::ObjectSource> = match api {
        Some(a) => Arc::new(crate::api_objects::KubeObjectSource::new(a.clients.main.clone())),
        None => Arc::new(crate::volumes::source::NoApiServer),
    };
    // CSI drivers register through the plugin manager; their node objects in API mode.
    let csi_node_info: Arc<dyn crate::volumes::csi::NodeInfoUpdater> = match api {
        Some(a) => Arc::new(crate::volumes::csi::KubeNodeInfo::new(a.clients.main.clone(), cfg.node_name.clone())),
        None => Arc::new(crate::volumes::csi::NoNodeInfo),
    };
    let volume_metrics = crate::volumes::metrics::VolumeMetrics::new(registry);
    let csi = Arc::new(
        crate::volumes::csi::CsiDrivers::new(cfg.node_name.clone(), csi_node_info).with_metrics(volume_metrics.clone()),
    );
    // Dynamic Resource Allocation: claims come from the API server.
    let dra = match api {
        Some(a) => {
            let claims = Arc::new(crate::dra::KubeClaimSource::new(a.clients.main.clone()));
            let dra = crate::dra::DraManager::new(&cfg.root_dir, &cfg.node_name, claims)?
                .with_metrics(crate::dra::metrics::DraMetrics::new(registry));
            registry.register_collector(Box::new(dra.claims_in_use_collector()));
            dra.start();
            Some(dra)
        }
        None => None,
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
    let startup = Arc::new(crate::pod_startup::PodStartupTracker::new(metrics.pod_startup.clone()));
    // The device manager joins the resource managers.
    let devices = crate::cm::devicemanager::DeviceManager::new(&cfg.root_dir)?
        .with_metrics(crate::cm::devicemanager::metrics::DevicePluginMetrics::new(registry));
    // Device plugins and DRA drivers tell the sync loop which pods' devices changed health.
    let (health_tx, health_updates) = mpsc::unbounded_channel();
    devices.set_health_updates(health_tx.clone());
    if let Some(dra) = &dra {
        dra.set_health_updates(health_tx);
    }
    devices.start(crate::cm::devicemanager::running_containers(rt.as_ref()).await)?;
    node.managers.topology.add_hint_provider(Arc::new(devices.clone()));
    let apparmor_enabled = crate::runtime::security_context::apparmor_enabled_on_host();
    let start_concurrency = crate::settings::runtime_start_concurrency(cfg);
    let runtime = Arc::new(RuntimeManager::new(crate::runtime::manager::RuntimeManagerDeps {
        rt: rt.clone(),
        cm: node.cm.clone(),
        metrics: metrics.runtime.clone(),
        cfg: crate::settings::runtime_manager(cfg, host_ip.clone()),
        backoff: Backoff::new(
            crate::container::backoff::INITIAL.min(crash_max),
            crash_max,
            Arc::new(crate::container::backoff::TokioClock::new()),
        ),
        images: Arc::new(
            crate::images::puller::ImageManager::new(
                rt.clone(),
                crate::settings::image_puller(kc),
                metrics.images.clone(),
            )
            .with_recorder(recorder.clone())
            .with_startup_tracker(startup.clone()),
        ),
        recorder: recorder.clone(),
        volumes: Arc::new(
            crate::volumes::VolumeManager::new(cfg.root_dir.clone(), object_source)
                .with_csi(csi.clone())
                .with_metrics(volume_metrics),
        ),
        dns: crate::settings::dns(kc),
        cache: cache.clone(),
        probes: probes.clone(),
        runtime_name: runtime_name.clone(),
        startup: startup.clone(),
        container_hooks: {
            let mut hooks: Vec<Arc<dyn crate::cm::container_lifecycle::ContainerLifecycleHook>> =
                vec![node.managers.cpu.clone(), node.managers.memory.clone(), Arc::new(devices.clone())];
            hooks.extend(dra.clone().map(|d| Arc::new(d) as _));
            hooks
        },
        allocation: allocation.clone(),
        start_concurrency,
        security: crate::runtime::security_context::SecuritySettings::new(
            kc.seccomp_default,
            &cfg.root_dir,
            apparmor_enabled,
        ),
        userns: Arc::new(user_namespaces(cfg, runtime_state)?),
        dra,
        // Runtime classes come from the API server; standalone, every pod runs on the
        // default handler (as upstream's kubelet without a client).
        runtime_classes: crate::runtime::runtime_class::RuntimeClasses::new(api.map(|a| {
            Arc::new(crate::runtime::runtime_class::KubeRuntimeClasses::new(a.clients.main.clone()))
                as Arc<dyn crate::runtime::runtime_class::RuntimeClassSource>
        })),
        devices: Some(devices.clone()),
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
            let (m, w) = crate::status::api::ApiStatusManager::new(
                a.clients.main.clone(),
                pod_manager.clone(),
                metrics.status.clone(),
            );
            (Arc::new(m), Some(w))
        }
        None => (Arc::new(StatusManager::default()), None),
    };
    let workers = PodWorkers::new(
        Arc::new(SyncDeps {
            runtime: runtime.clone(),
            cm: node.cm.clone(),
            status: status.clone(),
            metrics: metrics.pod_workers.clone(),
            recorder: recorder.clone() as Arc<dyn EventRecorder>,
            runtime_name,
            sync_frequency: kc.sync_frequency.to_std(),
            host_ip,
            runtime_state: Some(runtime_state.clone()),
            records: bus.clone(),
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
        health_updates,
        prober_metrics,
        startup,
        cache,
        apparmor_enabled,
    })
}
