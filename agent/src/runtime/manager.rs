//! [`RuntimeManager`]: the kubelet's `kubeGenericRuntimeManager`. It decides what a pod
//! needs from the runtime ([`compute_pod_actions`], a pure function of the spec and the
//! runtime's state) and carries it out through CRI: sandbox, init containers in order,
//! app containers with crash-loop back-off, and kills with grace periods.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::backoff::{Backoff, go_duration};
use super::labels;
use super::pod_status::{ContainerState, RuntimeContainerStatus, RuntimePodStatus};
use super::{Error, Result, RuntimeService, api};
use crate::cm::PodContainerManager;
use crate::events::{EventRecorder, EventType, pod_ref};
use crate::metrics::{ContainerTypeLabels, KubeletMetrics};

/// Upstream `minimumGracePeriodInSeconds`: a kill never gets less than this.
pub const MINIMUM_GRACE_PERIOD_SECS: i64 = 2;
/// Default `terminationGracePeriodSeconds` (API server defaulting).
pub const DEFAULT_GRACE_PERIOD_SECS: i64 = 30;

/// Waiting reasons as upstream (`kubecontainer` errors and `images` errors).
pub mod reasons {
    pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
    pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";
    pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
    pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
    pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
    pub const CONTAINER_CREATING: &str = "ContainerCreating";
    pub const POD_INITIALIZING: &str = "PodInitializing";
}

/// What a sync must do to a pod (upstream `podActions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandbox.
    pub kill_pod: bool,
    /// Create a new sandbox (after killing the old one).
    pub create_sandbox: bool,
    /// The sandbox to use when not creating one.
    pub sandbox_id: String,
    /// Attempt number of the sandbox to create.
    pub attempt: u32,
    /// Index into `spec.initContainers` of the next init container to start.
    pub next_init_container: Option<usize>,
    /// Indexes into `spec.containers` to start.
    pub containers_to_start: Vec<usize>,
    /// Running containers to kill: container id -> (name, reason).
    pub containers_to_kill: BTreeMap<String, (String, String)>,
}

/// Outcome of one `SyncPod`.
#[derive(Clone, Debug, Default)]
pub struct SyncResult {
    /// Errors of this sync (each names the container and the reason).
    pub errors: Vec<String>,
    /// Ask the pod worker to sync again after this long (back-off expiry).
    pub requeue_after: Option<Duration>,
}

fn restart_policy(spec: &PodSpec) -> &str {
    spec.restart_policy.as_deref().unwrap_or("Always")
}

fn should_restart_on_failure(spec: &PodSpec) -> bool {
    restart_policy(spec) != "Never"
}

fn is_host_network(spec: &PodSpec) -> bool {
    spec.host_network.unwrap_or(false)
}

/// Upstream `ShouldContainerBeRestarted`.
#[must_use]
pub fn should_container_be_restarted(container: &Container, pod: &Pod, status: &RuntimePodStatus) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(c) = status.find_container(&container.name) else { return true };
    match c.state {
        ContainerState::Running => false,
        ContainerState::Unknown | ContainerState::Created => true,
        ContainerState::Exited => {
            let spec = pod.spec.as_ref().expect("pod has a spec");
            match restart_policy(spec) {
                "Never" => false,
                "OnFailure" => c.exit_code != 0,
                _ => true,
            }
        }
    }
}

fn is_init_container_failed(c: &RuntimeContainerStatus) -> bool {
    (c.state == ContainerState::Exited && c.exit_code != 0) || c.state == ContainerState::Unknown
}

/// Upstream `findNextInitContainerToRun`: (status of the last failed init container,
/// index of the next init container to run, whether all are done).
fn find_next_init_container<'a>(
    spec: &PodSpec,
    status: &'a RuntimePodStatus,
) -> (Option<&'a RuntimeContainerStatus>, Option<usize>, bool) {
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    if inits.is_empty() {
        return (None, None, true);
    }
    // A running app container means initialization happened (e.g. before an agent restart
    // after which init containers were garbage collected).
    if spec
        .containers
        .iter()
        .any(|c| status.find_container(&c.name).is_some_and(|s| s.state == ContainerState::Running))
    {
        return (None, None, true);
    }
    for (i, c) in inits.iter().enumerate().rev() {
        if let Some(s) = status.find_container(&c.name)
            && is_init_container_failed(s)
        {
            return (Some(s), Some(i), false);
        }
    }
    for (i, c) in inits.iter().enumerate().rev() {
        let Some(s) = status.find_container(&c.name) else { continue };
        match s.state {
            ContainerState::Running | ContainerState::Created => return (None, None, false),
            ContainerState::Exited => {
                if i == inits.len() - 1 {
                    return (None, None, true);
                }
                return (None, Some(i + 1), false);
            }
            ContainerState::Unknown => {}
        }
    }
    (None, Some(0), false)
}

/// Upstream `podSandboxChanged`: (create a new sandbox?, attempt, current sandbox id).
fn pod_sandbox_changed(spec: &PodSpec, status: &RuntimePodStatus) -> (bool, u32, String) {
    let Some(latest) = status.sandboxes.first() else { return (true, 0, String::new()) };
    let ready = status.sandboxes.iter().filter(|s| s.ready).count();
    let next = latest.attempt + 1;
    if ready > 1 || !latest.ready {
        return (true, next, latest.id.clone());
    }
    if latest.host_network != is_host_network(spec) {
        return (true, next, latest.id.clone());
    }
    if !is_host_network(spec) && latest.ips.is_empty() {
        return (true, next, latest.id.clone());
    }
    (false, latest.attempt, latest.id.clone())
}

/// Upstream `computePodActions`.
#[must_use]
pub fn compute_pod_actions(pod: &Pod, status: &RuntimePodStatus) -> PodActions {
    let spec = pod.spec.as_ref().expect("pod has a spec");
    let (create_sandbox, attempt, sandbox_id) = pod_sandbox_changed(spec, status);
    let mut actions =
        PodActions { kill_pod: create_sandbox, create_sandbox, sandbox_id, attempt, ..Default::default() };
    if create_sandbox {
        // A pod that must not restart and whose sandbox died after its containers ran is
        // finished: do not bring it back.
        if !should_restart_on_failure(spec) && attempt != 0 && !status.containers.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        let to_start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                !(restart_policy(spec) == "OnFailure"
                    && status
                        .find_container(&c.name)
                        .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0))
            })
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
            actions.next_init_container = Some(0);
            return actions;
        }
        actions.containers_to_start = to_start;
        return actions;
    }

    let (last_failed, next, done) = find_next_init_container(spec, status);
    if !done {
        if let Some(next) = next {
            let failed = last_failed.is_some();
            if failed && !should_restart_on_failure(spec) {
                actions.kill_pod = true;
            } else {
                if let Some(s) = last_failed.filter(|s| s.state == ContainerState::Unknown) {
                    actions.containers_to_kill.insert(
                        s.id.clone(),
                        (s.name.clone(), "Init container is in unknown state, try killing it before restart".into()),
                    );
                }
                actions.next_init_container = Some(next);
            }
        }
        return actions;
    }

    let mut keep = 0;
    for (i, c) in spec.containers.iter().enumerate() {
        let s = status.find_container(&c.name);
        if let Some(s) = s.filter(|s| s.state == ContainerState::Unknown) {
            actions.containers_to_kill.insert(
                s.id.clone(),
                (c.name.clone(), "Container is in unknown state, try killing it before restart".into()),
            );
        }
        match s {
            Some(s) if s.state == ContainerState::Running => {
                if !s.hash.is_empty() && s.hash != labels::container_hash(c) {
                    actions.containers_to_start.push(i);
                    actions
                        .containers_to_kill
                        .insert(s.id.clone(), (c.name.clone(), format!("Container {} definition changed", c.name)));
                } else {
                    keep += 1;
                }
            }
            _ => {
                if should_container_be_restarted(c, pod, status) {
                    actions.containers_to_start.push(i);
                }
            }
        }
    }
    if keep == 0 && actions.containers_to_start.is_empty() {
        actions.kill_pod = true;
    }
    actions
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
    image_backoff: Mutex<Backoff>,
    /// Last start failure per (pod uid, container name): (reason, message). Upstream
    /// `ReasonCache`; cleared by a successful start.
    reasons: Mutex<HashMap<(String, String), (String, String)>>,
    recorder: Option<Arc<dyn EventRecorder>>,
}

impl RuntimeManager {
    #[must_use]
    pub fn new(
        rt: Arc<dyn RuntimeService>,
        cm: Arc<dyn PodContainerManager>,
        metrics: Arc<KubeletMetrics>,
        cfg: RuntimeManagerConfig,
        backoff: Backoff,
        image_backoff: Backoff,
    ) -> Self {
        Self {
            rt,
            cm,
            metrics,
            cfg,
            backoff: Mutex::new(backoff),
            image_backoff: Mutex::new(image_backoff),
            reasons: Mutex::new(HashMap::new()),
            recorder: None,
        }
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
        self.image_backoff.lock().unwrap().forget_prefix(&prefix);
    }

    /// Drops expired back-off entries (housekeeping).
    pub fn gc_backoff(&self) {
        self.backoff.lock().unwrap().gc();
        self.image_backoff.lock().unwrap().gc();
    }

    /// Fetches a pod's runtime status.
    pub async fn pod_status(&self, uid: &str) -> Result<RuntimePodStatus> {
        RuntimePodStatus::fetch(self.rt.as_ref(), uid).await
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
    pub async fn sync_pod(&self, pod: &Pod, status: &RuntimePodStatus) -> SyncResult {
        let spec = pod.spec.as_ref().expect("pod has a spec");
        let actions = compute_pod_actions(pod, status);
        tracing::debug!(pod = %pod_full_name(pod), ?actions, "computed pod actions");
        let mut result = SyncResult::default();

        let nothing_yet = status.sandboxes.is_empty() && status.containers.is_empty();
        if actions.kill_pod && !nothing_yet {
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
                    if let Err(e) = self.rt.remove_container(&c.id).await
                        && !e.is_not_found()
                    {
                        tracing::warn!(container = %c.id, error = %e, "failed to remove old init container");
                    }
                }
            }
        } else {
            for (id, (name, why)) in &actions.containers_to_kill {
                tracing::info!(pod = %pod_full_name(pod), container = %name, reason = %why, "killing container");
                if let Err(e) = self.kill_container(pod, id, name, None).await {
                    result.errors.push(format!("KillContainer {name}: {e}"));
                    return result;
                }
            }
        }
        self.prune_init_containers(spec, status).await;

        let mut sandbox_id = actions.sandbox_id.clone();
        let sandbox_config = match self.sandbox_config(pod, actions.attempt) {
            Ok(c) => c,
            Err(e) => {
                result.errors.push(format!("CreatePodSandboxConfig: {e}"));
                return result;
            }
        };
        let mut pod_ips = status.ips().to_vec();
        if actions.create_sandbox {
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

        let inits = spec.init_containers.as_deref().unwrap_or_default();
        if let Some(i) = actions.next_init_container {
            self.start_with_backoff(pod, &inits[i], true, status, &sandbox_id, &sandbox_config, &pod_ips, &mut result)
                .await;
            return result;
        }
        for &i in &actions.containers_to_start {
            self.start_with_backoff(
                pod,
                &spec.containers[i],
                false,
                status,
                &sandbox_id,
                &sandbox_config,
                &pod_ips,
                &mut result,
            )
            .await;
        }
        result
    }

    #[expect(clippy::too_many_arguments, reason = "mirrors upstream startContainer inputs")]
    async fn start_with_backoff(
        &self,
        pod: &Pod,
        container: &Container,
        init: bool,
        status: &RuntimePodStatus,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        pod_ips: &[String],
        result: &mut SyncResult,
    ) {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some(wait) = self.crash_loop_backoff(pod, container, status) {
            let msg = format!(
                "back-off {} restarting failed container={} pod={}",
                go_duration(self.current_backoff(pod, container).unwrap_or(wait)),
                container.name,
                pod_full_name(pod)
            );
            self.set_reason(uid, &container.name, reasons::CRASH_LOOP_BACK_OFF, msg.clone());
            self.event(
                pod,
                EventType::Warning,
                "BackOff",
                format!("Back-off restarting failed container {} in pod {}", container.name, pod_full_name(pod)),
            );
            result.errors.push(format!("{}: {msg}", reasons::CRASH_LOOP_BACK_OFF));
            result.requeue_after = Some(result.requeue_after.map_or(wait, |r| r.min(wait)));
            return;
        }
        let restart_count = status.find_container(&container.name).map_or(0, |c| c.restart_count + 1);
        let container_type = if init { "init_container" } else { "container" };
        match self.start_container(pod, container, init, restart_count, sandbox_id, sandbox_config, pod_ips).await {
            Ok(()) => {
                self.clear_reason(uid, &container.name);
                self.metrics
                    .started_containers
                    .get_or_create(&ContainerTypeLabels { container_type: container_type.into() })
                    .inc();
            }
            Err((reason, msg, retry)) => {
                tracing::warn!(pod = %pod_full_name(pod), container = %container.name, reason, message = %msg, "failed to start container");
                self.metrics
                    .started_containers_errors
                    .get_or_create(&ContainerTypeLabels { container_type: container_type.into() })
                    .inc();
                self.set_reason(uid, &container.name, reason, msg.clone());
                let event_reason = match reason {
                    reasons::IMAGE_PULL_BACK_OFF => "BackOff",
                    reasons::ERR_IMAGE_NEVER_PULL => reasons::ERR_IMAGE_NEVER_PULL,
                    reasons::INVALID_IMAGE_NAME => "InspectFailed",
                    _ => "Failed",
                };
                self.event(pod, EventType::Warning, event_reason, format!("Error: {reason}: {msg}"));
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

    async fn create_sandbox(&self, pod: &Pod, config: &api::PodSandboxConfig) -> Result<(String, Vec<String>)> {
        std::fs::create_dir_all(self.pod_log_dir(pod))
            .map_err(|e| Error::Invalid(format!("creating pod log directory: {e}")))?;
        let handler = pod.spec.as_ref().and_then(|s| s.runtime_class_name.clone()).unwrap_or_default();
        let id = self.rt.run_pod_sandbox(config.clone(), handler).await?;
        let st = self.rt.pod_sandbox_status(&id).await?;
        let mut ips = Vec::new();
        if let Some(net) = st.network {
            if !net.ip.is_empty() {
                ips.push(net.ip);
            }
            ips.extend(net.additional_ips.into_iter().map(|i| i.ip));
        }
        tracing::info!(pod = %pod_full_name(pod), sandbox = %id, ?ips, "created pod sandbox");
        Ok((id, ips))
    }

    /// Pulls the image as the pull policy says. Errors carry the waiting reason.
    async fn ensure_image(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox_config: &api::PodSandboxConfig,
    ) -> Result<String, (&'static str, String, Option<Duration>)> {
        let image = container.image.clone().unwrap_or_default();
        if image.is_empty() || image.contains(char::is_whitespace) {
            return Err((
                reasons::INVALID_IMAGE_NAME,
                format!("Failed to apply default image tag {image:?}: invalid reference format"),
                None,
            ));
        }
        let policy = container.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let present = match self.rt.image_status(&image).await {
            Ok(img) => img,
            Err(e) => {
                return Err((
                    reasons::ERR_IMAGE_PULL,
                    format!("ImageStatus {image}: {e}"),
                    Some(Duration::from_secs(10)),
                ));
            }
        };
        if policy != "Always" {
            if let Some(img) = present {
                self.event(
                    pod,
                    EventType::Normal,
                    "Pulled",
                    format!("Container image \"{image}\" already present on machine"),
                );
                return Ok(img.id);
            }
            if policy == "Never" {
                return Err((
                    reasons::ERR_IMAGE_NEVER_PULL,
                    format!("Container image \"{image}\" is not present with pull policy of Never"),
                    None,
                ));
            }
        }
        let key = format!("{}/{}", pod.metadata.uid.as_deref().unwrap_or_default(), image);
        let now = SystemTime::now();
        if let Some(rem) = self.image_backoff.lock().unwrap().remaining_since(&key, now) {
            return Err((reasons::IMAGE_PULL_BACK_OFF, format!("Back-off pulling image \"{image}\""), Some(rem)));
        }
        tracing::info!(pod = %pod_full_name(pod), %image, "pulling image");
        self.event(pod, EventType::Normal, "Pulling", format!("Pulling image \"{image}\""));
        let pull_start = std::time::Instant::now();
        match self.rt.pull_image(&image, None, Some(sandbox_config.clone())).await {
            Ok(r) => {
                self.event(
                    pod,
                    EventType::Normal,
                    "Pulled",
                    format!("Successfully pulled image \"{image}\" in {:.3}s", pull_start.elapsed().as_secs_f64()),
                );
                Ok(r)
            }
            Err(e) => {
                let mut b = self.image_backoff.lock().unwrap();
                b.next(&key, now);
                let wait = b.current(&key);
                Err((reasons::ERR_IMAGE_PULL, format!("failed to pull image \"{image}\": {e}"), wait))
            }
        }
    }

    #[expect(clippy::too_many_arguments, reason = "mirrors upstream startContainer inputs")]
    async fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
        init: bool,
        restart_count: u32,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        pod_ips: &[String],
    ) -> Result<(), (&'static str, String, Option<Duration>)> {
        let image_ref = self.ensure_image(pod, container, sandbox_config).await?;
        let config = self
            .container_config(pod, container, init, restart_count, &image_ref, pod_ips)
            .map_err(|e| (reasons::CREATE_CONTAINER_CONFIG_ERROR, e, None))?;
        let id = self
            .rt
            .create_container(sandbox_id, config, sandbox_config.clone())
            .await
            .map_err(|e| (reasons::CREATE_CONTAINER_ERROR, e.to_string(), None))?;
        self.event(pod, EventType::Normal, "Created", format!("Created container {}", container.name));
        if let Err(e) = self.rt.start_container(&id).await {
            return Err((reasons::RUN_CONTAINER_ERROR, e.to_string(), None));
        }
        self.event(pod, EventType::Normal, "Started", format!("Started container {}", container.name));
        tracing::info!(pod = %pod_full_name(pod), container = %container.name, id = %id, restart_count, "started container");
        Ok(())
    }

    /// Builds the CRI sandbox config of a pod (upstream `generatePodSandboxConfig`).
    pub fn sandbox_config(&self, pod: &Pod, attempt: u32) -> Result<api::PodSandboxConfig> {
        let spec = pod.spec.as_ref().expect("pod has a spec");
        let host_network = is_host_network(spec);
        // Host-network sandboxes fail in containerd 1.6 when a hostname is set; the
        // kubelet leaves it empty for them too.
        let hostname = if host_network {
            String::new()
        } else {
            spec.hostname.clone().unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default())
        };
        let mut port_mappings = Vec::new();
        for c in &spec.containers {
            for p in c.ports.iter().flatten() {
                if p.host_port.unwrap_or(0) == 0 && !host_network {
                    continue;
                }
                let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
                    "UDP" => api::Protocol::Udp,
                    "SCTP" => api::Protocol::Sctp,
                    _ => api::Protocol::Tcp,
                };
                port_mappings.push(api::PortMapping {
                    protocol: protocol as i32,
                    container_port: p.container_port,
                    host_port: p.host_port.unwrap_or(0),
                    host_ip: p.host_ip.clone().unwrap_or_default(),
                });
            }
        }
        let ns_mode = |node: bool| if node { api::NamespaceMode::Node } else { api::NamespaceMode::Pod } as i32;
        let sc = spec.security_context.as_ref();
        let linux = api::LinuxPodSandboxConfig {
            cgroup_parent: self.cm.cgroup_parent(pod),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: ns_mode(host_network),
                    pid: if spec.host_pid.unwrap_or(false) {
                        api::NamespaceMode::Node as i32
                    } else if spec.share_process_namespace.unwrap_or(false) {
                        api::NamespaceMode::Pod as i32
                    } else {
                        api::NamespaceMode::Container as i32
                    },
                    ipc: ns_mode(spec.host_ipc.unwrap_or(false)),
                    ..Default::default()
                }),
                run_as_user: sc.and_then(|s| s.run_as_user).map(|v| api::Int64Value { value: v }),
                run_as_group: sc.and_then(|s| s.run_as_group).map(|v| api::Int64Value { value: v }),
                supplemental_groups: sc.and_then(|s| s.supplemental_groups.clone()).unwrap_or_default(),
                privileged: spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .any(|c| c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false)),
                ..Default::default()
            }),
            sysctls: sc
                .and_then(|s| s.sysctls.as_ref())
                .map(|v| v.iter().map(|s| (s.name.clone(), s.value.clone())).collect())
                .unwrap_or_default(),
            ..Default::default()
        };
        let dns_config = if spec.dns_policy.as_deref() == Some("None") {
            spec.dns_config.as_ref().map(|d| api::DnsConfig {
                servers: d.nameservers.clone().unwrap_or_default(),
                searches: d.searches.clone().unwrap_or_default(),
                options: d
                    .options
                    .iter()
                    .flatten()
                    .map(|o| match &o.value {
                        Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
                        None => o.name.clone().unwrap_or_default(),
                    })
                    .collect(),
            })
        } else {
            None
        };
        Ok(api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                attempt,
            }),
            hostname,
            log_directory: self.pod_log_dir(pod).to_string_lossy().into_owned(),
            dns_config,
            port_mappings,
            labels: labels::sandbox_labels(pod),
            annotations: labels::sandbox_annotations(pod),
            linux: Some(linux),
            windows: None,
        })
    }

    /// Builds the CRI container config (upstream `generateContainerConfig`).
    fn container_config(
        &self,
        pod: &Pod,
        container: &Container,
        init: bool,
        restart_count: u32,
        image_ref: &str,
        pod_ips: &[String],
    ) -> std::result::Result<api::ContainerConfig, String> {
        let envs = crate::runtime::manager::env::resolve(pod, container, &self.cfg, pod_ips)?;
        let env_map: HashMap<&str, &str> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let command = container.command.iter().flatten().map(|c| env::expand(c, &env_map)).collect();
        let args = container.args.iter().flatten().map(|c| env::expand(c, &env_map)).collect();
        let log_dir = self.pod_log_dir(pod).join(&container.name);
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| format!("creating container log directory {}: {e}", log_dir.display()))?;
        let mounts = self.make_mounts(pod, container, pod_ips)?;
        let sc = container.security_context.as_ref();
        let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
        let caps = sc.and_then(|s| s.capabilities.as_ref());
        let linux = api::LinuxContainerConfig {
            resources: Some(crate::cm::linux_container_resources(pod, container)),
            security_context: Some(api::LinuxContainerSecurityContext {
                capabilities: caps.map(|c| api::Capability {
                    add_capabilities: c.add.clone().unwrap_or_default(),
                    drop_capabilities: c.drop.clone().unwrap_or_default(),
                    ..Default::default()
                }),
                privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
                namespace_options: Some(api::NamespaceOption {
                    network: if pod.spec.as_ref().is_some_and(is_host_network) {
                        api::NamespaceMode::Node as i32
                    } else {
                        api::NamespaceMode::Pod as i32
                    },
                    pid: if pod.spec.as_ref().and_then(|s| s.host_pid).unwrap_or(false) {
                        api::NamespaceMode::Node as i32
                    } else if pod.spec.as_ref().and_then(|s| s.share_process_namespace).unwrap_or(false) {
                        api::NamespaceMode::Pod as i32
                    } else {
                        api::NamespaceMode::Container as i32
                    },
                    ipc: if pod.spec.as_ref().and_then(|s| s.host_ipc).unwrap_or(false) {
                        api::NamespaceMode::Node as i32
                    } else {
                        api::NamespaceMode::Pod as i32
                    },
                    ..Default::default()
                }),
                run_as_user: sc
                    .and_then(|s| s.run_as_user)
                    .or_else(|| pod_sc.and_then(|s| s.run_as_user))
                    .map(|v| api::Int64Value { value: v }),
                run_as_group: sc
                    .and_then(|s| s.run_as_group)
                    .or_else(|| pod_sc.and_then(|s| s.run_as_group))
                    .map(|v| api::Int64Value { value: v }),
                readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem).unwrap_or(false),
                no_new_privs: sc.and_then(|s| s.allow_privilege_escalation).is_some_and(|a| !a),
                supplemental_groups: pod_sc.and_then(|s| s.supplemental_groups.clone()).unwrap_or_default(),
                ..Default::default()
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
            labels: labels::container_labels(pod, container, init),
            annotations: labels::container_annotations(pod, container, restart_count),
            log_path: format!("{}/{restart_count}.log", container.name),
            stdin: container.stdin.unwrap_or(false),
            stdin_once: container.stdin_once.unwrap_or(false),
            tty: container.tty.unwrap_or(false),
            linux: Some(linux),
            ..Default::default()
        })
    }

    /// Mounts the kubelet adds itself: a managed /etc/hosts for pods on the pod network
    /// and the termination-message file. Volumes are not supported yet (their issue is
    /// the API-server one); a pod that mounts one is refused with a clear reason.
    fn make_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        pod_ips: &[String],
    ) -> std::result::Result<Vec<api::Mount>, String> {
        let spec = pod.spec.as_ref().expect("pod has a spec");
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some(vm) = container.volume_mounts.as_ref().and_then(|v| v.first()) {
            return Err(format!(
                "volume mount {:?} of container {:?}: volumes are not supported by this swiftlet version yet",
                vm.name, container.name
            ));
        }
        let pod_dir = self.pod_dir(uid);
        let mut mounts = Vec::new();
        if !is_host_network(spec) {
            let hosts = pod_dir.join("etc-hosts");
            let hostname = spec.hostname.clone().unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default());
            let mut content = String::from(
                "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
            );
            for ip in pod_ips {
                let _ = writeln!(content, "{ip}\t{hostname}");
            }
            for ha in spec.host_aliases.iter().flatten() {
                let _ = writeln!(
                    content,
                    "\n# Entries added by HostAliases.\n{}\t{}",
                    ha.ip,
                    ha.hostnames.clone().unwrap_or_default().join("\t")
                );
            }
            std::fs::create_dir_all(&pod_dir).map_err(|e| format!("creating {}: {e}", pod_dir.display()))?;
            std::fs::write(&hosts, content).map_err(|e| format!("writing {}: {e}", hosts.display()))?;
            mounts.push(api::Mount {
                container_path: "/etc/hosts".into(),
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
    /// `pruneInitContainersBeforeStart`), so restarts do not pile up exited containers.
    async fn prune_init_containers(&self, spec: &PodSpec, status: &RuntimePodStatus) {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for c in &status.containers {
            if !c.init && !spec.init_containers.iter().flatten().any(|i| i.name == c.name) {
                continue;
            }
            let n = seen.entry(c.name.as_str()).or_default();
            *n += 1;
            if *n > 1
                && c.state == ContainerState::Exited
                && let Err(e) = self.rt.remove_container(&c.id).await
                && !e.is_not_found()
            {
                tracing::warn!(container = %c.id, error = %e, "failed to prune init container");
            }
        }
    }

    /// Removes exited app containers beyond the newest two per name (the running or
    /// latest one, and the previous one whose state is `lastState`). A crash-looping
    /// container must not fill the runtime.
    pub async fn prune_dead_containers(&self, status: &RuntimePodStatus) {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for c in &status.containers {
            let n = seen.entry(c.name.as_str()).or_default();
            *n += 1;
            if *n > 2
                && c.state == ContainerState::Exited
                && let Err(e) = self.rt.remove_container(&c.id).await
                && !e.is_not_found()
            {
                tracing::warn!(container = %c.id, error = %e, "failed to remove dead container");
            }
        }
    }

    async fn kill_container(&self, pod: &Pod, id: &str, name: &str, grace_override: Option<i64>) -> Result<()> {
        let grace = grace_override
            .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(DEFAULT_GRACE_PERIOD_SECS)
            .max(MINIMUM_GRACE_PERIOD_SECS);
        tracing::debug!(pod = %pod_full_name(pod), container = %name, grace, "stopping container");
        self.event(pod, EventType::Normal, "Killing", format!("Stopping container {name}"));
        match self.rt.stop_container(id, grace).await {
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
        let grace = grace_override
            .or_else(|| pod.and_then(|p| p.spec.as_ref()).and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(DEFAULT_GRACE_PERIOD_SECS)
            .max(MINIMUM_GRACE_PERIOD_SECS);
        let running: Vec<_> = status
            .containers
            .iter()
            .filter(|c| matches!(c.state, ContainerState::Running | ContainerState::Created | ContainerState::Unknown))
            .collect();
        if let Some(pod) = pod {
            for c in running.iter().filter(|c| c.state == ContainerState::Running) {
                self.event(pod, EventType::Normal, "Killing", format!("Stopping container {}", c.name));
            }
        }
        let stops = running.iter().map(|c| async move {
            match self.rt.stop_container(&c.id, grace).await {
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
            match self.rt.stop_pod_sandbox(&s.id).await {
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
            match self.rt.remove_container(&c.id).await {
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
    pub fn cleanup_orphaned_log_dirs(&self, known_uids: &std::collections::HashSet<String>) {
        let Ok(entries) = std::fs::read_dir(&self.cfg.pod_logs_dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(uid) = name.rsplit('_').next() else { continue };
            if name.split('_').count() == 3
                && !known_uids.contains(uid)
                && let Err(err) = remove_dir_if_exists(&e.path())
            {
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

/// Environment variables of a container: values, downward API field refs, and
/// `$(VAR)` expansion as upstream (`makeEnvironmentVariables`, `expansion.Expand`).
pub mod env {
    use std::collections::HashMap;

    use k8s_openapi::api::core::v1::{Container, Pod};

    use super::RuntimeManagerConfig;

    /// Expands `$(NAME)` references; `$$` escapes a `$`; unknown references stay as written.
    #[must_use]
    pub fn expand<S: std::hash::BuildHasher>(input: &str, vars: &HashMap<&str, &str, S>) -> String {
        let mut out = String::with_capacity(input.len());
        let bytes = input.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'$' && i + 1 < bytes.len() {
                if bytes[i + 1] == b'$' {
                    out.push('$');
                    i += 2;
                    continue;
                }
                if bytes[i + 1] == b'('
                    && let Some(end) = input[i + 2..].find(')')
                {
                    let name = &input[i + 2..i + 2 + end];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str(&input[i..i + 3 + end]);
                        }
                    }
                    i += 3 + end;
                    continue;
                }
            }
            let ch = input[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
        out
    }

    fn field_ref(pod: &Pod, path: &str, cfg: &RuntimeManagerConfig, pod_ips: &[String]) -> Result<String, String> {
        let m = &pod.metadata;
        let spec = pod.spec.as_ref();
        let map_key = |prefix: &str, map: Option<&std::collections::BTreeMap<String, String>>| {
            path.strip_prefix(prefix)
                .and_then(|r| r.strip_suffix("']"))
                .map(|k| map.and_then(|m| m.get(k)).cloned().unwrap_or_default())
        };
        Ok(match path {
            "metadata.name" => m.name.clone().unwrap_or_default(),
            "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
            "metadata.uid" => m.uid.clone().unwrap_or_default(),
            "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_else(|| cfg.node_name.clone()),
            "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
            "status.hostIP" | "status.hostIPs" => cfg.host_ip.clone().unwrap_or_default(),
            "status.podIP" => pod_ips.first().cloned().unwrap_or_default(),
            "status.podIPs" => pod_ips.join(","),
            _ => {
                if let Some(v) = map_key("metadata.labels['", m.labels.as_ref()) {
                    v
                } else if let Some(v) = map_key("metadata.annotations['", m.annotations.as_ref()) {
                    v
                } else {
                    return Err(format!("unsupported fieldRef fieldPath {path:?}"));
                }
            }
        })
    }

    /// Resolves the container's env list in order; later entries may refer to earlier ones.
    pub fn resolve(
        pod: &Pod,
        container: &Container,
        cfg: &RuntimeManagerConfig,
        pod_ips: &[String],
    ) -> Result<Vec<(String, String)>, String> {
        let mut out: Vec<(String, String)> = Vec::new();
        if container.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
            return Err(format!(
                "container {:?}: envFrom needs ConfigMaps/Secrets from an API server; not available to static pods",
                container.name
            ));
        }
        for (i, e) in container.env.iter().flatten().enumerate() {
            let value = if let Some(vf) = &e.value_from {
                if let Some(fr) = &vf.field_ref {
                    field_ref(pod, &fr.field_path, cfg, pod_ips)
                        .map_err(|err| format!("env[{i}] {:?}: {err}", e.name))?
                } else {
                    return Err(format!(
                        "env[{i}] {:?}: only valueFrom.fieldRef is supported for static pods (configMapKeyRef, secretKeyRef and resourceFieldRef need the API server or are not implemented yet)",
                        e.name
                    ));
                }
            } else {
                let vars: HashMap<&str, &str> = out.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                expand(e.value.as_deref().unwrap_or_default(), &vars)
            };
            out.retain(|(k, _)| k != &e.name);
            out.push((e.name.clone(), value));
        }
        Ok(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn expansion() {
            let vars = HashMap::from([("A", "1"), ("B", "two")]);
            assert_eq!(expand("x$(A)y$(B)", &vars), "x1ytwo");
            assert_eq!(expand("$(C) $$(A) $", &vars), "$(C) $(A) $");
            assert_eq!(expand("é$(A", &vars), "é$(A");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::pod_status::SandboxStatus;

    fn pod(policy: &str, inits: &[&str], containers: &[&str]) -> Pod {
        let mk = |n: &&str| Container { name: (*n).into(), image: Some("busybox".into()), ..Default::default() };
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: if inits.is_empty() { None } else { Some(inits.iter().map(mk).collect()) },
                containers: containers.iter().map(mk).collect(),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn sandbox(ready: bool, attempt: u32) -> SandboxStatus {
        SandboxStatus {
            id: format!("sb{attempt}"),
            ready,
            attempt,
            created_at: i64::from(attempt),
            ips: vec!["10.0.0.2".into()],
            host_network: false,
        }
    }

    fn ctr(
        pod: &Pod,
        name: &str,
        state: ContainerState,
        exit: i32,
        restarts: u32,
        init: bool,
    ) -> RuntimeContainerStatus {
        let spec = pod.spec.as_ref().unwrap();
        let c = spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name).unwrap();
        RuntimeContainerStatus {
            id: format!("{name}-{restarts}"),
            name: name.into(),
            sandbox_id: "sb0".into(),
            state,
            created_at: 0,
            started_at: None,
            finished_at: None,
            exit_code: exit,
            image: String::new(),
            image_ref: String::new(),
            reason: String::new(),
            message: String::new(),
            hash: labels::container_hash(c),
            restart_count: restarts,
            init,
        }
    }

    fn status(sandboxes: Vec<SandboxStatus>, containers: Vec<RuntimeContainerStatus>) -> RuntimePodStatus {
        RuntimePodStatus { uid: "u1".into(), sandboxes, containers, ..Default::default() }
    }

    #[test]
    fn new_pod_creates_sandbox_and_starts_all() {
        let p = pod("Always", &[], &["a", "b"]);
        let a = compute_pod_actions(&p, &RuntimePodStatus::default());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 0);
        assert_eq!(a.containers_to_start, vec![0, 1]);
    }

    #[test]
    fn new_pod_with_init_starts_first_init_only() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let a = compute_pod_actions(&p, &RuntimePodStatus::default());
        assert_eq!(a.next_init_container, Some(0));
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn init_containers_run_in_order_then_apps() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Running, 0, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.next_init_container, None);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);

        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 0, 0, true)]);
        assert_eq!(compute_pod_actions(&p, &s).next_init_container, Some(1));

        let s = status(
            vec![sandbox(true, 0)],
            vec![ctr(&p, "i2", ContainerState::Exited, 0, 0, true), ctr(&p, "i1", ContainerState::Exited, 0, 0, true)],
        );
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.next_init_container, None);
        assert_eq!(a.containers_to_start, vec![0]);
    }

    #[test]
    fn failed_init_blocks_apps_and_restarts_or_kills() {
        let p = pod("Always", &["i1"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 1, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.next_init_container, Some(0));
        assert!(a.containers_to_start.is_empty());

        let p = pod("Never", &["i1"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 1, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert!(a.kill_pod);
        assert_eq!(a.next_init_container, None);
    }

    #[test]
    fn restart_policies() {
        for (policy, exit, restart) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 3, true),
            ("Never", 0, false),
            ("Never", 1, false),
        ] {
            let p = pod(policy, &[], &["a"]);
            let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "a", ContainerState::Exited, exit, 0, false)]);
            let a = compute_pod_actions(&p, &s);
            assert_eq!(!a.containers_to_start.is_empty(), restart, "{policy} exit {exit}");
            // Nothing to run and nothing running: the sandbox goes.
            assert_eq!(a.kill_pod, !restart, "{policy} exit {exit}");
        }
    }

    #[test]
    fn running_pod_is_left_alone() {
        let p = pod("Always", &[], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "a", ContainerState::Running, 0, 0, false)]);
        assert_eq!(compute_pod_actions(&p, &s), PodActions { sandbox_id: "sb0".into(), ..Default::default() });
    }

    #[test]
    fn dead_sandbox_is_recreated_with_next_attempt() {
        let p = pod("Always", &[], &["a"]);
        let s = status(vec![sandbox(false, 0)], vec![ctr(&p, "a", ContainerState::Exited, 137, 0, false)]);
        let a = compute_pod_actions(&p, &s);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 1);
        assert_eq!(a.containers_to_start, vec![0]);

        // restartPolicy Never: a finished pod's sandbox is not brought back.
        let p = pod("Never", &[], &["a"]);
        let s = status(vec![sandbox(false, 0)], vec![ctr(&p, "a", ContainerState::Exited, 0, 0, false)]);
        let a = compute_pod_actions(&p, &s);
        assert!(!a.create_sandbox && a.kill_pod);
    }

    #[test]
    fn changed_spec_restarts_container() {
        let p = pod("Always", &[], &["a"]);
        let mut c = ctr(&p, "a", ContainerState::Running, 0, 0, false);
        c.hash = "deadbeef".into();
        let a = compute_pod_actions(&p, &status(vec![sandbox(true, 0)], vec![c]));
        assert_eq!(a.containers_to_start, vec![0]);
        assert!(a.containers_to_kill.contains_key("a-0"));
    }
}
