//! The node in the API (`kubelet_node_status.go`, `nodelease`): registration, the node
//! status computed every `nodeStatusUpdateFrequency` and reported when it changed or
//! every `nodeStatusReportFrequency`, and the Lease in `kube-node-lease` renewed every
//! `nodeLeaseDurationSeconds / 4`. A deleted Node object is registered again.

pub mod facts;
pub mod watch;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeFeatures, NodeSpec,
    NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

pub use facts::MachineFacts;

use crate::container::{RuntimeService, runtime_state};

/// The namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Most images reported in node status (upstream `nodeStatusMaxImages` default).
const MAX_IMAGES: usize = 50;

/// Errors of node registration and status reporting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("API request {what} failed: {source}")]
    Api {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the node manager needs from the configuration.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    pub node_name: String,
    pub hostname: String,
    /// `--node-ip`; without it the `InternalIP` is the host's primary address, found
    /// anew for every status (as upstream, it follows the host's address).
    pub node_ip: Option<IpAddr>,
    /// `--node-labels`.
    pub labels: BTreeMap<String, String>,
    /// `registerWithTaints`.
    pub taints: Vec<Taint>,
    pub max_pods: i32,
    /// The kubelet port (daemonEndpoints).
    pub port: i32,
    pub kube_reserved: BTreeMap<String, String>,
    pub system_reserved: BTreeMap<String, String>,
    pub eviction_hard: BTreeMap<String, String>,
    pub update_frequency: Duration,
    pub report_frequency: Duration,
    pub lease_duration_secs: i32,
    pub kubelet_version: String,
}

/// Is the node able to run pods as far as the agent's own health checks go (the PLEG's;
/// with a [`runtime_state::RuntimeState`], the runtime's state is checked besides).
pub type HealthFn = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;
/// Capacity and allocatable of the device plugin resources (the device manager's).
pub type ExtendedResourcesFn = Arc<dyn Fn() -> crate::cm::devicemanager::ExtendedResources + Send + Sync>;

/// Gives the volumes in use on the node (`status.volumesInUse`, sorted).
pub type VolumesInUseFn = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

fn now() -> Time {
    Time(Timestamp::now())
}

fn binary_si(bytes: u64) -> Quantity {
    Quantity(crate::types::quantity::binary_si(bytes))
}

fn ki(bytes: u64) -> Quantity {
    Quantity(format!("{}Ki", bytes / 1024))
}

fn reserved_bytes(map: &BTreeMap<String, String>, key: &str) -> u64 {
    map.get(key).and_then(|v| crate::types::quantity::parse_bytes(v).ok()).map_or(0, |b| b.max(0) as u64)
}

fn reserved_milli(map: &BTreeMap<String, String>, key: &str) -> u64 {
    map.get(key).and_then(|v| crate::types::quantity::parse_milli_cpu(v).ok()).map_or(0, |m| m.max(0) as u64)
}

/// An eviction threshold as bytes of `capacity` (`100Mi` or `10%`).
fn threshold_bytes(map: &BTreeMap<String, String>, signal: &str, capacity: u64) -> u64 {
    match map.get(signal) {
        Some(v) if v.ends_with('%') => {
            let pct: f64 = v.trim_end_matches('%').parse().unwrap_or(0.0);
            (capacity as f64 * pct / 100.0) as u64
        }
        Some(v) => crate::types::quantity::parse_bytes(v).map_or(0, |b| b.max(0) as u64),
        None => 0,
    }
}

/// Node labels the kubelet sets itself, plus `--node-labels`.
#[must_use]
pub fn node_labels(s: &NodeSettings, f: &MachineFacts) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), s.hostname.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), f.architecture.clone()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), f.architecture.clone()),
    ]);
    l.extend(s.labels.clone());
    l
}

/// Capacity and allocatable (capacity minus kubeReserved, systemReserved and the hard
/// eviction thresholds, as upstream `GetNodeAllocatableAbsolute` + eviction).
#[must_use]
pub fn capacity_and_allocatable(
    s: &NodeSettings,
    f: &MachineFacts,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let mut capacity = BTreeMap::from([
        ("cpu".to_string(), Quantity(f.cpus.to_string())),
        ("memory".to_string(), ki(f.memory_bytes)),
        ("ephemeral-storage".to_string(), ki(f.ephemeral_storage_bytes)),
        ("pods".to_string(), Quantity(s.max_pods.to_string())),
    ]);
    // Every page size the kernel offers, with what is preallocated (often 0), as cAdvisor's
    // machine info; allocatable subtracts the reserved `hugepages-<size>`.
    let mut hugepages = BTreeMap::new();
    for (&size, &total) in &f.hugepages {
        let name = crate::cm::resources::hugepage_resource_name(size);
        let left = total
            .saturating_sub(reserved_bytes(&s.kube_reserved, &name))
            .saturating_sub(reserved_bytes(&s.system_reserved, &name));
        capacity.insert(name.clone(), binary_si(total));
        hugepages.insert(name, binary_si(left));
    }
    let cpu_milli = (f.cpus * 1000)
        .saturating_sub(reserved_milli(&s.kube_reserved, "cpu"))
        .saturating_sub(reserved_milli(&s.system_reserved, "cpu"));
    let mem = f
        .memory_bytes
        .saturating_sub(reserved_bytes(&s.kube_reserved, "memory"))
        .saturating_sub(reserved_bytes(&s.system_reserved, "memory"))
        .saturating_sub(threshold_bytes(&s.eviction_hard, "memory.available", f.memory_bytes));
    let eph = f
        .ephemeral_storage_bytes
        .saturating_sub(reserved_bytes(&s.kube_reserved, "ephemeral-storage"))
        .saturating_sub(reserved_bytes(&s.system_reserved, "ephemeral-storage"))
        .saturating_sub(threshold_bytes(&s.eviction_hard, "nodefs.available", f.ephemeral_storage_bytes));
    let cpu = if cpu_milli.is_multiple_of(1000) { (cpu_milli / 1000).to_string() } else { format!("{cpu_milli}m") };
    let mut allocatable = capacity.clone();
    allocatable.insert("cpu".into(), Quantity(cpu));
    allocatable.insert("memory".into(), ki(mem));
    // Upstream reports allocatable ephemeral storage in plain bytes.
    allocatable.insert("ephemeral-storage".into(), Quantity(eph.to_string()));
    allocatable.extend(hugepages);
    (capacity, allocatable)
}

fn condition(type_: &str, ok: bool, reason: &str, message: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        ..Default::default()
    }
}

/// The eviction manager's pressure conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

/// Reads the current [`Pressure`] (the eviction manager's).
pub type PressureFn = Arc<dyn Fn() -> Pressure + Send + Sync>;

/// The node's conditions: `health` decides Ready, `pressure` the pressure conditions
/// (upstream's reasons and messages).
#[must_use]
pub fn conditions(health: &Result<(), String>, pressure: Pressure) -> Vec<NodeCondition> {
    vec![
        if pressure.memory {
            condition(
                "MemoryPressure",
                true,
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            )
        } else {
            condition("MemoryPressure", false, "KubeletHasSufficientMemory", "kubelet has sufficient memory available")
        },
        if pressure.disk {
            condition("DiskPressure", true, "KubeletHasDiskPressure", "kubelet has disk pressure")
        } else {
            condition("DiskPressure", false, "KubeletHasNoDiskPressure", "kubelet has no disk pressure")
        },
        if pressure.pid {
            condition("PIDPressure", true, "KubeletHasInsufficientPID", "kubelet has insufficient PID available")
        } else {
            condition("PIDPressure", false, "KubeletHasSufficientPID", "kubelet has sufficient PID available")
        },
        match health {
            Ok(()) => condition("Ready", true, "KubeletReady", "kubelet is posting ready status"),
            Err(why) => condition("Ready", false, "KubeletNotReady", why),
        },
    ]
}

/// Carries transition times over from the previous conditions (they change only when
/// the status flips) and stamps the heartbeat.
fn stamp_conditions(new: &mut [NodeCondition], old: Option<&[NodeCondition]>) {
    let t = now();
    for c in new {
        c.last_heartbeat_time = Some(t.clone());
        let prev = old.and_then(|o| o.iter().find(|p| p.type_ == c.type_));
        c.last_transition_time = match prev {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Some(t.clone()),
        };
    }
}

/// Images for node status: largest first, at most [`MAX_IMAGES`], as upstream.
#[must_use]
pub fn node_images(images: &[crate::container::api::Image]) -> Vec<ContainerImage> {
    let mut v: Vec<&crate::container::api::Image> = images.iter().collect();
    v.sort_by_key(|i| std::cmp::Reverse(i.size));
    v.into_iter()
        .take(MAX_IMAGES)
        .map(|i| ContainerImage {
            names: Some(i.repo_digests.iter().chain(i.repo_tags.iter()).cloned().collect()),
            size_bytes: Some(i.size as i64),
        })
        .collect()
}

/// Registers the node, keeps its status current and renews its Lease.
#[derive(Clone)]
pub struct NodeManager {
    client: kube::Client,
    settings: NodeSettings,
    facts: MachineFacts,
    rt: Arc<dyn RuntimeService>,
    health: HealthFn,
    pressure: Option<PressureFn>,
    /// Wakes the status loop before its period (e.g. the node shutdown manager's).
    sync_now: Arc<tokio::sync::Notify>,
    extended: Option<ExtendedResourcesFn>,
    volumes_in_use: Option<VolumesInUseFn>,
    /// The last Node this manager registered or reported (for admission).
    current: Arc<RwLock<Option<Node>>>,
    /// The addresses of the last status the API server took (upstream's
    /// `lastObservedNodeAddresses`: the serving certificate's names).
    observed_addresses: Option<tokio::sync::watch::Sender<Vec<NodeAddress>>>,
    /// The runtime's state (`Ready`, `features`); without it, `Ready` asks the runtime's
    /// version.
    runtime_state: Option<Arc<runtime_state::RuntimeState>>,
    /// The node shutdown manager's verdict, the last reason not to be ready (upstream's
    /// `nodeShutdownManagerErrorsFunc`).
    shutdown: Option<HealthFn>,
    /// Told when a heartbeat (Lease renewal, status update) fails: the other users of
    /// the API server leave their connections then (see [`NodeManager::with_heartbeat_failures`]).
    heartbeat_failed: Option<Arc<tokio::sync::Notify>>,
    /// The Lease the last renewal wrote (upstream's `latestLease`): the next renewal
    /// updates it without reading it first; after a failure it is read again.
    latest_lease: Arc<tokio::sync::Mutex<Option<Lease>>>,
    /// Where the status loop reads the node (upstream's node lister), and the client and
    /// connection generation its watch runs on (see [`NodeManager::with_node_watch`]).
    watched: watch::WatchedNode,
    node_watch: Option<(kube::Client, tokio::sync::watch::Receiver<u64>)>,
}

impl std::fmt::Debug for NodeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeManager").field("node", &self.settings.node_name).finish_non_exhaustive()
    }
}

impl NodeManager {
    #[must_use]
    pub fn new(
        client: kube::Client,
        settings: NodeSettings,
        facts: MachineFacts,
        rt: Arc<dyn RuntimeService>,
        health: HealthFn,
    ) -> Self {
        Self {
            client,
            settings,
            facts,
            rt,
            health,
            pressure: None,
            sync_now: Arc::default(),
            extended: None,
            volumes_in_use: None,
            current: Arc::default(),
            observed_addresses: None,
            runtime_state: None,
            shutdown: None,
            heartbeat_failed: None,
            latest_lease: Arc::default(),
            watched: watch::WatchedNode::default(),
            node_watch: None,
        }
    }

    /// Reads the node from a watch on `client` (the main client: see [`watch`]) that
    /// starts again whenever `connections` moves on, instead of a GET every
    /// `nodeStatusUpdateFrequency`. Without it, every period reads the API.
    #[must_use]
    pub fn with_node_watch(mut self, client: kube::Client, connections: tokio::sync::watch::Receiver<u64>) -> Self {
        self.node_watch = Some((client, connections));
        self
    }

    /// The node as of now: from the watch while it has the node, else from the API (also
    /// to confirm a deletion the watch saw before registering again).
    async fn read_node(&self, api: &Api<Node>) -> kube::Result<Option<Node>> {
        let watched = self.watched.read().unwrap().clone();
        match watched {
            watch::Watched::Present(n) => Ok(Some(*n)),
            watch::Watched::Absent | watch::Watched::Unsynced => api.get_opt(&self.settings.node_name).await,
        }
    }

    /// Tells `failed` of every failed heartbeat (the node read, its status update, the
    /// Lease renewal). Upstream's kubelet closes all its connections to the API server
    /// then (`closeAllConns`): a connection a network has black-holed (half-open: nothing
    /// moves, nothing closes) would otherwise hold the pod watch and later requests until
    /// their read timeout, minutes later. The heartbeats time out within
    /// `nodeStatusUpdateFrequency`.
    #[must_use]
    pub fn with_heartbeat_failures(mut self, failed: Arc<tokio::sync::Notify>) -> Self {
        self.heartbeat_failed = Some(failed);
        self
    }

    fn heartbeat_failed(&self) {
        if let Some(n) = &self.heartbeat_failed {
            n.notify_one();
        }
    }

    /// Takes `Ready`'s runtime errors and the node's `features` from `state`.
    #[must_use]
    pub fn with_runtime_state(mut self, state: Arc<runtime_state::RuntimeState>) -> Self {
        self.runtime_state = Some(state);
        self
    }

    /// Not ready while `shutdown` says why: the node shutdown manager's status
    /// (`nodeshutdown::ShutdownStatus::check`), an error while the node shuts down.
    #[must_use]
    pub fn with_shutdown_status(mut self, shutdown: Option<HealthFn>) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Why the node is not ready, in upstream's order (`ReadyCondition`: the runtime's
    /// errors with the health checks, the network's, the node shutdown's).
    async fn readiness(&self) -> Result<(), String> {
        let health = (self.health)().err();
        let mut errors = match &self.runtime_state {
            Some(state) => {
                let mut errors = state.runtime_errors(health);
                errors.extend(state.network_error());
                errors
            }
            None => match self.rt.version().await {
                Ok(_) => health.into_iter().collect(),
                Err(e) => vec![format!("container runtime is down: {e}")],
            },
        };
        errors.extend(self.shutdown.as_ref().and_then(|check| check().err()));
        runtime_state::aggregate(&errors)
    }

    /// Publishes the addresses of every status the API server takes to `addresses`.
    #[must_use]
    pub fn with_observed_addresses(mut self, addresses: tokio::sync::watch::Sender<Vec<NodeAddress>>) -> Self {
        self.observed_addresses = Some(addresses);
        self
    }

    /// Keeps `node` as the last one reported, and its addresses as the observed ones.
    fn reported(&self, node: &Node) {
        if let Some(tx) = &self.observed_addresses {
            let addresses = node.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default();
            tx.send_if_modified(|old| {
                let changed = *old != addresses;
                if changed {
                    *old = addresses;
                }
                changed
            });
        }
        *self.current.write().unwrap() = Some(node.clone());
    }

    /// A handle that makes the status loop compute and report at once.
    #[must_use]
    pub fn sync_now_handle(&self) -> Arc<tokio::sync::Notify> {
        self.sync_now.clone()
    }

    /// Reports the pressure conditions `pressure` reads (the eviction manager's).
    #[must_use]
    pub fn with_pressure(mut self, pressure: PressureFn) -> Self {
        self.pressure = Some(pressure);
        self
    }

    /// Reports the device plugin resources `extended` reads (upstream's
    /// `devicePluginResourceCapacityFunc`).
    #[must_use]
    pub fn with_extended_resources(mut self, extended: ExtendedResourcesFn) -> Self {
        self.extended = Some(extended);
        self
    }

    /// Reports the volumes `volumes` reads (upstream's `VolumesInUse` setter).
    #[must_use]
    pub fn with_volumes_in_use(mut self, volumes: VolumesInUseFn) -> Self {
        self.volumes_in_use = Some(volumes);
        self
    }

    /// The node as last registered or reported.
    #[must_use]
    pub fn current(&self) -> Option<Node> {
        self.current.read().unwrap().clone()
    }

    /// A shared view of the current node (for admission).
    #[must_use]
    pub fn current_handle(&self) -> Arc<RwLock<Option<Node>>> {
        self.current.clone()
    }

    async fn runtime_version(&self) -> String {
        match self.rt.version().await {
            Ok(v) => format!(
                "{}://{}",
                v.runtime_name,
                go_runtime_version(&v.runtime_version).unwrap_or_else(|| "Unknown".to_owned())
            ),
            Err(_) => String::new(),
        }
    }

    /// Computes the full status as of now.
    pub async fn compute_status(&self, old: Option<&NodeStatus>) -> NodeStatus {
        let (mut capacity, mut allocatable) = capacity_and_allocatable(&self.settings, &self.facts);
        if let Some(ext) = &self.extended {
            let ext = ext();
            capacity.extend(ext.capacity.into_iter().map(|(k, v)| (k, Quantity(v.to_string()))));
            allocatable.extend(ext.allocatable.into_iter().map(|(k, v)| (k, Quantity(v.to_string()))));
        }
        let health = self.readiness().await;
        let pressure = self.pressure.as_ref().map(|p| p()).unwrap_or_default();
        let mut conds = conditions(&health, pressure);
        stamp_conditions(&mut conds, old.and_then(|o| o.conditions.as_deref()));
        let images = self.rt.list_images().await.map(|i| node_images(&i)).unwrap_or_default();
        let mut addresses = Vec::new();
        if let Some(ip) = self.settings.node_ip.or_else(facts::default_node_ip) {
            addresses.push(NodeAddress { type_: "InternalIP".into(), address: ip.to_string() });
        }
        addresses.push(NodeAddress { type_: "Hostname".into(), address: self.settings.hostname.clone() });
        NodeStatus {
            capacity: Some(capacity),
            allocatable: Some(allocatable),
            conditions: Some(conds),
            addresses: Some(addresses),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: self.settings.port }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: self.facts.architecture.clone(),
                boot_id: self.facts.boot_id.clone(),
                container_runtime_version: self.runtime_version().await,
                kernel_version: self.facts.kernel_version.clone(),
                kube_proxy_version: String::new(),
                kubelet_version: self.settings.kubelet_version.clone(),
                machine_id: self.facts.machine_id.clone(),
                operating_system: "linux".into(),
                os_image: self.facts.os_image.clone(),
                system_uuid: self.facts.system_uuid.clone(),
                ..Default::default()
            }),
            images: Some(images),
            // Left out when empty, as upstream's `omitempty`.
            volumes_in_use: self.volumes_in_use.as_ref().map(|v| v()).filter(|v| !v.is_empty()),
            features: self.runtime_state.as_ref().map(|state| NodeFeatures {
                supplemental_groups_policy: Some(state.supports_supplemental_groups_policy()),
            }),
            // Upstream's `RuntimeHandlers` setter (an empty list is left out, as its
            // `omitempty` does).
            runtime_handlers: self
                .runtime_state
                .as_ref()
                .map(|state| {
                    state
                        .runtime_handlers()
                        .into_iter()
                        .map(|h| k8s_openapi::api::core::v1::NodeRuntimeHandler {
                            name: Some(h.name),
                            features: Some(k8s_openapi::api::core::v1::NodeRuntimeHandlerFeatures {
                                recursive_read_only_mounts: Some(h.recursive_read_only_mounts),
                                user_namespaces: Some(h.user_namespaces),
                            }),
                        })
                        .collect::<Vec<_>>()
                })
                .filter(|h| !h.is_empty()),
            declared_features: Some(
                crate::lifecycle::declared_features::DECLARED.iter().map(|f| (*f).to_owned()).collect(),
            ),
            ..Default::default()
        }
    }

    fn initial_node(&self, status: NodeStatus) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(self.settings.node_name.clone()),
                labels: Some(node_labels(&self.settings, &self.facts)),
                annotations: Some(BTreeMap::from([(
                    "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                    "true".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: (!self.settings.taints.is_empty()).then(|| self.settings.taints.clone()),
                ..Default::default()
            }),
            status: Some(status),
        }
    }

    /// Registers the node (upstream `registerWithAPIServer`): create it, or adopt the
    /// existing object with the same name and make sure our labels are on it.
    pub async fn register(&self) -> Result<Node> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut status = self.compute_status(None).await;
        let node = self.initial_node(status.clone());
        let registered = match api.create(&PostParams::default(), &node).await {
            Ok(n) => {
                tracing::info!(node = %self.settings.node_name, "registered node");
                n
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let labels = serde_json::json!({ "metadata": { "labels": node_labels(&self.settings, &self.facts) } });
                let n = api
                    .patch(&self.settings.node_name, &PatchParams::default(), &Patch::Merge(&labels))
                    .await
                    .map_err(|source| Error::Api { what: "patch node labels", source })?;
                tracing::info!(node = %self.settings.node_name, "node already registered; adopted it");
                if self.extended.as_ref().is_some_and(|e| e().reset_unknown) {
                    crate::cm::devicemanager::zero_unknown_extended(&mut status, n.status.as_ref());
                }
                n
            }
            Err(source) => return Err(Error::Api { what: "create node", source }),
        };
        // The status of a created object is dropped by the API server: report it now.
        let reported = self.patch_status(&api, &status).await?;
        self.reported(&reported);
        let _ = registered;
        Ok(reported)
    }

    async fn patch_status(&self, api: &Api<Node>, status: &NodeStatus) -> Result<Node> {
        let body = status_patch(status);
        api.patch_status(&self.settings.node_name, &PatchParams::default(), &Patch::Strategic(&body))
            .await
            .map_err(|source| Error::Api { what: "patch node status", source })
    }

    /// Registration with retries (upstream backs off from 100 ms to 7 s).
    async fn register_until_done(&self, shutdown: &CancellationToken) -> Option<Node> {
        let mut wait = Duration::from_millis(100);
        loop {
            match self.register().await {
                Ok(n) => return Some(n),
                Err(e) => tracing::warn!(error = %e, retry_in = ?wait, "node registration failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return None,
                () = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(Duration::from_secs(7));
        }
    }

    /// Registers, then reports status until shutdown; renews the Lease alongside.
    pub async fn run(self, shutdown: CancellationToken) {
        let Some(node) = self.register_until_done(&shutdown).await else { return };
        let lease = {
            let this = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { this.lease_loop(shutdown).await })
        };
        let watching = self.node_watch.clone().map(|(client, connections)| {
            tokio::spawn(watch::run(
                client,
                self.settings.node_name.clone(),
                self.watched.clone(),
                connections,
                shutdown.clone(),
            ))
        });
        let api: Api<Node> = Api::all(self.client.clone());
        let mut last_reported = node.status.clone();
        let mut last_report_at = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(self.settings.update_frequency);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
                () = self.sync_now.notified() => {}
            }
            // Like upstream's tryUpdateNodeStatus, look at the node every period, from the
            // watch (upstream's node lister) while it has it, else from the API: a node
            // object that was deleted is registered again at once, not at the next report.
            let fetched = match self.read_node(&api).await {
                Ok(None) => {
                    tracing::warn!(node = %self.settings.node_name, "node object was deleted; registering again");
                    if let Some(n) = self.register_until_done(&shutdown).await {
                        last_reported.clone_from(&n.status);
                        last_report_at = tokio::time::Instant::now();
                    }
                    continue;
                }
                Ok(Some(n)) => n.status,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the node object");
                    self.heartbeat_failed();
                    continue;
                }
            };
            // As upstream, the node just read is the base: its conditions' transition times
            // carry over, and a condition of ours that another writer changed (the node
            // lifecycle controller's `Ready: Unknown` after missed heartbeats) is reported
            // again now, not at the next periodic report.
            let status = self.compute_status(fetched.as_ref().or(last_reported.as_ref())).await;
            let changed = last_reported.as_ref().is_none_or(|old| !same_status(old, &status))
                || fetched.as_ref().is_some_and(|f| owned_conditions_differ(f, &status));
            if !changed && last_report_at.elapsed() < self.settings.report_frequency {
                continue;
            }
            match self.patch_status(&api, &status).await {
                Ok(n) => {
                    last_reported.clone_from(&n.status);
                    last_report_at = tokio::time::Instant::now();
                    self.reported(&n);
                }
                Err(Error::Api { source: kube::Error::Api(e), .. }) if e.code == 404 => {
                    tracing::warn!(node = %self.settings.node_name, "node object was deleted; registering again");
                    if let Some(n) = self.register_until_done(&shutdown).await {
                        last_reported.clone_from(&n.status);
                        last_report_at = tokio::time::Instant::now();
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "node status update failed");
                    self.heartbeat_failed();
                }
            }
        }
        lease.abort();
        if let Some(w) = watching {
            w.abort();
        }
    }

    fn lease_object(&self, node_uid: Option<String>, existing: Option<Lease>) -> Lease {
        let mut lease = existing.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.settings.node_name.clone()),
                namespace: Some(LEASE_NAMESPACE.into()),
                ..Default::default()
            },
            spec: None,
        });
        if let Some(uid) = node_uid {
            lease.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.settings.node_name.clone(),
                uid,
                ..Default::default()
            }]);
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.settings.node_name.clone());
        spec.lease_duration_seconds = Some(self.settings.lease_duration_secs);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease
    }

    /// One renewal: update the Lease the last renewal wrote, without reading it first (as
    /// upstream's lease controller); without one, or after a failed update, read it and
    /// create or update it (optimistic concurrency).
    pub async fn renew_lease(&self) -> Result<Lease> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let node_uid = self.current().and_then(|n| n.metadata.uid);
        let mut latest = self.latest_lease.lock().await;
        if let Some(l) = latest.take() {
            let renewed = api
                .replace(
                    &self.settings.node_name,
                    &PostParams::default(),
                    &self.lease_object(node_uid.clone(), Some(l)),
                )
                .await;
            match renewed {
                Ok(l) => {
                    *latest = Some(l.clone());
                    return Ok(l);
                }
                // A conflict (another writer) or a deleted Lease: read it and try again.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
                Err(source) => return Err(Error::Api { what: "renew lease", source }),
            }
        }
        let existing =
            api.get_opt(&self.settings.node_name).await.map_err(|source| Error::Api { what: "get lease", source })?;
        let written = match existing {
            None => api
                .create(&PostParams::default(), &self.lease_object(node_uid, None))
                .await
                .map_err(|source| Error::Api { what: "create lease", source }),
            Some(l) => api
                .replace(&self.settings.node_name, &PostParams::default(), &self.lease_object(node_uid, Some(l)))
                .await
                .map_err(|source| Error::Api { what: "renew lease", source }),
        }?;
        *latest = Some(written.clone());
        Ok(written)
    }

    async fn lease_loop(&self, shutdown: CancellationToken) {
        // Upstream renews every quarter of the lease duration, retrying failures with a
        // back-off starting at 200 ms.
        let interval = Duration::from_secs(u64::from(self.settings.lease_duration_secs.max(4).unsigned_abs()) / 4);
        let mut retry = Duration::from_millis(200);
        loop {
            let wait = match self.renew_lease().await {
                Ok(_) => {
                    retry = Duration::from_millis(200);
                    interval
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease renewal failed");
                    self.heartbeat_failed();
                    let w = retry;
                    retry = (retry * 2).min(Duration::from_secs(7));
                    w
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// Whether two statuses differ only in heartbeat times.
/// Whether the node as read (`fetched`) shows one of the conditions `status` computes
/// (the agent's own types) with another status, reason or message, or not at all.
fn owned_conditions_differ(fetched: &NodeStatus, status: &NodeStatus) -> bool {
    let theirs = fetched.conditions.as_deref().unwrap_or_default();
    status.conditions.iter().flatten().any(|ours| {
        theirs.iter().find(|c| c.type_ == ours.type_).is_none_or(|c| {
            (c.status.as_str(), c.reason.as_deref(), c.message.as_deref())
                != (ours.status.as_str(), ours.reason.as_deref(), ours.message.as_deref())
        })
    })
}

/// The strategic merge patch of a status report. `volumesInUse` is the agent's alone:
/// when none is in use it is removed (`null`), as upstream's two-way patch between the
/// node it read and the one it reports does; left out, the list reported last would stay
/// and the attach/detach controller would never detach those volumes.
fn status_patch(status: &NodeStatus) -> serde_json::Value {
    let mut body = serde_json::json!({ "status": status });
    if status.volumes_in_use.is_none() {
        body["status"]["volumesInUse"] = serde_json::Value::Null;
    }
    body
}

fn same_status(a: &NodeStatus, b: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        // The attach/detach controller's, never reported by the agent: the node read back
        // having it is no change of the agent's status.
        s.volumes_attached = None;
        s
    };
    strip(a) == strip(b)
}

/// The runtime's version as the upstream kubelet prints it (`newRuntimeVersion`: Go's
/// `version.ParseSemantic`, else `ParseGeneric`, then `String()`): Debian's containerd
/// says `1.6.20~ds1`, which is no semantic version, so the node shows `1.6.20`. `None`
/// when neither parses (upstream then says `Unknown`).
fn go_runtime_version(s: &str) -> Option<String> {
    let s = s.trim_start();
    let s = s.strip_prefix('v').unwrap_or(s);
    // `[0-9]+(\.[0-9]+)*`, greedy; the rest is the "extra".
    let bytes = s.as_bytes();
    let mut end = 0;
    loop {
        let start = end;
        while end < bytes.len() && bytes[end].is_ascii_digit() {
            end += 1;
        }
        if end == start {
            if start == 0 {
                return None;
            }
            end = start - 1; // the '.' that no digit followed belongs to the extra
            break;
        }
        if end + 1 < bytes.len() && bytes[end] == b'.' && bytes[end + 1].is_ascii_digit() {
            end += 1;
        } else {
            break;
        }
    }
    let (numbers, extra) = s.split_at(end);
    let components: Vec<&str> = numbers.split('.').collect();
    let zero_prefixed = |c: &str| c.starts_with('0') && c != "0";
    let parsed: Option<Vec<u64>> = components.iter().map(|c| c.parse().ok()).collect();
    let parsed = parsed?;
    let joined = parsed.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
    // Semantic: three components, none zero-prefixed, an extra of `-pre` and `+build`.
    if components.len() == 3 && !components.iter().any(|c| zero_prefixed(c)) {
        let ident_list = |t: &str| {
            !t.is_empty()
                && t.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        };
        let rest = extra.trim_end();
        let (pre, build) = match rest.split_once('+') {
            Some((a, b)) => (a, Some(b)),
            None => (rest, None),
        };
        let pre = if pre.is_empty() { Some("") } else { pre.strip_prefix('-').filter(|p| ident_list(p)) };
        let build_ok = build.is_none_or(ident_list);
        if let Some(pre) = pre
            && build_ok
            && !pre.split('.').any(|c| c.bytes().all(|b| b.is_ascii_digit()) && zero_prefixed(c))
        {
            let mut out = joined;
            if !pre.is_empty() {
                out.push('-');
                out.push_str(pre);
            }
            if let Some(b) = build {
                out.push('+');
                out.push_str(b);
            }
            return Some(out);
        }
    }
    // Generic: at least two components, the first not zero-prefixed; the extra ignored.
    (components.len() >= 2 && !zero_prefixed(components[0])).then_some(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> NodeSettings {
        NodeSettings {
            node_name: "n1".into(),
            hostname: "n1".into(),
            node_ip: None,
            labels: BTreeMap::from([("tier".into(), "edge".into())]),
            taints: vec![],
            max_pods: 110,
            port: 10250,
            kube_reserved: BTreeMap::from([("cpu".into(), "100m".into()), ("memory".into(), "100Mi".into())]),
            system_reserved: BTreeMap::new(),
            eviction_hard: BTreeMap::from([
                ("memory.available".into(), "100Mi".into()),
                ("nodefs.available".into(), "10%".into()),
            ]),
            update_frequency: Duration::from_secs(10),
            report_frequency: Duration::from_mins(5),
            lease_duration_secs: 40,
            kubelet_version: "v1.37.0".into(),
        }
    }

    /// Found by `cargo xtask fidelity`: the upstream kubelet v1.37.2 shows Debian's
    /// containerd `1.6.20~ds1` as `containerd://1.6.20`.
    #[test]
    fn runtime_versions_print_as_go_parses_them() {
        assert_eq!(go_runtime_version("1.6.20~ds1").as_deref(), Some("1.6.20"));
        assert_eq!(go_runtime_version("v1.7.0-rc.1+abc.2").as_deref(), Some("1.7.0-rc.1+abc.2"));
        assert_eq!(go_runtime_version("2.1.4").as_deref(), Some("2.1.4"));
        assert_eq!(go_runtime_version("1.28").as_deref(), Some("1.28"));
        assert_eq!(go_runtime_version("1.2.3.4-x").as_deref(), Some("1.2.3.4"));
        assert_eq!(go_runtime_version("1.02.3").as_deref(), Some("1.2.3"), "generic allows it after the first");
        assert_eq!(go_runtime_version("01.2"), None);
        assert_eq!(go_runtime_version("7"), None);
        assert_eq!(go_runtime_version("unknown"), None);
        assert_eq!(go_runtime_version("1.2.3-01"), Some("1.2.3".to_owned()), "semver refuses; generic drops the extra");
        assert_eq!(go_runtime_version("1."), None);
    }

    #[tokio::test]
    async fn readiness_gives_every_reason_in_upstreams_order_and_the_runtime_features() {
        use k8s_cri::v1 as api;
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let rt = Arc::new(crate::container::fake::FakeRuntime::default());
        let pleg_ok = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let pleg = pleg_ok.clone();
        let health: HealthFn = Arc::new(move || {
            if pleg.load(std::sync::atomic::Ordering::SeqCst) { Ok(()) } else { Err("PLEG is not healthy: x".into()) }
        });
        let state = Arc::new(runtime_state::RuntimeState::default());
        let shutdown = crate::nodeshutdown::ShutdownStatus::default();
        let manager = NodeManager::new(client, settings(), MachineFacts::default(), rt, health)
            .with_runtime_state(state.clone())
            .with_shutdown_status(Some({
                let shutdown = shutdown.clone();
                Arc::new(move || shutdown.check())
            }));
        assert_eq!(
            manager.readiness().await,
            Err("[container runtime status check may not have completed yet, network state unknown]".into())
        );
        let condition = |t: &str, ok: bool| api::RuntimeCondition {
            r#type: t.into(),
            status: ok,
            reason: if ok { String::new() } else { "NetworkPluginNotReady".into() },
            message: if ok { String::new() } else { "cni plugin not initialized".into() },
        };
        let status = |network: bool| api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![condition("RuntimeReady", true), condition("NetworkReady", network)],
            }),
            ..Default::default()
        };
        state.apply(Ok(&status(false)));
        pleg_ok.store(false, std::sync::atomic::Ordering::SeqCst);
        shutdown.set(true);
        assert_eq!(
            manager.readiness().await,
            Err("[PLEG is not healthy: x, container runtime network not ready: NetworkReady=false \
                 reason:NetworkPluginNotReady message:cni plugin not initialized, node is shutting down]"
                .into())
        );
        state.apply(Ok(&status(true)));
        pleg_ok.store(true, std::sync::atomic::Ordering::SeqCst);
        shutdown.set(false);
        assert_eq!(manager.readiness().await, Ok(()));
        let computed = manager.compute_status(None).await;
        let features = computed.features.unwrap();
        assert_eq!(features.supplemental_groups_policy, Some(false), "containerd 1.6 has no such feature");
        assert_eq!(computed.runtime_handlers, None, "containerd 1.6 lists no handlers");
        // containerd 2.x lists its handlers and their features.
        let mut listed = status(true);
        listed.runtime_handlers = vec![api::RuntimeHandler {
            name: String::new(),
            features: Some(api::RuntimeHandlerFeatures { recursive_read_only_mounts: true, user_namespaces: true }),
        }];
        state.apply(Ok(&listed));
        let handlers = manager.compute_status(None).await.runtime_handlers.unwrap();
        assert_eq!(
            serde_json::to_value(&handlers).unwrap(),
            serde_json::json!([{"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}}])
        );
    }

    #[test]
    fn allocatable_subtracts_reservations_and_thresholds() {
        let f = MachineFacts {
            cpus: 2,
            memory_bytes: 4096 * 1024 * 1024,
            ephemeral_storage_bytes: 100 * 1024 * 1024 * 1024,
            architecture: "amd64".into(),
            hugepages: BTreeMap::from([(2 << 20, 6 << 20), (1 << 30, 0)]),
            ..Default::default()
        };
        let mut s = settings();
        s.kube_reserved.insert("hugepages-2Mi".into(), "2Mi".into());
        let (cap, alloc) = capacity_and_allocatable(&s, &f);
        assert_eq!((cap["hugepages-2Mi"].0.as_str(), alloc["hugepages-2Mi"].0.as_str()), ("6Mi", "4Mi"));
        assert_eq!((cap["hugepages-1Gi"].0.as_str(), alloc["hugepages-1Gi"].0.as_str()), ("0", "0"));
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["memory"].0, "4194304Ki");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(alloc["cpu"].0, "1900m");
        assert_eq!(alloc["memory"].0, format!("{}Ki", (4096 - 200) * 1024));
        assert_eq!(alloc["ephemeral-storage"].0, (100u64 * 1024 * 1024 * 1024 * 9 / 10).to_string());
        let labels = node_labels(&settings(), &f);
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["tier"], "edge");
    }

    #[test]
    fn owned_conditions_changed_by_another_writer_count_as_changes() {
        let ours = NodeStatus { conditions: Some(conditions(&Ok(()), Pressure::default())), ..Default::default() };
        assert!(!owned_conditions_differ(&ours, &ours));
        // Conditions of other types (node-problem-detector's, say) are not ours to judge.
        let mut theirs = ours.clone();
        theirs.conditions.as_mut().unwrap().push(NodeCondition {
            type_: "KernelDeadlock".into(),
            status: "True".into(),
            ..Default::default()
        });
        assert!(!owned_conditions_differ(&theirs, &ours));
        // The node lifecycle controller's Unknown, or one of ours gone, is a change.
        let mut unknown = ours.clone();
        let ready = unknown.conditions.as_mut().unwrap().iter_mut().find(|c| c.type_ == "Ready").unwrap();
        ready.status = "Unknown".into();
        ready.reason = Some("NodeStatusUnknown".into());
        assert!(owned_conditions_differ(&unknown, &ours));
        let mut gone = ours.clone();
        gone.conditions.as_mut().unwrap().retain(|c| c.type_ != "MemoryPressure");
        assert!(owned_conditions_differ(&gone, &ours));
    }

    #[test]
    fn transition_times_move_only_on_flips() {
        let mut a = conditions(&Ok(()), Pressure::default());
        stamp_conditions(&mut a, None);
        let mut b = conditions(&Ok(()), Pressure::default());
        stamp_conditions(&mut b, Some(&a));
        assert_eq!(a[3].last_transition_time, b[3].last_transition_time);
        let mut c = conditions(&Err("PLEG is not healthy".into()), Pressure { memory: true, ..Pressure::default() });
        stamp_conditions(&mut c, Some(&b));
        assert_eq!(c[3].status, "False");
        assert_eq!(c[3].reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_deref()),
            ("True", Some("KubeletHasInsufficientMemory")),
            "memory pressure from the eviction manager"
        );
        assert_ne!(c[0].last_transition_time, b[0].last_transition_time);
        let sa = NodeStatus { conditions: Some(a), ..Default::default() };
        let sb = NodeStatus { conditions: Some(b), ..Default::default() };
        assert!(same_status(&sa, &sb), "only heartbeats differ");
    }

    /// A Lease store behind a fake API server: GET, POST and PUT with optimistic
    /// concurrency (a PUT of another resourceVersion is a 409), every request recorded.
    #[derive(Clone, Default)]
    struct FakeLeases {
        stored: Arc<std::sync::Mutex<Option<serde_json::Value>>>,
        seen: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl FakeLeases {
        fn client(&self) -> kube::Client {
            use http_body_util::BodyExt as _;
            let api = self.clone();
            let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let api = api.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
                    let method = parts.method.to_string();
                    api.seen.lock().unwrap().push(method.clone());
                    let mut stored = api.stored.lock().unwrap();
                    let rv = |l: &serde_json::Value| l["metadata"]["resourceVersion"].as_str().unwrap_or("").to_owned();
                    let (code, answer) = match (method.as_str(), stored.clone()) {
                        ("GET", None) => {
                            (404, serde_json::json!({"kind": "Status", "code": 404, "reason": "NotFound"}))
                        }
                        ("GET", Some(l)) => (200, l),
                        ("POST" | "PUT", current) => {
                            let mut l: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            if method == "PUT" && current.as_ref().map(rv) != Some(rv(&l)) {
                                (409, serde_json::json!({"kind": "Status", "code": 409, "reason": "Conflict"}))
                            } else {
                                let next = current.as_ref().map_or(0, |c| rv(c).parse::<u64>().unwrap()) + 1;
                                l["metadata"]["resourceVersion"] = serde_json::json!(next.to_string());
                                *stored = Some(l.clone());
                                (if method == "POST" { 201 } else { 200 }, l)
                            }
                        }
                        _ => (405, serde_json::json!({})),
                    };
                    let response = http::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(http_body_util::Full::new(bytes::Bytes::from(answer.to_string())))
                        .unwrap();
                    Ok::<_, std::io::Error>(response)
                }
            });
            kube::Client::new(service, "default")
        }

        fn take_seen(&self) -> Vec<String> {
            std::mem::take(&mut *self.seen.lock().unwrap())
        }
    }

    /// As upstream's lease controller, a renewal updates the Lease the last one wrote
    /// without reading it first (the bench found a GET before every renewal: half of the
    /// agent's requests at idle); a conflict with another writer is read and retried.
    #[tokio::test]
    async fn lease_renewals_update_the_last_lease_without_reading_it() {
        let leases = FakeLeases::default();
        let rt = Arc::new(crate::container::fake::FakeRuntime::default());
        let health: HealthFn = Arc::new(|| Ok(()));
        let manager = NodeManager::new(leases.client(), settings(), MachineFacts::default(), rt, health);
        manager.renew_lease().await.unwrap();
        assert_eq!(leases.take_seen(), ["GET", "POST"], "the first renewal creates it");
        manager.renew_lease().await.unwrap();
        manager.renew_lease().await.unwrap();
        assert_eq!(leases.take_seen(), ["PUT", "PUT"]);
        // Another writer updated it meanwhile.
        {
            let mut stored = leases.stored.lock().unwrap();
            stored.as_mut().unwrap()["metadata"]["resourceVersion"] = serde_json::json!("99");
        }
        let l = manager.renew_lease().await.unwrap();
        assert_eq!(leases.take_seen(), ["PUT", "GET", "PUT"]);
        assert_eq!(l.metadata.resource_version.as_deref(), Some("100"));
        assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("n1"));
    }

    #[test]
    fn a_status_report_removes_volumes_in_use_when_none_is_in_use() {
        let none = NodeStatus::default();
        assert_eq!(status_patch(&none)["status"]["volumesInUse"], serde_json::Value::Null);
        assert!(status_patch(&none)["status"].as_object().unwrap().contains_key("volumesInUse"));
        let some = NodeStatus { volumes_in_use: Some(vec!["kubernetes.io/csi/d^v".into()]), ..NodeStatus::default() };
        assert_eq!(status_patch(&some)["status"]["volumesInUse"], serde_json::json!(["kubernetes.io/csi/d^v"]));
        // Other fields absent from the report stay absent (volumesAttached is the
        // attach/detach controller's).
        assert!(!status_patch(&some)["status"].as_object().unwrap().contains_key("volumesAttached"));
    }

    #[test]
    fn volumes_attached_by_the_controller_are_no_change_of_the_agents_status() {
        let reported =
            NodeStatus { volumes_in_use: Some(vec!["kubernetes.io/csi/d^v".into()]), ..NodeStatus::default() };
        let read_back = NodeStatus {
            volumes_attached: Some(vec![k8s_openapi::api::core::v1::AttachedVolume {
                name: "kubernetes.io/csi/d^v".into(),
                device_path: String::new(),
            }]),
            ..reported.clone()
        };
        assert!(same_status(&read_back, &reported));
        assert!(!same_status(&read_back, &NodeStatus::default()), "volumesInUse still counts");
    }
}
