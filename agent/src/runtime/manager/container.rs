//! Containers (upstream `kuberuntime_container.go`): what to start and where
//! ([`StartSpec`], [`StartContext`]), `startContainer` (the image, the CRI container config
//! with its environment, mounts and namespaces, `CreateContainer` and `StartContainer`, the
//! postStart hook), and `killContainer` (the preStop hook within the grace period, then
//! `StopContainer`).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::{
    DEFAULT_GRACE_PERIOD_SECS, MINIMUM_GRACE_PERIOD_SECS, RuntimeManager, dns, env, is_host_network, no_spec,
    pod_full_name, reasons,
};
use crate::container::ephemeral;
use crate::container::labels::{self, ContainerKind};
use crate::container::pod_status::{ContainerState, RuntimePodStatus};
use crate::container::{ImageSubPaths, Result, api};
use crate::events::EventType;
use crate::images::puller::{EnsuredImage, PullError};
use crate::runtime::security_context;
use crate::volumes::manager::{ContainerMounts, ImageVolumes};

/// The hosts file the kubelet manages in containers.
const ETC_HOSTS: &str = "/etc/hosts";

/// Why a container did not start (upstream `startContainer`'s error and message): its
/// waiting reason (one of [`reasons`]), the message the status and the `Failed` event carry,
/// and when to sync again (`None`: after the pod worker's error back-off; image pulls in
/// back-off say when theirs ends).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct StartError {
    /// One of [`reasons`].
    pub reason: &'static str,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl StartError {
    /// A failure with no back-off of its own.
    #[must_use]
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self { reason, message: message.into(), retry_after: None }
    }
}

impl From<PullError> for StartError {
    fn from(e: PullError) -> Self {
        Self { reason: e.reason, message: e.message, retry_after: e.retry_after }
    }
}

/// Runs `step` of a container start inside its trace span, marking the span failed with
/// the waiting reason and message if it fails.
async fn traced_step<T>(
    name: &'static str,
    container: &str,
    image: &str,
    step: impl std::future::Future<Output = Result<T, StartError>>,
) -> Result<T, StartError> {
    let span = crate::telemetry::pod_step_span(name, container, image);
    let outcome = tracing::Instrument::instrument(step, span.clone()).await;
    if let Err(e) = &outcome {
        crate::telemetry::record_error(&span, &e.to_string());
    }
    outcome
}

/// What to start (upstream `startSpec`): a container of the spec, its kind, and for an
/// ephemeral container the `targetContainerName` whose pid namespace it joins.
#[derive(Clone, Copy, Debug)]
pub(super) struct StartSpec<'a> {
    pub(super) container: &'a Container,
    pub(super) kind: ContainerKind,
    pub(super) target: Option<&'a str>,
}

impl<'a> StartSpec<'a> {
    pub(super) fn of(container: &'a Container, kind: ContainerKind) -> Self {
        Self { container, kind, target: None }
    }
}

/// Where a sync starts containers: the runtime's view of the pod before the sync and the
/// sandbox to start them in.
#[derive(Clone, Copy)]
pub(super) struct StartContext<'a> {
    pub(super) status: &'a RuntimePodStatus,
    pub(super) sandbox_id: &'a str,
    pub(super) sandbox_config: &'a api::PodSandboxConfig,
    pub(super) pod_ips: &'a [String],
    /// The pulls of the pod's image volumes for this sync.
    pub(super) image_volumes: &'a super::image_volumes::ImageVolumePulls,
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

/// A container about to be created, and what goes into its CRI config (upstream
/// `generateContainerConfig`'s inputs).
#[derive(Clone, Copy)]
struct Starting<'a> {
    pod: &'a Pod,
    container: &'a Container,
    kind: ContainerKind,
    /// The container whose process namespace an ephemeral container targets.
    target_id: Option<&'a str>,
    restart_count: u32,
    pod_ips: &'a [String],
    image: &'a EnsuredImage,
    image_volumes: &'a ImageVolumes,
}

impl RuntimeManager {
    /// Upstream `startContainer`; `image_volumes` are the pulled images of the image
    /// volumes the container mounts.
    pub(super) async fn start_container(
        &self,
        pod: &Pod,
        start: &StartSpec<'_>,
        ctx: &StartContext<'_>,
        restart_count: u32,
        image_volumes: &ImageVolumes,
    ) -> Result<(), StartError> {
        let StartContext { status, sandbox_id, sandbox_config, pod_ips, .. } = *ctx;
        let container = start.container;
        let image = container.image.as_deref().unwrap_or_default();
        let credentials = self.image_credentials(pod, image).await;
        let pulled = async {
            self.images.ensure_image_exists(pod, container, credentials, Some(sandbox_config)).await.map_err(Into::into)
        };
        let ensured = traced_step("ensureImageExists", &container.name, image, pulled).await?;
        // Upstream resolves the target after the image, as a container config error.
        let target_id = ephemeral::target_id(start.target, status)
            .map_err(|e| StartError::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, e.to_string()))?;
        let starting = Starting {
            pod,
            container,
            kind: start.kind,
            target_id,
            restart_count,
            pod_ips,
            image: &ensured,
            image_volumes,
        };
        let started = self.create_and_start_container(starting, sandbox_id, sandbox_config);
        traced_step("startContainer", &container.name, image, started).await
    }

    /// The part of [`Self::start_container`] after the image: create, start, postStart.
    async fn create_and_start_container(
        &self,
        starting: Starting<'_>,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
    ) -> Result<(), StartError> {
        let Starting { pod, container, restart_count, pod_ips, .. } = starting;
        let (mut config, image_sub_paths) = self
            .container_config(starting)
            .await
            .map_err(|e| StartError::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, e))?;
        for h in &self.container_hooks {
            h.pre_create_container(pod, container, &mut config)
                .map_err(|e| StartError::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, e))?;
        }
        let create_and_start = async {
            let under_way = self.cache.starts().begin(pod.metadata.uid.as_deref().unwrap_or_default());
            let id = self
                .rt
                .create_container_with_image_sub_paths(sandbox_id, config, sandbox_config.clone(), &image_sub_paths)
                .await
                .map_err(|e| StartError::new(reasons::CREATE_CONTAINER_ERROR, e.to_string()))?;
            // Before it can exit: the evented PLEG then waits for the runtime to record
            // a failed exit, whose message may be the end of the log (`KernelExits`).
            if container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError") {
                self.cache.exits().await_runtime(pod.metadata.uid.as_deref().unwrap_or_default(), &id);
            }
            for h in &self.container_hooks {
                h.pre_start_container(pod, container, &id)
                    .map_err(|e| StartError::new(reasons::RUN_CONTAINER_ERROR, e))?;
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
                Err(e) => Err(StartError::new(reasons::RUN_CONTAINER_ERROR, e.to_string())),
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
                return Err(StartError::new(reasons::POST_START_HOOK_ERROR, e.message));
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
    async fn container_config(
        &self,
        starting: Starting<'_>,
    ) -> std::result::Result<(api::ContainerConfig, ImageSubPaths), String> {
        let Starting { pod, container, kind, target_id, restart_count, pod_ips, image, image_volumes } = starting;
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
        let command =
            container.command.iter().flatten().map(|c| crate::types::expansion::expand(c, &env_map)).collect();
        let args = container.args.iter().flatten().map(|c| crate::types::expansion::expand(c, &env_map)).collect();
        let log_dir = self.pod_log_dir(pod).join(&container.name);
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| format!("creating container log directory {}: {e}", log_dir.display()))?;
        let ContainerMounts { mut mounts, image_sub_paths, devices } =
            self.make_mounts(pod, container, pod_ips, image_volumes, &envs).await?;
        // A pod of its own user namespace: the same mappings for every container, and
        // for its mounts (idmapped by the runtime).
        let userns = self.user_namespace(pod)?;
        crate::runtime::userns::map_mounts(&mut mounts, Some(&userns));
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
        let image_user = security_context::ImageUser::from_image(image);
        security_context::verify_run_as_non_root(pod, container, &image_user).map_err(|e| e.to_string())?;
        let security = security_context::container_security_context(pod, container, &image_user, &self.security)
            .map_err(|e| e.to_string())?;
        let linux = api::LinuxContainerConfig {
            resources: Some(crate::cm::linux_container_resources(pod, container)),
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    userns_options: Some(userns),
                    ..container_namespaces(pod.spec.as_ref(), target_id)
                }),
                ..security
            }),
        };
        let config = api::ContainerConfig {
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
            devices,
            labels: labels::container_labels(pod, container, kind),
            annotations: labels::container_annotations(pod, container, restart_count),
            log_path: format!("{}/{restart_count}.log", container.name),
            stdin: container.stdin.unwrap_or(false),
            stdin_once: container.stdin_once.unwrap_or(false),
            tty: container.tty.unwrap_or(false),
            linux: Some(linux),
            ..Default::default()
        };
        Ok((config, image_sub_paths))
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
        image_volumes: &ImageVolumes,
        envs: &[(String, String)],
    ) -> std::result::Result<ContainerMounts, String> {
        let spec = pod.spec.as_ref().ok_or_else(|| no_spec(pod))?;
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let volumes = match self.volumes.mounted_volumes(uid) {
            Some(v) => v,
            None => self.volumes.mount_pod_volumes(pod).await.map_err(|e| e.to_string())?,
        };
        let mut out =
            self.volumes.container_mounts(container, &volumes, image_volumes, envs).map_err(|e| e.to_string())?;
        let mounts = &mut out.mounts;
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
            // Any container user writes its message there (upstream chmods it 0666 too).
            std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o666))
                .map_err(|e| format!("chmod {}: {e}", file.display()))?;
            mounts.push(api::Mount {
                container_path: term_path,
                host_path: file.to_string_lossy().into_owned(),
                ..Default::default()
            });
        }
        Ok(out)
    }

    /// Keeps only the newest instance of each init container (upstream
    /// `pruneInitContainersBeforeStart`), so restarts do not pile up exited containers;
    /// true when it asked the runtime to remove any.
    pub(super) async fn prune_init_containers(&self, spec: &PodSpec, status: &RuntimePodStatus) -> bool {
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
    pub(super) fn grace_period(pod: Option<&Pod>, grace_override: Option<i64>) -> i64 {
        grace_override
            .or_else(|| pod.and_then(|p| p.spec.as_ref()).and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(DEFAULT_GRACE_PERIOD_SECS)
    }

    /// Runs the container's preStop hook, if any, within `grace` seconds; returns the
    /// grace period left for `StopContainer` (never under the 2 s minimum).
    pub(super) async fn pre_stop(&self, pod: &Pod, id: &str, name: &str, grace: i64, pod_ips: &[String]) -> i64 {
        use crate::lifecycle::hooks;
        let Some(container) = Self::container_spec(pod, name) else { return grace.max(MINIMUM_GRACE_PERIOD_SECS) };
        // Upstream runs the hook only within a grace period (a reset kills with none).
        let Some(handler) = container.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).filter(|_| grace > 0) else {
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
    pub(super) async fn kill_container(
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

    /// Removes a container, telling the container manager's hooks first (upstream
    /// `removeContainer` calls `PostStopContainer`).
    pub(super) async fn remove_container(&self, id: &str) -> Result<()> {
        for h in &self.container_hooks {
            h.post_stop_container(id);
        }
        self.rt.remove_container(id).await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::container::fake::exec_response;
    use crate::runtime::manager::testing::{app_config, cluster_dns, env, events, hooked, pod, setup};

    #[test]
    fn a_start_error_prints_its_reason_and_message_and_keeps_a_pull_back_off() {
        let e = StartError::new(reasons::RUN_CONTAINER_ERROR, "exec format error");
        assert_eq!(e.to_string(), "RunContainerError: exec format error");
        assert_eq!(e.retry_after, None);
        let pull = PullError {
            reason: reasons::IMAGE_PULL_BACK_OFF,
            message: "Back-off pulling image \"img\"".into(),
            retry_after: Some(Duration::from_secs(20)),
        };
        let e = StartError::from(pull.clone());
        assert_eq!(e.to_string(), pull.to_string());
        assert_eq!(
            e,
            StartError {
                reason: "ImagePullBackOff",
                message: "Back-off pulling image \"img\"".into(),
                retry_after: Some(Duration::from_secs(20)),
            }
        );
    }

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

    /// An image as `ensure_image_exists` hands it back when it read no status: the
    /// container config asks the runtime for the image's user itself.
    fn unchecked_image(image_ref: &str) -> EnsuredImage {
        EnsuredImage { image_ref: image_ref.into(), status: None }
    }

    /// A regular container's first start, with `image`.
    fn regular<'a>(
        pod: &'a Pod,
        container: &'a Container,
        image: &'a EnsuredImage,
        pod_ips: &'a [String],
    ) -> Starting<'a> {
        static NO_IMAGE_VOLUMES: std::sync::LazyLock<ImageVolumes> = std::sync::LazyLock::new(ImageVolumes::new);
        Starting {
            pod,
            container,
            kind: ContainerKind::Regular,
            target_id: None,
            restart_count: 0,
            pod_ips,
            image,
            image_volumes: &NO_IMAGE_VOLUMES,
        }
    }

    #[tokio::test]
    async fn container_config_has_volumes_env_and_hosts() {
        let e = env(cluster_dns(tempfile::tempdir().unwrap().path()));
        e.src.set_config_map(app_config("debug"));
        let p = pod();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let ips = vec!["10.0.0.7".to_string()];
        let (cfg, _) = e.rm.container_config(regular(&p, c, &unchecked_image("img"), &ips)).await.unwrap();
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
        let (cfg, _) = e.rm.container_config(regular(&p, &c, &unchecked_image("img"), &[])).await.unwrap();
        let sc = cfg.linux.unwrap().security_context.unwrap();
        assert_eq!(sc.supplemental_groups, [2000]);
        assert_eq!(sc.seccomp.unwrap().profile_type, api::security_profile::ProfileType::RuntimeDefault as i32);
        // The fake runtime does not know "img": treated as root, as upstream.
        assert_eq!(sc.run_as_user, Some(api::Int64Value { value: 0 }));
        assert!(sc.namespace_options.is_some());
        let sb = e.rm.sandbox_config(&p, 0).unwrap().linux.unwrap().security_context.unwrap();
        assert_eq!(sb.supplemental_groups, [2000]);
        p.spec.as_mut().unwrap().security_context.as_mut().unwrap().run_as_non_root = Some(true);
        let err = e.rm.container_config(regular(&p, &c, &unchecked_image("img"), &[])).await.unwrap_err();
        assert!(err.starts_with("container has runAsNonRoot and image will run as root (pod: "), "{err}");
    }

    #[tokio::test]
    async fn env_errors_are_create_container_config_errors() {
        let e = env(dns::DnsSettings::default());
        let p = pod();
        e.src
            .set_config_map(serde_json::from_value(json!({"metadata": {"name": "app", "namespace": "shop"}})).unwrap());
        let c = &p.spec.as_ref().unwrap().containers[0];
        let err = e.rm.container_config(regular(&p, c, &unchecked_image("img"), &[])).await.unwrap_err();
        assert_eq!(err, "couldn't find key level in ConfigMap shop/app");
    }

    /// The image manager's `ImageStatus` (presence check, or the one after a pull) is the
    /// one the container config reads the image user from: no second call per start.
    #[tokio::test]
    async fn a_container_start_reads_the_image_status_once_and_uses_its_user() {
        let (_dir, fake, _recorder, rm) = setup();
        let user = |name: &str, uid: i64| api::Image {
            uid: Some(api::Int64Value { value: uid }),
            ..crate::container::fake::fake_image(name)
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
        assert!(r.errors().is_empty(), "{:?}", r.errors());
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
            r.errors().iter().any(|e| e.contains("container has runAsNonRoot and image will run as root")),
            "{:?}",
            r.errors()
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
        assert!(r.errors().iter().any(|e| e.starts_with("PostStartHookError")), "{:?}", r.errors());
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
        assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
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
