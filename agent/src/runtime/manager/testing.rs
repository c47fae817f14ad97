//! Fixtures of the runtime manager's tests: managers on the fake runtime, and the pods
//! they sync.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use serde_json::json;

use super::{RuntimeManager, RuntimeManagerConfig, RuntimeManagerDeps, dns};
use crate::cm::FakePodContainerManager;
use crate::container::Backoff;
use crate::container::fake::FakeRuntime;
use crate::events::{EventRecorder, MemoryRecorder};
use crate::images::puller::ImageManager;
use crate::volumes::{FakeMounter, FakeObjectSource, NoApiServer, NodeAllocatable, VolumeManager};

impl RuntimeManagerDeps {
    /// Test doubles for every dependency, on `rt`, with the directories in `dir`: node
    /// `node-1`, no cluster DNS, no start limit, no resource manager hooks, events kept in
    /// memory, volumes without an API server, an allocation manager and a prober of their
    /// own. Tests replace the fields they look at.
    pub(crate) fn fake(rt: Arc<FakeRuntime>, dir: &std::path::Path) -> Self {
        let recorder: Arc<dyn EventRecorder> = Arc::new(MemoryRecorder::new("node-1"));
        let cfg = RuntimeManagerConfig {
            pod_logs_dir: dir.join("logs"),
            root_dir: dir.join("root"),
            node_name: "node-1".into(),
            host_ip: None,
        };
        Self {
            images: Arc::new(ImageManager::new(
                rt.clone(),
                crate::images::puller::PullerConfig::default(),
                Arc::default(),
            )),
            cm: Arc::new(FakePodContainerManager::default()),
            backoff: Backoff::default(),
            volumes: Arc::new(VolumeManager::new(cfg.root_dir.clone(), Arc::new(NoApiServer))),
            dns: dns::DnsSettings::default(),
            cache: Arc::default(),
            probes: crate::prober::ProbeManager::new(
                Arc::new(crate::prober::runner::HandlerRunner::new(rt.clone())),
                recorder.clone(),
                Arc::new(crate::prober::metrics::ProberMetrics::new()),
            ),
            runtime_name: "fake".into(),
            startup: Arc::new(crate::pod_startup::PodStartupTracker::new(Arc::default())),
            container_hooks: Vec::new(),
            allocation: Arc::new(crate::allocation::AllocationManager::in_memory(
                crate::allocation::NodeResizeConfig::default(),
            )),
            start_concurrency: 0,
            security: crate::runtime::security_context::SecuritySettings::new(false, &cfg.root_dir, false),
            userns: Arc::new(
                crate::runtime::userns::UsernsManager::new(
                    &cfg.root_dir.join("pods"),
                    crate::runtime::userns::UNIT,
                    (crate::runtime::userns::UNIT, 0u32.wrapping_sub(crate::runtime::userns::UNIT)),
                    110,
                    Arc::default(),
                )
                .expect("the default mapping"),
            ),
            dra: None,
            runtime_classes: crate::runtime::runtime_class::RuntimeClasses::default(),
            devices: None,
            recorder,
            metrics: Arc::default(),
            cfg,
            rt,
        }
    }
}

/// A manager on `fake` with its directories in `dir`, recording events on `recorder` (the
/// image manager's too when `image_events`).
fn manager(
    dir: &std::path::Path,
    fake: Arc<FakeRuntime>,
    host_ip: Option<&str>,
    recorder: &Arc<MemoryRecorder>,
    image_events: bool,
) -> RuntimeManagerDeps {
    let mut deps = RuntimeManagerDeps::fake(fake.clone(), dir);
    let images = ImageManager::new(fake, crate::images::puller::PullerConfig::default(), Arc::default());
    deps.images = Arc::new(if image_events { images.with_recorder(recorder.clone()) } else { images });
    deps.cfg.host_ip = host_ip.map(Into::into);
    deps.recorder = recorder.clone();
    deps
}

/// A manager on a fake runtime that has the image `img`, recording events.
pub(super) fn setup() -> (tempfile::TempDir, Arc<FakeRuntime>, Arc<MemoryRecorder>, RuntimeManager) {
    let (dir, fake, recorder, deps) = setup_deps();
    (dir, fake, recorder, RuntimeManager::new(deps))
}

/// What [`setup`] builds its manager from, for tests that change a dependency.
pub(super) fn setup_deps() -> (tempfile::TempDir, Arc<FakeRuntime>, Arc<MemoryRecorder>, RuntimeManagerDeps) {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeRuntime::with_images(&["img"]));
    let recorder = Arc::new(MemoryRecorder::new("node-1"));
    let deps = manager(dir.path(), fake.clone(), None, &recorder, true);
    (dir, fake, recorder, deps)
}

/// A pod `web` (uid `u1`) with one container `c` of image `img` and `lifecycle`.
pub(super) fn hooked(lifecycle: &serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "containers": [{
                "name": "c", "image": "img", "imagePullPolicy": "IfNotPresent",
                "terminationMessagePath": "", "lifecycle": lifecycle
            }]
        }
    }))
    .unwrap()
}

/// A manager with volumes and the fake object source, and what the tests look at.
pub(super) struct Env {
    pub(super) dir: tempfile::TempDir,
    pub(super) src: FakeObjectSource,
    pub(super) recorder: Arc<MemoryRecorder>,
    pub(super) rm: Arc<RuntimeManager>,
}

/// An [`Env`] with the DNS settings `dns`.
pub(super) fn env(dns: dns::DnsSettings) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let src = FakeObjectSource::new();
    let recorder = Arc::new(MemoryRecorder::new("node-1"));
    let volumes = VolumeManager::new(dir.path().join("root"), Arc::new(src.clone()))
        .with_mounter(Arc::new(FakeMounter::default()))
        .with_node_allocatable(NodeAllocatable { cpu_milli: 2000, memory: 1 << 30, ephemeral_storage: 1 << 30 });
    let fake = Arc::new(FakeRuntime::with_images(&["img"]));
    let rm = RuntimeManager::new(RuntimeManagerDeps {
        volumes: Arc::new(volumes),
        dns,
        ..manager(dir.path(), fake, Some("192.0.2.1"), &recorder, false)
    });
    Env { dir, src, recorder, rm: Arc::new(rm) }
}

/// Cluster DNS settings, with a host `resolv.conf` written in `dir`.
pub(super) fn cluster_dns(dir: &std::path::Path) -> dns::DnsSettings {
    let resolv = dir.join("resolv.conf");
    std::fs::write(&resolv, "nameserver 192.0.2.53\nsearch corp.example\noptions timeout:2\n").unwrap();
    dns::DnsSettings {
        cluster_dns: vec!["10.96.0.10".into()],
        cluster_domain: "cluster.local".into(),
        resolv_conf: resolv.to_string_lossy().into_owned(),
    }
}

/// A pod `web` in `shop` (uid `u1`) with a `ConfigMap` volume and an env var from it.
pub(super) fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
        "spec": {
            "hostname": "web-0", "subdomain": "web",
            "hostAliases": [{"ip": "10.9.9.9", "hostnames": ["legacy.local"]}],
            "volumes": [{"name": "cfg", "configMap": {"name": "app"}}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": "img", "imagePullPolicy": "IfNotPresent",
                "terminationMessagePath": "",
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}],
                "env": [{"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "level"}}}]
            }]
        }
    }))
    .unwrap()
}

/// The `ConfigMap` `app` of [`pod`].
pub(super) fn app_config(level: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": "app", "namespace": "shop"}, "data": {"level": level}})).unwrap()
}

/// The messages of the events recorded with `reason`.
pub(super) fn events(r: &MemoryRecorder, reason: &str) -> Vec<String> {
    r.list().into_iter().filter(|e| e.reason.as_deref() == Some(reason)).filter_map(|e| e.message).collect()
}
