//! The PLEG the agent runs: evented (eBPF) when it loads, else the relist alone.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::adapters::{PlegHealth, observed_sink};
use super::node::NodeResources;
use super::pods::Pods;
use super::{Base, Task, task};
use crate::event_api::EventBus;
use crate::pleg::PodLifecycleEventGenerator;
use crate::pleg::evented::{CgroupIndex, EventedPleg};
use crate::pleg::relist::{GenericPleg, RELIST_PERIOD, RELIST_THRESHOLD};

/// The PLEG the agent runs, known by its trait alone (`/healthz` asks it), and its task.
pub(super) struct Pleg {
    pub(super) health: Arc<PlegHealth>,
    pub(super) task: Task,
}

/// The evented PLEG when asked for and the kernel lets us (the eBPF sensors load here);
/// else the 1 s relist alone. Either writes the runtime cache; its events go to `events`.
pub(super) fn build(
    base: &Base,
    node: &NodeResources,
    pods: &Pods,
    bus: EventBus,
    pressure: &crate::pressure::PressureSignals,
    events: mpsc::Sender<crate::pleg::PodLifecycleEvent>,
) -> Pleg {
    let Base { cfg, rt, metrics, shutdown, .. } = base;
    let sensors = if cfg.swiftlet.evented_pleg {
        crate::pleg::sensors::start(&node.kubepods_dirs, cfg.swiftlet.evented_pleg_ring_buffer_bytes, shutdown)
    } else {
        Err("disabled by --evented-pleg=false".to_string())
    };
    let pleg: Arc<dyn PodLifecycleEventGenerator> = match sensors {
        Ok(running) => {
            let relist = GenericPleg::new(
                rt.clone(),
                metrics.pleg.clone(),
                pods.cache.clone(),
                cfg.swiftlet.pleg_relist_period,
                RELIST_THRESHOLD,
            );
            let mut index = CgroupIndex::default();
            if let Some(d) = &node.kubepods_dirs.cgroup2 {
                index.scan(crate::pleg::evented::CGROUP2_HIERARCHY, d);
            }
            let memory_hierarchy = crate::pleg::sensors::memory_hierarchy_id();
            if let Some(d) = &node.kubepods_dirs.memory_v1 {
                index.scan(memory_hierarchy, d);
            }
            pods.startup.set_first_execs_reported(true);
            let sink = observed_sink(bus, pods.pod_manager.clone(), pods.cache.clone(), pods.startup.clone());
            let evented = EventedPleg::new(
                relist,
                rt.clone(),
                metrics.pleg.clone(),
                cfg.swiftlet.pleg_relist_period,
                index,
                memory_hierarchy,
                Some(sink),
            );
            let evented =
                if cfg.swiftlet.eviction_kernel_signals { evented.with_pressure(pressure.clone()) } else { evented };
            tracing::info!(
                safety_relist = ?cfg.swiftlet.pleg_relist_period,
                ring_buffer_bytes = cfg.swiftlet.evented_pleg_ring_buffer_bytes,
                "evented PLEG: container lifecycle from the kernel (eBPF)"
            );
            // Loading parsed the kernel's BTF; give that memory back.
            crate::memory::trim();
            Arc::new(evented.with_sensors(running))
        }
        Err(why) => {
            tracing::warn!(reason = %why, "evented PLEG unavailable; running the {}s relisting PLEG", RELIST_PERIOD.as_secs());
            metrics.pleg.evented_pleg_active.set(0);
            Arc::new(
                GenericPleg::new(rt.clone(), metrics.pleg.clone(), pods.cache.clone(), RELIST_PERIOD, RELIST_THRESHOLD)
                    .with_fallback_reason(why),
            )
        }
    };
    let task = task(pleg.start(events, shutdown.clone()), tracing::info_span!("pleg"));
    Pleg { health: Arc::new(PlegHealth(pleg)), task }
}
