//! API mode: the watch of the node's pods, mirror pods, and the node manager.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::adapters::PlegHealth;
use super::api_clients::Api;
use super::node::NodeResources;
use super::pods::Pods;
use super::{Base, Task, task};
use crate::server::HealthCheck as _;
use crate::sources::PodUpdate;

/// The tasks of API mode.
pub(super) struct ApiTasks {
    /// Resets the clients' connections when a heartbeat fails.
    pub(super) connections: Task,
    /// The watch of the node's pods.
    pub(super) pods: Task,
    pub(super) mirror_pods: Task,
    /// Registration, node status and the Lease.
    pub(super) node_status: Task,
}

/// API mode's node manager and tasks.
pub(super) struct ApiMode {
    /// The node as registered, for the sync loop's admission.
    pub(super) node: Arc<std::sync::RwLock<Option<k8s_openapi::api::core::v1::Node>>>,
    /// Asks the node manager for a node status update now (node shutdown does).
    pub(super) sync_now: Arc<tokio::sync::Notify>,
    pub(super) tasks: ApiTasks,
}

/// API mode: the watch of the node's pods (into `updates`), mirror pods, and the node
/// manager (registration, node status with the eviction manager's pressure, the Lease),
/// whose failed heartbeats make the clients reconnect.
#[expect(clippy::too_many_arguments, reason = "one step of build, given what the steps before made")]
pub(super) fn build(
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
            metrics.sources.clone(),
            connections.clone(),
            shutdown.clone(),
        ),
        tracing::info_span!("api_pods"),
    );
    let health = pleg_health.clone();
    let manager = crate::node::NodeManager::new(
        api.clients.heartbeat.clone(),
        crate::settings::node(cfg, explicit_node_ip),
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
    .with_volumes_in_use({
        let volumes = pods.runtime.volumes().clone();
        Arc::new(move || volumes.volumes_in_use())
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
