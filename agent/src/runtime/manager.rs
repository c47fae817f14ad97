//! [`RuntimeManager`]: the kubelet's `kubeGenericRuntimeManager`. It decides what a pod
//! needs from the runtime ([`compute_pod_actions`], a pure function of the spec and the
//! runtime's state) and carries it out through CRI: sandbox, init containers in order,
//! app containers with crash-loop back-off, and kills with grace periods.
//!
//! Split as upstream splits `pkg/kubelet/kuberuntime`:
//! - this file: the manager, its construction, `SyncPod` ([`RuntimeManager::sync_pod`],
//!   crash-loop back-off included) and `KillPod` ([`RuntimeManager::kill_pod`])
//!   (`kuberuntime_manager.go`);
//! - [`pod_actions`]: what a sync must do (`computePodActions`);
//! - `sandbox`: the sandbox config and `RunPodSandbox` (`kuberuntime_sandbox.go`);
//! - `container`: container starts (image, config, create, start, postStart) and kills
//!   (preStop, stop), [`StartError`] (`kuberuntime_container.go`);
//! - `image_credentials`: pull secrets and node credentials for image pulls;
//! - [`dns`]: pod DNS, hostnames and `/etc/hosts` (`pkg/kubelet/network/dns`);
//! - [`env`](mod@env): container environment variables (`makeEnvironmentVariables`);
//! - `termination_order`: sidecars stop after the app containers, in reverse order
//!   (`kuberuntime_termination_order.go`);
//! - `sync_result`: what a sync did, per action ([`PodSyncResult`], [`SyncResult`];
//!   `pkg/kubelet/container/sync_result.go`);
//! - `tests` (`SyncPod` on the fake runtime) and `testing` (fixtures the tests share).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cm::PodContainerManager;
use crate::container::backoff::{Backoff, go_duration};
use crate::container::helpers::is_host_network;
use crate::container::labels::{self, ContainerKind};
use crate::container::pod_status::{ContainerState, RuntimePodStatus};
use crate::container::{Error, Result, RuntimeService, api};
use crate::events::{EventRecorder, EventType, pod_ref};
use crate::runtime::metrics::{ContainerTypeLabels, RuntimeMetrics, StartedContainerErrorLabels};
use crate::types::pod::pod_full_name;
use crate::types::pod_resources::is_restartable_init_container;
use crate::volumes::VolumeManager;

mod container;
pub mod dns;
pub mod env;
mod image_credentials;
mod image_volumes;
pub mod pod_actions;
mod sandbox;
mod sync_result;
mod termination_order;
#[cfg(test)]
mod testing;

pub use container::StartError;
use container::{StartContext, StartSpec};
pub use pod_actions::{
    ContainerToReset, PodActions, compute_pod_actions, compute_pod_actions_with, compute_reset_actions,
};
pub use sync_result::{PodSyncResult, SyncAction, SyncResult};
use termination_order::TerminationOrder;

/// Upstream `minimumGracePeriodInSeconds`: a kill never gets less than this.
pub const MINIMUM_GRACE_PERIOD_SECS: i64 = 2;
/// Default `terminationGracePeriodSeconds` (API server defaulting).
pub const DEFAULT_GRACE_PERIOD_SECS: i64 = 30;

/// How long a kill waits for the runtime to record an exit the kernel reported
/// ([`RuntimeManager::await_runtime_exits`]); containerd takes tens of milliseconds.
const RUNTIME_EXIT_LAG_LIMIT: Duration = Duration::from_secs(2);

/// How often the runtime is asked meanwhile.
const RUNTIME_EXIT_POLL: Duration = Duration::from_millis(10);
/// Waiting reasons as upstream (`kubecontainer` errors and `images` errors).
pub mod reasons {
    pub use crate::container::reasons::*;
    pub use crate::images::puller::reasons::{
        ERR_IMAGE_NEVER_PULL, ERR_IMAGE_PULL, IMAGE_INSPECT_ERROR, IMAGE_PULL_BACK_OFF, INVALID_IMAGE_NAME,
        REGISTRY_UNAVAILABLE, SIGNATURE_VALIDATION_FAILED,
    };
}

/// Waiting reasons the image manager gives (it records their events itself).
const IMAGE_REASONS: [&str; 7] = [
    reasons::ERR_IMAGE_PULL,
    reasons::IMAGE_PULL_BACK_OFF,
    reasons::ERR_IMAGE_NEVER_PULL,
    reasons::INVALID_IMAGE_NAME,
    reasons::IMAGE_INSPECT_ERROR,
    reasons::REGISTRY_UNAVAILABLE,
    reasons::SIGNATURE_VALIDATION_FAILED,
];

/// The prober's verdicts on one pod's containers, for [`compute_pod_actions_with`]
/// (the runtime reports bare ids; the prober keys its results by `<runtime>://<id>`).
struct Verdicts<'a> {
    pod: &'a Pod,
    probes: &'a crate::prober::ProbeManager,
    runtime_name: &'a str,
}

impl Verdicts<'_> {
    fn full_id(&self, id: &str) -> String {
        format!("{}://{id}", self.runtime_name)
    }
}

impl pod_actions::ProbeVerdicts for Verdicts<'_> {
    fn to_kill(&self, container: &Container, id: &str) -> Option<crate::prober::ProbeKill> {
        self.probes.container_to_kill(self.pod, &container.name, &self.full_id(id))
    }

    fn startup_succeeded(&self, _: &Container, id: &str) -> bool {
        self.probes.startup().get(&self.full_id(id)) == Some(crate::prober::ProbeResult::Success)
    }
}

/// The error of a pod that came without a spec (a broken object from a source).
fn no_spec(pod: &Pod) -> String {
    format!("pod {} has no spec", pod_full_name(pod))
}

/// Settings of the runtime manager.
#[derive(Clone, Debug)]
pub struct RuntimeManagerConfig {
    /// Where container logs go: `<dir>/<ns>_<name>_<uid>/<container>/<n>.log`
    /// (upstream `podLogsDir`, default `/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// The kubelet root dir (`--root-dir`); pod dirs live in `<root>/pods/<uid>`.
    pub root_dir: PathBuf,
    /// Node name, for downward API env vars.
    pub node_name: String,
    /// Node IP for `status.hostIP` env vars, if known.
    pub host_ip: Option<String>,
}

/// Everything the runtime manager works with, all required, so that no feature can be left
/// off by a dependency not given: production fills it once (`agent::build`), tests start
/// from `RuntimeManagerDeps::fake` and replace what they look at.
#[derive(Debug)]
pub struct RuntimeManagerDeps {
    /// The CRI client.
    pub rt: Arc<dyn RuntimeService>,
    /// Pod and `QoS` cgroups.
    pub cm: Arc<dyn PodContainerManager>,
    pub metrics: Arc<RuntimeMetrics>,
    pub cfg: RuntimeManagerConfig,
    /// The crash-loop back-off (`crashLoopBackOff.maxContainerRestartPeriod`).
    pub backoff: Backoff,
    /// Pulls images as their pull policy says (events, back-off, credentials).
    pub images: Arc<crate::images::puller::ImageManager>,
    /// Records pod events (`Pulled`, `Created`, `Started`, `Killing`, `BackOff`, ...) as
    /// upstream.
    pub recorder: Arc<dyn EventRecorder>,
    /// Pod volumes, and the source of `ConfigMap`s and `Secret`s for environment variables.
    pub volumes: Arc<VolumeManager>,
    /// Cluster DNS settings (`clusterDNS`, `clusterDomain`, `resolvConf`).
    pub dns: dns::DnsSettings,
    /// The runtime cache the PLEGs write: pod statuses are read through it (with the
    /// exits the kernel saw first laid over them), start calls are marked in it for the
    /// evented PLEG, and every start and stop is counted there for the stats provider.
    pub cache: Arc<crate::container::cache::RuntimeCache>,
    /// The prober: its liveness and startup verdicts kill and restart containers.
    pub probes: crate::prober::ProbeManager,
    /// The runtime's name, which prefixes container ids in the API status
    /// (`containerd://<id>`).
    pub runtime_name: String,
    /// Pod start latency (`kubelet_pod_start_*`; image pulls are excluded from the SLI).
    pub startup: Arc<crate::pod_startup::PodStartupTracker>,
    /// The container manager's hooks (CPU, memory, device managers), called in order
    /// around every container's creation, after the allocation's own.
    pub container_hooks: Vec<Arc<dyn crate::cm::container_lifecycle::ContainerLifecycleHook>>,
    /// In-place resize: allocations and actuated resources ([`crate::allocation`]).
    pub allocation: Arc<crate::allocation::AllocationManager>,
    /// At most this many sandbox starts and this many container create+start pairs reach
    /// the runtime at once (0: no limit, upstream's behaviour); see [`super::start_gate`].
    pub start_concurrency: usize,
    /// `seccompDefault`, the seccomp profile root and `AppArmor` on the host
    /// ([`super::security_context`]).
    pub security: super::security_context::SecuritySettings,
    /// The user namespaces of pods with `hostUsers: false` ([`super::userns`]).
    pub userns: Arc<super::userns::UsernsManager>,
    /// Dynamic Resource Allocation (API-server mode): the pod's claims are prepared
    /// before its sandbox is created.
    pub dra: Option<crate::dra::DraManager>,
    /// Pods' runtime classes → runtime handlers ([`super::runtime_class`]).
    pub runtime_classes: super::runtime_class::RuntimeClasses,
    /// The device manager, whose devices' health goes into the containers'
    /// `allocatedResourcesStatus` (none in tests that do not look).
    pub devices: Option<crate::cm::devicemanager::DeviceManager>,
}

/// Carries out pod syncs and kills through CRI.
#[derive(Debug)]
pub struct RuntimeManager {
    rt: Arc<dyn RuntimeService>,
    cm: Arc<dyn PodContainerManager>,
    metrics: Arc<RuntimeMetrics>,
    cfg: RuntimeManagerConfig,
    backoff: Mutex<Backoff>,
    images: Arc<crate::images::puller::ImageManager>,
    /// Registry credentials of the node (docker config files).
    node_credentials: crate::images::credentials::NodeCredentials,
    /// Last start failure per (pod uid, container name): (reason, message). Upstream
    /// `ReasonCache`; cleared by a successful start.
    reasons: Mutex<HashMap<(String, String), (String, String)>>,
    recorder: Arc<dyn EventRecorder>,
    volumes: Arc<VolumeManager>,
    dns: dns::DnsSettings,
    cache: Arc<crate::container::cache::RuntimeCache>,
    probes: crate::prober::ProbeManager,
    runtime_name: String,
    /// Runs postStart / preStop hooks.
    hooks: crate::lifecycle::hooks::HandlerRunner,
    startup: Arc<crate::pod_startup::PodStartupTracker>,
    /// The allocation's actuation hook, then the container manager's hooks.
    container_hooks: Vec<Arc<dyn crate::cm::container_lifecycle::ContainerLifecycleHook>>,
    allocation: Arc<crate::allocation::AllocationManager>,
    /// Limits concurrent `RunPodSandbox` calls ([`super::start_gate`]).
    sandbox_gate: super::start_gate::StartGate,
    /// Limits concurrent `CreateContainer`+`StartContainer` pairs.
    container_gate: super::start_gate::StartGate,
    security: super::security_context::SecuritySettings,
    userns: Arc<super::userns::UsernsManager>,
    dra: Option<crate::dra::DraManager>,
    runtime_classes: super::runtime_class::RuntimeClasses,
    devices: Option<crate::cm::devicemanager::DeviceManager>,
}

/// Upstream `calcRestartCountByLogDir`: for a container the runtime has no instance of
/// (removed by a `RestartAllContainers` reset, or lost with the runtime's state), one past
/// the highest `<n>.log` (or rotated `<n>.log.*`) in its log directory, so that it logs to
/// a new file; 0 when there is none or the directory cannot be read.
fn restart_count_from_log_dir(dir: &std::path::Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name();
            let (n, rest) = name.to_str()?.split_once(".log")?;
            (rest.is_empty() || rest.starts_with('.')).then_some(())?;
            n.parse::<u32>().ok().map(|n| n.saturating_add(1))
        })
        .max()
        .unwrap_or(0)
}

impl RuntimeManager {
    /// One container of a `RestartAllContainers` reset: stopped without a grace period
    /// (no preStop hook) if it runs, with a `Killing` event, then removed; its logs stay
    /// until the pod goes.
    async fn reset_container(&self, pod: &Pod, reset: &ContainerToReset, status: &RuntimePodStatus) -> Result<()> {
        tracing::info!(pod = %pod_full_name(pod), container = %reset.name, id = %reset.id, kill = reset.kill, "removing container before the pod restarts");
        if reset.kill {
            self.kill_container(pod, &reset.id, &reset.name, Some(0), "killing", &self.pod_ips(pod, status.ips()))
                .await?;
        } else {
            self.await_runtime_exits(std::iter::once(reset.id.as_str())).await;
        }
        match self.remove_container(&reset.id).await {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    /// The pod's IPs as its containers see them (env vars, hooks, `/etc/hosts`): the
    /// sandbox's, or the node's for a pod on the node's network, whose sandbox has none
    /// (upstream takes them from the API status, where such a pod has the host IP).
    fn pod_ips(&self, pod: &Pod, sandbox_ips: &[String]) -> Vec<String> {
        let host_network = pod.spec.as_ref().is_some_and(is_host_network);
        match &self.cfg.host_ip {
            Some(ip) if host_network && sandbox_ips.is_empty() => vec![ip.clone()],
            _ => sandbox_ips.to_vec(),
        }
    }

    #[must_use]
    pub fn new(deps: RuntimeManagerDeps) -> Self {
        let RuntimeManagerDeps {
            rt,
            cm,
            metrics,
            cfg,
            backoff,
            images,
            recorder,
            volumes,
            dns,
            cache,
            probes,
            runtime_name,
            startup,
            container_hooks,
            allocation,
            start_concurrency,
            security,
            userns,
            dra,
            runtime_classes,
            devices,
        } = deps;
        // The allocation records what each container starts with before the resource
        // managers see it.
        let actuation: Arc<dyn crate::cm::container_lifecycle::ContainerLifecycleHook> =
            Arc::new(crate::allocation::ActuationHook(allocation.clone()));
        Self {
            cm,
            metrics,
            backoff: Mutex::new(backoff),
            images,
            node_credentials: crate::images::credentials::NodeCredentials::new(&cfg.root_dir),
            reasons: Mutex::new(HashMap::new()),
            recorder,
            volumes,
            dns,
            cache,
            probes,
            runtime_name,
            startup,
            container_hooks: std::iter::once(actuation).chain(container_hooks).collect(),
            allocation,
            sandbox_gate: super::start_gate::StartGate::new(start_concurrency),
            container_gate: super::start_gate::StartGate::new(start_concurrency),
            security,
            userns,
            dra,
            runtime_classes,
            devices,
            hooks: crate::lifecycle::hooks::HandlerRunner::new(rt.clone()),
            rt,
            cfg,
        }
    }

    /// The allocation manager (in-place resize).
    #[must_use]
    pub fn allocation(&self) -> &Arc<crate::allocation::AllocationManager> {
        &self.allocation
    }

    /// The pod start latency tracker.
    #[must_use]
    pub fn startup_tracker(&self) -> &Arc<crate::pod_startup::PodStartupTracker> {
        &self.startup
    }

    /// The runtime cache it reads pod statuses through.
    #[must_use]
    pub fn cache(&self) -> &Arc<crate::container::cache::RuntimeCache> {
        &self.cache
    }

    /// The prober.
    #[must_use]
    pub fn probes(&self) -> &crate::prober::ProbeManager {
        &self.probes
    }

    fn containers_changed(&self) {
        self.cache.containers_changed();
    }

    /// The volume manager (the pod workers mount and clean up through it).
    #[must_use]
    pub fn volumes(&self) -> &Arc<VolumeManager> {
        &self.volumes
    }

    /// The user namespace ranges of the pods.
    #[must_use]
    pub fn userns(&self) -> &Arc<super::userns::UsernsManager> {
        &self.userns
    }

    /// Prepares the pod's resource claims (upstream `PrepareDynamicResources`); nothing to
    /// do for a pod without claims.
    async fn prepare_dynamic_resources(&self, pod: &Pod) -> std::result::Result<(), String> {
        let has_claims = pod.spec.as_ref().is_some_and(|s| s.resource_claims.as_ref().is_some_and(|c| !c.is_empty()))
            || pod.status.as_ref().is_some_and(|s| s.extended_resource_claim_status.is_some());
        if !has_claims {
            return Ok(());
        }
        match &self.dra {
            Some(dra) => dra.prepare_resources(pod).await.map_err(|e| e.to_string()),
            None => Err("resource claims need the API server (standalone mode)".to_owned()),
        }
    }

    /// The DRA manager (API-server mode).
    #[must_use]
    pub fn dra(&self) -> Option<&crate::dra::DraManager> {
        self.dra.as_ref()
    }

    /// Upstream `UpdateAllocatedResourcesStatus` (`ResourceHealthStatus`, beta and on
    /// since 1.36): each app container's `allocatedResourcesStatus`, the device plugin
    /// resources it holds with each device's health, then its DRA claims' devices (see
    /// [`crate::dra::DraManager::allocated_resources_status`]). A container holding
    /// neither has none.
    pub fn set_allocated_resources_status(&self, pod: &Pod, status: &mut k8s_openapi::api::core::v1::PodStatus) {
        let uid = crate::types::pod::uid(pod);
        let spec = pod.spec.as_ref();
        for cs in status.container_statuses.iter_mut().flatten() {
            let mut list: Vec<k8s_openapi::api::core::v1::ResourceStatus> =
                self.devices.as_ref().map(|d| d.allocated_resources_status(uid, &cs.name)).unwrap_or_default();
            if let (Some(dra), Some(c)) =
                (&self.dra, spec.and_then(|s| s.containers.iter().find(|c| c.name == cs.name)))
            {
                for entry in dra.allocated_resources_status(pod, c) {
                    match list.iter_mut().find(|e| e.name == entry.name) {
                        Some(e) => *e = entry,
                        None => list.push(entry),
                    }
                }
            }
            cs.allocated_resources_status = (!list.is_empty()).then_some(list);
        }
    }

    /// The pod's user namespace for its sandbox and containers ([`super::userns`]), on
    /// the runtime handler its runtime class names.
    pub(crate) fn user_namespace(&self, pod: &Pod) -> std::result::Result<api::UserNamespace, String> {
        self.userns.namespace(pod, &self.runtime_classes.cached(pod))
    }

    /// A sandbox that could not be made (its runtime class, or `RunPodSandbox`): upstream's
    /// `FailedCreatePodSandBox` event, the sync's failed result with `message`, and
    /// `kubelet_started_pods_errors_total`.
    fn sandbox_failed(&self, pod: &Pod, result: &mut PodSyncResult, e: &dyn std::fmt::Display, message: String) {
        tracing::warn!(pod = %pod_full_name(pod), error = %e, "failed to create pod sandbox");
        self.event(pod, EventType::Warning, "FailedCreatePodSandBox", format!("Failed to create pod sandbox: {e}"));
        result.add(SyncResult::failed(SyncAction::CreatePodSandbox, pod_full_name(pod), message));
        self.metrics.started_pods_errors.inc();
    }

    fn event(&self, pod: &Pod, type_: EventType, reason: &str, message: String) {
        self.recorder.record(pod_ref(pod), type_, reason, message);
    }

    /// An event about one container (`involvedObject.fieldPath` names it, as upstream).
    fn container_event(&self, pod: &Pod, container: &str, type_: EventType, reason: &str, message: String) {
        self.recorder.record(crate::events::container_ref(pod, container), type_, reason, message);
    }

    #[must_use]
    pub fn runtime(&self) -> &Arc<dyn RuntimeService> {
        &self.rt
    }

    /// The last start failure of a container, as (reason, message).
    #[must_use]
    pub fn start_failure(&self, uid: &str, container: &str) -> Option<(String, String)> {
        self.reasons.lock().unwrap().get(&(uid.to_string(), container.to_string())).cloned()
    }

    fn set_reason(&self, uid: &str, container: &str, reason: &str, message: String) {
        self.reasons.lock().unwrap().insert((uid.to_string(), container.to_string()), (reason.to_string(), message));
    }

    fn clear_reason(&self, uid: &str, container: &str) {
        self.reasons.lock().unwrap().remove(&(uid.to_string(), container.to_string()));
    }

    /// Forgets per-pod state (back-off, reasons) of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.reasons.lock().unwrap().retain(|(u, _), _| u != uid);
        let prefix = format!("{uid}/");
        self.backoff.lock().unwrap().forget_prefix(&prefix);
        self.images.forget_pod(uid);
    }

    /// Drops expired back-off entries (housekeeping).
    pub fn gc_backoff(&self) {
        self.backoff.lock().unwrap().gc();
        self.images.gc_backoff();
    }

    /// Fetches a pod's runtime status, with the exits the kernel saw first.
    pub async fn pod_status(&self, uid: &str) -> Result<RuntimePodStatus> {
        self.cache.pod_status(self.rt.as_ref(), uid).await
    }

    fn pod_log_dir(&self, pod: &Pod) -> PathBuf {
        self.cfg.pod_logs_dir.join(format!(
            "{}_{}_{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        ))
    }

    /// The pod cgroup as the pod's `status.resources` shows it
    /// ([`PodContainerManager::pod_cgroup_status_config`]); `None` when there is none or
    /// it cannot be read.
    #[must_use]
    pub fn pod_cgroup_for_status(&self, pod: &Pod) -> Option<crate::cm::resources::PodResourceConfig> {
        self.cm.pod_cgroup_status_config(pod).unwrap_or_else(|e| {
            tracing::debug!(pod = %pod_full_name(pod), error = %e, "cannot read the pod cgroup for the pod's status");
            None
        })
    }

    /// The pod's directory under the root dir.
    #[must_use]
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.cfg.root_dir.join("pods").join(uid)
    }

    /// Upstream `SyncPod` of the runtime manager. The caller has computed the API status
    /// and ensured the pod cgroup.
    /// A pod without a spec is an error for that pod.
    pub async fn sync_pod(&self, pod: &Pod, status: &RuntimePodStatus) -> PodSyncResult {
        self.sync_pod_restarting(pod, status, false).await
    }

    /// [`Self::sync_pod`]; with `restart_all` (the pod's `AllContainersRestarting`
    /// condition is True) it removes every container of the pod instead of starting any
    /// ([`compute_reset_actions`]), and the caller syncs again at once.
    pub async fn sync_pod_restarting(&self, pod: &Pod, status: &RuntimePodStatus, restart_all: bool) -> PodSyncResult {
        let Some(spec) = pod.spec.as_ref() else {
            return PodSyncResult::sync_failed(no_spec(pod));
        };
        let verdicts = Verdicts { pod, probes: &self.probes, runtime_name: &self.runtime_name };
        let mut actions = if restart_all {
            compute_reset_actions(pod, status)
        } else {
            compute_pod_actions_with(pod, status, &verdicts)
        };
        // In-place resize: restarts join the actions; in-place updates come after the kills.
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let a = &self.allocation;
        let actuated = |c: &str| a.actuated(uid, c).or_else(|| super::resize::reported_values(pod, status, c));
        a.initialize_pod_actuated(pod);
        let resize_plan = if restart_all {
            None
        } else {
            super::resize::compute_pod_resize_action(pod, status, &actuated, a.pod_actuated(uid), &mut actions)
        };
        tracing::debug!(pod = %pod_full_name(pod), ?actions, "computed pod actions");
        let nothing_yet = status.sandboxes.is_empty() && status.containers.is_empty();
        let mut result = PodSyncResult::default();
        if actions.kill_pod && !nothing_yet {
            result.touched_runtime = true;
            let reason = if actions.create_sandbox {
                "sandbox changed; a new one will be created"
            } else {
                "all containers are done"
            };
            tracing::info!(pod = %pod_full_name(pod), reason, "killing pod");
            if actions.create_sandbox {
                self.event(
                    pod,
                    EventType::Normal,
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.".into(),
                );
            }
            if let Err(e) = self.kill_pod(Some(pod), status, None).await {
                result.add(SyncResult::failed(SyncAction::KillPod, pod_full_name(pod), e.to_string()));
                return result;
            }
            result.add(SyncResult::ok(SyncAction::KillPod, pod_full_name(pod)));
            if actions.create_sandbox {
                // Old init containers would confuse the init sequence of the new sandbox.
                for c in status.containers.iter().filter(|c| c.init) {
                    if let Err(e) = self.remove_container(&c.id).await
                        && !e.is_not_found()
                    {
                        tracing::warn!(container = %c.id, error = %e, "failed to remove old init container");
                    }
                }
            }
        } else {
            for (id, (name, why)) in &actions.containers_to_kill {
                result.touched_runtime = true;
                tracing::info!(pod = %pod_full_name(pod), container = %name, reason = %why, "killing container");
                let grace = actions.kill_grace.get(id).copied();
                if let Err(e) = self.kill_container(pod, id, name, grace, why, &self.pod_ips(pod, status.ips())).await {
                    result.add(SyncResult::failed(SyncAction::KillContainer, name, e.to_string()));
                    return result;
                }
                result.add(SyncResult::ok(SyncAction::KillContainer, name));
            }
            for reset in &actions.containers_to_reset {
                result.touched_runtime = true;
                if let Err(e) = self.reset_container(pod, reset, status).await {
                    tracing::warn!(pod = %pod_full_name(pod), container = %reset.name, error = %e, "failed to remove container before the pod restarts");
                    result.add(SyncResult::failed(SyncAction::RemoveContainer, &reset.name, e.to_string()));
                    return result;
                }
                result.add(SyncResult::ok(SyncAction::RemoveContainer, &reset.name));
            }
        }
        if self.prune_init_containers(spec, status).await {
            result.touched_runtime = true;
        }
        if let Some(plan) = &resize_plan {
            result.touched_runtime = true;
            match super::resize::do_pod_resize_action(self.rt.as_ref(), self.cm.as_ref(), a, pod, plan).await {
                Ok(()) => {
                    a.clear_resize_error(pod);
                    result.add(SyncResult::ok(SyncAction::ResizePodInPlace, pod_full_name(pod)));
                }
                Err(e) => {
                    tracing::warn!(pod = %pod_full_name(pod), error = %e, "pod resize failed");
                    a.set_resize_error(pod, &e);
                    result.add(SyncResult::failed(SyncAction::ResizePodInPlace, pod_full_name(pod), e));
                }
            }
        }

        let mut sandbox_id = actions.sandbox_id.clone();
        // Upstream: the claims are prepared before the sandbox, and before its config is
        // generated (in `createPodSandbox`, with its DNS warnings); a failure is an event and
        // the sync ends there (the next sync tries again).
        if actions.create_sandbox
            && let Err(e) = Box::pin(self.prepare_dynamic_resources(pod)).await
        {
            tracing::warn!(pod = %pod_full_name(pod), error = %e, "failed to prepare dynamic resources");
            self.event(
                pod,
                EventType::Warning,
                "FailedPrepareDynamicResources",
                format!("Failed to prepare dynamic resources: {e}"),
            );
            return result;
        }
        // Upstream generates the sandbox config, and records its DNS warnings, when it creates
        // a sandbox and again before it starts any container (`lazyStart`), in back-off too:
        // a new pod gets `MissingClusterDNS` twice, and once more each sync that has a
        // container to start. One config serves both here; its warnings are recorded as often.
        let starts_any = !actions.init_containers_to_start.is_empty()
            || !actions.containers_to_start.is_empty()
            || !actions.ephemeral_containers_to_start.is_empty();
        let dns_records = usize::from(actions.create_sandbox) + usize::from(starts_any);
        // The handler of the pod's runtime class, which the sandbox and container configs
        // take from (user namespaces, image volumes): looked up afresh for a new sandbox
        // (a failure is the sandbox's, reported below once its config is made, in
        // upstream's order), else as seen before (looked up after an agent restart; a
        // failure then leaves the default handler to a running sandbox's containers).
        let sandbox_handler = if actions.create_sandbox {
            Some(self.runtime_classes.lookup(pod).await)
        } else {
            if starts_any && let Err(e) = self.runtime_classes.handler(pod).await {
                tracing::debug!(pod = %pod_full_name(pod), error = %e, "runtime class not resolved");
            }
            None
        };
        let sandbox_config = match self.sandbox_config_recording(pod, actions.attempt, dns_records) {
            Ok(c) => c,
            Err(e) if actions.create_sandbox => {
                // Upstream generates the config in `createPodSandbox`: its failure is the
                // sandbox's (a pod with `hostUsers: false` on a runtime without user
                // namespaces, say).
                tracing::warn!(pod = %pod_full_name(pod), error = %e, "failed to generate sandbox config for pod");
                self.event(
                    pod,
                    EventType::Warning,
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {e}"),
                );
                let message = format!("Failed to generate sandbox config for pod \"{}\": {e}", pod_full_name(pod));
                result.add(SyncResult::failed(SyncAction::CreatePodSandbox, pod_full_name(pod), message));
                return result;
            }
            Err(e) => {
                result.add(SyncResult::failed(SyncAction::ConfigPodSandbox, pod_full_name(pod), e.to_string()));
                return result;
            }
        };
        let mut pod_ips = self.pod_ips(pod, status.ips());
        if actions.create_sandbox {
            // Upstream looks the runtime class up as it creates the sandbox: a class that
            // does not exist fails the sandbox, and the next sync tries again.
            let handler = match sandbox_handler.unwrap_or_else(|| Ok(String::new())) {
                Ok(h) => h,
                Err(e) => {
                    let message = format!("Failed to create sandbox for pod \"{}\": {e}", pod_full_name(pod));
                    self.sandbox_failed(pod, &mut result, &e, message);
                    return result;
                }
            };
            result.touched_runtime = true;
            match self.create_sandbox(pod, &sandbox_config, &handler).await {
                Ok((id, ips)) => {
                    sandbox_id = id;
                    pod_ips = self.pod_ips(pod, &ips);
                    result.add(SyncResult::ok(SyncAction::CreatePodSandbox, pod_full_name(pod)));
                }
                Err(e) => {
                    self.sandbox_failed(pod, &mut result, &e, e.to_string());
                    return result;
                }
            }
            self.metrics.started_pods.inc();
        }
        if sandbox_id.is_empty() {
            return result;
        }

        // Upstream's `lazyStart`: the images of the pod's image volumes, before any
        // container that may mount them starts.
        let image_volumes = if starts_any {
            Box::pin(self.pull_image_volumes(pod, &sandbox_config)).await
        } else {
            image_volumes::ImageVolumePulls::new()
        };
        let ctx = StartContext {
            status,
            sandbox_id: &sandbox_id,
            sandbox_config: &sandbox_config,
            pod_ips: &pod_ips,
            image_volumes: &image_volumes,
        };
        // Ephemeral containers first, so that they run even when an init container cannot
        // start (upstream's step 5). A sandbox just stopped because the pod is done gets none.
        // (Boxed: the sync's own future stays small.)
        if !actions.kill_pod && !actions.ephemeral_containers_to_start.is_empty() {
            let to_start = &actions.ephemeral_containers_to_start;
            Box::pin(self.start_ephemeral_containers(pod, to_start, &ctx, &mut result)).await;
        }
        let inits = spec.init_containers.as_deref().unwrap_or_default();
        for &i in &actions.init_containers_to_start {
            let start = StartSpec::of(&inits[i], ContainerKind::Init);
            let started = self.start_with_backoff(pod, &start, &ctx, &mut result).await;
            // A sidecar that cannot start is retried at the next sync; a plain init
            // container that cannot start holds initialization up.
            if !started && !is_restartable_init_container(&inits[i]) {
                return result;
            }
        }
        for &i in &actions.containers_to_start {
            let start = StartSpec::of(&spec.containers[i], ContainerKind::Regular);
            self.start_with_backoff(pod, &start, &ctx, &mut result).await;
        }
        result
    }

    /// Starts the ephemeral containers at `indexes` of the pod's spec, in order.
    async fn start_ephemeral_containers(
        &self,
        pod: &Pod,
        indexes: &[usize],
        ctx: &StartContext<'_>,
        result: &mut PodSyncResult,
    ) {
        let ephemeral = pod.spec.as_ref().and_then(|s| s.ephemeral_containers.as_deref()).unwrap_or_default();
        for &i in indexes {
            let Some(ec) = ephemeral.get(i) else { continue };
            let container = crate::container::ephemeral::as_container(ec);
            let start = StartSpec {
                container: &container,
                kind: ContainerKind::Ephemeral,
                target: ec.target_container_name.as_deref(),
            };
            self.start_with_backoff(pod, &start, ctx, result).await;
        }
    }

    async fn start_with_backoff(
        &self,
        pod: &Pod,
        start: &StartSpec<'_>,
        ctx: &StartContext<'_>,
        result: &mut PodSyncResult,
    ) -> bool {
        let status = ctx.status;
        let container = start.container;
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some(wait) = self.crash_loop_backoff(pod, container, status) {
            let msg = format!(
                "back-off {} restarting failed container={} pod={}",
                go_duration(self.current_backoff(pod, container).unwrap_or(wait)),
                container.name,
                pod_full_name(pod)
            );
            self.set_reason(uid, &container.name, reasons::CRASH_LOOP_BACK_OFF, msg.clone());
            self.container_event(
                pod,
                &container.name,
                EventType::Warning,
                "BackOff",
                format!("Back-off restarting failed container {} in pod {}", container.name, pod_full_name(pod)),
            );
            let back_off = StartError { reason: reasons::CRASH_LOOP_BACK_OFF, message: msg, retry_after: Some(wait) };
            result.add(SyncResult::start_failed(&container.name, back_off));
            return false;
        }
        let restart_count = match status.find_container(&container.name) {
            Some(c) => c.restart_count + 1,
            None => restart_count_from_log_dir(&self.pod_log_dir(pod).join(&container.name)),
        };
        result.touched_runtime = true;
        let container_type = start.kind.metric_label();
        // Upstream counts every start it attempts (past the back-off), failed ones included.
        self.metrics
            .started_containers
            .get_or_create(&ContainerTypeLabels { container_type: container_type.into() })
            .inc();
        // Upstream fails a container whose image volume was not pulled here, after counting
        // the start and before `startContainer` (so not in the errors counter).
        let image_volumes = match self.container_image_volumes(pod, container, ctx.image_volumes) {
            Ok(v) => v,
            Err(e) => {
                self.set_reason(uid, &container.name, e.reason, e.message.clone());
                result.add(SyncResult::start_failed(&container.name, e));
                return false;
            }
        };
        let started = self.start_container(pod, start, ctx, restart_count, &image_volumes).await;
        self.count_image_volume_mounts(container, &image_volumes, &started);
        match started {
            Ok(()) => {
                self.clear_reason(uid, &container.name);
                result.add(SyncResult::ok(SyncAction::StartContainer, &container.name));
                true
            }
            Err(e) => {
                let (reason, msg) = (e.reason, e.message.as_str());
                tracing::warn!(pod = %pod_full_name(pod), container = %container.name, reason, message = %msg, "failed to start container");
                self.metrics
                    .started_containers_errors
                    .get_or_create(&StartedContainerErrorLabels {
                        code: reason.into(),
                        container_type: container_type.into(),
                    })
                    .inc();
                self.set_reason(uid, &container.name, reason, msg.to_owned());
                // The image manager recorded its own events (Failed, BackOff, ...); upstream
                // adds "Error: <reason>" for an image failure. FailedPostStartHook was
                // recorded, without the hook's output.
                let image_failure = IMAGE_REASONS.contains(&reason);
                if reason != reasons::POST_START_HOOK_ERROR {
                    let message =
                        if image_failure { format!("Error: {reason}") } else { format!("Error: {reason}: {msg}") };
                    self.container_event(pod, &container.name, EventType::Warning, "Failed", message);
                }
                result.add(SyncResult::start_failed(&container.name, e));
                false
            }
        }
    }

    fn backoff_key(pod: &Pod, container: &Container) -> String {
        format!(
            "{}/{}_{}",
            pod.metadata.uid.as_deref().unwrap_or_default(),
            container.name,
            labels::container_hash(container)
        )
    }

    fn current_backoff(&self, pod: &Pod, container: &Container) -> Option<Duration> {
        self.backoff.lock().unwrap().current(&Self::backoff_key(pod, container))
    }

    /// Upstream `doBackOff`: `Some(remaining)` while the container's last exit is within
    /// its back-off; otherwise records the restart and returns `None`.
    fn crash_loop_backoff(&self, pod: &Pod, container: &Container, status: &RuntimePodStatus) -> Option<Duration> {
        let exited =
            status.containers.iter().find(|c| c.name == container.name && c.state == ContainerState::Exited)?;
        let finished = exited.finished_at.unwrap_or_else(SystemTime::now);
        let key = Self::backoff_key(pod, container);
        let mut b = self.backoff.lock().unwrap();
        if let Some(rem) = b.remaining_since(&key, finished) {
            return Some(rem);
        }
        b.next(&key, finished);
        None
    }

    /// Stops every running container of the pod in parallel with the grace period, then
    /// every sandbox (upstream `KillPod`). `pod` is `None` for pods only the runtime knows.
    pub async fn kill_pod(
        &self,
        pod: Option<&Pod>,
        status: &RuntimePodStatus,
        grace_override: Option<i64>,
    ) -> Result<()> {
        let grace = Self::grace_period(pod, grace_override);
        let running: Vec<_> = status
            .containers
            .iter()
            .filter(|c| matches!(c.state, ContainerState::Running | ContainerState::Created | ContainerState::Unknown))
            .collect();
        if let Some(pod) = pod {
            for c in running.iter().filter(|c| c.state == ContainerState::Running) {
                self.container_event(
                    pod,
                    &c.name,
                    EventType::Normal,
                    "Killing",
                    format!("Stopping container {}", c.name),
                );
            }
        }
        let names: Vec<&str> = running.iter().map(|c| c.name.as_str()).collect();
        let order = pod.and_then(|pod| TerminationOrder::new(pod, &names));
        let order = order.as_ref();
        let stops = running.iter().map(|c| async move {
            // Each container's preStop hook runs within its own grace period, in parallel;
            // then sidecars wait for their turn with what is left of it.
            let mut grace = match pod {
                Some(pod) if c.state == ContainerState::Running => {
                    self.pre_stop(pod, &c.id, &c.name, grace, &self.pod_ips(pod, status.ips())).await
                }
                _ => grace,
            };
            if let Some(order) = order {
                grace -= order.wait_for_turn(&c.name, grace).await;
            }
            let stopped = self.rt.stop_container(&c.id, grace.max(MINIMUM_GRACE_PERIOD_SECS)).await;
            self.containers_changed();
            match stopped {
                Err(e) if !e.is_not_found() => Err(e),
                _ => {
                    if let Some(order) = order {
                        order.stopped(&c.name);
                    }
                    Ok(())
                }
            }
        });
        let mut first_err = None;
        for r in futures::future::join_all(stops).await {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let exited = status.containers.iter().filter(|c| c.state == ContainerState::Exited);
        self.await_runtime_exits(exited.map(|c| c.id.as_str())).await;
        for s in &status.sandboxes {
            let stopped = self.rt.stop_pod_sandbox(&s.id).await;
            self.containers_changed();
            match stopped {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Waits, up to [`RUNTIME_EXIT_LAG_LIMIT`], until the runtime has recorded the exits of
    /// the `exited` containers that only the kernel reported so far ([`KernelExits`]
    /// laid over the status). containerd's `StopPodSandbox` kills every container of the
    /// sandbox it still shows running, and killing one whose exit it is handling fails
    /// (`ttrpc: closed`): the kernel is ahead of it by tens of milliseconds, and a pod
    /// that turns terminal on such an exit is killed within that window. After the limit
    /// the sandbox is stopped anyway and what the runtime answers is the kill's result.
    /// Likewise `RemoveContainer` refuses a container containerd still shows running.
    ///
    /// [`KernelExits`]: crate::container::exits::KernelExits
    async fn await_runtime_exits(&self, exited: impl Iterator<Item = &str>) {
        let exits = self.cache.exits();
        let give_up = tokio::time::Instant::now() + RUNTIME_EXIT_LAG_LIMIT;
        for id in exited {
            if exits.get(id).is_none() {
                continue;
            }
            loop {
                match self.rt.container_status(id).await {
                    Ok(s) if ContainerState::from_cri(s.state) == ContainerState::Running => {}
                    _ => break,
                }
                if tokio::time::Instant::now() >= give_up {
                    tracing::warn!(container = %id, "the runtime has not recorded within {RUNTIME_EXIT_LAG_LIMIT:?} an exit the kernel reported; stopping the sandbox anyway");
                    return;
                }
                tokio::time::sleep(RUNTIME_EXIT_POLL).await;
            }
        }
    }

    /// Removes everything the runtime has for a pod that is gone: containers, sandboxes,
    /// the pod's log and data directories (upstream: container GC + pod dir cleanup).
    pub async fn remove_pod(&self, status: &RuntimePodStatus) -> Result<()> {
        for c in &status.containers {
            match self.remove_container(&c.id).await {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        for s in &status.sandboxes {
            // RemovePodSandbox of an unknown sandbox is OK in containerd.
            self.rt.remove_pod_sandbox(&s.id).await?;
        }
        if !status.uid.is_empty() {
            let dir = self.cfg.pod_logs_dir.join(format!("{}_{}_{}", status.namespace, status.name, status.uid));
            remove_dir_if_exists(&dir).map_err(|e| Error::Invalid(format!("removing {}: {e}", dir.display())))?;
            let pod_dir = self.pod_dir(&status.uid);
            remove_dir_if_exists(&pod_dir)
                .map_err(|e| Error::Invalid(format!("removing {}: {e}", pod_dir.display())))?;
        }
        self.forget_pod(&status.uid);
        Ok(())
    }

    /// Removes log directories of pods the kubelet no longer knows (`<ns>_<name>_<uid>`).
    pub fn cleanup_orphaned_log_dirs<C>(&self, claim: impl Fn(&str) -> Option<C>) {
        let Ok(entries) = std::fs::read_dir(&self.cfg.pod_logs_dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(uid) = name.rsplit('_').next() else { continue };
            if name.split('_').count() != 3 {
                continue;
            }
            // Held while the directory goes.
            let Some(_claim) = claim(uid) else { continue };
            if let Err(err) = remove_dir_if_exists(&e.path()) {
                tracing::warn!(dir = %e.path().display(), error = %err, "failed to remove orphaned pod log dir");
            }
        }
    }
}

fn remove_dir_if_exists(dir: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
