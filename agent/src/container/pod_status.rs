//! The runtime's view of a pod (`kubecontainer.PodStatus` upstream): its sandboxes and
//! every container the runtime still has for it, newest first, decoded from CRI.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::labels::{self, PodRef};
use super::{RuntimeService, api};

/// State of a container as the runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl ContainerState {
    #[must_use]
    pub fn from_cri(state: i32) -> Self {
        match api::ContainerState::try_from(state) {
            Ok(api::ContainerState::ContainerCreated) => Self::Created,
            Ok(api::ContainerState::ContainerRunning) => Self::Running,
            Ok(api::ContainerState::ContainerExited) => Self::Exited,
            _ => Self::Unknown,
        }
    }

    /// The `container_state` label value upstream uses in `kubelet_running_containers`.
    #[must_use]
    pub fn as_metric_label(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Unknown => "unknown",
        }
    }
}

/// Converts CRI nanoseconds since the epoch; 0 means "not set".
#[must_use]
pub fn time_from_nanos(ns: i64) -> Option<SystemTime> {
    (ns > 0).then(|| UNIX_EPOCH + Duration::from_nanos(ns as u64))
}

/// One container as the runtime knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeContainerStatus {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    pub exit_code: i32,
    pub image: String,
    pub image_ref: String,
    pub reason: String,
    pub message: String,
    pub hash: String,
    pub restart_count: u32,
    pub init: bool,
    /// Where its termination message comes from (for an exit the kernel reports first).
    pub termination_message: super::termination_message::Source,
    /// The user its process runs as, as the runtime reports it (CRI
    /// `ContainerStatus.user`: containerd 2.x, not 1.6): the API status' `user`.
    pub user: Option<LinuxUser>,
}

/// A container process's uid, gid and supplementary groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxUser {
    pub uid: i64,
    pub gid: i64,
    pub supplemental_groups: Vec<i64>,
}

impl RuntimeContainerStatus {
    /// A running container `name` with runtime id `id` in sandbox `sb`, everything else
    /// empty: a fixture for other modules' tests.
    #[cfg(test)]
    #[must_use]
    pub fn running_for_test(name: &str, id: &str) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            sandbox_id: "sb".into(),
            state: ContainerState::Running,
            created_at: 1,
            started_at: None,
            finished_at: None,
            exit_code: 0,
            image: String::new(),
            image_ref: String::new(),
            reason: String::new(),
            message: String::new(),
            hash: String::new(),
            restart_count: 0,
            init: false,
            termination_message: super::termination_message::Source::default(),
            user: None,
        }
    }

    /// Builds the status from a `ContainerStatus` answer and the list entry it belongs to.
    #[must_use]
    pub fn from_cri(listed: &api::Container, status: Option<&api::ContainerStatus>) -> Self {
        let annotations = status.map_or(&listed.annotations, |s| &s.annotations);
        let labels = status.map_or(&listed.labels, |s| &s.labels);
        let name = listed
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .or_else(|| labels.get(labels::CONTAINER_NAME).cloned())
            .unwrap_or_default();
        let restart_count = annotations
            .get(labels::CONTAINER_RESTART_COUNT)
            .and_then(|v| v.parse().ok())
            .or_else(|| listed.metadata.as_ref().map(|m| m.attempt))
            .unwrap_or(0);
        Self {
            id: listed.id.clone(),
            name,
            sandbox_id: listed.pod_sandbox_id.clone(),
            state: ContainerState::from_cri(status.map_or(listed.state, |s| s.state)),
            created_at: status.map_or(listed.created_at, |s| s.created_at),
            started_at: status.and_then(|s| time_from_nanos(s.started_at)),
            finished_at: status.and_then(|s| time_from_nanos(s.finished_at)),
            exit_code: status.map_or(0, |s| s.exit_code),
            // The runtime's status names the image as the user knows it (containerd: its
            // first repo tag); the listing has what the container was created from (the id).
            image: status
                .and_then(|s| s.image.as_ref())
                .or(listed.image.as_ref())
                .map(|i| i.image.clone())
                .unwrap_or_default(),
            image_ref: status.map_or_else(|| listed.image_ref.clone(), |s| s.image_ref.clone()),
            reason: status.map(|s| s.reason.clone()).unwrap_or_default(),
            message: status.map(|s| s.message.clone()).unwrap_or_default(),
            hash: annotations.get(labels::CONTAINER_HASH).cloned().unwrap_or_default(),
            restart_count,
            init: labels.get(labels::CONTAINER_TYPE).is_some_and(|t| t == "init"),
            termination_message: status.map(super::termination_message::Source::of).unwrap_or_default(),
            user: status.and_then(|s| s.user.as_ref()?.linux.as_ref()).map(|u| LinuxUser {
                uid: u.uid,
                gid: u.gid,
                supplemental_groups: u.supplemental_groups.clone(),
            }),
        }
    }
}

/// Sandbox summary needed by the sync logic and the pod status.
#[derive(Clone, Debug, PartialEq)]
pub struct SandboxStatus {
    pub id: String,
    pub ready: bool,
    pub attempt: u32,
    pub created_at: i64,
    pub ips: Vec<String>,
    pub host_network: bool,
}

/// Everything the runtime has for one pod UID.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimePodStatus {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// Newest first.
    pub sandboxes: Vec<SandboxStatus>,
    /// Newest first.
    pub containers: Vec<RuntimeContainerStatus>,
    /// The resources the runtime reports per container id (`ContainerStatus.resources`),
    /// for the containers it reports them for.
    pub container_resources: HashMap<String, api::LinuxContainerResources>,
}

impl RuntimePodStatus {
    /// The newest container with this name (of either kind), as upstream
    /// `FindContainerStatusByName`.
    #[must_use]
    pub fn find_container(&self, name: &str) -> Option<&RuntimeContainerStatus> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The newest container with this name in the newest sandbox (upstream
    /// `FindActiveContainerStatusByName`): what an older sandbox ran says nothing about the
    /// current one.
    #[must_use]
    pub fn find_active_container(&self, name: &str) -> Option<&RuntimeContainerStatus> {
        let sandbox = &self.sandboxes.first()?.id;
        self.containers.iter().find(|c| c.name == name && &c.sandbox_id == sandbox)
    }

    /// IPs of the newest sandbox.
    #[must_use]
    pub fn ips(&self) -> &[String] {
        self.sandboxes.first().map_or(&[], |s| s.ips.as_slice())
    }

    /// Whether anything of the pod still runs.
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.sandboxes.iter().any(|s| s.ready) || self.containers.iter().any(|c| c.state == ContainerState::Running)
    }

    /// Fetches the status of one pod: its sandboxes (with IPs) and containers (with full
    /// container status), filtered by the pod UID label.
    pub async fn fetch(rt: &dyn RuntimeService, uid: &str) -> super::Result<Self> {
        let selector = HashMap::from([(labels::POD_UID.to_string(), uid.to_string())]);
        let mut sandboxes = rt
            .list_pod_sandbox(Some(api::PodSandboxFilter { label_selector: selector.clone(), ..Default::default() }))
            .await?;
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let mut out = Self { uid: uid.to_string(), ..Default::default() };
        if let Some(pr) = sandboxes.first().and_then(|s| PodRef::from_labels(&s.labels)) {
            out.name = pr.name;
            out.namespace = pr.namespace;
        }
        for s in &sandboxes {
            let ready = s.state == api::PodSandboxState::SandboxReady as i32;
            let mut ips = Vec::new();
            let mut host_network = false;
            // Only a ready sandbox has a network worth asking about; a stopped one may
            // already be gone from the runtime.
            if ready {
                match rt.pod_sandbox_status(&s.id).await {
                    Ok(st) => {
                        if let Some(net) = &st.network {
                            if !net.ip.is_empty() {
                                ips.push(net.ip.clone());
                            }
                            ips.extend(net.additional_ips.iter().map(|i| i.ip.clone()));
                        }
                        host_network = st
                            .linux
                            .as_ref()
                            .and_then(|l| l.namespaces.as_ref())
                            .and_then(|n| n.options.as_ref())
                            .is_some_and(|o| o.network == api::NamespaceMode::Node as i32);
                    }
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e),
                }
            }
            out.sandboxes.push(SandboxStatus {
                id: s.id.clone(),
                ready,
                attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
                created_at: s.created_at,
                ips,
                host_network,
            });
        }
        let mut containers =
            rt.list_containers(Some(api::ContainerFilter { label_selector: selector, ..Default::default() })).await?;
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in &containers {
            match rt.container_status(&c.id).await {
                Ok(st) => {
                    if let Some(linux) = st.resources.as_ref().and_then(|r| r.linux.clone()) {
                        out.container_resources.insert(c.id.clone(), linux);
                    }
                    let mut status = RuntimeContainerStatus::from_cri(c, Some(&st));
                    status.message = super::termination_message::message(&st);
                    out.containers.push(status);
                }
                // Removed between list and status: it no longer belongs to the pod.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// A pod as seen in a runtime listing (no per-container status calls): used by the
/// relisting PLEG and by housekeeping to find pods nobody wants.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimePod {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// sandbox id -> ready
    pub sandboxes: BTreeMap<String, bool>,
    /// container id -> (container name, state)
    pub containers: BTreeMap<String, (String, ContainerState)>,
}

impl RuntimePod {
    /// Groups a sandbox and container listing by pod UID. Objects without the pod UID
    /// label were not made by a kubelet and are ignored.
    #[must_use]
    pub fn group(sandboxes: &[api::PodSandbox], containers: &[api::Container]) -> BTreeMap<String, RuntimePod> {
        let mut pods: BTreeMap<String, RuntimePod> = BTreeMap::new();
        for s in sandboxes {
            let Some(pr) = PodRef::from_labels(&s.labels) else { continue };
            let p = pods.entry(pr.uid.clone()).or_insert_with(|| RuntimePod {
                uid: pr.uid,
                name: pr.name,
                namespace: pr.namespace,
                ..Default::default()
            });
            p.sandboxes.insert(s.id.clone(), s.state == api::PodSandboxState::SandboxReady as i32);
        }
        for c in containers {
            let Some(pr) = PodRef::from_labels(&c.labels) else { continue };
            let p = pods.entry(pr.uid.clone()).or_insert_with(|| RuntimePod {
                uid: pr.uid,
                name: pr.name,
                namespace: pr.namespace,
                ..Default::default()
            });
            let name = c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
            p.containers.insert(c.id.clone(), (name, ContainerState::from_cri(c.state)));
        }
        pods
    }

    /// Lists every kubelet-made pod in the runtime.
    pub async fn list_all(rt: &dyn RuntimeService) -> super::Result<BTreeMap<String, RuntimePod>> {
        let sandboxes = rt.list_pod_sandbox(None).await?;
        let containers = rt.list_containers(None).await?;
        Ok(Self::group(&sandboxes, &containers))
    }
}
