use std::sync::Mutex;

use super::*;
use crate::container::fake::FakeRuntime;

#[derive(Debug, Default)]
struct Pods {
    gone: Mutex<HashSet<String>>,
    not_ready: bool,
}

impl PodPresence for Pods {
    fn sources_ready(&self) -> bool {
        !self.not_ready
    }
    fn is_gone(&self, pod_uid: &str) -> bool {
        self.gone.lock().unwrap().contains(pod_uid)
    }
}

struct Env {
    rt: Arc<FakeRuntime>,
    pods: Arc<Pods>,
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self {
            rt: Arc::new(FakeRuntime::default()),
            pods: Arc::new(Pods::default()),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn gc(&self, policy: ContainerGcPolicy) -> ContainerGc {
        ContainerGc::new(self.rt.clone(), self.pods.clone(), policy)
    }

    async fn sandbox(&self, uid: &str) -> String {
        let config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: "p".into(),
                uid: uid.into(),
                namespace: "d".into(),
                attempt: 0,
            }),
            labels: HashMap::from([(labels::POD_UID.to_string(), uid.to_string())]),
            ..Default::default()
        };
        self.rt.run_pod_sandbox(config, String::new()).await.unwrap()
    }

    /// A container of `uid`/`name` in `sandbox` with a log file, exited unless `running`.
    async fn container(&self, sandbox: &str, uid: &str, name: &str, running: bool) -> String {
        let log = self.dir.path().join(format!("{uid}-{name}-{}.log", self.rt.created_containers()));
        std::fs::write(&log, "log\n").unwrap();
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
            labels: HashMap::from([
                (labels::POD_UID.to_string(), uid.to_string()),
                (labels::CONTAINER_NAME.to_string(), name.to_string()),
            ]),
            log_path: log.display().to_string(),
            ..Default::default()
        };
        let id = self.rt.create_container(sandbox, config, api::PodSandboxConfig::default()).await.unwrap();
        self.rt.start_container(&id).await.unwrap();
        if !running {
            self.rt.exit_container(&id, 1);
        }
        id
    }

    async fn ids(&self) -> HashSet<String> {
        self.rt.list_containers(None).await.unwrap().into_iter().map(|c| c.id).collect()
    }
}

fn later() -> SystemTime {
    SystemTime::now() + Duration::from_hours(1)
}

#[tokio::test]
async fn the_newest_dead_container_per_pod_container_is_kept_and_running_ones_untouched() {
    let e = Env::new();
    let sb = e.sandbox("u1").await;
    let old = e.container(&sb, "u1", "web", false).await;
    let old_log = e.rt.container_status(&old).await.unwrap().log_path;
    let newer = e.container(&sb, "u1", "web", false).await;
    let running = e.container(&sb, "u1", "web", true).await;
    let sidecar = e.container(&sb, "u1", "sidecar", false).await;
    let (containers, sandboxes) = e.gc(ContainerGcPolicy::default()).collect(later()).await.unwrap();
    assert_eq!((containers, sandboxes), (1, 0));
    assert_eq!(e.ids().await, HashSet::from([newer, running, sidecar]));
    assert!(!std::path::Path::new(&old_log).exists(), "the log goes with its container");
}

#[tokio::test]
async fn everything_dead_of_a_gone_pod_goes_but_only_once_sources_are_ready() {
    let e = Env::new();
    let sb = e.sandbox("gone").await;
    let a = e.container(&sb, "gone", "a", false).await;
    e.rt.stop_pod_sandbox(&sb).await.unwrap();
    e.pods.gone.lock().unwrap().insert("gone".into());
    let not_ready = Env {
        rt: e.rt.clone(),
        pods: Arc::new(Pods { not_ready: true, ..Pods::default() }),
        dir: tempfile::tempdir().unwrap(),
    };
    assert_eq!(not_ready.gc(ContainerGcPolicy::default()).collect(later()).await.unwrap(), (0, 0));
    assert!(e.ids().await.contains(&a));
    assert_eq!(e.gc(ContainerGcPolicy::default()).collect(later()).await.unwrap(), (1, 1));
    assert!(e.ids().await.is_empty());
    assert!(e.rt.list_pod_sandbox(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_live_pod_keeps_its_newest_sandbox_and_any_ready_or_in_use_one() {
    let e = Env::new();
    let first = e.sandbox("u1").await;
    e.rt.stop_pod_sandbox(&first).await.unwrap();
    let second = e.sandbox("u1").await;
    e.container(&second, "u1", "a", false).await;
    e.rt.stop_pod_sandbox(&second).await.unwrap();
    let third = e.sandbox("u1").await;
    e.rt.stop_pod_sandbox(&third).await.unwrap();
    let (_, removed) = e.gc(ContainerGcPolicy::default()).collect(later()).await.unwrap();
    assert_eq!(removed, 1);
    let left: HashSet<String> = e.rt.list_pod_sandbox(None).await.unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(left, HashSet::from([second, third]), "the newest, and the one with a container");
}

#[tokio::test]
async fn containers_younger_than_min_age_stay() {
    let e = Env::new();
    let sb = e.sandbox("u1").await;
    let a = e.container(&sb, "u1", "a", false).await;
    let b = e.container(&sb, "u1", "a", false).await;
    let created: HashMap<String, i64> =
        e.rt.list_containers(None).await.unwrap().into_iter().map(|c| (c.id, c.created_at)).collect();
    let policy = ContainerGcPolicy { min_age: Duration::from_nanos(10), ..ContainerGcPolicy::default() };
    // "Now" is right after both were created: neither is old enough.
    let now = UNIX_EPOCH + Duration::from_nanos(u64::try_from(created[&b]).unwrap() + 5);
    assert_eq!(e.gc(policy).collect(now).await.unwrap().0, 0);
    let now = UNIX_EPOCH + Duration::from_nanos(u64::try_from(created[&b]).unwrap() + 10);
    assert_eq!(e.gc(policy).collect(now).await.unwrap().0, 1);
    assert_eq!(e.ids().await, HashSet::from([b]));
    let _ = a;
}

#[tokio::test]
async fn the_node_wide_limit_evens_out_then_removes_the_oldest() {
    let e = Env::new();
    let sb = e.sandbox("u1").await;
    let mut made = Vec::new();
    for name in ["a", "a", "a", "b", "b", "c"] {
        made.push(e.container(&sb, "u1", name, false).await);
    }
    let policy = ContainerGcPolicy { max_per_pod_container: -1, max_containers: 2, ..ContainerGcPolicy::default() };
    e.gc(policy).collect(later()).await.unwrap();
    // 3 units → 1 each (a's newest, b's newest, c) → still 3 > 2 → the oldest of those goes.
    assert_eq!(e.ids().await, HashSet::from([made[4].clone(), made[5].clone()]));
}

#[tokio::test]
async fn containers_without_kubelet_labels_are_ignored() {
    let e = Env::new();
    let sb = e.sandbox("u1").await;
    for _ in 0..3 {
        let id =
            e.rt.create_container(&sb, api::ContainerConfig::default(), api::PodSandboxConfig::default())
                .await
                .unwrap();
        e.rt.start_container(&id).await.unwrap();
        e.rt.exit_container(&id, 0);
    }
    assert_eq!(e.gc(ContainerGcPolicy::default()).collect(later()).await.unwrap().0, 0);
    assert_eq!(e.ids().await.len(), 3);
}
