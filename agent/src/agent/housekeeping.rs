//! Image and container garbage collection, and node-pressure eviction.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::adapters::GcPods;
use super::pods::Pods;
use super::{Base, Task, task};

/// The eviction manager's task and the kernel's memory-pressure watchers that wake it.
pub(super) struct EvictionTasks {
    pub(super) manager: Task,
    /// What the kernel's memory-pressure watchers need; `None` with
    /// `--eviction-kernel-signals=false`.
    pub(super) kernel_signals: Option<(crate::pressure::PressureSignals, crate::pressure::MemcgThresholdSettings)>,
}

/// Image and container garbage collection, and their tasks.
pub(super) struct GarbageCollection {
    pub(super) image_gc: Option<Arc<crate::images::gc::ImageGcManager>>,
    pub(super) image_gc_task: Option<Task>,
    pub(super) container_gc: Arc<crate::gc::ContainerGc>,
    pub(super) container_gc_task: Task,
}

/// Builds image GC (which asks the runtime for its sandbox image when no flag names one)
/// and container GC.
pub(super) async fn garbage_collection(base: &Base, pods: &Pods) -> GarbageCollection {
    let Base { cfg, rt, metrics, recorder, shutdown, .. } = base;
    // Image GC keeps the sandbox image: the flag's, else the runtime's own.
    let sandbox_image = match &cfg.pod_infra_container_image {
        Some(image) => Some(image.clone()),
        None => match rt.status(true).await {
            Ok(status) => crate::container::sandbox_image_of(&status),
            Err(e) => {
                tracing::warn!(error = %e, "runtime status");
                None
            }
        },
    };
    let (image_gc, image_gc_task) = match crate::images::gc::ImageGcManager::new(
        rt.clone(),
        Arc::new(crate::images::gc::Statvfs),
        crate::settings::image_gc(&cfg.kubelet),
        metrics.images.clone(),
    ) {
        Ok(gc) => {
            let mut gc =
                gc.with_recorder(recorder.clone(), &cfg.node_name).with_period(crate::settings::image_gc_period(cfg));
            if let Some(image) = &sandbox_image {
                tracing::info!(%image, "image GC keeps the sandbox image");
                gc = gc.with_sandbox_image(image);
            } else {
                tracing::warn!(
                    "the runtime did not name its sandbox image; set --pod-infra-container-image so image GC keeps it"
                );
            }
            let gc = Arc::new(gc);
            let task = task(gc.clone().run(shutdown.clone()), tracing::info_span!("image_gc"));
            (Some(gc), Some(task))
        }
        Err(e) => {
            tracing::error!(error = %e, "image GC is off");
            (None, None)
        }
    };
    let gc_pods = Arc::new(GcPods { manager: pods.pod_manager.clone(), workers: pods.workers.clone() });
    let container_gc = Arc::new(crate::gc::ContainerGc::new(rt.clone(), gc_pods, crate::settings::container_gc(cfg)));
    let container_gc_task = task(
        container_gc.clone().run(crate::gc::CONTAINER_GC_PERIOD, shutdown.clone()),
        tracing::info_span!("container_gc"),
    );
    GarbageCollection { image_gc, image_gc_task, container_gc, container_gc_task }
}

/// The node-pressure eviction manager: it reads the stats, kills through the pod workers
/// and reclaims through the garbage collectors, and is woken by `pressure`'s signals.
#[expect(clippy::too_many_arguments, reason = "one step of build, given what the steps before made")]
pub(super) fn eviction(
    base: &Base,
    pods: &Pods,
    gc: &GarbageCollection,
    stats: &Arc<crate::stats::provider::StatsProvider>,
    config: crate::eviction::EvictionConfig,
    metrics: crate::eviction::EvictionMetrics,
    pressure: crate::pressure::PressureSignals,
    signals: mpsc::Receiver<crate::pressure::PressureSignal>,
) -> (Arc<crate::eviction::EvictionManager>, EvictionTasks) {
    use crate::eviction::adapters::{AgentKiller, AgentPods, AgentReclaimer, AgentStats};
    let Base { cfg, recorder, shutdown, .. } = base;
    let manager = Arc::new(crate::eviction::EvictionManager::new(
        config,
        crate::eviction::Dependencies {
            stats: Arc::new(AgentStats { provider: stats.clone(), root_dir: cfg.root_dir.clone() }),
            pods: Arc::new(AgentPods {
                manager: pods.pod_manager.clone(),
                workers: pods.workers.clone(),
                status: pods.status.clone(),
            }),
            killer: Arc::new(AgentKiller { workers: pods.workers.clone() }),
            reclaimer: Arc::new(AgentReclaimer { containers: gc.container_gc.clone(), images: gc.image_gc.clone() }),
            recorder: recorder.clone(),
            metrics,
            node_name: cfg.node_name.clone(),
            records: base.bus.clone(),
        },
    ));
    let tasks = EvictionTasks {
        manager: task(manager.clone().run(signals, shutdown.clone()), tracing::info_span!("eviction")),
        kernel_signals: cfg
            .swiftlet
            .eviction_kernel_signals
            .then(|| (pressure, crate::settings::memcg_thresholds(&cfg.kubelet))),
    };
    (manager, tasks)
}
