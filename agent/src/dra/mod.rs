//! Dynamic Resource Allocation on the node (upstream `pkg/kubelet/cm/dra`, DRA GA,
//! `resource.k8s.io/v1`): before a pod's sandbox is created, every `ResourceClaim` the
//! pod uses is prepared by the DRA drivers whose devices the scheduler allocated to it;
//! containers get the CDI devices the drivers answered with; once the last pod using a
//! claim is done, the drivers unprepare it.
//!
//! - Drivers: their kubelet plugins register through the plugin manager (type
//!   `DRAPlugin`; [`DraManager`] is its [`PluginHandler`]). The registration's version
//!   list names gRPC services: the first of the plugin's list that the agent speaks
//!   (`v1.DRAPlugin`, `v1beta1.DRAPlugin`: [`SUPPORTED_SERVICES`]) is used. A driver left
//!   without a plugin has its node's `ResourceSlice`s deleted after [`WIPING_DELAY`]
//!   unless it registers again first; [`DraManager::start`] deletes the node's slices of
//!   every driver once, as upstream does at start, since no driver is usable before it
//!   registers.
//! - [`DraManager::prepare_resources`] (upstream `PrepareResources`): checks every claim
//!   first (exists, made for the pod when it comes from a template, reserved for the pod,
//!   allocated, its drivers registered), then records the pod as a user of each claim,
//!   then calls `NodePrepareResources` per driver for the claims not prepared yet, and
//!   records the devices and CDI ids of each answer.
//! - [`DraManager::unprepare_resources`] (upstream `UnprepareResources`): the pod stops
//!   using its claims; a claim without users left is unprepared by its drivers and
//!   forgotten. [`DraManager::unprepare_inactive`] does the same for pods no longer
//!   active (upstream's reconcile loop, for the caller to run periodically).
//! - Containers: as a [`ContainerLifecycleHook`] the manager adds the CDI devices of the
//!   claims (or only of the named requests) a container lists in
//!   `resources.claims`, and of the extended resources DRA serves it, to its CRI config.
//! - Checkpoint: `<root-dir>/dra_manager_state` ([`checkpoint`]), restored by
//!   [`DraManager::new`] and written on every change.
//!
//! gRPC calls run on a runtime of their own (one thread), each bounded by
//! [`CALL_TIMEOUT`]. Metrics: [`metrics`].
//!
//! Admission: upstream has no DRA admission handler; a pod whose claims cannot be
//! prepared fails at sandbox creation with the error of `prepare_resources`. What DRA
//! touches in admission is the resource fit: extended resources served by the pod's
//! extended resource claim are not counted against the node's allocatable (nor allocated
//! by the device manager): see [`is_dra_backed_extended_resource`],
//! `lifecycle::admission::without_dra_backed_requests` and the device manager.
//!
//! Wiring, as upstream's kubelet does it: [`DraManager::new`] with the root dir, the node
//! name and a [`KubeClaimSource`]; [`DraManager::start`] once; the manager as the plugin
//! manager's handler of `DRAPlugin` and as a container lifecycle hook;
//! `prepare_resources` before the pod's sandbox is created (an error is the pod's
//! `FailedPrepareDynamicResources` warning event, and the sandbox is not created);
//! `unprepare_resources` when the terminated pod is cleaned up, before its final status is
//! sent; `pod_might_need_to_unprepare` in the pod deletion safety check;
//! `unprepare_inactive` every [`RECONCILE_PERIOD`] once the pod sources are ready;
//! [`DraMetrics::new`] and [`DraManager::claims_in_use_collector`] for `/metrics`.
//!
//! Deviations: one plugin per driver is used at a time, the newest (upstream also prefers
//! a connected one); [`PluginHandler::deregister`] names no socket, so it forgets the
//! driver's oldest plugin (right for rolling updates); a plugin registering at a known
//! socket replaces the earlier registration instead of being refused; a driver counts
//! as usable while registered (upstream also watches the connection); the prepared flag
//! is checkpointed for the current boot (see [`checkpoint`]); unprepare takes a pod's
//! claims from the checkpointed state only (upstream falls back to the pod spec when the
//! state lists none, then skips every claim the state does not list the pod for, so the
//! fallback changes nothing); slice deletion retries back off as upstream's but without its
//! node lookup; health reporting (`DRAResourceHealth`), pod groups
//! (`DRAWorkloadResourceClaims`, beta, off) and optional node operations
//! (`DRAOptionalNodeOperations`, alpha, off: such claims are refused as upstream does
//! with the gate off) are not implemented.

pub mod checkpoint;
pub mod claims;
pub mod health;
pub mod metrics;
mod plugins;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod, ResourceHealth, ResourceStatus};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio_util::sync::CancellationToken;

pub use checkpoint::ClaimInfo;
pub use claims::{
    ClaimSource, DEVICE_CLASS_RESOURCE_PREFIX, FakeClaimSource, KubeClaimSource, claim_name,
    is_dra_backed_extended_resource, is_dra_extended_resource_name,
};
use metrics::{ClaimsInUseCollector, DraMetrics};
use plugins::Plugins;
pub use plugins::{SUPPORTED_SERVICES, Service, choose_service};
use state::Cache;

use crate::cm::container_lifecycle::ContainerLifecycleHook;
use crate::pluginmanager::PluginHandler;

/// Code generated from `proto/dra/v1/api.proto` (messages, the `DRAPlugin` client and
/// server).
#[expect(clippy::pedantic, reason = "generated by prost/tonic, not ours to restyle")]
pub mod proto {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The checkpoint's file name in the root dir (upstream `draManagerStateFileName`).
pub const STATE_FILE: &str = "dra_manager_state";
/// How long a driver left without a plugin keeps its `ResourceSlice`s (upstream
/// `defaultWipingDelay`): long enough for a plugin's pod to be replaced.
pub const WIPING_DELAY: Duration = Duration::from_secs(30);
/// How often the caller should run [`DraManager::unprepare_inactive`] (upstream
/// `defaultReconcilePeriod`).
pub const RECONCILE_PERIOD: Duration = Duration::from_mins(1);
/// How long one call to a plugin may take (upstream `defaultClientCallTimeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);
/// The first wait before a failed slice deletion is tried again; it doubles up to
/// [`WIPE_RETRY_CAP`] (upstream's backoff).
const WIPE_RETRY_START: Duration = Duration::from_secs(1);
const WIPE_RETRY_CAP: Duration = Duration::from_mins(5);
const WIPE_ATTEMPTS: u32 = 100;
const WIPE_JITTER: f64 = 0.2;

/// The operation names of `dra_operations_duration_seconds`.
const PREPARE: &str = "PrepareResources";
const UNPREPARE: &str = "UnprepareResources";
const NODE_PREPARE: &str = "NodePrepareResources";
const NODE_UNPREPARE: &str = "NodeUnprepareResources";

/// How the manager behaves; `Default` is upstream's.
#[derive(Clone, Debug)]
pub struct Options {
    /// The current boot's id; `None` (default): `/proc/sys/kernel/random/boot_id`.
    pub boot_id: Option<String>,
    /// Default [`WIPING_DELAY`].
    pub wiping_delay: Duration,
    /// Default [`CALL_TIMEOUT`].
    pub call_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self { boot_id: None, wiping_delay: WIPING_DELAY, call_timeout: CALL_TIMEOUT }
    }
}

/// Errors of the DRA manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint could not be restored or created: the agent must not start and
    /// forget prepared claims (upstream refuses to start too).
    #[error("creating the ResourceClaim cache")]
    State(#[source] checkpoint::Error),
    /// Upstream `PrepareResources`' error; the text is what the pod's event shows.
    #[error("prepare dynamic resources: {0}")]
    Prepare(ClaimError),
    /// Upstream `UnprepareResources`' error.
    #[error("unprepare dynamic resources: {0}")]
    Unprepare(ClaimError),
}

/// Why a pod's claims could not be prepared or unprepared, worded as upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("pod {pod:?}: ResourceClaim not created yet")]
    NotCreatedYet { pod: String },
    #[error("pod {pod:?}, spec.resourceClaim {claim:?}: none of the supported fields are set")]
    Unsupported { pod: String, claim: String },
    #[error("fetch ResourceClaim {claim}: {message}")]
    Fetch { claim: String, message: String },
    #[error("ResourceClaim {claim} is not in the same namespace as Pod {pod}")]
    OtherNamespace { claim: String, pod: String },
    #[error("ResourceClaim {claim} was not created for Pod {pod} (Pod is not owner)")]
    NotOwner { claim: String, pod: String },
    #[error("pod {pod_name} ({pod_uid}) is not allowed to use ResourceClaim {claim} ({claim_uid})")]
    NotReserved { pod_name: String, pod_uid: String, claim: String, claim_uid: String },
    #[error("ResourceClaim {claim}: not allocated")]
    NotAllocated { claim: String },
    #[error("ResourceClaim {claim}: DRAOptionalNodeOperations feature gate is disabled on kubelet")]
    OptionalNodeOperations { claim: String },
    #[error("DRA driver name is empty")]
    EmptyDriverName,
    #[error("DRA driver {driver} is not registered")]
    DriverNotRegistered { driver: String },
    #[error(
        "old ResourceClaim with same name {claim} and different UID {old_uid} still exists (previous pod force-deleted?!)"
    )]
    UidChanged { claim: String, old_uid: String },
    #[error("ResourceClaim {claim} is being unprepared")]
    Unpreparing { claim: String },
    /// The call failed as a whole; `message` is grpc-go's text of the status.
    #[error("{method}: {message}")]
    Rpc { method: &'static str, message: String },
    #[error("{method} returned result for unknown claim UID {uid}")]
    UnknownClaim { method: &'static str, uid: String },
    #[error("{method} failed for ResourceClaim {claim}: {message}")]
    ClaimFailed { method: &'static str, claim: String, message: String },
    #[error("{method} skipped {count} ResourceClaims")]
    Skipped { method: &'static str, count: usize },
    #[error("internal error: unable to get claim info for ResourceClaim {claim} in namespace {namespace}")]
    Internal { claim: String, namespace: String },
    /// The checkpoint could not be written; `message` has the cause.
    #[error("checkpoint ResourceClaim state: {message}")]
    Checkpoint { message: String },
}

impl ClaimError {
    fn checkpoint(e: &checkpoint::Error) -> Self {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        Self::Checkpoint { message }
    }
}

/// The claim a `ResourceClaim` becomes on the node, before any driver prepared it
/// (upstream `newClaimInfoFromClaim`): one entry per driver of the allocation.
///
/// # Errors
/// [`ClaimError::NotAllocated`], or [`ClaimError::OptionalNodeOperations`] when the
/// allocation lets a driver skip node operations (the alpha gate is off).
pub fn claim_info(claim: &ResourceClaim) -> Result<ClaimInfo, ClaimError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(ClaimError::NotAllocated { claim: name });
    };
    let results = allocation.devices.as_ref().and_then(|d| d.results.as_deref()).unwrap_or_default();
    let mut info = ClaimInfo {
        claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
        claim_name: name.clone(),
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        ..ClaimInfo::default()
    };
    // Per driver: its results, and per operation how many of them skip it.
    let mut per_driver: BTreeMap<&str, (usize, BTreeMap<&str, usize>)> = BTreeMap::new();
    for r in results {
        info.driver_state.entry(r.driver.clone()).or_default();
        let (total, skips) = per_driver.entry(&r.driver).or_default();
        *total += 1;
        let ops = r.skip_node_operations.as_deref().unwrap_or_default();
        if ops.iter().any(|o| o == "All") {
            *skips.entry("All").or_default() += 1;
        } else {
            for op in ops {
                *skips.entry(op).or_default() += 1;
            }
        }
    }
    // Upstream: an operation is skipped when every result of the driver skips it.
    let skipped = per_driver.values().any(|(total, skips)| {
        let all = skips.get("All").copied().unwrap_or(0);
        all == *total || skips.iter().any(|(op, n)| *op != "All" && n + all == *total)
    });
    if skipped {
        return Err(ClaimError::OptionalNodeOperations { claim: name });
    }
    Ok(info)
}

/// The DRA manager. Cheap to clone; every clone is the same manager.
#[derive(Clone, Debug)]
pub struct DraManager {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node_name: String,
    claims: Arc<dyn ClaimSource>,
    cache: Arc<Mutex<Cache>>,
    plugins: Plugins,
    /// Pending slice deletions by driver: a generation (so that a finished deletion
    /// removes only its own entry) and the token that cancels it.
    wipes: Mutex<HashMap<String, (u64, CancellationToken)>>,
    next_wipe: AtomicU64,
    wiping_delay: Duration,
    shutdown: CancellationToken,
    metrics: DraMetrics,
    /// What the drivers report of their devices' health ([`health`]).
    health: Arc<health::HealthCache>,
    /// Where the UIDs of pods whose devices changed health go ([`DraManager::set_health_updates`]).
    health_updates: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Vec<String>>>>,
}

impl Inner {
    /// Tells the sync loop which pods hold `devices` of `driver`, whose health changed
    /// (upstream's `podsToUpdate`).
    fn health_changed(&self, driver: &str, devices: &[health::DeviceHealth]) {
        let pods: std::collections::BTreeSet<String> = {
            let cache = self.cache.lock().unwrap();
            devices.iter().flat_map(|d| cache.pods_holding(driver, &d.pool_name, &d.device_name)).collect()
        };
        if pods.is_empty() {
            tracing::debug!(driver, devices = devices.len(), "device health changed; no pod holds those devices");
            return;
        }
        tracing::info!(driver, ?pods, "device health changed for pods");
        if let Some(tx) = self.health_updates.lock().unwrap().as_ref() {
            let _ = tx.send(pods.into_iter().collect());
        }
    }
}

/// The current boot's id, empty when the kernel does not say.
fn machine_boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default()
}

impl DraManager {
    /// The manager of node `node_name`, its state in `root_dir`, reading claims from
    /// `claims` (upstream `NewManager`): restores the checkpoint, or creates an empty one.
    ///
    /// # Errors
    /// [`Error::State`] when the checkpoint cannot be read (or is corrupt) or created.
    pub fn new(root_dir: &Path, node_name: &str, claims: Arc<dyn ClaimSource>) -> Result<Self, Error> {
        Self::with_options(root_dir, node_name, claims, Options::default())
    }

    /// [`Self::new`] with `options`.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn with_options(
        root_dir: &Path,
        node_name: &str,
        claims: Arc<dyn ClaimSource>,
        options: Options,
    ) -> Result<Self, Error> {
        let boot_id = options.boot_id.unwrap_or_else(machine_boot_id);
        let cache = Cache::load(&root_dir.join(STATE_FILE), &boot_id).map_err(Error::State)?;
        let inner = Inner {
            node_name: node_name.to_owned(),
            claims,
            cache: Arc::new(Mutex::new(cache)),
            plugins: Plugins::new(options.call_timeout),
            wipes: Mutex::default(),
            next_wipe: AtomicU64::new(0),
            wiping_delay: options.wiping_delay,
            shutdown: CancellationToken::new(),
            metrics: DraMetrics::default(),
            health: Arc::new(health::HealthCache::load(&root_dir.join(health::STATE_FILE))),
            health_updates: Mutex::default(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Sends the UIDs of pods holding a device whose health a driver's report changed to
    /// `tx` (the sync loop, which syncs them; upstream `Updates()`).
    pub fn set_health_updates(&self, tx: tokio::sync::mpsc::UnboundedSender<Vec<String>>) {
        *self.inner.health_updates.lock().unwrap() = Some(tx);
    }

    /// Reports into `metrics` (registered in the `/metrics` registry with
    /// [`DraMetrics::new`]) instead of families registered nowhere. Call before sharing
    /// the manager.
    #[must_use]
    pub fn with_metrics(mut self, metrics: DraMetrics) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.metrics = metrics;
        }
        self
    }

    /// `dra_resource_claims_in_use`, for `Registry::register_collector`.
    #[must_use]
    pub fn claims_in_use_collector(&self) -> ClaimsInUseCollector {
        ClaimsInUseCollector { cache: Arc::clone(&self.inner.cache) }
    }

    /// The path of the checkpoint.
    #[must_use]
    pub fn state_file(root_dir: &Path) -> PathBuf {
        root_dir.join(STATE_FILE)
    }

    /// Deletes the node's `ResourceSlice`s of every driver, in the background, retrying
    /// until it succeeds or [`Self::stop`] (upstream does so when the manager starts: no
    /// driver is usable before its plugin registers, so none of their devices should be
    /// offered meanwhile; the plugins publish their slices again once registered). Call
    /// once, from within the agent's runtime.
    pub fn start(&self) {
        let inner = Arc::clone(&self.inner);
        let token = self.inner.shutdown.child_token();
        tokio::spawn(async move {
            wipe(&inner, None, &token).await;
        });
    }

    /// Cancels pending slice deletions (shutdown, tests).
    pub fn stop(&self) {
        self.inner.shutdown.cancel();
    }

    /// Whether `driver` has a registered plugin.
    #[must_use]
    pub fn is_registered(&self, driver: &str) -> bool {
        self.inner.plugins.is_registered(driver)
    }

    /// Whether a slice deletion of `driver` is pending (for tests and diagnostics).
    #[must_use]
    pub fn wipe_pending(&self, driver: &str) -> bool {
        self.inner.wipes.lock().unwrap().contains_key(driver)
    }

    /// The claim `namespace/name` as known on this node.
    #[must_use]
    pub fn claim(&self, namespace: &str, name: &str) -> Option<ClaimInfo> {
        self.inner.cache.lock().unwrap().get(namespace, name).map(|e| e.info.clone())
    }

    /// Whether pod `uid` still uses a claim, so that it must not be deleted before
    /// [`Self::unprepare_resources`] succeeded (upstream `PodMightNeedToUnprepareResources`).
    #[must_use]
    pub fn pod_might_need_to_unprepare(&self, uid: &str) -> bool {
        self.inner.cache.lock().unwrap().has_pod(uid)
    }

    /// Prepares the claims of `pod` (upstream `PrepareResources`). Idempotent: claims
    /// prepared already only gain the pod as a user.
    ///
    /// # Errors
    /// [`Error::Prepare`] with the first problem.
    pub async fn prepare_resources(&self, pod: &Pod) -> Result<(), Error> {
        let started = Instant::now();
        let result = self.prepare(pod).await;
        self.inner.metrics.observe_operation(PREPARE, result.is_err(), started.elapsed().as_secs_f64());
        result.map_err(Error::Prepare)
    }

    /// Ends `pod`'s use of its claims; claims left without users are unprepared by their
    /// drivers and forgotten (upstream `UnprepareResources`). Idempotent.
    ///
    /// # Errors
    /// [`Error::Unprepare`] with the first problem; the call may be repeated.
    pub async fn unprepare_resources(&self, pod: &Pod) -> Result<(), Error> {
        let started = Instant::now();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let names = self.inner.cache.lock().unwrap().claim_names_for_pod(uid);
        let result = self.unprepare(uid, namespace, &names).await;
        self.inner.metrics.observe_operation(UNPREPARE, result.is_err(), started.elapsed().as_secs_f64());
        result.map_err(Error::Unprepare)
    }

    /// Unprepares for every pod using claims that is not among `active` (pod UIDs), as
    /// upstream's reconcile loop does each minute once the pod sources are ready. Failures
    /// are logged; the next run tries again.
    pub async fn unprepare_inactive(&self, active: &HashSet<String>) {
        let pods = self.inner.cache.lock().unwrap().pods();
        for (uid, (namespace, names)) in pods {
            if active.contains(&uid) {
                continue;
            }
            let names: Vec<String> = names.into_iter().collect();
            if let Err(e) = self.unprepare(&uid, &namespace, &names).await {
                tracing::info!(pod_uid = %uid, error = %e, "unpreparing the claims of an inactive pod failed; will retry");
            }
        }
    }

    async fn prepare(&self, pod: &Pod) -> Result<(), ClaimError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
        // Check everything before recording anything: a pod that cannot start must not
        // leave claims that unprepare would then try to unprepare with absent drivers.
        let mut checked: Vec<ClaimInfo> = Vec::new();
        for pod_claim in claims::pod_claims(pod) {
            let Some((name, must_check_owner)) = claims::claim_name(pod, &pod_claim)? else {
                tracing::debug!(pod_claim = %pod_claim.name, "no ResourceClaim was needed");
                continue;
            };
            let claim = self
                .inner
                .claims
                .resource_claim(namespace, &name)
                .await
                .map_err(|message| ClaimError::Fetch { claim: name.clone(), message })?
                .ok_or_else(|| ClaimError::Fetch {
                    claim: name.clone(),
                    message: format!("resourceclaims.resource.k8s.io {name:?} not found"),
                })?;
            if must_check_owner {
                claims::is_for_pod(pod, &claim)?;
            }
            if !claims::is_reserved_for_pod(pod, &claim) {
                return Err(ClaimError::NotReserved {
                    pod_name: pod.metadata.name.clone().unwrap_or_default(),
                    pod_uid: pod_uid.to_owned(),
                    claim: name,
                    claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
                });
            }
            let info = claim_info(&claim)?;
            // Prepared or not, the claim's drivers must be here: if one is not, the
            // node is not fit to run the pod.
            for driver in info.driver_state.keys() {
                self.inner.plugins.get(driver)?;
            }
            checked.push(info);
        }

        // Record the pod as a user of each claim, and what is left to prepare.
        let mut batches: BTreeMap<String, Vec<proto::Claim>> = BTreeMap::new();
        let mut to_prepare: Vec<(String, String)> = Vec::new();
        {
            let mut cache = self.inner.cache.lock().unwrap();
            for info in checked {
                let key = (info.namespace.clone(), info.claim_name.clone());
                if let Some(known) = cache.get(&key.0, &key.1) {
                    if known.info.claim_uid != info.claim_uid {
                        return Err(ClaimError::UidChanged {
                            claim: info.claim_name,
                            old_uid: known.info.claim_uid.clone(),
                        });
                    }
                    if known.unpreparing {
                        return Err(ClaimError::Unpreparing { claim: info.claim_name });
                    }
                }
                let entry = cache.get_or_insert(info);
                entry.info.pod_uids.insert(pod_uid.to_owned());
                let prepared = entry.info.prepared;
                let claim = proto::Claim {
                    namespace: entry.info.namespace.clone(),
                    uid: entry.info.claim_uid.clone(),
                    name: entry.info.claim_name.clone(),
                };
                let drivers: Vec<String> = entry.info.driver_state.keys().cloned().collect();
                // Checkpointed before any driver is called: a crash from here on leaves
                // the pod recorded as a user, so its claims get unprepared later.
                cache.sync().map_err(|e| ClaimError::checkpoint(&e))?;
                if prepared || to_prepare.contains(&key) {
                    continue;
                }
                for driver in drivers {
                    batches.entry(driver).or_default().push(claim.clone());
                }
                to_prepare.push(key);
            }
        }

        for (driver, claims) in batches {
            let plugin = self.inner.plugins.get(&driver)?;
            tracing::debug!(driver = %driver, claims = claims.len(), "calling NodePrepareResources");
            let response =
                self.inner.plugins.node_prepare(&plugin, claims.clone(), &self.inner.metrics).await.map_err(|s| {
                    ClaimError::Rpc { method: NODE_PREPARE, message: crate::container::go_status_text(&s) }
                })?;
            for (uid, result) in &response.claims {
                let Some(asked) = claims.iter().find(|c| &c.uid == uid) else {
                    return Err(ClaimError::UnknownClaim { method: NODE_PREPARE, uid: uid.clone() });
                };
                if !result.error.is_empty() {
                    return Err(ClaimError::ClaimFailed {
                        method: NODE_PREPARE,
                        claim: asked.name.clone(),
                        message: result.error.clone(),
                    });
                }
                let mut cache = self.inner.cache.lock().unwrap();
                let Some(entry) = cache.get_mut(&asked.namespace, &asked.name) else {
                    return Err(ClaimError::Internal { claim: asked.name.clone(), namespace: asked.namespace.clone() });
                };
                // The driver's answer replaces what an earlier, partly failed attempt
                // recorded.
                entry.info.driver_state.entry(driver.clone()).or_default().devices = result
                    .devices
                    .iter()
                    .map(|d| checkpoint::Device {
                        pool_name: d.pool_name.clone(),
                        device_name: d.device_name.clone(),
                        share_id: d.share_id.clone(),
                        request_names: d.request_names.clone(),
                        cdi_device_ids: d.cdi_device_ids.clone(),
                    })
                    .collect();
            }
            let unfinished = claims.len().saturating_sub(response.claims.len());
            if unfinished != 0 {
                return Err(ClaimError::Skipped { method: NODE_PREPARE, count: unfinished });
            }
        }

        let mut cache = self.inner.cache.lock().unwrap();
        for (namespace, name) in &to_prepare {
            let Some(entry) = cache.get_mut(namespace, name) else {
                return Err(ClaimError::Internal { claim: name.clone(), namespace: namespace.clone() });
            };
            entry.info.prepared = true;
        }
        cache.sync().map_err(|e| ClaimError::checkpoint(&e))
    }

    /// Upstream `unprepareResources`: pod `pod_uid` stops using claims `names` of
    /// `namespace`.
    async fn unprepare(&self, pod_uid: &str, namespace: &str, names: &[String]) -> Result<(), ClaimError> {
        let mut batches: BTreeMap<String, Vec<proto::Claim>> = BTreeMap::new();
        let mut to_forget: Vec<String> = Vec::new();
        {
            let mut cache = self.inner.cache.lock().unwrap();
            for name in names {
                let Some(entry) = cache.get_mut(namespace, name) else { continue };
                // Not a user: prepare stopped before recording the pod, nothing to undo
                // (and the claim may serve other pods).
                if !entry.info.pod_uids.contains(pod_uid) {
                    continue;
                }
                if entry.info.pod_uids.len() > 1 {
                    // Checkpointed with the rest below; a crash before only means this
                    // (idempotent) unprepare runs again.
                    entry.info.pod_uids.remove(pod_uid);
                    continue;
                }
                entry.unpreparing = true;
                let claim = proto::Claim {
                    namespace: entry.info.namespace.clone(),
                    uid: entry.info.claim_uid.clone(),
                    name: entry.info.claim_name.clone(),
                };
                for driver in entry.info.driver_state.keys() {
                    batches.entry(driver.clone()).or_default().push(claim.clone());
                }
                to_forget.push(name.clone());
            }
        }

        for (driver, claims) in batches {
            let plugin = self.inner.plugins.get(&driver)?;
            tracing::debug!(driver = %driver, claims = claims.len(), "calling NodeUnprepareResources");
            let response =
                self.inner.plugins.node_unprepare(&plugin, claims.clone(), &self.inner.metrics).await.map_err(|s| {
                    ClaimError::Rpc { method: NODE_UNPREPARE, message: crate::container::go_status_text(&s) }
                })?;
            for (uid, result) in &response.claims {
                let Some(asked) = claims.iter().find(|c| &c.uid == uid) else {
                    return Err(ClaimError::UnknownClaim { method: NODE_UNPREPARE, uid: uid.clone() });
                };
                if !result.error.is_empty() {
                    return Err(ClaimError::ClaimFailed {
                        method: NODE_UNPREPARE,
                        claim: asked.name.clone(),
                        message: result.error.clone(),
                    });
                }
            }
            let unfinished = claims.len().saturating_sub(response.claims.len());
            if unfinished != 0 {
                return Err(ClaimError::Skipped { method: NODE_UNPREPARE, count: unfinished });
            }
        }

        let mut cache = self.inner.cache.lock().unwrap();
        for name in &to_forget {
            cache.remove(namespace, name);
        }
        cache.sync().map_err(|e| ClaimError::checkpoint(&e))
    }

    /// The `allocatedResourcesStatus` entries of `container` (upstream
    /// `UpdateAllocatedResourcesStatus`, `ResourceHealthStatus`, beta and on since 1.36):
    /// for each claim in its `resources.claims` that is prepared on this node,
    /// `claim:<name>` (`claim:<name>/<request>` for one request) with each device serving
    /// it, as its first CDI id (`<driver>/<pool>/<device>` without one), once, with the
    /// health and message its driver last reported ([`health`]; `Unknown` without a
    /// report that still holds).
    #[must_use]
    pub fn allocated_resources_status(&self, pod: &Pod, container: &Container) -> Vec<ResourceStatus> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let container_claims = container.resources.as_ref().and_then(|r| r.claims.as_deref()).unwrap_or_default();
        let pod_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_deref()).unwrap_or_default();
        let cache = self.inner.cache.lock().unwrap();
        let now = std::time::SystemTime::now();
        let mut out = Vec::new();
        for claim in container_claims {
            let Some(pod_claim) = pod_claims.iter().find(|c| c.name == claim.name) else { continue };
            let Ok(Some((name, _))) = claims::claim_name(pod, pod_claim) else { continue };
            let Some(entry) = cache.get(namespace, &name) else { continue };
            let request = claim.request.as_deref().unwrap_or_default();
            let base_request = request.split('/').next().unwrap_or_default();
            let mut resources: Vec<ResourceHealth> = Vec::new();
            // A subrequest (`request/sub`) is served by its request's devices.
            for (driver, d) in entry.info.devices_for(base_request) {
                let id = d
                    .cdi_device_ids
                    .first()
                    .cloned()
                    .unwrap_or_else(|| format!("{driver}/{}/{}", d.pool_name, d.device_name));
                if !resources.iter().any(|r| r.resource_id == id) {
                    let (health, message) = self.inner.health.get(driver, &d.pool_name, &d.device_name, now);
                    let message = Some(message).filter(|m| !m.is_empty());
                    resources.push(ResourceHealth { health: Some(health), message, resource_id: id });
                }
            }
            let name = if request.is_empty() {
                format!("claim:{}", claim.name)
            } else {
                format!("claim:{}/{request}", claim.name)
            };
            out.push(ResourceStatus { name, resources: Some(resources).filter(|r| !r.is_empty()) });
        }
        out
    }

    /// The CDI devices of `container` (upstream `GetResources`): for each claim the
    /// container lists (only the named request's devices when it names one), and for its
    /// extended resources served by DRA, the CDI ids the drivers answered, in the pod's
    /// claim order, without repeats.
    ///
    /// # Errors
    /// A claim of the container that is not prepared on this node, or whose name is not
    /// known yet.
    pub fn container_cdi_devices(&self, pod: &Pod, container: &Container) -> Result<Vec<String>, String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        // ResourceClaim name → the requests the container wants of it ("" = all).
        let mut wanted: Vec<(String, Vec<String>)> = Vec::new();
        let mut want = |claim: String, request: String| match wanted.iter_mut().find(|(c, _)| *c == claim) {
            Some((_, requests)) => requests.push(request),
            None => wanted.push((claim, vec![request])),
        };
        let container_claims = container.resources.as_ref().and_then(|r| r.claims.as_deref()).unwrap_or_default();
        let pod_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_deref()).unwrap_or_default();
        for pod_claim in pod_claims {
            let requests: Vec<String> = container_claims
                .iter()
                .filter(|c| c.name == pod_claim.name)
                .map(|c| c.request.clone().unwrap_or_default())
                .collect();
            if requests.is_empty() {
                continue;
            }
            let Some((name, _)) = claims::claim_name(pod, pod_claim).map_err(|e| e.to_string())? else { continue };
            for request in requests {
                want(name.clone(), request);
            }
        }
        if let Some(ext) = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()) {
            let requested: HashSet<&str> = container
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .into_iter()
                .flatten()
                .filter(|(name, q)| {
                    is_dra_extended_resource_name(name)
                        && crate::types::quantity::parse(&q.0).is_ok_and(|q| !q.is_zero())
                })
                .map(|(name, _)| name.as_str())
                .collect();
            for m in &ext.request_mappings {
                if m.container_name == container.name && requested.contains(m.resource_name.as_str()) {
                    want(ext.resource_claim_name.clone(), m.request_name.clone());
                }
            }
        }

        let cache = self.inner.cache.lock().unwrap();
        let mut out: Vec<String> = Vec::new();
        for (name, requests) in &wanted {
            let Some(entry) = cache.get(namespace, name) else {
                return Err(format!(
                    "ResourceClaim {namespace}/{name} used by container {:?} is not prepared on this node",
                    container.name
                ));
            };
            for request in requests {
                for id in entry.info.cdi_device_ids(request) {
                    if !out.iter().any(|o| o == id) {
                        out.push(id.to_owned());
                    }
                }
            }
        }
        Ok(out)
    }

    fn cancel_wipe(&self, driver: &str) {
        if let Some((_, token)) = self.inner.wipes.lock().unwrap().remove(driver) {
            tracing::info!(driver, "DRA driver is back; its ResourceSlices stay");
            token.cancel();
        }
    }

    /// Deletes `driver`'s slices after the wiping delay unless it registers again first.
    /// A deletion already pending keeps its original deadline.
    fn schedule_wipe(&self, driver: &str) {
        let token = {
            let mut wipes = self.inner.wipes.lock().unwrap();
            if wipes.contains_key(driver) {
                return;
            }
            let generation = self.inner.next_wipe.fetch_add(1, Ordering::Relaxed);
            let token = self.inner.shutdown.child_token();
            wipes.insert(driver.to_owned(), (generation, token.clone()));
            (generation, token)
        };
        let inner = Arc::clone(&self.inner);
        let driver = driver.to_owned();
        let delay = self.inner.wiping_delay;
        tokio::spawn(async move {
            let (generation, token) = token;
            tokio::select! {
                () = token.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            // Registered again meanwhile (a race with the cancellation): keep the slices.
            if !inner.plugins.is_registered(&driver) {
                wipe(&inner, Some(&driver), &token).await;
            }
            let mut wipes = inner.wipes.lock().unwrap();
            if wipes.get(&driver).is_some_and(|(g, _)| *g == generation) {
                wipes.remove(&driver);
            }
        });
    }
}

/// Deletes the node's slices of `driver` (all drivers when `None`), retrying with
/// upstream's backoff until it succeeds, the attempts run out, or `token` is cancelled.
async fn wipe(inner: &Inner, driver: Option<&str>, token: &CancellationToken) {
    let mut delay = WIPE_RETRY_START;
    for attempt in 1..=WIPE_ATTEMPTS {
        if token.is_cancelled() {
            return;
        }
        match inner.claims.delete_resource_slices(driver, &inner.node_name).await {
            Ok(()) => {
                tracing::info!(driver = driver.unwrap_or("<all>"), node = %inner.node_name, "deleted ResourceSlices");
                return;
            }
            Err(e) => {
                tracing::info!(driver = driver.unwrap_or("<all>"), attempt, error = %e, "deleting ResourceSlices failed; retrying");
            }
        }
        let jittered = delay.mul_f64(1.0 + WIPE_JITTER * rand::random::<f64>());
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(jittered) => {}
        }
        delay = (delay * 2).min(WIPE_RETRY_CAP);
    }
}

#[async_trait::async_trait]
impl PluginHandler for DraManager {
    /// Upstream `RegisterPlugin`: the plugin's first service the agent speaks is chosen;
    /// the socket is dialled on the first call.
    async fn register(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String> {
        let service = choose_service(versions).map_err(|e| {
            format!(
                "invalid supported gRPC versions of DRA driver plugin {name} at endpoint {}: {e}",
                endpoint.display()
            )
        })?;
        let health_stop = self.inner.plugins.add(name, endpoint, service);
        self.cancel_wipe(name);
        tracing::info!(driver = name, endpoint = %endpoint.display(), service = service.name(), "DRA driver plugin registered");
        if let Some(health_service) = health::choose_health_service(versions) {
            // The task holds no strong reference: the manager may go while it runs.
            let weak = Arc::downgrade(&self.inner);
            let changed = move |driver: &str, devices: Vec<health::DeviceHealth>| {
                if let Some(inner) = weak.upgrade() {
                    inner.health_changed(driver, &devices);
                }
            };
            let watch = health::watch(
                name.to_owned(),
                endpoint.to_owned(),
                health_service,
                Arc::clone(&self.inner.health),
                changed,
                health_stop,
            );
            let shutdown = self.inner.shutdown.clone();
            self.inner.plugins.spawn(async move {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = watch => {}
                }
            });
        }
        Ok(())
    }

    /// Upstream `DeRegisterPlugin`: the driver's oldest plugin is forgotten; a driver left
    /// without one has its slices deleted after the wiping delay.
    async fn deregister(&self, name: &str) {
        let Some(gone) = self.inner.plugins.remove_oldest(name) else { return };
        tracing::info!(driver = name, endpoint = %gone.endpoint.display(), "DRA driver plugin deregistered");
        if !self.inner.plugins.is_registered(name) {
            self.schedule_wipe(name);
        }
    }
}

impl ContainerLifecycleHook for DraManager {
    fn pre_create_container(
        &self,
        pod: &Pod,
        container: &Container,
        config: &mut api::ContainerConfig,
    ) -> Result<(), String> {
        for id in self.container_cdi_devices(pod, container)? {
            if !config.cdi_devices.iter().any(|d| d.name == id) {
                config.cdi_devices.push(api::CdiDevice { name: id });
            }
        }
        Ok(())
    }
}
