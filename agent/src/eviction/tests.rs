//! Tests of the eviction manager: parsing, observations, evaluation over (paused) time,
//! ranking, reclaim, messages, admission and the loop, against fakes of the injected
//! interfaces.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::evaluate::{thresholds_met, thresholds_updated_stats};
use super::ranking::{Ranking, rank};
use super::thresholds::{Errors, with_container_fs_thresholds};
use super::*;
use crate::config::KubeletConfiguration;
use crate::events::MemoryRecorder;
use crate::types::quantity::Quantity;

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

/// The eviction manager's configuration from the default `KubeletConfiguration`.
fn default_config() -> EvictionConfig {
    EvictionConfig::from_settings(&crate::settings::eviction(&KubeletConfiguration::default()))
        .expect("the default KubeletConfiguration has valid eviction settings")
}

// ---------------------------------------------------------------- fixtures

/// A pod: `containers` are (name, memory request, ephemeral-storage request); "" for none.
fn pod_with(name: &str, priority: i32, containers: &[(&str, &str, &str)], extra: serde_json::Value) -> Pod {
    let containers: Vec<serde_json::Value> = containers
        .iter()
        .map(|(c, mem, disk)| {
            let mut requests = serde_json::Map::new();
            if !mem.is_empty() {
                requests.insert("memory".into(), (*mem).into());
            }
            if !disk.is_empty() {
                requests.insert("ephemeral-storage".into(), (*disk).into());
            }
            serde_json::json!({"name": c, "image": "busybox", "resources": {"requests": requests}})
        })
        .collect();
    let mut pod = serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": containers, "priority": priority},
    });
    merge(&mut pod, extra);
    serde_json::from_value(pod).unwrap()
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn pod(name: &str, priority: i32, mem_request: &str) -> Pod {
    pod_with(name, priority, &[("web", mem_request, "")], serde_json::json!({}))
}

fn usage(name: &str, memory: u64) -> PodUsage {
    PodUsage {
        uid: format!("uid-{name}"),
        memory_working_set_bytes: Some(memory),
        containers: vec![ContainerUsage {
            name: "web".into(),
            memory_working_set_bytes: Some(memory),
            ..ContainerUsage::default()
        }],
        ..PodUsage::default()
    }
}

fn disk_usage(name: &str, rootfs: u64, logs: u64, volumes: &[(&str, u64)]) -> PodUsage {
    PodUsage {
        uid: format!("uid-{name}"),
        containers: vec![ContainerUsage {
            name: "web".into(),
            rootfs: Some(FsUsage { used_bytes: Some(rootfs), inodes_used: Some(rootfs / 1000) }),
            logs: Some(FsUsage { used_bytes: Some(logs), inodes_used: Some(1) }),
            ..ContainerUsage::default()
        }],
        volumes: volumes
            .iter()
            .map(|(n, b)| VolumeUsage {
                name: (*n).into(),
                usage: FsUsage { used_bytes: Some(*b), inodes_used: Some(1) },
            })
            .collect(),
        ..PodUsage::default()
    }
}

fn fs(capacity: u64, available: u64) -> FsSnapshot {
    FsSnapshot {
        capacity_bytes: Some(capacity),
        available_bytes: Some(available),
        inodes: Some(1_000_000),
        inodes_free: Some(900_000),
        time: None,
    }
}

/// A healthy 4Gi node with a 100Gi disk, with `memory_available` bytes free.
fn node(memory_available: u64, pods: Vec<PodUsage>) -> NodeSnapshot {
    NodeSnapshot {
        memory: Some(MemorySnapshot {
            available_bytes: memory_available,
            working_set_bytes: 4 * GI - memory_available,
            time: None,
        }),
        node_fs: Some(fs(100 * GI, 50 * GI)),
        image_fs: Some(fs(100 * GI, 50 * GI)),
        container_fs: Some(fs(100 * GI, 50 * GI)),
        pids: Some(PidSnapshot { max_pid: 4_194_304, running: 1000, time: None }),
        pods,
        ..NodeSnapshot::default()
    }
}

/// Gives every observation the same, given time.
fn stamp(mut s: NodeSnapshot, time: SystemTime) -> NodeSnapshot {
    let t = Some(time);
    if let Some(m) = &mut s.memory {
        m.time = t;
    }
    if let Some(m) = &mut s.allocatable_memory {
        m.time = t;
    }
    for f in [&mut s.node_fs, &mut s.image_fs, &mut s.container_fs].into_iter().flatten() {
        f.time = t;
    }
    if let Some(p) = &mut s.pids {
        p.time = t;
    }
    s
}

/// Stats that advance their time by a second on every read.
struct FakeStats {
    snapshot: Mutex<NodeSnapshot>,
    reads: AtomicU64,
    dedicated_image_fs: bool,
}

#[async_trait]
impl StatsSource for FakeStats {
    async fn snapshot(&self) -> Result<NodeSnapshot, BoxError> {
        let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(stamp(self.snapshot.lock().unwrap().clone(), UNIX_EPOCH + Duration::from_secs(n)))
    }

    async fn has_dedicated_image_fs(&self) -> Result<bool, BoxError> {
        Ok(self.dedicated_image_fs)
    }
}

struct FakePods {
    pods: Mutex<Vec<Pod>>,
    cleaned_up: AtomicBool,
}

impl ActivePods for FakePods {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.pods.lock().unwrap().iter().cloned().map(Arc::new).collect()
    }

    fn pod_cleaned_up(&self, _pod: &Pod) -> bool {
        self.cleaned_up.load(Ordering::SeqCst)
    }
}

#[derive(Default)]
struct FakeKiller {
    killed: Mutex<Vec<Eviction>>,
}

#[async_trait]
impl PodKiller for FakeKiller {
    async fn kill_pod(&self, eviction: &Eviction) -> Result<(), BoxError> {
        self.killed.lock().unwrap().push(eviction.clone());
        Ok(())
    }
}

/// Records calls; the image GC installs `after_images` as the node's stats.
struct FakeReclaimer {
    stats: Arc<FakeStats>,
    calls: Mutex<Vec<&'static str>>,
    after_images: Mutex<Option<NodeSnapshot>>,
}

#[async_trait]
impl NodeReclaimer for FakeReclaimer {
    async fn delete_all_unused_containers(&self) -> Result<(), BoxError> {
        self.calls.lock().unwrap().push("containers");
        Ok(())
    }

    async fn delete_unused_images(&self) -> Result<(), BoxError> {
        self.calls.lock().unwrap().push("images");
        if let Some(s) = self.after_images.lock().unwrap().take() {
            *self.stats.snapshot.lock().unwrap() = s;
        }
        Ok(())
    }
}

struct Harness {
    manager: Arc<EvictionManager>,
    stats: Arc<FakeStats>,
    pods: Arc<FakePods>,
    killer: Arc<FakeKiller>,
    reclaimer: Arc<FakeReclaimer>,
    recorder: MemoryRecorder,
    registry: Registry,
    records: crate::event_api::EventBus,
}

/// A manager of `config` over `stats` and `pods` (their cleanup done), killing with
/// `killer` and reclaiming with `h`'s reclaimer; events, metrics and records go nowhere.
fn bare_manager(
    config: EvictionConfig,
    stats: Arc<dyn StatsSource>,
    pods: Vec<Pod>,
    killer: Arc<FakeKiller>,
    h: &Harness,
) -> EvictionManager {
    let deps = Dependencies {
        stats,
        pods: Arc::new(FakePods { pods: Mutex::new(pods), cleaned_up: AtomicBool::new(true) }),
        killer,
        reclaimer: h.reclaimer.clone(),
        recorder: Arc::new(MemoryRecorder::new("n")),
        metrics: EvictionMetrics::default(),
        node_name: "n".into(),
        records: crate::event_api::EventBus::default(),
    };
    EvictionManager::new(config, deps)
}

impl Harness {
    fn new(kc: &KubeletConfiguration, snapshot: NodeSnapshot, pods: Vec<Pod>) -> Self {
        let config = EvictionConfig::from_settings(&crate::settings::eviction(kc)).unwrap();
        let stats =
            Arc::new(FakeStats { snapshot: Mutex::new(snapshot), reads: AtomicU64::new(0), dedicated_image_fs: false });
        let pods = Arc::new(FakePods { pods: Mutex::new(pods), cleaned_up: AtomicBool::new(false) });
        let killer = Arc::new(FakeKiller::default());
        let reclaimer =
            Arc::new(FakeReclaimer { stats: stats.clone(), calls: Mutex::default(), after_images: Mutex::default() });
        let recorder = MemoryRecorder::new("node-a");
        let mut registry = Registry::default();
        let records = crate::event_api::EventBus::default();
        let deps = Dependencies {
            stats: stats.clone(),
            pods: pods.clone(),
            killer: killer.clone(),
            reclaimer: reclaimer.clone(),
            recorder: Arc::new(recorder.clone()),
            metrics: EvictionMetrics::new(&mut registry),
            node_name: "node-a".into(),
            records: records.clone(),
        };
        Self {
            manager: Arc::new(EvictionManager::new(config, deps)),
            stats,
            pods,
            killer,
            reclaimer,
            recorder,
            registry,
            records,
        }
    }

    fn set(&self, snapshot: NodeSnapshot) {
        *self.stats.snapshot.lock().unwrap() = snapshot;
    }

    fn killed(&self) -> Vec<String> {
        self.killer.killed.lock().unwrap().iter().map(|e| e.pod.metadata.name.clone().unwrap()).collect()
    }

    fn events(&self) -> Vec<(String, String, String)> {
        self.recorder
            .list()
            .into_iter()
            .map(|e| {
                (
                    e.involved_object.kind.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect()
    }

    fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &self.registry).unwrap();
        crate::metrics::with_upstream_counter_names(&out)
    }
}

fn kc() -> KubeletConfiguration {
    KubeletConfiguration::default()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

// ---------------------------------------------------------------- thresholds

fn summary_of(config: &EvictionConfig) -> Vec<String> {
    config
        .thresholds
        .iter()
        .map(|t| {
            let value = match t.value {
                ThresholdValue::Quantity(q) => q.to_string(),
                ThresholdValue::Percentage(p) => format!("{}%", (f64::from(p) * 1000.0).round() / 10.0),
            };
            let grace = if t.is_hard() { String::new() } else { format!(" after {:?}", t.grace_period) };
            let reclaim = t.min_reclaim.map(|m| format!(" reclaim {m:?}")).unwrap_or_default();
            format!("{}<{value}{grace}{reclaim}", t.signal)
        })
        .collect()
}

#[test]
fn default_thresholds_are_the_linux_defaults() {
    let config = default_config();
    let got = summary_of(&config);
    // The five hard defaults, and allocatableMemory.available (enforceNodeAllocatable: [pods]).
    assert_eq!(
        got,
        [
            "imagefs.available<15%",
            "imagefs.inodesFree<5%",
            "memory.available<100Mi",
            "nodefs.available<10%",
            "nodefs.inodesFree<5%",
            "allocatableMemory.available<100Mi"
        ]
    );
    let pct = |s: Signal| config.thresholds.iter().find(|t| t.signal == s).map(|t| t.value).unwrap();
    assert_eq!(pct(Signal::NodeFsAvailable), ThresholdValue::Percentage(0.1));
    assert_eq!(pct(Signal::ImageFsAvailable), ThresholdValue::Percentage(0.15));
    assert_eq!(pct(Signal::NodeFsInodesFree), ThresholdValue::Percentage(0.05));
    assert_eq!(config.pressure_transition_period, Duration::from_mins(5));
    assert_eq!(config.max_pod_grace_period_seconds, 0);
}

#[test]
fn partial_eviction_hard_with_and_without_merging_defaults() {
    for (merge, expected) in [
        (false, vec!["memory.available<1Gi"]),
        (
            true,
            vec![
                "imagefs.available<15%",
                "imagefs.inodesFree<5%",
                "memory.available<1Gi",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%",
            ],
        ),
    ] {
        let kc = KubeletConfiguration {
            eviction_hard: map(&[("memory.available", "1Gi")]),
            merge_default_eviction_settings: merge,
            ..kc()
        };
        let kc = KubeletConfiguration { enforce_node_allocatable: Vec::new(), ..kc };
        let mut got = summary_of(&EvictionConfig::from_settings(&crate::settings::eviction(&kc)).unwrap());
        got.sort();
        assert_eq!(got, expected, "merge={merge}");
    }
}

#[test]
fn percentages_quantities_soft_thresholds_and_reclaims() {
    let kc = KubeletConfiguration {
        eviction_hard: map(&[("memory.available", "500Mi"), ("nodefs.available", "0%"), ("pid.available", "100%")]),
        eviction_soft: map(&[("memory.available", "1.5Gi"), ("nodefs.inodesFree", "7.5%")]),
        eviction_soft_grace_period: map(&[("memory.available", "1m30s"), ("nodefs.inodesFree", "2m")]),
        eviction_minimum_reclaim: map(&[("memory.available", "200Mi"), ("nodefs.inodesFree", "1%")]),
        eviction_max_pod_grace_period: 60,
        enforce_node_allocatable: vec!["pods".into()],
        ..kc()
    };
    let config = EvictionConfig::from_settings(&crate::settings::eviction(&kc)).unwrap();
    let by = |s: Signal, hard: bool| *config.thresholds.iter().find(|t| t.signal == s && t.is_hard() == hard).unwrap();
    // 0% and 100% are ignored.
    assert!(!config.thresholds.iter().any(|t| matches!(t.signal, Signal::NodeFsAvailable | Signal::PidAvailable)));
    let hard = by(Signal::MemoryAvailable, true);
    assert_eq!(hard.value, ThresholdValue::Quantity(Quantity::bytes(500 * MI)));
    assert_eq!(hard.min_reclaim, Some(ThresholdValue::Quantity(Quantity::bytes(200 * MI))));
    let soft = by(Signal::MemoryAvailable, false);
    assert_eq!(soft.grace_period, Duration::from_secs(90));
    assert_eq!(soft.value, ThresholdValue::Quantity(Quantity::bytes(1536 * MI)));
    let inodes = by(Signal::NodeFsInodesFree, false);
    assert_eq!(inodes.value, ThresholdValue::Percentage(0.075));
    assert_eq!(inodes.min_reclaim, Some(ThresholdValue::Percentage(0.01)));
    // enforceNodeAllocatable=pods copies the hard memory threshold.
    let allocatable = by(Signal::AllocatableMemoryAvailable, true);
    assert_eq!(allocatable.value, hard.value);
    assert_eq!(allocatable.min_reclaim, hard.min_reclaim);
    assert!(!config.thresholds.iter().any(|t| t.signal == Signal::AllocatableMemoryAvailable && !t.is_hard()));
    assert_eq!(config.max_pod_grace_period_seconds, 60);
    // A percentage threshold is a fraction of the observed capacity, truncated.
    assert_eq!(inodes.value.quantity(Quantity::count(1_000_000)), Quantity::count(75_000));
}

#[test]
fn bad_settings_are_all_reported_with_setting_and_signal() {
    let kc = KubeletConfiguration {
        eviction_hard: map(&[
            ("memory.available", "0"),
            ("nodefs.available", "-1Gi"),
            ("imagefs.available", "101%"),
            ("disk.full", "1Gi"),
            ("pid.available", "lots"),
        ]),
        eviction_soft: map(&[("memory.available", "1Gi")]),
        eviction_soft_grace_period: map(&[("nodefs.available", "-1s")]),
        eviction_minimum_reclaim: map(&[("imagefs.available", "0%"), ("nodefs.inodesFree", "-5")]),
        ..kc()
    };
    let Errors(errors) = EvictionConfig::from_settings(&crate::settings::eviction(&kc)).unwrap_err();
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let expected = [
        "evictionHard[disk.full]: unsupported eviction signal disk.full",
        "evictionHard[imagefs.available]: eviction percentage threshold imagefs.available must be <= 100%: 101%",
        "evictionHard[memory.available]: eviction threshold memory.available must be positive: 0",
        "evictionHard[nodefs.available]: eviction threshold nodefs.available must be positive: -1Gi",
        "evictionHard[pid.available]: invalid quantity",
        "evictionSoftGracePeriod[nodefs.available]: invalid eviction grace period specified: -1s, must be a positive value",
        "evictionMinimumReclaim[imagefs.available]: eviction percentage minimum reclaim imagefs.available must be positive: 0%",
        "evictionMinimumReclaim[nodefs.inodesFree]: negative eviction minimum reclaim specified for nodefs.inodesFree",
        "evictionSoftGracePeriod[memory.available]: grace period must be specified for the soft eviction threshold memory.available",
    ];
    for want in expected {
        assert!(messages.iter().any(|m| m.starts_with(want)), "{want} in {messages:#?}");
    }
    assert_eq!(messages.len(), expected.len(), "{messages:#?}");
}

#[test]
fn container_fs_thresholds_follow_nodefs_or_imagefs() {
    let config = default_config();
    let single = with_container_fs_thresholds(&config.thresholds, false);
    let of = |ts: &[Threshold], s: Signal| ts.iter().find(|t| t.signal == s).map(|t| t.value);
    assert_eq!(of(&single, Signal::ContainerFsAvailable), Some(ThresholdValue::Percentage(0.1)));
    assert_eq!(of(&single, Signal::ContainerFsInodesFree), Some(ThresholdValue::Percentage(0.05)));
    let dedicated = with_container_fs_thresholds(&config.thresholds, true);
    assert_eq!(of(&dedicated, Signal::ContainerFsAvailable), Some(ThresholdValue::Percentage(0.15)));
    // A given containerfs threshold is replaced, not kept next to the derived one.
    let kc = KubeletConfiguration {
        eviction_hard: map(&[("containerfs.available", "1Gi"), ("nodefs.available", "5%")]),
        ..kc()
    };
    let given = EvictionConfig::from_settings(&crate::settings::eviction(&kc)).unwrap();
    let derived = with_container_fs_thresholds(&given.thresholds, false);
    let cfs: Vec<_> = derived.iter().filter(|t| t.signal == Signal::ContainerFsAvailable).collect();
    assert_eq!(cfs.len(), 1);
    assert_eq!(cfs[0].value, ThresholdValue::Percentage(0.05));
}

// ---------------------------------------------------------------- observations

#[test]
fn observations_of_a_snapshot() {
    let s = NodeSnapshot {
        memory: Some(MemorySnapshot::from_usage(4 * GI, 3 * GI, GI, None)),
        allocatable_memory: Some(MemorySnapshot::from_usage(3 * GI, 3 * GI + 10, 0, None)),
        pids: Some(PidSnapshot { max_pid: 32768, running: 30000, time: None }),
        node_fs: Some(fs(100 * GI, 5 * GI)),
        ..NodeSnapshot::default()
    };
    let o = make_observations(&s);
    let mem = o[&Signal::MemoryAvailable];
    assert_eq!((mem.available, mem.capacity), (Quantity::bytes(2 * GI), Quantity::bytes(4 * GI)));
    // Working set above the limit: nothing available, capacity is the working set.
    let alloc = o[&Signal::AllocatableMemoryAvailable];
    assert_eq!((alloc.available, alloc.capacity), (Quantity::bytes(0), Quantity::bytes(3 * GI + 10)));
    let pid = o[&Signal::PidAvailable];
    assert_eq!((pid.available.units(), pid.capacity.units()), (2768, 32768));
    assert_eq!(o[&Signal::NodeFsAvailable].available, Quantity::bytes(5 * GI));
    assert_eq!(o[&Signal::NodeFsInodesFree].available, Quantity::count(900_000));
    assert!(!o.contains_key(&Signal::ImageFsAvailable));
}

#[test]
fn snapshot_from_summary() {
    let summary: crate::stats::Summary = serde_json::from_value(serde_json::json!({
        "node": {
            "nodeName": "node-a",
            "systemContainers": [{"name": "pods", "memory": {"time": "2024-01-01T00:00:00Z", "availableBytes": 100, "workingSetBytes": 900}}],
            "memory": {"time": "2024-01-01T00:00:00Z", "availableBytes": 1000, "workingSetBytes": 3000},
            "fs": {"time": "2024-01-01T00:00:00Z", "availableBytes": 10, "capacityBytes": 100, "inodesFree": 5, "inodes": 50},
            "rlimit": {"time": "2024-01-01T00:00:00Z", "maxpid": 100, "curproc": 40}
        },
        "pods": [{
            "podRef": {"name": "p", "namespace": "default", "uid": "u1"},
            "memory": {"workingSetBytes": 77},
            "containers": [{"name": "c", "memory": {"workingSetBytes": 70}, "rootfs": {"usedBytes": 5}, "logs": {"usedBytes": 6}}],
            "volume": [{"name": "scratch", "usedBytes": 8}],
            "process_stats": {"process_count": 3}
        }]
    }))
    .unwrap();
    let s = NodeSnapshot::from_summary(&summary, false);
    assert_eq!(s.memory.unwrap().available_bytes, 1000);
    assert_eq!(s.allocatable_memory.unwrap().working_set_bytes, 900);
    // No runtime stats: the image and container filesystems are the root filesystem.
    assert_eq!(s.image_fs, s.node_fs);
    assert_eq!(s.container_fs, s.node_fs);
    assert_eq!(s.pids.unwrap().running, 40);
    let p = &s.pods[0];
    assert_eq!((p.uid.as_str(), p.memory_working_set_bytes, p.process_count), ("u1", Some(77), Some(3)));
    assert_eq!(p.containers[0].logs.unwrap().used_bytes, Some(6));
    assert_eq!(p.volumes[0].usage.used_bytes, Some(8));
    assert_eq!(NodeSnapshot::from_summary(&summary, true).image_fs, None);
}

#[test]
fn thresholds_met_with_minimum_reclaim_and_fresh_stats() {
    let kc = KubeletConfiguration {
        eviction_hard: map(&[("memory.available", "100Mi")]),
        eviction_minimum_reclaim: map(&[("memory.available", "50Mi")]),
        ..kc()
    };
    let config = EvictionConfig::from_settings(&crate::settings::eviction(&kc)).unwrap();
    let at = |mi: u64| make_observations(&node(mi * MI, vec![]));
    assert_eq!(thresholds_met(&config.thresholds, &at(99), false).len(), 1);
    assert!(thresholds_met(&config.thresholds, &at(100), false).is_empty());
    // Once met, the threshold stays met until 150Mi are available.
    assert_eq!(thresholds_met(&config.thresholds, &at(149), true).len(), 1);
    assert!(thresholds_met(&config.thresholds, &at(150), true).is_empty());
    // Stats not newer than the previous pass's do not count.
    let t1 = make_observations(&stamp(node(MI, vec![]), UNIX_EPOCH + Duration::from_secs(1)));
    let t2 = make_observations(&stamp(node(MI, vec![]), UNIX_EPOCH + Duration::from_secs(2)));
    assert!(thresholds_updated_stats(&config.thresholds, &t1, &t1).is_empty());
    assert_eq!(thresholds_updated_stats(&config.thresholds, &t2, &t1).len(), 1);
}

// ---------------------------------------------------------------- evaluation over time

#[tokio::test(start_paused = true)]
async fn soft_threshold_waits_for_its_grace_period() {
    let kc = KubeletConfiguration {
        eviction_hard: BTreeMap::new(),
        eviction_soft: map(&[("memory.available", "1Gi")]),
        eviction_soft_grace_period: map(&[("memory.available", "30s")]),
        eviction_max_pod_grace_period: 20,
        ..kc()
    };
    let mut hog = pod("hog", 0, "");
    hog.spec.as_mut().unwrap().termination_grace_period_seconds = Some(45);
    let h = Harness::new(&kc, node(512 * MI, vec![usage("hog", 600 * MI)]), vec![hog]);
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_none());
    assert_eq!(h.manager.node_conditions(), [NodeCondition::MemoryPressure]);
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_none());
    tokio::time::advance(Duration::from_secs(1)).await;
    let eviction = h.manager.synchronize(Trigger::Periodic).await.expect("grace period over");
    assert!(!eviction.hard);
    // Soft: min(terminationGracePeriodSeconds, evictionMaxPodGracePeriod).
    assert_eq!(eviction.grace_period_seconds, 20);
    // Pressure gone before the grace period: the clock starts again.
    h.set(node(2 * GI, vec![]));
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_none());
    h.set(node(512 * MI, vec![usage("hog", 600 * MI)]));
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_none());
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_none());
    assert_eq!(h.killed(), ["hog"]);
}

#[tokio::test(start_paused = true)]
async fn pressure_condition_is_held_for_the_transition_period() {
    let kc = KubeletConfiguration {
        eviction_hard: map(&[("memory.available", "100Mi"), ("pid.available", "1000")]),
        eviction_pressure_transition_period: crate::config::GoDuration::from_secs(60),
        ..kc()
    };
    let h = Harness::new(&kc, node(50 * MI, vec![]), vec![]);
    assert!(!h.manager.is_under_memory_pressure());
    h.manager.synchronize(Trigger::Periodic).await;
    assert!(h.manager.is_under_memory_pressure());
    assert!(!h.manager.is_under_disk_pressure() && !h.manager.is_under_pid_pressure());
    tokio::time::advance(Duration::from_secs(10)).await;
    h.set(node(2 * GI, vec![]));
    h.manager.synchronize(Trigger::Periodic).await;
    tokio::time::advance(Duration::from_secs(49)).await;
    h.manager.synchronize(Trigger::Periodic).await;
    assert!(h.manager.is_under_memory_pressure(), "held for 60 s after it was last met");
    tokio::time::advance(Duration::from_secs(1)).await;
    h.manager.synchronize(Trigger::Periodic).await;
    assert!(h.manager.node_conditions().is_empty());
    // PID pressure.
    let mut s = node(2 * GI, vec![]);
    s.pids = Some(PidSnapshot { max_pid: 32768, running: 32000, time: None });
    h.set(s);
    h.manager.synchronize(Trigger::Periodic).await;
    assert_eq!(h.manager.node_conditions(), [NodeCondition::PidPressure]);
}

// ---------------------------------------------------------------- ranking

fn names(pods: &[&Pod]) -> Vec<String> {
    pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
}

#[test]
fn memory_ranking_exceeds_requests_then_priority_then_usage() {
    let pods = vec![
        pod("guaranteed-ish", 0, "1Gi"),  // 900Mi of 1Gi: within request
        pod("big-low", 0, "100Mi"),       // 500Mi, 400Mi above
        pod("small-low", 0, "100Mi"),     // 200Mi, 100Mi above
        pod("besteffort-high", 1000, ""), // 300Mi above, but higher priority
        pod("no-stats", 1000, "1Gi"),
    ];
    let stats = [
        usage("guaranteed-ish", 900 * MI),
        usage("big-low", 500 * MI),
        usage("small-low", 200 * MI),
        usage("besteffort-high", 300 * MI),
    ];
    let by_uid: HashMap<&str, &PodUsage> = stats.iter().map(|u| (u.uid.as_str(), u)).collect();
    let ranked = rank(&pods, &by_uid, Ranking::Memory);
    assert_eq!(names(&ranked), ["no-stats", "big-low", "small-low", "besteffort-high", "guaranteed-ish"]);
}

#[test]
fn disk_ranking_counts_what_the_filesystem_holds() {
    let with_volume = serde_json::json!({"spec": {"volumes": [
        {"name": "scratch", "emptyDir": {}},
        {"name": "tmpfs", "emptyDir": {"medium": "Memory"}},
    ]}});
    let pods = vec![
        pod_with("within-request", 0, &[("web", "", "10Gi")], serde_json::json!({})),
        pod_with("volume-hog", 0, &[("web", "", "")], with_volume),
        pod_with("layer-hog", 0, &[("web", "", "")], serde_json::json!({})),
        pod_with("important", 10, &[("web", "", "")], serde_json::json!({})),
    ];
    let stats = [
        disk_usage("within-request", 5 * GI, 0, &[]),
        disk_usage("volume-hog", MI, MI, &[("scratch", 3 * GI), ("tmpfs", 100 * GI)]),
        disk_usage("layer-hog", 2 * GI, MI, &[]),
        disk_usage("important", 50 * GI, 0, &[]),
    ];
    let by_uid: HashMap<&str, &PodUsage> = stats.iter().map(|u| (u.uid.as_str(), u)).collect();
    let nodefs = rank(&pods, &by_uid, Ranking::for_signal(Signal::NodeFsAvailable, false));
    assert_eq!(names(&nodefs), ["volume-hog", "layer-hog", "important", "within-request"]);
    // With a dedicated image filesystem, nodefs holds logs and volumes only, imagefs the
    // writable layers.
    let nodefs = rank(&pods, &by_uid, Ranking::for_signal(Signal::NodeFsAvailable, true));
    assert_eq!(names(&nodefs)[0], "volume-hog");
    let imagefs = rank(&pods, &by_uid, Ranking::for_signal(Signal::ImageFsAvailable, true));
    assert_eq!(names(&imagefs), ["layer-hog", "volume-hog", "important", "within-request"]);
    // Inodes: nothing is requested, so only priority and usage order.
    let inodes = rank(&pods, &by_uid, Ranking::for_signal(Signal::NodeFsInodesFree, false));
    assert_eq!(names(&inodes)[3], "important");
}

#[test]
fn pid_ranking_priority_then_processes() {
    let pods = vec![pod("few", 0, ""), pod("many", 0, ""), pod("many-important", 100, "")];
    let mk =
        |n: &str, count: u64| PodUsage { uid: format!("uid-{n}"), process_count: Some(count), ..PodUsage::default() };
    let stats = [mk("few", 3), mk("many", 300), mk("many-important", 3000)];
    let by_uid: HashMap<&str, &PodUsage> = stats.iter().map(|u| (u.uid.as_str(), u)).collect();
    assert_eq!(names(&rank(&pods, &by_uid, Ranking::Pids)), ["many", "few", "many-important"]);
}

// ---------------------------------------------------------------- evictions

#[tokio::test(start_paused = true)]
async fn hard_memory_eviction_message_events_and_metrics() {
    let pods = vec![pod("web", 0, ""), pod("db", 0, "1Gi")];
    let h = Harness::new(&kc(), node(50 * MI, vec![usage("web", 200 * MI), usage("db", 512 * MI)]), pods);
    let mut records = h.records.subscribe();
    let e = h.manager.synchronize(Trigger::Periodic).await.expect("evicts");
    assert_eq!(h.killed(), ["web"]);
    // The event API's record of the decision.
    let record = records.recv().await.unwrap();
    assert_eq!(record.kind, crate::event_api::NodeEventKind::EvictionDecided);
    assert_eq!(record.pod_name, "web");
    let decision = record.eviction.clone().unwrap();
    assert_eq!((decision.eviction_signal.as_str(), decision.trigger.as_str()), ("memory.available", "periodic"));
    assert_eq!(decision.signal_time_ns, 0);
    assert!(decision.pass_time_ns > 0 && record.agent_time_ns.unwrap() >= decision.pass_time_ns);
    assert!(e.hard);
    assert_eq!(e.grace_period_seconds, 0);
    assert_eq!((e.signal, e.resource), (Signal::MemoryAvailable, Resource::Memory));
    let message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container web \
                   was using 200Mi, request is 0, has larger consumption of memory. ";
    assert_eq!(e.message, message);
    assert_eq!(
        e.annotations,
        map(&[
            ("offending_containers", "web"),
            ("offending_containers_usage", "200Mi"),
            ("starved_resource", "memory")
        ])
    );
    assert_eq!(e.condition.as_ref().unwrap().type_, "DisruptionTarget");
    assert_eq!(e.condition.as_ref().unwrap().status, "True");
    assert_eq!(e.condition.as_ref().unwrap().reason.as_deref(), Some("TerminationByKubelet"));
    assert_eq!(e.condition.as_ref().unwrap().message.as_deref(), Some(message));
    assert_eq!(
        h.events(),
        [
            ("Node".into(), "EvictionThresholdMet".into(), "Attempting to reclaim memory".into()),
            ("Pod".into(), "Evicted".into(), message.into()),
        ]
    );
    let text = h.metrics_text();
    assert!(text.contains("# TYPE kubelet_evictions counter"), "{text}");
    assert!(text.contains("kubelet_evictions{eviction_signal=\"memory.available\"} 1"), "{text}");
    assert!(
        text.contains("kubelet_eviction_stats_age_seconds_count{eviction_signal=\"memory.available\"} 1"),
        "{text}"
    );
    // The pod worker writes this status.
    let mut status = PodStatus { phase: Some("Running".into()), ..PodStatus::default() };
    let now = Time(Timestamp::from_second(1_700_000_000).unwrap());
    e.apply_to_status(&mut status, now.clone());
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert_eq!(status.message.as_deref(), Some(message));
    let conditions = status.conditions.unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].last_transition_time, Some(now));
}

#[tokio::test(start_paused = true)]
async fn messages_with_requests_and_ephemeral_storage() {
    let pods = vec![pod_with("app", 0, &[("web", "64Mi", "1Gi"), ("side", "", "")], serde_json::json!({}))];
    let mut u = usage("app", 300 * MI);
    u.containers.push(ContainerUsage {
        name: "side".into(),
        memory_working_set_bytes: Some(1000),
        ..ContainerUsage::default()
    });
    let h = Harness::new(&kc(), node(99 * MI, vec![u]), pods.clone());
    let e = h.manager.synchronize(Trigger::Periodic).await.unwrap();
    assert_eq!(
        e.message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 99Mi. Container web was using \
         300Mi, request is 64Mi, has larger consumption of memory. Container side was using 1k, request is 0, has \
         larger consumption of memory. "
    );
    assert_eq!(e.annotations["offending_containers"], "web,side");
    assert_eq!(e.annotations["offending_containers_usage"], "300Mi,1k");

    // Disk: a percentage threshold prints as bytes of the capacity; usage is rootfs + logs.
    let mut s = node(2 * GI, vec![disk_usage("app", 2 * GI, 512 * MI, &[])]);
    s.node_fs = Some(fs(100 * GI, 5 * GI));
    let h = Harness::new(&kc(), s, pods);
    let e = h.manager.synchronize(Trigger::Periodic).await.unwrap();
    assert_eq!(e.resource, Resource::EphemeralStorage);
    assert_eq!(
        e.message,
        // 10% is Go's float32 0.1: 10737418400 bytes, not 10Gi.
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10737418400, available: 5Gi. \
         Container web was using 2560Mi, request is 1Gi, has larger consumption of ephemeral-storage. "
    );
}

#[tokio::test(start_paused = true)]
async fn critical_pods_are_spared_and_one_pod_per_pass() {
    let static_pod = pod_with(
        "etcd",
        0,
        &[("web", "", "")],
        serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.source": "file"}}}),
    );
    let mirror = pod_with(
        "mirror",
        0,
        &[("web", "", "")],
        serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "abc"}}}),
    );
    let system = pod("dns", 2_000_000_000, "");
    let pods = vec![static_pod, mirror, system, pod("a", 0, ""), pod("b", 0, "")];
    let stats = vec![
        usage("etcd", 3 * GI),
        usage("mirror", 2 * GI),
        usage("dns", GI),
        usage("a", 200 * MI),
        usage("b", 100 * MI),
    ];
    let h = Harness::new(&kc(), node(10 * MI, stats), pods);
    let e = h.manager.synchronize(Trigger::Periodic).await.unwrap();
    assert_eq!(e.pod.metadata.name.as_deref(), Some("a"));
    assert_eq!(h.killed(), ["a"], "exactly one pod per pass");
    // Only critical pods left: nothing to evict.
    h.pods.pods.lock().unwrap().retain(|p| !matches!(p.metadata.name.as_deref(), Some("a" | "b")));
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_none());
    assert_eq!(h.killed(), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_reclaims_node_resources_first() {
    let mut full = node(2 * GI, vec![disk_usage("a", GI, 0, &[])]);
    full.node_fs = Some(fs(100 * GI, 5 * GI));
    full.image_fs = full.node_fs;
    let h = Harness::new(&kc(), full.clone(), vec![pod("a", 0, "")]);
    // Image GC frees enough: no eviction.
    *h.reclaimer.after_images.lock().unwrap() = Some(node(2 * GI, vec![]));
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_none());
    assert_eq!(*h.reclaimer.calls.lock().unwrap(), ["containers", "images"]);
    assert!(h.killed().is_empty());
    assert!(h.manager.is_under_disk_pressure(), "the condition comes from the pass's observations");
    // GC frees too little: a pod goes.
    h.reclaimer.calls.lock().unwrap().clear();
    h.set(full);
    let e = h.manager.synchronize(Trigger::Periodic).await.expect("evicts");
    assert_eq!(*h.reclaimer.calls.lock().unwrap(), ["containers", "images"]);
    assert_eq!(e.resource, Resource::EphemeralStorage);
    // Memory pressure: no node-level reclaim.
    h.reclaimer.calls.lock().unwrap().clear();
    h.set(node(10 * MI, vec![usage("a", GI)]));
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_some());
    assert!(h.reclaimer.calls.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_ranks_by_disk_usage_measured_now() {
    /// The background `du` has not seen what "writer" wrote; a walk now does.
    struct StaleDu {
        stale: NodeSnapshot,
        fresh: NodeSnapshot,
        fresh_reads: AtomicU64,
    }
    #[async_trait]
    impl StatsSource for StaleDu {
        async fn snapshot(&self) -> Result<NodeSnapshot, BoxError> {
            Ok(stamp(self.stale.clone(), UNIX_EPOCH + Duration::from_secs(1)))
        }
        async fn snapshot_with_fresh_disk_usage(&self) -> Result<NodeSnapshot, BoxError> {
            self.fresh_reads.fetch_add(1, Ordering::SeqCst);
            Ok(stamp(self.fresh.clone(), UNIX_EPOCH + Duration::from_secs(2)))
        }
        async fn has_dedicated_image_fs(&self) -> Result<bool, BoxError> {
            Ok(true)
        }
    }
    let volume = serde_json::json!({"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}});
    let pods = vec![
        pod_with("idle", 0, &[("web", "", "")], volume.clone()),
        pod_with("writer", 0, &[("web", "", "")], volume),
    ];
    let with = |writer: u64| {
        let mut s =
            node(2 * GI, vec![disk_usage("idle", 0, MI, &[]), disk_usage("writer", 0, MI, &[("scratch", writer)])]);
        s.node_fs = Some(fs(100 * GI, 5 * GI));
        s
    };
    let stats = Arc::new(StaleDu { stale: with(0), fresh: with(3 * GI), fresh_reads: AtomicU64::new(0) });
    let h = Harness::new(&kc(), NodeSnapshot::default(), vec![]);
    let killer = Arc::new(FakeKiller::default());
    let config = || EvictionConfig::from_settings(&crate::settings::eviction(&kc())).unwrap();
    let m = bare_manager(config(), stats.clone(), pods, killer.clone(), &h);
    let e = m.synchronize(Trigger::Periodic).await.expect("evicts");
    assert_eq!(e.pod.metadata.name.as_deref(), Some("writer"), "the stale usages tie; the fresh ones do not");
    assert_eq!(stats.fresh_reads.load(Ordering::SeqCst), 1);

    // Memory pressure does not walk disks.
    let mut memory = with(0);
    memory.memory = node(10 * MI, vec![]).memory;
    let stats = Arc::new(StaleDu { stale: memory.clone(), fresh: memory, fresh_reads: AtomicU64::new(0) });
    let m = bare_manager(config(), stats.clone(), vec![pod("a", 0, "")], killer, &h);
    assert!(m.synchronize(Trigger::Periodic).await.is_some());
    assert_eq!(stats.fresh_reads.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn memory_is_reclaimed_before_disk() {
    let mut s = node(10 * MI, vec![usage("a", GI)]);
    s.node_fs = Some(fs(100 * GI, GI));
    let h = Harness::new(&kc(), s, vec![pod("a", 0, "")]);
    let e = h.manager.synchronize(Trigger::Periodic).await.unwrap();
    assert_eq!(e.signal, Signal::MemoryAvailable);
    assert_eq!(h.manager.node_conditions(), [NodeCondition::MemoryPressure, NodeCondition::DiskPressure]);
    assert!(h.reclaimer.calls.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn stale_stats_do_not_evict_twice() {
    struct Frozen(NodeSnapshot);
    #[async_trait]
    impl StatsSource for Frozen {
        async fn snapshot(&self) -> Result<NodeSnapshot, BoxError> {
            Ok(stamp(self.0.clone(), UNIX_EPOCH + Duration::from_secs(7)))
        }
        async fn has_dedicated_image_fs(&self) -> Result<bool, BoxError> {
            Ok(false)
        }
    }
    let h = Harness::new(&kc(), NodeSnapshot::default(), vec![]);
    let killer = Arc::new(FakeKiller::default());
    let stats = Arc::new(Frozen(node(10 * MI, vec![usage("a", GI), usage("b", GI)])));
    let m = bare_manager(default_config(), stats, vec![pod("a", 0, ""), pod("b", 0, "")], killer.clone(), &h);
    assert!(m.synchronize(Trigger::Periodic).await.is_some());
    assert!(m.synchronize(Trigger::Periodic).await.is_none());
    assert_eq!(killer.killed.lock().unwrap().len(), 1);
}

// ---------------------------------------------------------------- admission

#[tokio::test(start_paused = true)]
async fn admission_under_pressure() {
    let best_effort = pod("be", 0, "");
    let burstable = pod("bu", 0, "64Mi");
    let tolerant = pod_with(
        "tol",
        0,
        &[("web", "", "")],
        serde_json::json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}
        ]}}),
    );
    let critical = pod("crit", 2_000_001_000, "");
    assert_eq!(admit(&[], &best_effort), Ok(()));

    let memory = [NodeCondition::MemoryPressure];
    let refused = admit(&memory, &best_effort).unwrap_err();
    assert_eq!(refused.reason, "Evicted");
    assert_eq!(refused.message, "The node had condition: [MemoryPressure]. ");
    assert_eq!(admit(&memory, &burstable), Ok(()));
    assert_eq!(admit(&memory, &tolerant), Ok(()));
    assert_eq!(admit(&memory, &critical), Ok(()));

    let both = [NodeCondition::MemoryPressure, NodeCondition::DiskPressure];
    assert_eq!(
        admit(&both, &burstable).unwrap_err().message,
        "The node had condition: [MemoryPressure DiskPressure]. "
    );
    assert_eq!(admit(&both, &tolerant).unwrap_err().reason, "Evicted");
    assert!(admit(&[NodeCondition::PidPressure], &burstable).is_err());
    assert_eq!(admit(&[NodeCondition::DiskPressure], &critical), Ok(()));

    // Through the manager.
    let h = Harness::new(&kc(), node(10 * MI, vec![]), vec![]);
    assert_eq!(h.manager.admit(&best_effort), Ok(()));
    h.manager.synchronize(Trigger::Periodic).await;
    assert_eq!(h.manager.admit(&best_effort).unwrap_err().message, "The node had condition: [MemoryPressure]. ");
}

// ---------------------------------------------------------------- the loop

#[tokio::test(start_paused = true)]
async fn loop_runs_on_signals_and_waits_for_cleanup() {
    let h =
        Harness::new(&kc(), node(2 * GI, vec![usage("a", GI), usage("b", GI)]), vec![pod("a", 0, ""), pod("b", 0, "")]);
    let (pressure, rx) = crate::pressure::PressureSignals::channel();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(h.manager.clone().run(rx, shutdown.clone()));
    // The first pass runs at once and finds nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.stats.reads.load(Ordering::SeqCst), 1);
    // Memory runs low and the kernel says so: a pass right away, not at the 10 s tick.
    h.set(node(10 * MI, vec![usage("a", GI), usage("b", 900 * MI)]));
    pressure.send(crate::pressure::PressureSource::Psi);
    pressure.send(crate::pressure::PressureSource::Psi);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(h.killed(), ["a"]);
    assert!(h.metrics_text().contains("swiftlet_eviction_signal_to_decision_seconds_count{source=\"psi\"} 1"));
    // Waiting for "a" to be cleaned up: no pass, whatever the signals say.
    h.pods.pods.lock().unwrap().remove(0);
    pressure.send(crate::pressure::PressureSource::Psi);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(h.killed(), ["a"]);
    let reads = h.stats.reads.load(Ordering::SeqCst);
    // Cleaned up: the next pass follows at once and evicts "b".
    h.pods.cleaned_up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.killed(), ["a", "b"]);
    assert!(h.stats.reads.load(Ordering::SeqCst) > reads);
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn loop_times_out_waiting_for_cleanup_and_ticks_every_10s() {
    let h = Harness::new(&kc(), node(10 * MI, vec![usage("a", GI)]), vec![pod("a", 0, "")]);
    let (_pressure, rx) = crate::pressure::PressureSignals::channel();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(h.manager.clone().run(rx, shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.killed(), ["a"]);
    // Never cleaned up: after 30 s the loop goes on (and evicts "a" again, still active).
    tokio::time::sleep(Duration::from_secs(29) + Duration::from_millis(500)).await;
    assert_eq!(h.killed().len(), 2);
    h.set(node(2 * GI, vec![]));
    h.pods.cleaned_up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reads = h.stats.reads.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(h.stats.reads.load(Ordering::SeqCst), reads + 1, "one periodic pass per 10 s");
    shutdown.cancel();
    task.await.unwrap();
}

// ---------------------------------------------------------------- local storage limits

/// A pod whose containers have `ephemeral-storage` limits; `extra` merged into it.
fn limited(name: &str, limits: &[(&str, &str)], extra: serde_json::Value) -> Pod {
    let containers: Vec<serde_json::Value> = limits
        .iter()
        .map(|(c, limit)| {
            let resources = if limit.is_empty() {
                serde_json::json!({})
            } else {
                serde_json::json!({"limits": {"ephemeral-storage": limit}})
            };
            serde_json::json!({"name": c, "image": "busybox", "resources": resources})
        })
        .collect();
    let mut pod = serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": containers},
    });
    merge(&mut pod, extra);
    serde_json::from_value(pod).unwrap()
}

#[test]
fn local_storage_limits_in_upstream_order_and_words() {
    use super::local_storage::{LocalStorageLimit, violation};
    let sized = serde_json::json!({"spec": {"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}});
    let mut u = disk_usage("a", 0, 0, &[("scratch", 2 * MI)]);
    let p = limited("a", &[("web", "")], sized.clone());
    let v = violation(&p, &u, false).unwrap();
    assert_eq!(v.limit, LocalStorageLimit::EmptyDir);
    assert_eq!(v.message, "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ");
    u.volumes[0].usage.used_bytes = Some(MI);
    assert_eq!(violation(&p, &u, false), None, "at the limit is not over it");

    // The pod's total: the containers' limits add up (1G + 500M, printed as the first's format).
    let p = limited("a", &[("web", "1G"), ("side", "500M")], serde_json::json!({}));
    let mut u = disk_usage("a", 0, 0, &[]);
    u.ephemeral_storage_used_bytes = Some(1_600_000_000);
    let v = violation(&p, &u, false).unwrap();
    assert_eq!(v.limit, LocalStorageLimit::Pod);
    assert_eq!(v.message, "Pod ephemeral local storage usage exceeds the total limit of containers 1500M. ");

    // A container: its logs, plus its writable layer unless the image filesystem is apart.
    let p = limited("a", &[("web", "1Gi")], serde_json::json!({}));
    let mut u = disk_usage("a", 600 * MI, 600 * MI, &[]);
    u.ephemeral_storage_used_bytes = Some(GI);
    let v = violation(&p, &u, false).unwrap();
    assert_eq!(v.limit, LocalStorageLimit::Container);
    assert_eq!(v.message, "Container web exceeded its local ephemeral storage limit \"1Gi\". ");
    assert_eq!(violation(&p, &u, true), None);
    assert_eq!(LocalStorageLimit::Container.metric_label(), "ephemeralcontainerfs.limit");
}

#[tokio::test(start_paused = true)]
async fn pods_over_local_storage_limits_are_evicted_at_once_without_node_pressure() {
    let sized = serde_json::json!({"spec": {"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}});
    let critical = serde_json::json!({"spec": {
        "priority": 2_000_001_000,
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}],
    }});
    let pods = vec![
        limited("over", &[("web", "")], sized.clone()),
        limited("fine", &[("web", "1Gi")], serde_json::json!({})),
        limited("critical", &[("web", "")], critical),
        limited("also-over", &[("web", "")], sized),
    ];
    let stats = node(
        2 * GI,
        vec![
            disk_usage("over", 0, 0, &[("scratch", 2 * MI)]),
            disk_usage("fine", 0, MI, &[]),
            disk_usage("critical", 0, 0, &[("scratch", 2 * MI)]),
            disk_usage("also-over", 0, 0, &[("scratch", 2 * MI)]),
        ],
    );
    // No eviction thresholds at all: the limits still hold.
    let mut config = kc();
    config.eviction_hard = BTreeMap::new();
    let h = Harness::new(&config, stats.clone(), pods.clone());
    let e = h.manager.synchronize(Trigger::Periodic).await.expect("evicts");
    assert_eq!(h.killed(), ["over", "also-over"], "every pod over a limit, in one pass; never a critical one");
    assert_eq!(e.pod.metadata.name.as_deref(), Some("over"));
    assert_eq!((e.grace_period_seconds, e.condition.is_none()), (0, true));
    assert!(e.annotations.is_empty());
    let mut pod_status = k8s_openapi::api::core::v1::PodStatus::default();
    e.apply_to_status(&mut pod_status, k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
    assert_eq!((pod_status.phase.as_deref(), pod_status.reason.as_deref()), (Some("Failed"), Some("Evicted")));
    assert!(pod_status.conditions.is_none(), "no DisruptionTarget for local storage evictions");
    assert!(h.metrics_text().contains("kubelet_evictions{eviction_signal=\"emptydirfs.limit\"} 2"));
    assert!(h.events().iter().any(|(_, r, m)| r == "Evicted" && m.starts_with("Usage of EmptyDir volume")));
    assert!(h.manager.node_conditions().is_empty());

    // localStorageCapacityIsolation off: nothing.
    config.local_storage_capacity_isolation = false;
    let h = Harness::new(&config, stats, pods);
    assert!(h.manager.synchronize(Trigger::Periodic).await.is_none());
    assert!(h.killed().is_empty());
}
