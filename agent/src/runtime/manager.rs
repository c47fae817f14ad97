//! [`RuntimeManager`]: the kubelet's `kubeGenericRuntimeManager`. It decides what a pod
//! needs from the runtime ([`compute_pod_actions`], a pure function of the spec and the
//! runtime's state) and carries it out through CRI: sandbox, init containers in order,
//! app containers with crash-loop back-off, and kills with grace periods.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::backoff::{Backoff, go_duration};
use super::labels::{self, ContainerKind};
use super::pod_status::{ContainerState, RuntimePodStatus};
use super::{Error, Result, RuntimeService, api};
use crate::cm::PodContainerManager;
use crate::events::{EventRecorder, EventType, pod_ref};
use crate::images::puller::EnsuredImage;
use crate::metrics::{ContainerTypeLabels, KubeletMetrics, StartedContainerErrorLabels};
use crate::volumes::{NoApiServer, VolumeManager};

pub mod dns;
pub mod env;
pub mod pod_actions;
mod sandbox;
#[cfg(test)]
mod testing;

pub(crate) use pod_actions::pod_sandbox_changed_why;
pub use pod_actions::{PodActions, compute_pod_actions, compute_pod_actions_with, should_container_be_restarted};

/// Upstream `minimumGracePeriodInSeconds`: a kill never gets less than this.
pub const MINIMUM_GRACE_PERIOD_SECS: i64 = 2;
/// Default `terminationGracePeriodSeconds` (API server defaulting).
pub const DEFAULT_GRACE_PERIOD_SECS: i64 = 30;
/// The hosts file the kubelet manages in containers.
const ETC_HOSTS: &str = "/etc/hosts";

/// Waiting reasons as upstream (`kubecontainer` errors and `images` errors).
pub mod reasons {
    pub use crate::images::puller::reasons::{
        ERR_IMAGE_NEVER_PULL, ERR_IMAGE_PULL, IMAGE_INSPECT_ERROR, IMAGE_PULL_BACK_OFF, INVALID_IMAGE_NAME,
        REGISTRY_UNAVAILABLE, SIGNATURE_VALIDATION_FAILED,
    };
    pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
    pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
    pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
    pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
    /// The postStart hook failed (upstream `ErrPostStartHook`); the container was killed.
    pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";
    pub const CONTAINER_CREATING: &str = "ContainerCreating";
    pub const POD_INITIALIZING: &str = "PodInitializing";
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

/// Runs `step` of a container start inside its trace span, marking the span failed with
/// the waiting reason and message if it fails.
async fn traced_step<T>(
    name: &'static str,
    container: &str,
    image: &str,
    step: impl std::future::Future<Output = Result<T, (&'static str, String, Option<Duration>)>>,
) -> Result<T, (&'static str, String, Option<Duration>)> {
    let span = crate::telemetry::pod_step_span(name, container, image);
    let outcome = tracing::Instrument::instrument(step, span.clone()).await;
    if let Err((reason, msg, _)) = &outcome {
        crate::telemetry::record_error(&span, &format!("{reason}: {msg}"));
    }
    outcome
}

/// Outcome of one `SyncPod`.
#[derive(Clone, Debug, Default)]
pub struct SyncResult {
    /// Errors of this sync (each names the container and the reason).
    pub errors: Vec<String>,
    /// Ask the pod worker to sync again after this long (back-off expiry).
    pub requeue_after: Option<Duration>,
    /// The runtime was asked to change the pod: a kill, a removal, a resize, a sandbox or a
    /// container start (even one that failed). When false the pod's runtime state is still
    /// the status the sync was given, and the caller need not ask the runtime again.
    pub touched_runtime: bool,
}

/// The error of a pod that came without a spec (a broken object from a source).
fn no_spec(pod: &Pod) -> String {
    format!("pod {} has no spec", pod_full_name(pod))
}

fn is_host_network(spec: &PodSpec) -> bool {
    spec.host_network.unwrap_or(false)
}

/// What to start (upstream `startSpec`): a container of the spec, its kind, and for an
/// ephemeral container the `targetContainerName` whose pid namespace it joins.
#[derive(Clone, Copy, Debug)]
struct StartSpec<'a> {
    container: &'a Container,
    kind: ContainerKind,
    target: Option<&'a str>,
}

impl<'a> StartSpec<'a> {
    fn of(container: &'a Container, kind: ContainerKind) -> Self {
        Self { container, kind, target: None }
    }
}

/// Where a sync starts containers: the runtime's view of the pod before the sync and the
/// sandbox to start them in.
struct StartContext<'a> {
    status: &'a RuntimePodStatus,
    sandbox_id: &'a str,
    sandbox_config: &'a api::PodSandboxConfig,
    pod_ips: &'a [String],
}

/// A container's namespaces: the node's or the pod's network, pid and ipc namespaces as the
/// pod asks, else a pid namespace of its own; an ephemeral container with a target takes
/// the target's pid namespace instead of its own (upstream `generateLinuxContainerConfig`
/// with `nsTarget`; a pod-wide or host pid namespace is kept).
fn container_namespaces(spec: Option<&PodSpec>, target_id: Option<&str>) -> api::NamespaceOption {
    let flag = |f: fn(&PodSpec) -> Option<bool>| spec.and_then(f).unwrap_or(false);
    let node_or = |node: bool, otherwise: api::NamespaceMode| {
        if node { api::NamespaceMode::Node as i32 } else { otherwise as i32 }
    };
    let mut pid = if flag(|s| s.host_pid) {
        api::NamespaceMode::Node
    } else if flag(|s| s.share_process_namespace) {
        api::NamespaceMode::Pod
    } else {
        api::NamespaceMode::Container
    };
    let mut target = String::new();
    if let Some(id) = target_id
        && pid == api::NamespaceMode::Container
    {
        pid = api::NamespaceMode::Target;
        id.clone_into(&mut target);
    }
    api::NamespaceOption {
        network: node_or(spec.is_some_and(is_host_network), api::NamespaceMode::Pod),
        pid: pid as i32,
        ipc: node_or(flag(|s| s.host_ipc), api::NamespaceMode::Pod),
        target_id: target,
        ..Default::default()
    }
}

/// The full name of a pod as upstream prints it: `name_namespace(uid)`.
#[must_use]
pub fn pod_full_name(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
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

/// Carries out pod syncs and kills through CRI.
#[derive(Debug)]
pub struct RuntimeManager {
    rt: Arc<dyn RuntimeService>,
    cm: Arc<dyn PodContainerManager>,
    metrics: Arc<KubeletMetrics>,
    cfg: RuntimeManagerConfig,
    backoff: Mutex<Backoff>,
    /// Pulls images as their pull policy says (events, back-off, credentials).
    images: Arc<crate::images::puller::ImageManager>,
    /// Registry credentials of the node (docker config files).
    node_credentials: crate::images::credentials::NodeCredentials,
    /// Last start failure per (pod uid, container name): (reason, message). Upstream
    /// `ReasonCache`; cleared by a successful start.
    reasons: Mutex<HashMap<(String, String), (String, String)>>,
    recorder: Option<Arc<dyn EventRecorder>>,
    volumes: Arc<VolumeManager>,
    dns: dns::DnsSettings,
    /// Exits the kernel saw before the runtime recorded them (evented PLEG).
    kernel_exits: Option<Arc<crate::pleg::exits::KernelExits>>,
    /// Marks each `RunPodSandbox` and `CreateContainer`+`StartContainer` under way, for
    /// the evented PLEG (see [`crate::pleg::starts`]).
    starts: Arc<crate::pleg::starts::StartsInFlight>,
    /// Bumped whenever a sandbox or container is started or stopped (the stats provider's
    /// `container_changes`).
    container_changes: Arc<std::sync::atomic::AtomicU64>,
    /// The prober (liveness/startup verdicts) and the runtime's name, which prefixes
    /// container ids in the API status (`containerd://<id>`).
    probes: Option<(crate::prober::ProbeManager, String)>,
    /// Runs postStart / preStop hooks.
    hooks: crate::lifecycle::hooks::HandlerRunner,
    /// Pod start latency (image pulls are excluded from the SLI).
    startup: Option<Arc<crate::pod_startup::PodStartupTracker>>,
    /// The container manager's hooks (CPU, memory, device managers), in order.
    container_hooks: Vec<Arc<dyn crate::cm::container_lifecycle::ContainerLifecycleHook>>,
    /// In-place resize: allocations and actuated resources ([`crate::allocation`]).
    resize: Option<Arc<crate::allocation::AllocationManager>>,
    /// Limits concurrent `RunPodSandbox` calls ([`super::start_gate`]).
    sandbox_gate: super::start_gate::StartGate,
    /// Limits concurrent `CreateContainer`+`StartContainer` pairs.
    container_gate: super::start_gate::StartGate,
    /// `seccompDefault`, the seccomp profile root and `AppArmor` on the host
    /// ([`super::security_context`]).
    security: super::security_context::SecuritySettings,
}

impl RuntimeManager {
    #[must_use]
    pub fn new(
        rt: Arc<dyn RuntimeService>,
        cm: Arc<dyn PodContainerManager>,
        metrics: Arc<KubeletMetrics>,
        cfg: RuntimeManagerConfig,
        backoff: Backoff,
        images: Arc<crate::images::puller::ImageManager>,
    ) -> Self {
        Self {
            cm,
            metrics,
            backoff: Mutex::new(backoff),
            images,
            node_credentials: crate::images::credentials::NodeCredentials::new(&cfg.root_dir),
            reasons: Mutex::new(HashMap::new()),
            recorder: None,
            // Standalone until told otherwise: emptyDir/hostPath work, API objects fail clearly.
            volumes: Arc::new(VolumeManager::new(cfg.root_dir.clone(), Arc::new(NoApiServer))),
            dns: dns::DnsSettings::default(),
            kernel_exits: None,
            starts: Arc::default(),
            container_changes: Arc::default(),
            probes: None,
            startup: None,
            container_hooks: Vec::new(),
            resize: None,
            sandbox_gate: super::start_gate::StartGate::default(),
            container_gate: super::start_gate::StartGate::default(),
            security: super::security_context::SecuritySettings::new(false, &cfg.root_dir, false),
            hooks: crate::lifecycle::hooks::HandlerRunner::new(rt.clone()),
            rt,
            cfg,
        }
    }

    /// The node's security settings: `seccompDefault`, the seccomp profile root
    /// (`<root-dir>/seccomp`) and whether the host enforces `AppArmor`.
    #[must_use]
    pub fn with_security(mut self, security: super::security_context::SecuritySettings) -> Self {
        self.security = security;
        self
    }

    /// Lets at most `limit` sandbox starts and `limit` container create+start pairs reach
    /// the runtime at once (0: no limit, the default and upstream's behaviour); see
    /// [`super::start_gate`].
    #[must_use]
    pub fn with_start_concurrency(mut self, limit: usize) -> Self {
        self.sandbox_gate = super::start_gate::StartGate::new(limit);
        self.container_gate = super::start_gate::StartGate::new(limit);
        self
    }

    /// Adds a container manager hook, called around every container's creation.
    #[must_use]
    pub fn with_container_lifecycle_hook(
        mut self,
        hook: Arc<dyn crate::cm::container_lifecycle::ContainerLifecycleHook>,
    ) -> Self {
        self.container_hooks.push(hook);
        self
    }

    /// Actuates in-place resizes with `allocation` (see [`super::resize`]); also records
    /// what each container starts with.
    #[must_use]
    pub fn with_resize(mut self, allocation: Arc<crate::allocation::AllocationManager>) -> Self {
        self.container_hooks.push(Arc::new(crate::allocation::ActuationHook(allocation.clone())));
        self.resize = Some(allocation);
        self
    }

    /// The allocation manager, when in-place resize is on.
    #[must_use]
    pub fn resize(&self) -> Option<&Arc<crate::allocation::AllocationManager>> {
        self.resize.as_ref()
    }

    /// Removes a container, telling the container manager's hooks first (upstream
    /// `removeContainer` calls `PostStopContainer`).
    async fn remove_container(&self, id: &str) -> Result<()> {
        for h in &self.container_hooks {
            h.post_stop_container(id);
        }
        self.rt.remove_container(id).await
    }

    /// Kills and restarts containers whose liveness or startup probe failed, as
    /// `probes` says. `runtime_name` prefixes container ids in the API status.
    #[must_use]
    pub fn with_probes(mut self, probes: crate::prober::ProbeManager, runtime_name: &str) -> Self {
        self.probes = Some((probes, runtime_name.to_string()));
        self
    }

    /// Tracks pod start latency (`kubelet_pod_start_*` metrics).
    #[must_use]
    pub fn with_startup_tracker(mut self, tracker: Arc<crate::pod_startup::PodStartupTracker>) -> Self {
        self.startup = Some(tracker);
        self
    }

    /// The pod start latency tracker, if any.
    #[must_use]
    pub fn startup_tracker(&self) -> Option<&Arc<crate::pod_startup::PodStartupTracker>> {
        self.startup.as_ref()
    }

    /// The prober, when probes are on.
    #[must_use]
    pub fn probes(&self) -> Option<&crate::prober::ProbeManager> {
        self.probes.as_ref().map(|(p, _)| p)
    }

    /// Lays the exits the evented PLEG saw in the kernel over CRI's answers in
    /// [`Self::pod_status`] (see [`crate::pleg::exits`]).
    #[must_use]
    pub fn with_kernel_exits(mut self, exits: Arc<crate::pleg::exits::KernelExits>) -> Self {
        self.kernel_exits = Some(exits);
        self
    }

    /// Marks the sandbox and container start calls under way in `starts`, which the
    /// evented PLEG waits on before asking CRI about a start (see [`crate::pleg::starts`]).
    #[must_use]
    pub fn with_starts_in_flight(mut self, starts: Arc<crate::pleg::starts::StartsInFlight>) -> Self {
        self.starts = starts;
        self
    }

    /// Bumps `changes` whenever a sandbox or container is started or stopped.
    #[must_use]
    pub fn with_container_changes(mut self, changes: Arc<std::sync::atomic::AtomicU64>) -> Self {
        self.container_changes = changes;
        self
    }

    fn containers_changed(&self) {
        self.container_changes.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// Uses `volumes` for pod volumes and as the source of `ConfigMap`s and `Secret`s for
    /// environment variables. Default: a manager over `root_dir` with [`NoApiServer`].
    #[must_use]
    pub fn with_volumes(mut self, volumes: Arc<VolumeManager>) -> Self {
        self.volumes = volumes;
        self
    }

    /// Cluster DNS settings (`clusterDNS`, `clusterDomain`, `resolvConf`). Default: the
    /// `KubeletConfiguration` defaults (no cluster DNS, no domain, `/etc/resolv.conf`).
    #[must_use]
    pub fn with_dns(mut self, dns: dns::DnsSettings) -> Self {
        self.dns = dns;
        self
    }

    /// The volume manager (the pod workers mount and clean up through it).
    #[must_use]
    pub fn volumes(&self) -> &Arc<VolumeManager> {
        &self.volumes
    }

    /// Records pod events (`Pulled`, `Created`, `Started`, `Killing`, `BackOff`, ...) as upstream.
    #[must_use]
    pub fn with_recorder(mut self, recorder: Arc<dyn EventRecorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    fn event(&self, pod: &Pod, type_: EventType, reason: &str, message: String) {
        if let Some(r) = &self.recorder {
            r.record(pod_ref(pod), type_, reason, message);
        }
    }

    /// An event about one container (`involvedObject.fieldPath` names it, as upstream).
    fn container_event(&self, pod: &Pod, container: &str, type_: EventType, reason: &str, message: String) {
        if let Some(r) = &self.recorder {
            r.record(crate::events::container_ref(pod, container), type_, reason, message);
        }
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
        let mut status = RuntimePodStatus::fetch(self.rt.as_ref(), uid).await?;
        if let Some(exits) = &self.kernel_exits {
            exits.apply(&mut status);
        }
        Ok(status)
    }

    fn pod_log_dir(&self, pod: &Pod) -> PathBuf {
        self.cfg.pod_logs_dir.join(format!(
            "{}_{}_{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        ))
    }

    /// The pod's directory under the root dir.
    #[must_use]
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.cfg.root_dir.join("pods").join(uid)
    }

    /// Upstream `SyncPod` of the runtime manager. The caller has computed the API status
    /// and ensured the pod cgroup.
    /// A pod without a spec is an error for that pod.
    pub async fn sync_pod(&self, pod: &Pod, status: &RuntimePodStatus) -> SyncResult {
        let Some(spec) = pod.spec.as_ref() else {
            return SyncResult { errors: vec![no_spec(pod)], ..SyncResult::default() };
        };
        let mut actions = match &self.probes {
            Some((probes, runtime_name)) => compute_pod_actions_with(pod, status, &|c, id| {
                probes.container_to_kill(pod, &c.name, &format!("{runtime_name}://{id}"))
            }),
            None => compute_pod_actions(pod, status),
        };
        // In-place resize: restarts join the actions; in-place updates come after the kills.
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let resize_plan = self.resize.as_ref().and_then(|a| {
            let actuated = |c: &str| a.actuated(uid, c).or_else(|| super::resize::reported_values(pod, status, c));
            super::resize::compute_pod_resize_action(pod, status, &actuated, &mut actions)
        });
        tracing::debug!(pod = %pod_full_name(pod), ?actions, "computed pod actions");
        let nothing_yet = status.sandboxes.is_empty() && status.containers.is_empty();
        let mut result = SyncResult::default();
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
                result.errors.push(format!("KillPod: {e}"));
                return result;
            }
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
                if let Err(e) = self.kill_container(pod, id, name, grace, why, status.ips()).await {
                    result.errors.push(format!("KillContainer {name}: {e}"));
                    return result;
                }
            }
        }
        if self.prune_init_containers(spec, status).await {
            result.touched_runtime = true;
        }
        if let (Some(plan), Some(a)) = (&resize_plan, &self.resize) {
            result.touched_runtime = true;
            match super::resize::do_pod_resize_action(self.rt.as_ref(), self.cm.as_ref(), a, pod, plan).await {
                Ok(()) => a.clear_resize_error(pod),
                Err(e) => {
                    tracing::warn!(pod = %pod_full_name(pod), error = %e, "pod resize failed");
                    a.set_resize_error(pod, &e);
                    result.errors.push(format!("ResizePod: {e}"));
                }
            }
        }

        let mut sandbox_id = actions.sandbox_id.clone();
        // Upstream generates the sandbox config, and records its DNS warnings, when it creates
        // a sandbox and again before it starts any container (`lazyStart`), in back-off too:
        // a new pod gets `MissingClusterDNS` twice, and once more each sync that has a
        // container to start. One config serves both here; its warnings are recorded as often.
        let starts_any = actions.next_init_container.is_some()
            || !actions.containers_to_start.is_empty()
            || !actions.ephemeral_containers_to_start.is_empty();
        let dns_records = usize::from(actions.create_sandbox) + usize::from(starts_any);
        let sandbox_config = match self.sandbox_config_recording(pod, actions.attempt, dns_records) {
            Ok(c) => c,
            Err(e) => {
                result.errors.push(format!("CreatePodSandboxConfig: {e}"));
                return result;
            }
        };
        let mut pod_ips = status.ips().to_vec();
        if actions.create_sandbox {
            result.touched_runtime = true;
            match self.create_sandbox(pod, &sandbox_config).await {
                Ok((id, ips)) => {
                    sandbox_id = id;
                    pod_ips = ips;
                }
                Err(e) => {
                    tracing::warn!(pod = %pod_full_name(pod), error = %e, "failed to create pod sandbox");
                    self.event(
                        pod,
                        EventType::Warning,
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: {e}"),
                    );
                    result.errors.push(format!("CreatePodSandbox: {e}"));
                    self.metrics.started_pods_errors.inc();
                    return result;
                }
            }
            self.metrics.started_pods.inc();
        }
        if sandbox_id.is_empty() {
            return result;
        }

        // Ephemeral containers first, so that they run even when an init container cannot
        // start (upstream's step 5). A sandbox just stopped because the pod is done gets none.
        // (Boxed: the sync's own future stays small.)
        if !actions.kill_pod && !actions.ephemeral_containers_to_start.is_empty() {
            let to_start = &actions.ephemeral_containers_to_start;
            let ctx =
                StartContext { status, sandbox_id: &sandbox_id, sandbox_config: &sandbox_config, pod_ips: &pod_ips };
            Box::pin(self.start_ephemeral_containers(pod, to_start, &ctx, &mut result)).await;
        }
        let inits = spec.init_containers.as_deref().unwrap_or_default();
        if let Some(i) = actions.next_init_container {
            let start = StartSpec::of(&inits[i], ContainerKind::Init);
            self.start_with_backoff(pod, &start, status, &sandbox_id, &sandbox_config, &pod_ips, &mut result).await;
            return result;
        }
        for &i in &actions.containers_to_start {
            let start = StartSpec::of(&spec.containers[i], ContainerKind::Regular);
            self.start_with_backoff(pod, &start, status, &sandbox_id, &sandbox_config, &pod_ips, &mut result).await;
        }
        result
    }

    /// Starts the ephemeral containers at `indexes` of the pod's spec, in order.
    async fn start_ephemeral_containers(
        &self,
        pod: &Pod,
        indexes: &[usize],
        ctx: &StartContext<'_>,
        result: &mut SyncResult,
    ) {
        let ephemeral = pod.spec.as_ref().and_then(|s| s.ephemeral_containers.as_deref()).unwrap_or_default();
        for &i in indexes {
            let Some(ec) = ephemeral.get(i) else { continue };
            let container = super::ephemeral::as_container(ec);
            let start = StartSpec {
                container: &container,
                kind: ContainerKind::Ephemeral,
                target: ec.target_container_name.as_deref(),
            };
            self.start_with_backoff(pod, &start, ctx.status, ctx.sandbox_id, ctx.sandbox_config, ctx.pod_ips, result)
                .await;
        }
    }

    #[expect(clippy::too_many_arguments, reason = "mirrors upstream startContainer inputs")]
    async fn start_with_backoff(
        &self,
        pod: &Pod,
        start: &StartSpec<'_>,
        status: &RuntimePodStatus,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        pod_ips: &[String],
        result: &mut SyncResult,
    ) {
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
            result.errors.push(format!("{}: {msg}", reasons::CRASH_LOOP_BACK_OFF));
            result.requeue_after = Some(result.requeue_after.map_or(wait, |r| r.min(wait)));
            return;
        }
        let restart_count = status.find_container(&container.name).map_or(0, |c| c.restart_count + 1);
        result.touched_runtime = true;
        let container_type = start.kind.metric_label();
        // Upstream counts every start it attempts (past the back-off), failed ones included.
        self.metrics
            .started_containers
            .get_or_create(&ContainerTypeLabels { container_type: container_type.into() })
            .inc();
        match self.start_container(pod, start, status, restart_count, sandbox_id, sandbox_config, pod_ips).await {
            Ok(()) => {
                self.clear_reason(uid, &container.name);
            }
            Err((reason, msg, retry)) => {
                tracing::warn!(pod = %pod_full_name(pod), container = %container.name, reason, message = %msg, "failed to start container");
                self.metrics
                    .started_containers_errors
                    .get_or_create(&StartedContainerErrorLabels {
                        code: reason.into(),
                        container_type: container_type.into(),
                    })
                    .inc();
                self.set_reason(uid, &container.name, reason, msg.clone());
                // The image manager recorded its own events (Failed, BackOff, ...); upstream
                // adds "Error: <reason>" for an image failure. FailedPostStartHook was
                // recorded, without the hook's output.
                let image_failure = IMAGE_REASONS.contains(&reason);
                if reason != reasons::POST_START_HOOK_ERROR {
                    let message =
                        if image_failure { format!("Error: {reason}") } else { format!("Error: {reason}: {msg}") };
                    self.container_event(pod, &container.name, EventType::Warning, "Failed", message);
                }
                result.errors.push(format!("{reason}: {msg}"));
                if let Some(r) = retry {
                    result.requeue_after = Some(result.requeue_after.map_or(r, |x| x.min(r)));
                }
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

    /// The registry credentials to try for `image`, in order (upstream
    /// `getPullSecretsForPod` + the union keyring): the pod's `imagePullSecrets` first,
    /// then the node's docker config. A pull secret that cannot be read is a
    /// `FailedToRetrieveImagePullSecret` warning and the pull goes on without it, as
    /// upstream; a malformed one is logged and skipped. Empty: an anonymous pull.
    async fn image_credentials(&self, pod: &Pod, image: &str) -> Vec<api::AuthConfig> {
        use crate::images::credentials::{Keyring, credentials_for_image};
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let names: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
            .collect();
        let mut secrets = Vec::new();
        let mut missing = Vec::new();
        for name in names {
            match self.volumes.object_source().secret(namespace, name).await {
                Ok(Some(secret)) => secrets.push(secret),
                Ok(None) => missing.push(name),
                Err(e) => {
                    tracing::warn!(pod = %pod_full_name(pod), secret = name, error = %e, "reading an image pull secret");
                    missing.push(name);
                }
            }
        }
        if !missing.is_empty() {
            self.event(
                pod,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    missing.join(", ")
                ),
            );
        }
        let (pod_keyring, errors) = Keyring::from_pull_secrets(&secrets);
        for e in errors {
            tracing::warn!(pod = %pod_full_name(pod), error = %e, "image pull secret");
        }
        let node_keyring = self.node_credentials.keyring();
        match credentials_for_image(image, &[&pod_keyring, &node_keyring]) {
            Ok(found) => found.iter().map(crate::images::credentials::Credential::auth_config).collect(),
            // The image manager reports the bad name.
            Err(_) => Vec::new(),
        }
    }

    #[expect(clippy::too_many_arguments, reason = "mirrors upstream startContainer inputs")]
    async fn start_container(
        &self,
        pod: &Pod,
        start: &StartSpec<'_>,
        status: &RuntimePodStatus,
        restart_count: u32,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        pod_ips: &[String],
    ) -> Result<(), (&'static str, String, Option<Duration>)> {
        let container = start.container;
        let image = container.image.as_deref().unwrap_or_default();
        let credentials = self.image_credentials(pod, image).await;
        let pulled = async {
            self.images.ensure_image_exists(pod, container, credentials, Some(sandbox_config)).await.map_err(Into::into)
        };
        let ensured = traced_step("ensureImageExists", &container.name, image, pulled).await?;
        // Upstream resolves the target after the image, as a container config error.
        let target_id = super::ephemeral::target_id(start.target, status)
            .map_err(|e| (reasons::CREATE_CONTAINER_CONFIG_ERROR, e.to_string(), None))?;
        let started = self.create_and_start_container(
            pod,
            container,
            start.kind,
            target_id,
            restart_count,
            sandbox_id,
            sandbox_config,
            pod_ips,
            &ensured,
        );
        traced_step("startContainer", &container.name, image, started).await
    }

    /// The part of [`Self::start_container`] after the image: create, start, postStart.
    #[expect(clippy::too_many_arguments, reason = "mirrors upstream startContainer inputs")]
    async fn create_and_start_container(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        target_id: Option<&str>,
        restart_count: u32,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        pod_ips: &[String],
        image: &EnsuredImage,
    ) -> Result<(), (&'static str, String, Option<Duration>)> {
        let mut config = self
            .container_config(pod, container, kind, target_id, restart_count, image, pod_ips)
            .await
            .map_err(|e| (reasons::CREATE_CONTAINER_CONFIG_ERROR, e, None))?;
        for h in &self.container_hooks {
            h.pre_create_container(pod, container, &mut config)
                .map_err(|e| (reasons::CREATE_CONTAINER_CONFIG_ERROR, e, None))?;
        }
        let create_and_start = async {
            let under_way = self.starts.begin(pod.metadata.uid.as_deref().unwrap_or_default());
            let id = self
                .rt
                .create_container(sandbox_id, config, sandbox_config.clone())
                .await
                .map_err(|e| (reasons::CREATE_CONTAINER_ERROR, e.to_string(), None))?;
            for h in &self.container_hooks {
                h.pre_start_container(pod, container, &id).map_err(|e| (reasons::RUN_CONTAINER_ERROR, e, None))?;
            }
            self.container_event(
                pod,
                &container.name,
                EventType::Normal,
                "Created",
                // Upstream's message since 1.34 (kuberuntime_container.go); the event's
                // involved object names the container.
                "Container created".to_owned(),
            );
            let started = self.rt.start_container(&id).await;
            if started.is_ok() {
                under_way.succeeded(&id, &container.name);
            }
            drop(under_way);
            self.containers_changed();
            match started {
                Ok(()) => Ok(id),
                Err(e) => Err((reasons::RUN_CONTAINER_ERROR, e.to_string(), None)),
            }
        };
        let id = self.container_gate.run("CreateContainer+StartContainer", create_and_start).await?;
        self.container_event(pod, &container.name, EventType::Normal, "Started", "Container started".to_owned());
        tracing::info!(pod = %pod_full_name(pod), container = %container.name, id = %id, restart_count, "started container");
        if let Some(handler) = container.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            use crate::lifecycle::hooks;
            let ctx = hooks::HookContext { pod, container, container_id: &id, pod_ips };
            let span = tracing::info_span!("post_start_hook", pod = %pod_full_name(pod), container = %container.name);
            let outcome = tracing::Instrument::instrument(
                self.hooks.run(&ctx, handler, &tokio_util::sync::CancellationToken::new()),
                span,
            )
            .await;
            if let Some(msg) = outcome.http_fallback {
                self.metrics.lifecycle_handler_http_fallbacks.inc();
                self.event(pod, EventType::Warning, hooks::LIFECYCLE_HTTP_FALLBACK, msg);
            }
            if let Err(e) = outcome.result {
                tracing::warn!(pod = %pod_full_name(pod), container = %container.name, error = %e.message, "postStart hook failed");
                self.container_event(
                    pod,
                    &container.name,
                    EventType::Warning,
                    hooks::FAILED_POST_START_HOOK,
                    hooks::FAILED_POST_START_HOOK_MESSAGE.into(),
                );
                if let Err(kill) =
                    self.kill_container(pod, &id, &container.name, None, hooks::FAILED_POST_START_HOOK, pod_ips).await
                {
                    tracing::warn!(container = %id, error = %kill, "failed to kill the container after its postStart hook failed");
                }
                return Err((reasons::POST_START_HOOK_ERROR, e.message, None));
            }
        }
        Ok(())
    }

    /// Builds the CRI container config (upstream `generateContainerConfig`).
    ///
    /// `image.status` is the image's `ImageStatus` when the caller already holds it (the
    /// image manager read it to check presence or after the pull); `None` asks the runtime,
    /// as upstream's `getImageUser` always does. Upstream asks twice per container start;
    /// once is enough, and at a 100-pod burst the runtime's time is what start latency is
    /// made of.
    #[expect(clippy::too_many_arguments, reason = "upstream generateContainerConfig's inputs")]
    async fn container_config(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        target_id: Option<&str>,
        restart_count: u32,
        image: &EnsuredImage,
        pod_ips: &[String],
    ) -> std::result::Result<api::ContainerConfig, String> {
        let image_ref = image.image_ref.as_str();
        let ctx = env::Context {
            cfg: &self.cfg,
            pod_ips,
            source: self.volumes.object_source().as_ref(),
            node: self.volumes.node_allocatable(),
        };
        let resolved = env::resolve(pod, container, &ctx).await.map_err(|e| e.to_string())?;
        for warning in resolved.warnings {
            self.event(pod, EventType::Warning, "InvalidEnvironmentVariableNames", warning);
        }
        let envs = resolved.vars;
        let env_map: HashMap<&str, &str> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let command = container.command.iter().flatten().map(|c| env::expand(c, &env_map)).collect();
        let args = container.args.iter().flatten().map(|c| env::expand(c, &env_map)).collect();
        let log_dir = self.pod_log_dir(pod).join(&container.name);
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| format!("creating container log directory {}: {e}", log_dir.display()))?;
        let mounts = self.make_mounts(pod, container, pod_ips, &envs).await?;
        // Upstream `getImageUser` + `verifyRunAsNonRoot`, then
        // `determineEffectiveSecurityContext` ([`super::security_context`]).
        let queried;
        let image = if let Some(i) = &image.status {
            Some(i)
        } else {
            let name = if image_ref.is_empty() { container.image.as_deref().unwrap_or_default() } else { image_ref };
            queried = self.rt.image_status(name).await.map_err(|e| e.to_string())?;
            queried.as_ref()
        };
        let image_user = super::security_context::ImageUser::from_image(image);
        super::security_context::verify_run_as_non_root(pod, container, &image_user).map_err(|e| e.to_string())?;
        let security = super::security_context::container_security_context(pod, container, &image_user, &self.security)
            .map_err(|e| e.to_string())?;
        let linux = api::LinuxContainerConfig {
            resources: Some(crate::cm::linux_container_resources(pod, container)),
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(container_namespaces(pod.spec.as_ref(), target_id)),
                ..security
            }),
        };
        Ok(api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: container.name.clone(), attempt: restart_count }),
            image: Some(api::ImageSpec {
                image: if image_ref.is_empty() {
                    container.image.clone().unwrap_or_default()
                } else {
                    image_ref.to_string()
                },
                user_specified_image: container.image.clone().unwrap_or_default(),
                ..Default::default()
            }),
            command,
            args,
            working_dir: container.working_dir.clone().unwrap_or_default(),
            envs: envs.into_iter().map(|(key, value)| api::KeyValue { key, value }).collect(),
            mounts,
            labels: labels::container_labels(pod, container, kind),
            annotations: labels::container_annotations(pod, container, restart_count),
            log_path: format!("{}/{restart_count}.log", container.name),
            stdin: container.stdin.unwrap_or(false),
            stdin_once: container.stdin_once.unwrap_or(false),
            tty: container.tty.unwrap_or(false),
            linux: Some(linux),
            ..Default::default()
        })
    }

    /// The container's mounts, in upstream `makeMounts` order: its volumes (set up by the
    /// volume manager before the runtime sync; set up here if that has not happened), the
    /// managed `/etc/hosts` unless the container mounts its own, then the
    /// termination-message file.
    async fn make_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        pod_ips: &[String],
        envs: &[(String, String)],
    ) -> std::result::Result<Vec<api::Mount>, String> {
        let spec = pod.spec.as_ref().ok_or_else(|| no_spec(pod))?;
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let volumes = match self.volumes.mounted_volumes(uid) {
            Some(v) => v,
            None => self.volumes.mount_pod_volumes(pod).await.map_err(|e| e.to_string())?,
        };
        let mut mounts = self.volumes.container_mounts(pod, container, &volumes, envs).map_err(|e| e.to_string())?;
        let pod_dir = self.pod_dir(uid);

        // Host-network pods report the node's IPs as theirs.
        let host_network = is_host_network(spec);
        let ips: Vec<String> = if host_network && pod_ips.is_empty() {
            self.cfg.host_ip.iter().cloned().collect()
        } else {
            pod_ips.to_vec()
        };
        let own_hosts = container.volume_mounts.iter().flatten().any(|m| m.mount_path == ETC_HOSTS);
        if !ips.is_empty() && !own_hosts {
            let aliases = spec.host_aliases.as_deref().unwrap_or_default();
            let content = if host_network {
                let node_hosts = std::fs::read_to_string(ETC_HOSTS).map_err(|e| format!("reading {ETC_HOSTS}: {e}"))?;
                dns::node_hosts_content(&node_hosts, aliases)
            } else {
                let (hostname, domain) =
                    dns::pod_hostname_and_domain(pod, &self.dns.cluster_domain).map_err(|e| e.to_string())?;
                dns::managed_hosts_content(&ips, &hostname, &domain, aliases)
            };
            let hosts = pod_dir.join("etc-hosts");
            std::fs::create_dir_all(&pod_dir).map_err(|e| format!("creating {}: {e}", pod_dir.display()))?;
            std::fs::write(&hosts, content).map_err(|e| format!("writing {}: {e}", hosts.display()))?;
            // Written with the umask; upstream forces 0644 so that any container user reads it.
            std::fs::set_permissions(&hosts, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                .map_err(|e| format!("chmod {}: {e}", hosts.display()))?;
            mounts.push(api::Mount {
                container_path: ETC_HOSTS.into(),
                host_path: hosts.to_string_lossy().into_owned(),
                ..Default::default()
            });
        }
        let term_path = container.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into());
        if !term_path.is_empty() {
            let dir = pod_dir.join("containers").join(&container.name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            let file = dir.join(format!("termination-{}", std::process::id() ^ rand::random::<u32>()));
            std::fs::write(&file, b"").map_err(|e| format!("writing {}: {e}", file.display()))?;
            mounts.push(api::Mount {
                container_path: term_path,
                host_path: file.to_string_lossy().into_owned(),
                ..Default::default()
            });
        }
        Ok(mounts)
    }

    /// Keeps only the newest instance of each init container (upstream
    /// `pruneInitContainersBeforeStart`), so restarts do not pile up exited containers;
    /// true when it asked the runtime to remove any.
    async fn prune_init_containers(&self, spec: &PodSpec, status: &RuntimePodStatus) -> bool {
        let mut removed = false;
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for c in &status.containers {
            if !c.init && !spec.init_containers.iter().flatten().any(|i| i.name == c.name) {
                continue;
            }
            let n = seen.entry(c.name.as_str()).or_default();
            *n += 1;
            if *n > 1 && c.state == ContainerState::Exited {
                removed = true;
                if let Err(e) = self.remove_container(&c.id).await
                    && !e.is_not_found()
                {
                    tracing::warn!(container = %c.id, error = %e, "failed to prune init container");
                }
            }
        }
        removed
    }

    /// The spec of the container (or init container) `name`. Ephemeral containers are left
    /// out: what this is asked for (a preStop hook) they cannot have.
    fn container_spec<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
        let spec = pod.spec.as_ref()?;
        spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
    }

    /// Upstream's grace period for stopping a container: the override (deletion or
    /// probe), else the pod's `terminationGracePeriodSeconds`, else 30 s.
    fn grace_period(pod: Option<&Pod>, grace_override: Option<i64>) -> i64 {
        grace_override
            .or_else(|| pod.and_then(|p| p.spec.as_ref()).and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(DEFAULT_GRACE_PERIOD_SECS)
    }

    /// Runs the container's preStop hook, if any, within `grace` seconds; returns the
    /// grace period left for `StopContainer` (never under the 2 s minimum).
    async fn pre_stop(&self, pod: &Pod, id: &str, name: &str, grace: i64, pod_ips: &[String]) -> i64 {
        use crate::lifecycle::hooks;
        let Some(container) = Self::container_spec(pod, name) else { return grace.max(MINIMUM_GRACE_PERIOD_SECS) };
        let Some(handler) = container.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) else {
            return grace.max(MINIMUM_GRACE_PERIOD_SECS);
        };
        let ctx = hooks::HookContext { pod, container, container_id: id, pod_ips };
        let span = tracing::info_span!("pre_stop_hook", pod = %pod_full_name(pod), container = %name, grace);
        let run = tracing::Instrument::instrument(
            self.hooks.execute_pre_stop_hook(&ctx, handler, grace, &tokio_util::sync::CancellationToken::new()),
            span,
        )
        .await;
        if let Some(outcome) = &run.outcome {
            if let Err(e) = &outcome.result {
                tracing::warn!(pod = %pod_full_name(pod), container = %name, error = %e.message, "preStop hook failed");
                self.container_event(
                    pod,
                    name,
                    EventType::Warning,
                    hooks::FAILED_PRE_STOP_HOOK,
                    hooks::FAILED_PRE_STOP_HOOK_MESSAGE.into(),
                );
            }
            if let Some(msg) = &outcome.http_fallback {
                self.metrics.lifecycle_handler_http_fallbacks.inc();
                self.event(pod, EventType::Warning, hooks::LIFECYCLE_HTTP_FALLBACK, msg.clone());
            }
        }
        hooks::grace_period_after_pre_stop(grace, run.elapsed_secs)
    }

    /// Upstream `killContainer`: the `Killing` event with `message`, the preStop hook
    /// within the grace period, then `StopContainer` with what is left of it.
    async fn kill_container(
        &self,
        pod: &Pod,
        id: &str,
        name: &str,
        grace_override: Option<i64>,
        message: &str,
        pod_ips: &[String],
    ) -> Result<()> {
        let grace = Self::grace_period(Some(pod), grace_override);
        self.container_event(pod, name, EventType::Normal, "Killing", message.to_string());
        let grace = self.pre_stop(pod, id, name, grace, pod_ips).await;
        tracing::debug!(pod = %pod_full_name(pod), container = %name, grace, "stopping container");
        let stopped = self.rt.stop_container(id, grace).await;
        self.containers_changed();
        match stopped {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
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
        let stops = running.iter().map(|c| async move {
            // Each container's preStop hook runs within its own grace period, in parallel.
            let grace = match pod {
                Some(pod) if c.state == ContainerState::Running => {
                    self.pre_stop(pod, &c.id, &c.name, grace, status.ips()).await
                }
                _ => grace.max(MINIMUM_GRACE_PERIOD_SECS),
            };
            let stopped = self.rt.stop_container(&c.id, grace).await;
            self.containers_changed();
            match stopped {
                Err(e) if !e.is_not_found() => Err(e),
                _ => Ok(()),
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
mod tests {
    use super::*;

    #[test]
    fn a_target_shares_its_pid_namespace_unless_the_pod_shares_one() {
        let mut spec = PodSpec::default();
        let ns = container_namespaces(Some(&spec), None);
        assert_eq!((ns.pid, ns.target_id.as_str()), (api::NamespaceMode::Container as i32, ""));
        let ns = container_namespaces(Some(&spec), Some("c0ffee"));
        assert_eq!((ns.pid, ns.target_id.as_str()), (api::NamespaceMode::Target as i32, "c0ffee"));
        assert_eq!((ns.network, ns.ipc), (api::NamespaceMode::Pod as i32, api::NamespaceMode::Pod as i32));
        spec.share_process_namespace = Some(true);
        let ns = container_namespaces(Some(&spec), Some("c0ffee"));
        assert_eq!((ns.pid, ns.target_id.as_str()), (api::NamespaceMode::Pod as i32, ""));
        spec.host_pid = Some(true);
        spec.host_network = Some(true);
        let ns = container_namespaces(Some(&spec), Some("c0ffee"));
        assert_eq!((ns.pid, ns.network), (api::NamespaceMode::Node as i32, api::NamespaceMode::Node as i32));
    }

    /// Ephemeral containers through the runtime manager, on the fake runtime.
    mod ephemeral_wiring {
        use serde_json::json;

        use super::super::*;
        use crate::metrics::StartedContainerErrorLabels;
        use crate::runtime::manager::testing::setup;

        fn pod(debuggers: &serde_json::Value) -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
                "spec": {
                    "restartPolicy": "Always",
                    "containers": [{"name": "app", "image": "img", "imagePullPolicy": "IfNotPresent",
                                    "terminationMessagePath": ""}],
                    "ephemeralContainers": debuggers
                }
            }))
            .unwrap()
        }

        fn started(rm: &RuntimeManager, kind: &str) -> u64 {
            rm.metrics.started_containers.get_or_create(&ContainerTypeLabels { container_type: kind.into() }).get()
        }

        fn errors(rm: &RuntimeManager, code: &str) -> u64 {
            rm.metrics
                .started_containers_errors
                .get_or_create(&StartedContainerErrorLabels {
                    code: code.into(),
                    container_type: "ephemeral_container".into(),
                })
                .get()
        }

        #[tokio::test]
        async fn an_ephemeral_container_joins_its_target_and_is_never_restarted() {
            let (_dir, fake, _recorder, rm) = setup();
            let debugger = json!([{"name": "debug", "image": "img", "imagePullPolicy": "IfNotPresent",
                                   "targetContainerName": "app", "terminationMessagePath": ""}]);
            let plain = pod(&json!([]));
            let st = rm.pod_status("u1").await.unwrap();
            assert!(rm.sync_pod(&plain, &st).await.errors.is_empty());
            let app = fake.containers_named("app")[0].clone();

            let p = pod(&debugger);
            let st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.is_empty() && r.touched_runtime, "{r:?}");
            let ids = fake.containers_named("debug");
            assert_eq!(ids.len(), 1);
            let cfg = fake.container_config(&ids[0]).unwrap();
            let ns = cfg.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
            assert_eq!((ns.pid, ns.target_id.as_str()), (api::NamespaceMode::Target as i32, app.as_str()));
            assert_eq!(cfg.labels[labels::CONTAINER_TYPE], "ephemeral");
            assert_eq!(cfg.labels[labels::CONTAINER_NAME], "debug");
            assert_eq!(cfg.log_path, "debug/0.log");
            assert_eq!((started(&rm, "ephemeral_container"), started(&rm, "container")), (1, 1));

            // Running: left alone. Exited: not restarted, though the pod restarts containers.
            let st = rm.pod_status("u1").await.unwrap();
            assert!(!rm.sync_pod(&p, &st).await.touched_runtime);
            fake.exit_container(&ids[0], 0);
            let st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.is_empty() && !r.touched_runtime, "{r:?}");
            assert_eq!(fake.containers_named("debug").len(), 1);
            assert_eq!(started(&rm, "ephemeral_container"), 1);
        }

        #[tokio::test]
        async fn a_missing_or_stopped_target_fails_the_start_until_it_runs() {
            let (_dir, fake, _recorder, rm) = setup();
            let st = rm.pod_status("u1").await.unwrap();
            assert!(rm.sync_pod(&pod(&json!([])), &st).await.errors.is_empty());
            // Upstream validates the target's name; a spec that names no container of the
            // runtime is a config error, and nothing is created.
            let p = pod(&json!([{"name": "debug", "image": "img", "imagePullPolicy": "IfNotPresent",
                                "targetContainerName": "nope", "terminationMessagePath": ""}]));
            let st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert_eq!(r.errors, ["CreateContainerConfigError: unable to find target container nope"]);
            assert_eq!(
                rm.start_failure("u1", "debug"),
                Some(("CreateContainerConfigError".into(), "unable to find target container nope".into()))
            );
            assert_eq!(errors(&rm, "CreateContainerConfigError"), 1);
            assert!(fake.containers_named("debug").is_empty());

            // A target that is not running: the runtime refuses it, and the next sync tries again.
            let p = pod(&json!([{"name": "debug", "image": "img", "imagePullPolicy": "IfNotPresent",
                                "targetContainerName": "app", "terminationMessagePath": ""}]));
            let app = fake.containers_named("app")[0].clone();
            fake.exit_container(&app, 1);
            let mut st = rm.pod_status("u1").await.unwrap();
            // The ephemeral container comes first (and fails); the app container restarts.
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.iter().any(|e| e.starts_with("CreateContainerError")), "{r:?}");
            assert_eq!(errors(&rm, "CreateContainerError"), 1);
            assert!(fake.containers_named("debug").is_empty());
            // The app container came back: the debugger joins the new one.
            st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.is_empty(), "{r:?}");
            let new_app = fake.containers_named("app").last().cloned().unwrap();
            assert_ne!(new_app, app);
            let debug = fake.containers_named("debug");
            assert_eq!(debug.len(), 1);
            let cfg = fake.container_config(&debug[0]).unwrap();
            assert_eq!(cfg.linux.unwrap().security_context.unwrap().namespace_options.unwrap().target_id, new_app);
            assert_eq!(rm.start_failure("u1", "debug"), None, "a start clears the reason");
        }
    }

    /// postStart and preStop hooks through the runtime manager, on the fake runtime.
    mod hooks_wiring {
        use serde_json::json;

        use super::super::*;
        use crate::runtime::fake::exec_response;
        use crate::runtime::manager::testing::{events, hooked, setup};

        /// `touched_runtime` tells the pod worker whether the runtime state it holds is stale.
        #[tokio::test]
        async fn a_sync_says_whether_it_touched_the_runtime() {
            let (_dir, fake, _recorder, rm) = setup();
            let p = hooked(&json!({}));
            let st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.is_empty() && r.touched_runtime, "{r:?}");
            // Running, nothing to do.
            let calls = fake.calls().len();
            let st = rm.pod_status("u1").await.unwrap();
            let reads = fake.calls().len() - calls;
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.is_empty() && !r.touched_runtime, "{r:?}");
            assert_eq!(fake.calls().len() - calls, reads, "the sync itself called nothing");
            // The container died: its restart is a change; the next, in crash-loop back-off, is not.
            let id = fake.containers_named("c")[0].clone();
            fake.exit_container(&id, 1);
            let st = rm.pod_status("u1").await.unwrap();
            assert!(rm.sync_pod(&p, &st).await.touched_runtime);
            let id = fake.containers_named("c").last().cloned().unwrap();
            fake.exit_container(&id, 1);
            let st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.iter().any(|e| e.starts_with("CrashLoopBackOff")), "{r:?}");
            assert!(!r.touched_runtime, "{r:?}");
        }

        /// The image manager's `ImageStatus` (presence check, or the one after a pull) is the
        /// one the container config reads the image user from: no second call per start.
        #[tokio::test]
        async fn a_container_start_reads_the_image_status_once_and_uses_its_user() {
            let (_dir, fake, _recorder, rm) = setup();
            let user = |name: &str, uid: i64| api::Image {
                uid: Some(api::Int64Value { value: uid }),
                ..crate::runtime::fake::fake_image(name)
            };
            fake.add_image(user("img", 1000));
            let non_root = |image: &str, policy: &str| -> Pod {
                serde_json::from_value(json!({
                    "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
                    "spec": {
                        "securityContext": {"runAsNonRoot": true},
                        "containers": [{"name": "c", "image": image, "imagePullPolicy": policy,
                                        "terminationMessagePath": ""}]
                    }
                }))
                .unwrap()
            };
            let image_statuses = || fake.calls().iter().filter(|c| *c == "image_status").count();

            // Present (IfNotPresent): one ImageStatus, and its non-root uid lets the pod start.
            let st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&non_root("img", "IfNotPresent"), &st).await;
            assert!(r.errors.is_empty(), "{:?}", r.errors);
            assert_eq!(image_statuses(), 1);
            assert_eq!(fake.created_containers(), 1);

            // Pulled (Always): the status read after the pull serves; a root image is refused.
            fake.add_registry_image(user("root", 0));
            let before = image_statuses();
            let st = rm.pod_status("u2").await.unwrap();
            let mut p = non_root("root", "Always");
            p.metadata.uid = Some("u2".into());
            let r = rm.sync_pod(&p, &st).await;
            assert!(
                r.errors.iter().any(|e| e.contains("container has runAsNonRoot and image will run as root")),
                "{:?}",
                r.errors
            );
            assert_eq!(image_statuses() - before, 1, "only the one after the pull");
            assert_eq!(fake.created_containers(), 1);
        }

        #[tokio::test]
        async fn a_failing_post_start_hook_kills_the_container() {
            let (_dir, fake, recorder, rm) = setup();
            fake.set_exec_handler(|_, cmd, _| Ok(exec_response(i32::from(cmd[0] == "false"), "", "nope")));
            let p = hooked(&json!({"postStart": {"exec": {"command": ["false"]}}}));
            let st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.iter().any(|e| e.starts_with("PostStartHookError")), "{:?}", r.errors);
            assert_eq!(events(&recorder, "FailedPostStartHook"), ["PostStartHook failed"]);
            assert_eq!(events(&recorder, "Killing"), ["FailedPostStartHook"]);
            assert!(events(&recorder, "Failed").is_empty(), "no generic Failed event with the hook's output");
            let calls = fake.calls();
            let pos = |c: &str| calls.iter().position(|x| x == c).unwrap_or(usize::MAX);
            assert!(pos("start_container") < pos("exec_sync") && pos("exec_sync") < pos("stop_container"), "{calls:?}");
            let (reason, msg) = rm.start_failure("u1", "c").unwrap();
            assert_eq!(reason, "PostStartHookError");
            assert!(msg.contains("Exec lifecycle hook ([false])"), "{msg}");
        }

        #[tokio::test]
        async fn pre_stop_runs_before_the_stop_signal() {
            let (_dir, fake, recorder, rm) = setup();
            let p = hooked(&json!({"preStop": {"exec": {"command": ["sh", "-c", "echo bye"]}}}));
            let st = rm.pod_status("u1").await.unwrap();
            assert!(rm.sync_pod(&p, &st).await.errors.is_empty());
            assert!(fake.exec_calls().is_empty(), "no hook at start");
            let st = rm.pod_status("u1").await.unwrap();
            rm.kill_pod(Some(&p), &st, None).await.unwrap();
            let calls = fake.calls();
            let pos = |c: &str| calls.iter().position(|x| x == c).unwrap_or(usize::MAX);
            assert!(pos("exec_sync") < pos("stop_container"), "{calls:?}");
            assert_eq!(fake.exec_calls()[0].cmd, ["sh", "-c", "echo bye"]);
            assert!(events(&recorder, "FailedPreStopHook").is_empty());
            // A failing preStop is reported and the container is stopped all the same.
            fake.set_exec_handler(|_, _, _| Ok(exec_response(2, "", "")));
            let p2 = hooked(&json!({"preStop": {"exec": {"command": ["false"]}}}));
            let st = rm.pod_status("u1").await.unwrap();
            let _ = rm.sync_pod(&p2, &st).await;
            let st = rm.pod_status("u1").await.unwrap();
            rm.kill_pod(Some(&p2), &st, None).await.unwrap();
            assert_eq!(events(&recorder, "FailedPreStopHook"), ["PreStopHook failed"]);
        }
    }

    /// The start gate between the pod workers and the runtime ([`super::super::start_gate`]).
    mod start_gate_wiring {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Duration;

        use futures::FutureExt as _;
        use serde_json::json;

        use super::super::*;
        use crate::runtime::manager::testing::setup;

        fn pod(uid: &str) -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": format!("p-{uid}"), "namespace": "default", "uid": uid},
                "spec": {"containers": [
                    {"name": "a", "image": "img", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": ""},
                    {"name": "b", "image": "img", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": ""}
                ]}
            }))
            .unwrap()
        }

        /// In-flight and peak counts of one kind of call.
        #[derive(Default)]
        struct Flight {
            now: AtomicUsize,
            peak: AtomicUsize,
        }

        /// Starts `pods` pods at once through a manager limited to `limit`; every
        /// sandbox and container start takes 100 ms. The peaks of (sandbox starts,
        /// container create+start pairs) in flight.
        async fn peaks(limit: usize, pods: usize) -> (usize, usize) {
            let (_dir, fake, _recorder, rm) = setup();
            let rm = rm.with_start_concurrency(limit);
            let sandboxes = Arc::new(Flight::default());
            let containers = Arc::new(Flight::default());
            fake.set_start_hook({
                let (sandboxes, containers) = (sandboxes.clone(), containers.clone());
                move |call| {
                    let (sandboxes, containers) = (sandboxes.clone(), containers.clone());
                    async move {
                        // A container is in flight from its create to the end of its start.
                        let flight = match call {
                            "run_podsandbox" => &sandboxes,
                            "create_container" => {
                                let n = containers.now.fetch_add(1, Ordering::SeqCst) + 1;
                                containers.peak.fetch_max(n, Ordering::SeqCst);
                                return tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            _ => {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                containers.now.fetch_sub(1, Ordering::SeqCst);
                                return;
                            }
                        };
                        let n = flight.now.fetch_add(1, Ordering::SeqCst) + 1;
                        flight.peak.fetch_max(n, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        flight.now.fetch_sub(1, Ordering::SeqCst);
                    }
                    .boxed()
                }
            });
            let all: Vec<Pod> = (0..pods).map(|i| pod(&format!("u{i}"))).collect();
            let syncs = all.iter().map(|p| async {
                let st = rm.pod_status(p.metadata.uid.as_deref().unwrap()).await.unwrap();
                rm.sync_pod(p, &st).await
            });
            for r in futures::future::join_all(syncs).await {
                assert!(r.errors.is_empty(), "{:?}", r.errors);
            }
            assert_eq!(fake.calls().iter().filter(|c| *c == "start_container").count(), 2 * pods);
            (sandboxes.peak.load(Ordering::SeqCst), containers.peak.load(Ordering::SeqCst))
        }

        #[tokio::test(start_paused = true)]
        async fn starts_reach_the_runtime_at_most_limit_at_a_time() {
            assert_eq!(peaks(3, 10).await, (3, 3));
        }

        #[tokio::test(start_paused = true)]
        async fn zero_sends_every_start_at_once() {
            // A pod's containers start one after another, as upstream's SyncPod starts them.
            assert_eq!(peaks(0, 10).await, (10, 10));
        }

        #[tokio::test]
        async fn the_evented_pleg_is_told_of_each_start_call_under_way() {
            let (_dir, fake, _recorder, rm) = setup();
            let starts = Arc::new(crate::pleg::starts::StartsInFlight::default());
            let rm = rm.with_start_concurrency(2).with_starts_in_flight(starts.clone());
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            fake.set_start_hook({
                let (starts, seen) = (starts.clone(), seen.clone());
                move |call| {
                    seen.lock().unwrap().push((call, starts.in_flight("u1"), starts.in_flight("u2")));
                    async {}.boxed()
                }
            });
            let p = pod("u1");
            let st = rm.pod_status("u1").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.is_empty(), "{:?}", r.errors);
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen.len(), 5, "a sandbox, two creates, two starts: {seen:?}");
            assert!(seen.iter().all(|&(_, mine, other)| mine && !other), "{seen:?}");
            assert!(!starts.in_flight("u1"), "nothing under way once the sync is done");
            // Each successful start is there for the PLEG to take, with the container's name.
            let sandbox = fake.list_pod_sandbox(None).await.unwrap()[0].id.clone();
            assert_eq!(starts.take_started(&sandbox).as_deref(), Some(""));
            for name in ["a", "b"] {
                let id = fake.containers_named(name)[0].clone();
                assert_eq!(starts.take_started(&id).as_deref(), Some(name));
            }
        }

        #[tokio::test(start_paused = true)]
        async fn a_hung_sandbox_start_does_not_stall_the_other_pods() {
            let (_dir, fake, _recorder, rm) = setup();
            let rm = Arc::new(rm.with_start_concurrency(1));
            let first = Arc::new(AtomicUsize::new(0));
            let hanging = Arc::new(tokio::sync::Notify::new());
            fake.set_start_hook({
                let hanging = hanging.clone();
                move |call| {
                    let hang = call == "run_podsandbox" && first.fetch_add(1, Ordering::SeqCst) == 0;
                    let hanging = hanging.clone();
                    async move {
                        if hang {
                            hanging.notify_one();
                            std::future::pending::<()>().await;
                        }
                    }
                    .boxed()
                }
            });
            let hung = tokio::spawn({
                let rm = rm.clone();
                async move {
                    let p = pod("stuck");
                    let st = rm.pod_status("stuck").await.unwrap();
                    rm.sync_pod(&p, &st).await
                }
            });
            hanging.notified().await;
            let started = tokio::time::Instant::now();
            let p = pod("next");
            let st = rm.pod_status("next").await.unwrap();
            let r = rm.sync_pod(&p, &st).await;
            assert!(r.errors.is_empty(), "{:?}", r.errors);
            assert_eq!(started.elapsed(), crate::runtime::start_gate::HOLD, "the next pod waited for the hold only");
            assert!(!hung.is_finished());
            hung.abort();
        }
    }

    /// Volumes, env, DNS and `/etc/hosts` wired through the runtime manager and the pod
    /// workers, on the fake runtime and the fake object source.
    mod wiring {
        use std::sync::Arc;
        use std::time::Duration;

        use serde_json::json;
        use tokio_util::sync::CancellationToken;
        use tokio_util::task::TaskTracker;

        use super::super::*;
        use crate::cm::FakePodContainerManager;
        use crate::pod_workers::{PodWorkers, SyncDeps, WorkType};
        use crate::runtime::manager::testing::{app_config, cluster_dns, env, events, pod};
        use crate::status::{StatusManager, StatusProvider as _};

        /// An image as `ensure_image_exists` hands it back when it read no status: the
        /// container config asks the runtime for the image's user itself.
        fn unchecked_image(image_ref: &str) -> EnsuredImage {
            EnsuredImage { image_ref: image_ref.into(), status: None }
        }

        #[tokio::test]
        async fn container_config_has_volumes_env_and_hosts() {
            let e = env(cluster_dns(tempfile::tempdir().unwrap().path()));
            e.src.set_config_map(app_config("debug"));
            let p = pod();
            let c = &p.spec.as_ref().unwrap().containers[0];
            let ips = vec!["10.0.0.7".to_string()];
            let cfg =
                e.rm.container_config(&p, c, ContainerKind::Regular, None, 0, &unchecked_image("img"), &ips)
                    .await
                    .unwrap();
            assert_eq!(cfg.envs, vec![api::KeyValue { key: "LEVEL".into(), value: "debug".into() }]);
            let app = cfg.mounts.iter().find(|m| m.container_path == "/etc/app").unwrap();
            assert!(app.readonly);
            assert_eq!(std::fs::read_to_string(std::path::Path::new(&app.host_path).join("level")).unwrap(), "debug");
            let hosts = cfg.mounts.iter().find(|m| m.container_path == "/etc/hosts").unwrap();
            let content = std::fs::read_to_string(&hosts.host_path).unwrap();
            assert!(content.contains("10.0.0.7\tweb-0.web.shop.svc.cluster.local\tweb-0\n"), "{content}");
            assert!(content.ends_with("# Entries added by HostAliases.\n10.9.9.9\tlegacy.local\n"), "{content}");
            assert!(e.dir.path().join("root/pods/u1/volumes/kubernetes.io~configmap/cfg/..data").exists());
        }

        #[tokio::test]
        async fn container_config_carries_the_security_context_and_refuses_root_for_run_as_non_root() {
            let tmp = tempfile::tempdir().unwrap();
            let e = env(cluster_dns(tmp.path()));
            e.src.set_config_map(app_config("debug"));
            let mut p = pod();
            p.spec.as_mut().unwrap().security_context = Some(
                serde_json::from_value(json!({"fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}})).unwrap(),
            );
            let c = p.spec.as_ref().unwrap().containers[0].clone();
            let cfg =
                e.rm.container_config(&p, &c, ContainerKind::Regular, None, 0, &unchecked_image("img"), &[])
                    .await
                    .unwrap();
            let sc = cfg.linux.unwrap().security_context.unwrap();
            assert_eq!(sc.supplemental_groups, [2000]);
            assert_eq!(sc.seccomp.unwrap().profile_type, api::security_profile::ProfileType::RuntimeDefault as i32);
            // The fake runtime does not know "img": treated as root, as upstream.
            assert_eq!(sc.run_as_user, Some(api::Int64Value { value: 0 }));
            assert!(sc.namespace_options.is_some());
            let sb = e.rm.sandbox_config(&p, 0).unwrap().linux.unwrap().security_context.unwrap();
            assert_eq!(sb.supplemental_groups, [2000]);
            p.spec.as_mut().unwrap().security_context.as_mut().unwrap().run_as_non_root = Some(true);
            let err =
                e.rm.container_config(&p, &c, ContainerKind::Regular, None, 0, &unchecked_image("img"), &[])
                    .await
                    .unwrap_err();
            assert!(err.starts_with("container has runAsNonRoot and image will run as root (pod: "), "{err}");
        }

        #[tokio::test]
        async fn env_errors_are_create_container_config_errors() {
            let e = env(dns::DnsSettings::default());
            let p = pod();
            e.src.set_config_map(
                serde_json::from_value(json!({"metadata": {"name": "app", "namespace": "shop"}})).unwrap(),
            );
            let c = &p.spec.as_ref().unwrap().containers[0];
            let err =
                e.rm.container_config(&p, c, ContainerKind::Regular, None, 0, &unchecked_image("img"), &[])
                    .await
                    .unwrap_err();
            assert_eq!(err, "couldn't find key level in ConfigMap shop/app");
        }

        /// The pod worker hooks: a missing `ConfigMap` keeps the pod waiting with
        /// `FailedMount`; once it exists the pod starts; removal cleans the volumes.
        #[tokio::test]
        async fn pod_workers_wait_for_volumes_and_clean_them_up() {
            let tmp = tempfile::tempdir().unwrap();
            let e = env(cluster_dns(tmp.path()));
            let status = Arc::new(StatusManager::default());
            let stop = CancellationToken::new();
            let workers = PodWorkers::new(
                Arc::new(SyncDeps {
                    runtime: e.rm.clone(),
                    cm: Arc::new(FakePodContainerManager::default()),
                    status: status.clone(),
                    metrics: Arc::new(KubeletMetrics::unregistered()),
                    recorder: e.recorder.clone(),
                    runtime_name: "fake".into(),
                    sync_frequency: Duration::from_millis(50),
                    host_ip: None,
                    runtime_state: None,
                }),
                TaskTracker::new(),
                stop.clone(),
            );
            let p = pod();
            workers.update_pod(p.clone(), WorkType::Create);
            for _ in 0..100 {
                if !events(&e.recorder, "FailedMount").is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(
                events(&e.recorder, "FailedMount"),
                vec!["MountVolume.SetUp failed for volume \"cfg\" : configmap \"app\" not found"]
            );
            assert!(!e.recorder.list().iter().any(|ev| ev.reason.as_deref() == Some("Started")));

            e.src.set_config_map(app_config("info"));
            workers.update_pod(p.clone(), WorkType::Sync);
            for _ in 0..200 {
                if status.get("u1").is_some_and(|s| s.phase.as_deref() == Some("Running")) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(status.get("u1").and_then(|s| s.phase), Some("Running".into()));
            let vol_dir = e.dir.path().join("root/pods/u1/volumes");
            assert!(vol_dir.exists());

            workers.update_pod(p, WorkType::Kill { grace: None });
            tokio::time::timeout(Duration::from_secs(5), workers.wait_finished("u1")).await.unwrap();
            assert!(!vol_dir.exists());
            assert!(!e.dir.path().join("root/pods/u1").exists());
            stop.cancel();
        }
    }
}
