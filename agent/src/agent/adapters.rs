//! Adapters that join two subsystems at a trait the consumer owns: the server's `/pods`
//! and `/healthz` check, the container GC's view of pods, and the evented PLEG's sink
//! onto the node event API.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::event_api::{EventBus, NodeEvent, NodeEventKind};
use crate::pleg::PodLifecycleEventGenerator;
use crate::pleg::evented::{Observed, ObservedKind, ObservedSink};
use crate::pod_manager::PodManager;
use crate::server::{HealthCheck, PodsProvider};
use crate::status::StatusProvider;

/// `/pods`: desired pods with their latest status, as the kubelet serves them.
#[derive(Debug)]
pub(super) struct PodsView {
    pub(super) manager: PodManager,
    pub(super) status: Arc<dyn StatusProvider>,
}

impl PodsProvider for PodsView {
    fn pods(&self) -> Vec<Pod> {
        self.manager
            .pods()
            .into_iter()
            .map(|p| {
                let mut p = Arc::unwrap_or_clone(p);
                if let Some(s) = p.metadata.uid.as_deref().and_then(|u| self.status.get(u)) {
                    p.status = Some(s);
                }
                p
            })
            .collect()
    }
}

/// `/healthz` check `pleg`; its note says which PLEG runs and, for a fallback, why.
#[derive(Debug)]
pub(super) struct PlegHealth(pub(super) Arc<dyn PodLifecycleEventGenerator>);

impl HealthCheck for PlegHealth {
    fn name(&self) -> &'static str {
        "pleg"
    }

    fn check(&self) -> Result<(), String> {
        self.0.healthy()
    }

    fn detail(&self) -> Option<String> {
        Some(self.0.describe())
    }
}

/// What the container GC needs to know of pods: gone = neither desired nor being worked on.
#[derive(Debug)]
pub(super) struct GcPods {
    pub(super) manager: PodManager,
    pub(super) workers: crate::pod_workers::PodWorkers,
}

impl crate::gc::PodPresence for GcPods {
    fn sources_ready(&self) -> bool {
        self.manager.sources_ready()
    }

    fn is_gone(&self, pod_uid: &str) -> bool {
        self.manager.get(pod_uid).is_none() && !self.workers.known_uids().contains(pod_uid)
    }
}

/// Publishes what the evented PLEG observed on the node event API, with the pod's and
/// container's names.
/// A container's first exec also goes into its pod's start trace.
pub(super) fn observed_sink(
    bus: EventBus,
    pods: PodManager,
    cache: Arc<crate::container::cache::RuntimeCache>,
    startup: Arc<crate::pod_startup::PodStartupTracker>,
) -> ObservedSink {
    // Runs for every kernel event: looks up the two names, copies neither the pod nor the
    // runtime's pods.
    Arc::new(move |o: Observed| {
        let (pod_namespace, pod_name) = pods.namespace_and_name(&o.pod_uid).unwrap_or_default();
        let container_name = if o.container_name.is_empty() {
            cache.container_name(&o.pod_uid, &o.container_id).unwrap_or_default()
        } else {
            o.container_name.clone()
        };
        if o.kind == ObservedKind::ContainerStarted {
            startup.first_exec(
                &o.pod_uid,
                &container_name,
                &o.container_id,
                crate::container::exits::wall_time_of(o.kernel_time_ns),
            );
        }
        let kind = match o.kind {
            ObservedKind::ContainerStarted => NodeEventKind::ContainerStarted,
            ObservedKind::ContainerDied => NodeEventKind::ContainerDied,
            ObservedKind::OomKilled => NodeEventKind::ContainerOomKilled,
            ObservedKind::CgroupCreated => NodeEventKind::CgroupCreated,
            ObservedKind::CgroupRemoved => NodeEventKind::CgroupRemoved,
            ObservedKind::MemoryPressure => NodeEventKind::MemoryPressure,
        };
        bus.publish(NodeEvent {
            pod_uid: o.pod_uid,
            pod_namespace,
            pod_name,
            container_id: o.container_id,
            container_name,
            kernel_time_ns: Some(o.kernel_time_ns),
            exit_code: o.exit_code,
            signal: o.signal,
            oom_killed: o.kind == ObservedKind::OomKilled,
            ..NodeEvent::new(kind)
        });
    })
}
