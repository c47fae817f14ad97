//! The agent-side event type: what the PLEG, the OOM watcher and the eviction manager
//! publish on the [`EventBus`](super::EventBus), and its conversion into the wire type.
//! Kept separate from the generated `proto::NodeEvent` so publishers use plain Rust types
//! (`Option`, `SystemTime`) and never depend on prost's representation.

use std::time::SystemTime;

use super::proto;

/// What a [`NodeEvent`] is about. Mirrors `swiftlet.events.v1.EventKind` without its
/// `UNSPECIFIED` value, which the agent never sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeEventKind {
    /// A container's main process started (its first exec in the container's cgroup).
    ContainerStarted,
    /// A container's main process exited.
    ContainerDied,
    /// The kernel OOM killer killed a process in a container's cgroup.
    ContainerOomKilled,
    /// The container runtime removed a container.
    ContainerRemoved,
    /// A pod or container cgroup was created.
    CgroupCreated,
    /// A pod or container cgroup was removed.
    CgroupRemoved,
    /// Memory pressure on a pod's cgroup, or on the node when no pod is set.
    MemoryPressure,
    /// Record: a PLEG event reached the pod's worker.
    PlegEventDispatched,
    /// Record: a pod worker computed the pod's status.
    PodStatusComputed,
    /// Record: the eviction manager chose the pod to evict.
    EvictionDecided,
}

impl NodeEventKind {
    /// The agent's records (sent only to a `Watch` that names them), as opposed to what
    /// happened on the node.
    #[must_use]
    pub fn is_record(self) -> bool {
        matches!(self, Self::PlegEventDispatched | Self::PodStatusComputed | Self::EvictionDecided)
    }
}

impl From<NodeEventKind> for proto::EventKind {
    fn from(kind: NodeEventKind) -> Self {
        match kind {
            NodeEventKind::ContainerStarted => Self::ContainerStarted,
            NodeEventKind::ContainerDied => Self::ContainerDied,
            NodeEventKind::ContainerOomKilled => Self::ContainerOomKilled,
            NodeEventKind::ContainerRemoved => Self::ContainerRemoved,
            NodeEventKind::CgroupCreated => Self::CgroupCreated,
            NodeEventKind::CgroupRemoved => Self::CgroupRemoved,
            NodeEventKind::MemoryPressure => Self::MemoryPressure,
            NodeEventKind::PlegEventDispatched => Self::PlegEventDispatched,
            NodeEventKind::PodStatusComputed => Self::PodStatusComputed,
            NodeEventKind::EvictionDecided => Self::EvictionDecided,
        }
    }
}

/// One thing that happened on the node. Fields that do not apply to the kind stay
/// empty; see `proto/swiftlet/events/v1/events.proto` for each field's meaning.
///
/// Build one with struct update syntax over [`NodeEvent::new`]:
/// `NodeEvent { pod_uid, container_id, exit_code: Some(1), ..NodeEvent::new(NodeEventKind::ContainerDied) }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    /// The pod's `metadata.uid`; empty for node-level events.
    pub pod_uid: String,
    /// The pod's namespace; empty for node-level events.
    pub pod_namespace: String,
    /// The pod's name; empty for node-level events.
    pub pod_name: String,
    /// The CRI container id (no `containerd://` prefix); empty when not about a container.
    pub container_id: String,
    /// The container's name in the pod spec; empty when not about a container.
    pub container_name: String,
    /// What happened.
    pub kind: NodeEventKind,
    /// `CLOCK_MONOTONIC` nanoseconds of the kernel event; `None` when the event did not
    /// come from the kernel (sent as 0 on the wire).
    pub kernel_time_ns: Option<u64>,
    /// When the agent observed the event.
    pub observed_at: SystemTime,
    /// Exit code of the container's main process, when known.
    pub exit_code: Option<i32>,
    /// Signal that killed the container's main process, when it died of one.
    pub signal: Option<i32>,
    /// The OOM killer killed a process in the container's cgroup.
    pub oom_killed: bool,
    /// Human-readable detail, for people and logs.
    pub message: String,
    /// Records: `CLOCK_MONOTONIC` nanoseconds of what the agent did.
    pub agent_time_ns: Option<u64>,
    /// [`NodeEventKind::PlegEventDispatched`]: the PLEG event's type.
    pub pleg_event: String,
    /// [`NodeEventKind::PodStatusComputed`]: each container's state.
    pub containers: Vec<ContainerSummary>,
    /// [`NodeEventKind::EvictionDecided`]: the decision.
    pub eviction: Option<EvictionRecord>,
}

/// One container in a [`NodeEventKind::PodStatusComputed`] record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSummary {
    pub name: String,
    /// `running`, `terminated` or `waiting`.
    pub state: &'static str,
    pub restart_count: u32,
}

/// What a [`NodeEventKind::EvictionDecided`] record says about the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionRecord {
    /// The signal whose threshold was crossed (`memory.available`, ...).
    pub eviction_signal: String,
    /// `periodic`, or the kernel signal's source (`memcg_threshold`, `psi`, ...).
    pub trigger: String,
    /// `CLOCK_MONOTONIC` ns when the deciding pass started.
    pub pass_time_ns: u64,
    /// `CLOCK_MONOTONIC` ns when the signal that started the pass arrived; 0 if periodic.
    pub signal_time_ns: u64,
}

impl NodeEvent {
    /// An event of `kind` observed now, with every other field empty.
    #[must_use]
    pub fn new(kind: NodeEventKind) -> Self {
        Self {
            pod_uid: String::new(),
            pod_namespace: String::new(),
            pod_name: String::new(),
            container_id: String::new(),
            container_name: String::new(),
            kind,
            kernel_time_ns: None,
            observed_at: SystemTime::now(),
            exit_code: None,
            signal: None,
            oom_killed: false,
            message: String::new(),
            agent_time_ns: None,
            pleg_event: String::new(),
            containers: Vec::new(),
            eviction: None,
        }
    }

    /// An event of `kind` about `pod` (its UID, namespace and name) observed now, with
    /// every other field empty.
    #[must_use]
    pub fn for_pod(kind: NodeEventKind, pod: &k8s_openapi::api::core::v1::Pod) -> Self {
        let meta = &pod.metadata;
        Self {
            pod_uid: meta.uid.clone().unwrap_or_default(),
            pod_namespace: meta.namespace.clone().unwrap_or_default(),
            pod_name: meta.name.clone().unwrap_or_default(),
            ..Self::new(kind)
        }
    }
}

impl From<&NodeEvent> for proto::NodeEvent {
    fn from(ev: &NodeEvent) -> Self {
        Self {
            pod_uid: ev.pod_uid.clone(),
            pod_namespace: ev.pod_namespace.clone(),
            pod_name: ev.pod_name.clone(),
            container_id: ev.container_id.clone(),
            container_name: ev.container_name.clone(),
            kind: proto::EventKind::from(ev.kind).into(),
            kernel_time_ns: ev.kernel_time_ns.unwrap_or(0),
            observed_at: Some(ev.observed_at.into()),
            exit_code: ev.exit_code,
            signal: ev.signal,
            oom_killed: ev.oom_killed,
            message: ev.message.clone(),
            agent_time_ns: ev.agent_time_ns.unwrap_or(0),
            pleg_event: ev.pleg_event.clone(),
            containers: ev
                .containers
                .iter()
                .map(|c| proto::ContainerSummary {
                    name: c.name.clone(),
                    state: c.state.to_owned(),
                    restart_count: c.restart_count,
                })
                .collect(),
            eviction: ev.eviction.as_ref().map(|e| proto::EvictionDecision {
                eviction_signal: e.eviction_signal.clone(),
                trigger: e.trigger.clone(),
                pass_time_ns: e.pass_time_ns,
                signal_time_ns: e.signal_time_ns,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn converts_every_field() {
        let ev = NodeEvent {
            pod_uid: "uid-1".into(),
            pod_namespace: "ns".into(),
            pod_name: "web".into(),
            container_id: "abc".into(),
            container_name: "app".into(),
            kernel_time_ns: Some(42),
            observed_at: SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5),
            exit_code: Some(137),
            signal: Some(9),
            oom_killed: true,
            message: "killed".into(),
            ..NodeEvent::new(NodeEventKind::ContainerDied)
        };
        let wire = proto::NodeEvent::from(&ev);
        assert_eq!(wire.pod_uid, "uid-1");
        assert_eq!(wire.pod_namespace, "ns");
        assert_eq!(wire.pod_name, "web");
        assert_eq!(wire.container_id, "abc");
        assert_eq!(wire.container_name, "app");
        assert_eq!(wire.kind(), proto::EventKind::ContainerDied);
        assert_eq!(wire.kernel_time_ns, 42);
        assert_eq!(wire.observed_at, Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 5 }));
        assert_eq!(wire.exit_code, Some(137));
        assert_eq!(wire.signal, Some(9));
        assert!(wire.oom_killed);
        assert_eq!(wire.message, "killed");
    }

    #[test]
    fn records_carry_their_details_to_the_wire() {
        let status = NodeEvent {
            agent_time_ns: Some(7),
            containers: vec![ContainerSummary { name: "c0".into(), state: "terminated", restart_count: 2 }],
            ..NodeEvent::new(NodeEventKind::PodStatusComputed)
        };
        let wire = proto::NodeEvent::from(&status);
        assert_eq!(wire.kind(), proto::EventKind::PodStatusComputed);
        assert_eq!(wire.agent_time_ns, 7);
        assert_eq!(
            wire.containers[0],
            proto::ContainerSummary { name: "c0".into(), state: "terminated".into(), restart_count: 2 }
        );
        let eviction = NodeEvent {
            eviction: Some(EvictionRecord {
                eviction_signal: "memory.available".into(),
                trigger: "psi".into(),
                pass_time_ns: 3,
                signal_time_ns: 2,
            }),
            ..NodeEvent::new(NodeEventKind::EvictionDecided)
        };
        let wire = proto::NodeEvent::from(&eviction).eviction.unwrap();
        assert_eq!((wire.trigger.as_str(), wire.pass_time_ns, wire.signal_time_ns), ("psi", 3, 2));
        assert!(NodeEventKind::EvictionDecided.is_record() && !NodeEventKind::ContainerDied.is_record());
    }

    #[test]
    fn not_from_the_kernel_is_zero_on_the_wire() {
        let wire = proto::NodeEvent::from(&NodeEvent::new(NodeEventKind::MemoryPressure));
        assert_eq!(wire.kernel_time_ns, 0);
        assert_eq!(wire.exit_code, None);
        assert_eq!(wire.kind(), proto::EventKind::MemoryPressure);
    }

    #[test]
    fn every_kind_maps_to_a_specified_wire_kind() {
        use NodeEventKind::*;
        for kind in [
            ContainerStarted,
            ContainerDied,
            ContainerOomKilled,
            ContainerRemoved,
            CgroupCreated,
            CgroupRemoved,
            MemoryPressure,
            PlegEventDispatched,
            PodStatusComputed,
            EvictionDecided,
        ] {
            assert_ne!(proto::EventKind::from(kind), proto::EventKind::Unspecified, "{kind:?}");
        }
    }
}
