//! `SyncPod` through the runtime manager on the fake runtime: what a sync reports, ephemeral
//! containers, the start gate, and the pod workers around it.

use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::container::ContainerState;
use crate::runtime::manager::testing::{hooked, setup, setup_deps};

/// `touched_runtime` tells the pod worker whether the runtime state it holds is stale; the
/// results say what each action did, successes included, and a container in crash-loop
/// back-off is a failed start that says when to come back.
#[tokio::test]
async fn a_sync_says_whether_it_touched_the_runtime() {
    use super::{SyncAction, SyncResult};
    let (_dir, fake, _recorder, rm) = setup();
    let p = hooked(&json!({}));
    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod(&p, &st).await;
    assert!(r.errors().is_empty() && r.touched_runtime, "{r:?}");
    assert_eq!(
        r.results,
        [
            SyncResult::ok(SyncAction::CreatePodSandbox, "web_default(u1)"),
            SyncResult::ok(SyncAction::StartContainer, "c")
        ]
    );
    // Running, nothing to do.
    let calls = fake.calls().len();
    let st = rm.pod_status("u1").await.unwrap();
    let reads = fake.calls().len() - calls;
    let r = rm.sync_pod(&p, &st).await;
    assert!(r.errors().is_empty() && !r.touched_runtime, "{r:?}");
    assert!(r.results.is_empty(), "no action, no result: {r:?}");
    assert_eq!(fake.calls().len() - calls, reads, "the sync itself called nothing");
    // The container died: its restart is a change; the next, in crash-loop back-off, is not.
    let id = fake.containers_named("c")[0].clone();
    fake.exit_container(&id, 1);
    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod(&p, &st).await;
    assert!(r.touched_runtime);
    assert_eq!(r.results, [SyncResult::ok(SyncAction::StartContainer, "c")]);
    let id = fake.containers_named("c").last().cloned().unwrap();
    fake.exit_container(&id, 1);
    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod(&p, &st).await;
    assert!(r.errors().iter().any(|e| e.starts_with("CrashLoopBackOff")), "{r:?}");
    assert!(!r.touched_runtime, "{r:?}");
    let [only] = r.results.as_slice() else { panic!("{r:?}") };
    assert_eq!(
        (only.action, only.target.as_str(), only.error),
        (SyncAction::StartContainer, "c", Some("CrashLoopBackOff"))
    );
    assert!(only.retry_after.is_some_and(|d| !d.is_zero()), "{only:?}");
    assert_eq!(r.requeue_after(), only.retry_after);
    assert!(r.failed());
}

/// Ephemeral containers through the runtime manager, on the fake runtime.
mod ephemeral_wiring {
    use serde_json::json;

    use super::super::*;
    use crate::runtime::manager::testing::setup;
    use crate::runtime::metrics::StartedContainerErrorLabels;

    fn pod(debuggers: &serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {
                "restartPolicy": "Always",
                "containers": [{"name": "app", "image": "img", "imagePullPolicy": "IfNotPresent",
                                "terminationMessagePath": ""}],
                "ephemeralContainers": debuggers
            }
        }))
        .unwrap()
    }

    fn started(rm: &RuntimeManager, kind: &str) -> u64 {
        rm.metrics.started_containers.get_or_create(&ContainerTypeLabels { container_type: kind.into() }).get()
    }

    fn errors(rm: &RuntimeManager, code: &str) -> u64 {
        rm.metrics
            .started_containers_errors
            .get_or_create(&StartedContainerErrorLabels {
                code: code.into(),
                container_type: "ephemeral_container".into(),
            })
            .get()
    }

    #[tokio::test]
    async fn an_ephemeral_container_joins_its_target_and_is_never_restarted() {
        let (_dir, fake, _recorder, rm) = setup();
        let debugger = json!([{"name": "debug", "image": "img", "imagePullPolicy": "IfNotPresent",
                               "targetContainerName": "app", "terminationMessagePath": ""}]);
        let plain = pod(&json!([]));
        let st = rm.pod_status("u1").await.unwrap();
        assert!(rm.sync_pod(&plain, &st).await.errors().is_empty());
        let app = fake.containers_named("app")[0].clone();

        let p = pod(&debugger);
        let st = rm.pod_status("u1").await.unwrap();
        let r = rm.sync_pod(&p, &st).await;
        assert!(r.errors().is_empty() && r.touched_runtime, "{r:?}");
        let ids = fake.containers_named("debug");
        assert_eq!(ids.len(), 1);
        let cfg = fake.container_config(&ids[0]).unwrap();
        let ns = cfg.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!((ns.pid, ns.target_id.as_str()), (api::NamespaceMode::Target as i32, app.as_str()));
        assert_eq!(cfg.labels[labels::CONTAINER_TYPE], "ephemeral");
        assert_eq!(cfg.labels[labels::CONTAINER_NAME], "debug");
        assert_eq!(cfg.log_path, "debug/0.log");
        assert_eq!((started(&rm, "ephemeral_container"), started(&rm, "container")), (1, 1));

        // Running: left alone. Exited: not restarted, though the pod restarts containers.
        let st = rm.pod_status("u1").await.unwrap();
        assert!(!rm.sync_pod(&p, &st).await.touched_runtime);
        fake.exit_container(&ids[0], 0);
        let st = rm.pod_status("u1").await.unwrap();
        let r = rm.sync_pod(&p, &st).await;
        assert!(r.errors().is_empty() && !r.touched_runtime, "{r:?}");
        assert_eq!(fake.containers_named("debug").len(), 1);
        assert_eq!(started(&rm, "ephemeral_container"), 1);
    }

    #[tokio::test]
    async fn a_missing_or_stopped_target_fails_the_start_until_it_runs() {
        let (_dir, fake, _recorder, rm) = setup();
        let st = rm.pod_status("u1").await.unwrap();
        assert!(rm.sync_pod(&pod(&json!([])), &st).await.errors().is_empty());
        // Upstream validates the target's name; a spec that names no container of the
        // runtime is a config error, and nothing is created.
        let p = pod(&json!([{"name": "debug", "image": "img", "imagePullPolicy": "IfNotPresent",
                            "targetContainerName": "nope", "terminationMessagePath": ""}]));
        let st = rm.pod_status("u1").await.unwrap();
        let r = rm.sync_pod(&p, &st).await;
        assert_eq!(r.errors(), ["CreateContainerConfigError: unable to find target container nope"]);
        assert_eq!(
            rm.start_failure("u1", "debug"),
            Some(("CreateContainerConfigError".into(), "unable to find target container nope".into()))
        );
        assert_eq!(errors(&rm, "CreateContainerConfigError"), 1);
        assert!(fake.containers_named("debug").is_empty());

        // A target that is not running: the runtime refuses it, and the next sync tries again.
        let p = pod(&json!([{"name": "debug", "image": "img", "imagePullPolicy": "IfNotPresent",
                            "targetContainerName": "app", "terminationMessagePath": ""}]));
        let app = fake.containers_named("app")[0].clone();
        fake.exit_container(&app, 1);
        let mut st = rm.pod_status("u1").await.unwrap();
        // The ephemeral container comes first (and fails); the app container restarts.
        let r = rm.sync_pod(&p, &st).await;
        assert!(r.errors().iter().any(|e| e.starts_with("CreateContainerError")), "{r:?}");
        assert_eq!(errors(&rm, "CreateContainerError"), 1);
        assert!(fake.containers_named("debug").is_empty());
        // The app container came back: the debugger joins the new one.
        st = rm.pod_status("u1").await.unwrap();
        let r = rm.sync_pod(&p, &st).await;
        assert!(r.errors().is_empty(), "{r:?}");
        let new_app = fake.containers_named("app").last().cloned().unwrap();
        assert_ne!(new_app, app);
        let debug = fake.containers_named("debug");
        assert_eq!(debug.len(), 1);
        let cfg = fake.container_config(&debug[0]).unwrap();
        assert_eq!(cfg.linux.unwrap().security_context.unwrap().namespace_options.unwrap().target_id, new_app);
        assert_eq!(rm.start_failure("u1", "debug"), None, "a start clears the reason");
    }
}

/// The start gate between the pod workers and the runtime ([`super::super::start_gate`]).
mod start_gate_wiring {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::FutureExt as _;
    use serde_json::json;

    use super::super::*;
    use crate::runtime::manager::testing::setup_deps;

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{uid}"), "namespace": "default", "uid": uid},
            "spec": {"containers": [
                {"name": "a", "image": "img", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": ""},
                {"name": "b", "image": "img", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": ""}
            ]}
        }))
        .unwrap()
    }

    /// In-flight and peak counts of one kind of call.
    #[derive(Default)]
    struct Flight {
        now: AtomicUsize,
        peak: AtomicUsize,
    }

    /// Starts `pods` pods at once through a manager limited to `limit`; every
    /// sandbox and container start takes 100 ms. The peaks of (sandbox starts,
    /// container create+start pairs) in flight.
    async fn peaks(limit: usize, pods: usize) -> (usize, usize) {
        let (_dir, fake, _recorder, deps) = setup_deps();
        let rm = RuntimeManager::new(RuntimeManagerDeps { start_concurrency: limit, ..deps });
        let sandboxes = Arc::new(Flight::default());
        let containers = Arc::new(Flight::default());
        fake.set_start_hook({
            let (sandboxes, containers) = (sandboxes.clone(), containers.clone());
            move |call| {
                let (sandboxes, containers) = (sandboxes.clone(), containers.clone());
                async move {
                    // A container is in flight from its create to the end of its start.
                    let flight = match call {
                        "run_podsandbox" => &sandboxes,
                        "create_container" => {
                            let n = containers.now.fetch_add(1, Ordering::SeqCst) + 1;
                            containers.peak.fetch_max(n, Ordering::SeqCst);
                            return tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            containers.now.fetch_sub(1, Ordering::SeqCst);
                            return;
                        }
                    };
                    let n = flight.now.fetch_add(1, Ordering::SeqCst) + 1;
                    flight.peak.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    flight.now.fetch_sub(1, Ordering::SeqCst);
                }
                .boxed()
            }
        });
        let all: Vec<Pod> = (0..pods).map(|i| pod(&format!("u{i}"))).collect();
        let syncs = all.iter().map(|p| async {
            let st = rm.pod_status(p.metadata.uid.as_deref().unwrap()).await.unwrap();
            rm.sync_pod(p, &st).await
        });
        for r in futures::future::join_all(syncs).await {
            assert!(r.errors().is_empty(), "{:?}", r.errors());
        }
        assert_eq!(fake.calls().iter().filter(|c| *c == "start_container").count(), 2 * pods);
        (sandboxes.peak.load(Ordering::SeqCst), containers.peak.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn starts_reach_the_runtime_at_most_limit_at_a_time() {
        assert_eq!(peaks(3, 10).await, (3, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_sends_every_start_at_once() {
        // A pod's containers start one after another, as upstream's SyncPod starts them.
        assert_eq!(peaks(0, 10).await, (10, 10));
    }

    #[tokio::test]
    async fn the_evented_pleg_is_told_of_each_start_call_under_way() {
        let (_dir, fake, _recorder, deps) = setup_deps();
        let cache = Arc::new(crate::container::cache::RuntimeCache::default());
        let starts = cache.starts().clone();
        let rm = RuntimeManager::new(RuntimeManagerDeps { start_concurrency: 2, cache, ..deps });
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        fake.set_start_hook({
            let (starts, seen) = (starts.clone(), seen.clone());
            move |call| {
                seen.lock().unwrap().push((call, starts.in_flight("u1"), starts.in_flight("u2")));
                async {}.boxed()
            }
        });
        let p = pod("u1");
        let st = rm.pod_status("u1").await.unwrap();
        let r = rm.sync_pod(&p, &st).await;
        assert!(r.errors().is_empty(), "{:?}", r.errors());
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 5, "a sandbox, two creates, two starts: {seen:?}");
        assert!(seen.iter().all(|&(_, mine, other)| mine && !other), "{seen:?}");
        assert!(!starts.in_flight("u1"), "nothing under way once the sync is done");
        // Each successful start is there for the PLEG to take, with the container's name.
        let sandbox = fake.list_pod_sandbox(None).await.unwrap()[0].id.clone();
        assert_eq!(starts.take_started(&sandbox).as_deref(), Some(""));
        for name in ["a", "b"] {
            let id = fake.containers_named(name)[0].clone();
            assert_eq!(starts.take_started(&id).as_deref(), Some(name));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_sandbox_start_does_not_stall_the_other_pods() {
        let (_dir, fake, _recorder, deps) = setup_deps();
        let rm = Arc::new(RuntimeManager::new(RuntimeManagerDeps { start_concurrency: 1, ..deps }));
        let first = Arc::new(AtomicUsize::new(0));
        let hanging = Arc::new(tokio::sync::Notify::new());
        fake.set_start_hook({
            let hanging = hanging.clone();
            move |call| {
                let hang = call == "run_podsandbox" && first.fetch_add(1, Ordering::SeqCst) == 0;
                let hanging = hanging.clone();
                async move {
                    if hang {
                        hanging.notify_one();
                        std::future::pending::<()>().await;
                    }
                }
                .boxed()
            }
        });
        let hung = tokio::spawn({
            let rm = rm.clone();
            async move {
                let p = pod("stuck");
                let st = rm.pod_status("stuck").await.unwrap();
                rm.sync_pod(&p, &st).await
            }
        });
        hanging.notified().await;
        let started = tokio::time::Instant::now();
        let p = pod("next");
        let st = rm.pod_status("next").await.unwrap();
        let r = rm.sync_pod(&p, &st).await;
        assert!(r.errors().is_empty(), "{:?}", r.errors());
        assert_eq!(started.elapsed(), crate::runtime::start_gate::HOLD, "the next pod waited for the hold only");
        assert!(!hung.is_finished());
        hung.abort();
    }
}

/// Volumes wired through the runtime manager and the pod workers, on the fake runtime and
/// the fake object source.
mod volumes_wiring {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use crate::cm::FakePodContainerManager;
    use crate::pod_workers::{PodWorkers, SyncDeps, WorkType};
    use crate::runtime::manager::testing::{app_config, cluster_dns, env, events, pod};
    use crate::status::{StatusManager, StatusProvider as _};

    /// The pod worker hooks: a missing `ConfigMap` keeps the pod waiting with
    /// `FailedMount`; once it exists the pod starts; removal cleans the volumes.
    #[tokio::test]
    async fn pod_workers_wait_for_volumes_and_clean_them_up() {
        let tmp = tempfile::tempdir().unwrap();
        let e = env(cluster_dns(tmp.path()));
        let status = Arc::new(StatusManager::default());
        let stop = CancellationToken::new();
        let workers = PodWorkers::new(
            Arc::new(SyncDeps {
                runtime: e.rm.clone(),
                cm: Arc::new(FakePodContainerManager::default()),
                status: status.clone(),
                metrics: Arc::default(),
                recorder: e.recorder.clone(),
                runtime_name: "fake".into(),
                sync_frequency: Duration::from_millis(50),
                host_ip: None,
                runtime_state: None,
                records: crate::event_api::EventBus::default(),
            }),
            TaskTracker::new(),
            stop.clone(),
        );
        let p = pod();
        workers.update_pod(p.clone(), WorkType::Create);
        for _ in 0..100 {
            if !events(&e.recorder, "FailedMount").is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            events(&e.recorder, "FailedMount"),
            vec!["MountVolume.SetUp failed for volume \"cfg\" : configmap \"app\" not found"]
        );
        assert!(!e.recorder.list().iter().any(|ev| ev.reason.as_deref() == Some("Started")));

        e.src.set_config_map(app_config("info"));
        workers.update_pod(p.clone(), WorkType::Sync);
        for _ in 0..200 {
            if status.get("u1").is_some_and(|s| s.phase.as_deref() == Some("Running")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(status.get("u1").and_then(|s| s.phase), Some("Running".into()));
        let vol_dir = e.dir.path().join("root/pods/u1/volumes");
        assert!(vol_dir.exists());

        workers.update_pod(p, WorkType::Kill { grace: None });
        tokio::time::timeout(Duration::from_secs(5), workers.wait_finished("u1")).await.unwrap();
        assert!(!vol_dir.exists());
        assert!(!e.dir.path().join("root/pods/u1").exists());
        stop.cancel();
    }
}

/// A pod with sidecars on the fake runtime: each sidecar starts and keeps running while the
/// next init container and the app containers start, and the pod stops app containers
/// first, then its sidecars in reverse order.
#[tokio::test]
async fn sidecars_run_beside_initialization_and_stop_last_in_reverse_order() {
    use k8s_openapi::api::core::v1::Pod;
    let (_dir, fake, _recorder, rm) = setup();
    let ctr = |name: &str| json!({"name": name, "image": "img", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": ""});
    let sidecar = |name: &str| {
        let mut c = ctr(name);
        c["restartPolicy"] = json!("Always");
        c
    };
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
        "spec": {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 5,
            "initContainers": [sidecar("logs"), ctr("setup"), sidecar("proxy")],
            "containers": [ctr("app"), ctr("worker")]
        }
    }))
    .unwrap();
    let started = |name: &str| fake.containers_named(name).len();
    // Sync after sync, as the pod worker does: logs; setup beside it; once setup is done,
    // proxy; once proxy runs, the app containers.
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    assert_eq!((started("logs"), started("setup")), (1, 0));
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    assert_eq!(started("setup"), 1, "setup starts while logs runs");
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    assert_eq!((started("proxy"), started("app")), (0, 0), "both wait for setup");
    fake.exit_container(&fake.containers_named("setup")[0], 0);
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    assert_eq!((started("proxy"), started("app")), (1, 0));
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    assert_eq!((started("app"), started("worker")), (1, 1));
    assert_eq!((started("logs"), started("setup")), (1, 1), "neither ran twice");
    // Steady state: nothing to do.
    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod(&p, &st).await;
    assert!(!r.touched_runtime, "{r:?}");
    // Stopping: apps first (in any order), then proxy, then logs, whatever the order the
    // runtime listed them in (here by name, which would stop logs second).
    let mut st = rm.pod_status("u1").await.unwrap();
    st.containers.sort_by(|a, b| a.name.cmp(&b.name));
    rm.kill_pod(Some(&p), &st, None).await.unwrap();
    let stopped = fake.stopped_containers();
    assert_eq!(stopped.len(), 4, "{stopped:?}");
    let mut apps = stopped[..2].to_vec();
    apps.sort();
    assert_eq!(apps, ["app", "worker"], "{stopped:?}");
    assert_eq!(stopped[2..], ["proxy", "logs"], "{stopped:?}");
}

/// What a container writes to its termination-message file becomes its status message
/// once it has exited (the file is the pod directory's, mounted at the message path).
#[tokio::test]
async fn an_exited_containers_termination_message_is_read_from_its_file() {
    let (_dir, fake, _recorder, rm) = setup();
    let mut p = hooked(&json!({}));
    p.spec.as_mut().unwrap().containers[0].termination_message_path = Some("/dev/termination-log".into());
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    let id = fake.containers_named("c")[0].clone();
    let config = fake.container_config(&id).unwrap();
    let mount = config.mounts.iter().find(|m| m.container_path == "/dev/termination-log").unwrap();
    // Any container user may write it.
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&mount.host_path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o666);
    std::fs::write(&mount.host_path, "DONE").unwrap();
    let st = rm.pod_status("u1").await.unwrap();
    assert_eq!(st.find_container("c").unwrap().message, "", "not read while it runs");
    fake.exit_container(&id, 0);
    let st = rm.pod_status("u1").await.unwrap();
    assert_eq!(st.find_container("c").unwrap().message, "DONE");
}

/// A host-network pod's IP is the node's: a container that asks for `status.podIP` and
/// `status.podIPs` gets the node IP, as upstream's (the sandbox of such a pod has no IP).
#[tokio::test]
async fn a_host_network_pods_ip_in_env_vars_is_the_nodes() {
    let (_dir, fake, _recorder, mut deps) = setup_deps();
    deps.cfg.host_ip = Some("192.0.2.7".into());
    let rm = crate::runtime::manager::RuntimeManager::new(deps);
    let mut p = hooked(&json!({}));
    let spec = p.spec.as_mut().unwrap();
    spec.host_network = Some(true);
    spec.containers[0].env = Some(
        serde_json::from_value(json!([
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
        ]))
        .unwrap(),
    );
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    let id = fake.containers_named("c")[0].clone();
    let envs = fake.container_config(&id).unwrap().envs;
    let value = |k: &str| envs.iter().find(|e| e.key == k).map(|e| e.value.clone());
    assert_eq!(value("POD_IP").as_deref(), Some("192.0.2.7"));
    assert_eq!(value("POD_IPS").as_deref(), Some("192.0.2.7"));
}

/// A reset (`RestartAllContainers`) stops a running container without a grace period,
/// so without its preStop hook, with a `Killing` event saying `killing`, removes it, and
/// starts nothing.
#[tokio::test]
async fn a_reset_kills_without_the_pre_stop_hook_and_removes() {
    use super::{SyncAction, SyncResult};
    let (_dir, fake, recorder, rm) = setup();
    let p = hooked(&json!({"preStop": {"exec": {"command": ["/bin/hook"]}}}));
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod_restarting(&p, &st, true).await;
    assert_eq!(r.results, [SyncResult::ok(SyncAction::RemoveContainer, "c")]);
    assert!(r.removed_any() && r.touched_runtime);
    assert!(fake.containers_named("c").is_empty(), "removed");
    assert!(fake.exec_calls().is_empty(), "no preStop hook");
    let killing: Vec<_> = recorder.list().into_iter().filter(|e| e.reason.as_deref() == Some("Killing")).collect();
    assert_eq!(killing.len(), 1);
    assert_eq!(killing[0].message.as_deref(), Some("killing"));
}

/// A running pod whose container the kernel saw exit with `code`, which the runtime shows
/// running for `polls` more `ContainerStatus` calls; `status` has the kernel's exit.
struct KernelOnlyExit {
    dir: tempfile::TempDir,
    fake: std::sync::Arc<crate::container::fake::FakeRuntime>,
    recorder: std::sync::Arc<crate::events::MemoryRecorder>,
    rm: super::RuntimeManager,
    pod: k8s_openapi::api::core::v1::Pod,
    status: crate::container::RuntimePodStatus,
}

async fn kernel_only_exit(code: i32, polls: u32) -> KernelOnlyExit {
    let (dir, fake, recorder, rm) = setup();
    let pod = hooked(&json!({}));
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&pod, &st).await.errors().is_empty());
    let id = fake.containers_named("c")[0].clone();
    fake.exit_container_lagging(&id, code, polls);
    rm.cache().exits().record("u1", &id, code, SystemTime::now());
    let status = rm.pod_status("u1").await.unwrap();
    KernelOnlyExit { dir, fake, recorder, rm, pod, status }
}

/// A reset on an exit the kernel reported before the runtime recorded it removes the
/// container once the runtime has (containerd refuses to remove a container it shows
/// running), in the same sync, and kills nothing.
#[tokio::test(start_paused = true)]
async fn a_reset_removes_a_container_once_the_runtime_records_its_exit() {
    use super::{SyncAction, SyncResult};
    let KernelOnlyExit { dir: _dir, fake, recorder, rm, pod: p, status: st } = Box::pin(kernel_only_exit(1, 5)).await;
    let r = rm.sync_pod_restarting(&p, &st, true).await;
    assert_eq!(r.results, [SyncResult::ok(SyncAction::RemoveContainer, "c")]);
    assert!(fake.containers_named("c").is_empty(), "removed");
    assert!(fake.stopped_containers().is_empty(), "not stopped: it had exited");
    assert!(!recorder.list().iter().any(|e| e.reason.as_deref() == Some("Killing")), "{:?}", recorder.list());
}

/// A container the runtime no longer has (removed by a reset, or lost in a runtime
/// restart) starts with the restart count after the newest log file of its directory, as
/// upstream's `calcRestartCountByLogDir`: its log goes to a new file, not onto the old one.
#[tokio::test]
async fn a_removed_container_starts_after_its_newest_log_file() {
    let (dir, fake, _recorder, rm) = setup();
    let p = hooked(&json!({}));
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    let first = fake.container_config(&fake.containers_named("c")[0]).unwrap();
    assert_eq!((first.log_path.as_str(), first.metadata.unwrap().attempt), ("c/0.log", 0));
    // What the runtime wrote: the log and a rotated one.
    let logs = dir.path().join("logs").join("default_web_u1").join("c");
    std::fs::create_dir_all(&logs).unwrap();
    for name in ["0.log", "1.log.20261205-101010", "notes.txt"] {
        std::fs::write(logs.join(name), "").unwrap();
    }
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod_restarting(&p, &st, true).await.removed_any());
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&p, &st).await.errors().is_empty());
    let again = fake.container_config(&fake.containers_named("c")[0]).unwrap();
    assert_eq!((again.log_path.as_str(), again.metadata.unwrap().attempt), ("c/2.log", 2));
}

/// The kernel reports a container's exit tens of milliseconds before containerd records
/// it; a pod that turns terminal on that exit is killed at once. Its sandbox is stopped
/// only once the runtime has recorded the exit: containerd kills every container of a
/// sandbox it still thinks runs, and a kill during its own exit handling fails
/// (`ttrpc: closed`), which failed the pod's termination for one sync (`FailedKillPod`).
#[tokio::test(start_paused = true)]
async fn a_pod_is_killed_after_the_runtime_records_an_exit_the_kernel_reported_first() {
    let KernelOnlyExit { dir: _dir, fake, recorder, rm, pod: p, status: st } = Box::pin(kernel_only_exit(137, 5)).await;
    assert_eq!(st.containers[0].state, ContainerState::Exited, "the kernel's exit is laid over CRI's answer");
    rm.kill_pod(Some(&p), &st, None).await.unwrap();
    let st = rm.pod_status("u1").await.unwrap();
    assert!(st.sandboxes.iter().all(|s| !s.ready), "{st:?}");
    assert!(fake.stopped_containers().is_empty(), "the exited container is not stopped");
    assert!(!recorder.list().iter().any(|e| e.reason.as_deref() == Some("Killing")), "{:?}", recorder.list());
}

/// A runtime that never records the exit does not hold the kill up for ever: after the
/// wait the sandbox is stopped anyway and the runtime's error is the kill's.
#[tokio::test(start_paused = true)]
async fn a_runtime_that_never_records_a_kernel_exit_delays_the_kill_by_a_bounded_wait() {
    let KernelOnlyExit { dir: _dir, rm, pod: p, status: st, .. } = Box::pin(kernel_only_exit(137, u32::MAX)).await;
    let began = tokio::time::Instant::now();
    let err = rm.kill_pod(Some(&p), &st, None).await.unwrap_err();
    assert!(err.to_string().contains("ttrpc: closed"), "{err}");
    let waited = began.elapsed();
    assert!(waited >= Duration::from_secs(1) && waited <= Duration::from_secs(3), "{waited:?}");
}

/// A pod whose container `c` writes its termination message to the default path, with
/// `terminationMessagePolicy: policy`; the container is started and its id returned.
async fn with_termination_message(
    policy: &str,
) -> (tempfile::TempDir, std::sync::Arc<crate::container::fake::FakeRuntime>, super::RuntimeManager, String) {
    let (dir, fake, _recorder, rm) = setup();
    let mut pod = hooked(&json!({}));
    let c = &mut pod.spec.as_mut().unwrap().containers[0];
    c.termination_message_path = Some("/dev/termination-log".into());
    c.termination_message_policy = Some(policy.into());
    let st = rm.pod_status("u1").await.unwrap();
    assert!(rm.sync_pod(&pod, &st).await.errors().is_empty());
    let id = fake.containers_named("c")[0].clone();
    (dir, fake, rm, id)
}

/// Where the fake runtime's container `id` has its termination message file on the host.
fn termination_file(fake: &crate::container::fake::FakeRuntime, id: &str) -> std::path::PathBuf {
    let config = fake.container_config(id).unwrap();
    let mount = config.mounts.iter().find(|m| m.container_path == "/dev/termination-log").unwrap();
    mount.host_path.clone().into()
}

/// An exit the kernel reported before the runtime recorded it carries the message the
/// container wrote, in the first status that shows it exited: a pod that turns terminal
/// on that exit writes that status once, and a status without the message was what the
/// API kept.
#[tokio::test]
async fn a_kernel_only_exit_carries_the_termination_message() {
    let (_dir, fake, rm, id) = Box::pin(with_termination_message("File")).await;
    std::fs::write(termination_file(&fake, &id), "all done").unwrap();
    fake.exit_container_lagging(&id, 3, 5);
    rm.cache().exits().record("u1", &id, 3, SystemTime::now());
    let st = rm.pod_status("u1").await.unwrap();
    let c = &st.containers[0];
    assert_eq!((c.state, c.exit_code, c.reason.as_str()), (ContainerState::Exited, 3, "Error"));
    assert_eq!(c.message, "all done");
}

/// With `FallbackToLogsOnError`, a failed container that wrote no message gets the end of
/// its log, which the runtime may not have written out when the kernel sees the exit:
/// such an exit waits for the runtime. The manager says so before the container starts,
/// so that the evented PLEG confirms the exit with the runtime instead of reporting it at
/// once; a kernel record made all the same (the agent restarted, say) is not laid over.
#[tokio::test]
async fn a_failed_exit_whose_message_comes_from_the_log_waits_for_the_runtime() {
    let (dir, fake, rm, id) = Box::pin(with_termination_message("FallbackToLogsOnError")).await;
    assert!(rm.cache().exits().awaits_runtime(&id), "marked before it could exit");
    let log = dir.path().join("logs").join("default_web_u1").join("c").join("0.log");
    std::fs::write(&log, "2026-12-05T10:00:00.000000000Z stderr F no such file\n").unwrap();
    fake.exit_container_lagging(&id, 2, 1);
    rm.cache().exits().record("u1", &id, 2, SystemTime::now());
    let st = rm.pod_status("u1").await.unwrap();
    assert_eq!(st.containers[0].state, ContainerState::Running, "the runtime has not flushed the log");
    let st = rm.pod_status("u1").await.unwrap();
    let c = &st.containers[0];
    assert_eq!((c.state, c.exit_code, c.message.as_str()), (ContainerState::Exited, 2, "no such file\n"));
    // A clean exit needs no log: it is reported at once.
    let (_dir, fake, rm, id) = Box::pin(with_termination_message("FallbackToLogsOnError")).await;
    fake.exit_container_lagging(&id, 0, 5);
    rm.cache().exits().record("u1", &id, 0, SystemTime::now());
    let st = rm.pod_status("u1").await.unwrap();
    assert_eq!((st.containers[0].state, st.containers[0].message.as_str()), (ContainerState::Exited, ""));
}

/// Image volumes: pulled before the containers start, with their own pull policy and
/// events on the pod; a failed pull holds back only the containers that mount the volume.
#[tokio::test]
async fn image_volumes_are_pulled_first_and_a_failed_one_holds_back_its_containers_only() {
    use crate::container::api;
    use crate::container::fake::fake_image;
    use crate::runtime::metrics::{ContainerTypeLabels, StartedContainerErrorLabels};
    let (_dir, fake, recorder, rm) = setup();
    fake.add_registry_image(fake_image("example.test/tools:1"));
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "u1", "annotations": {"a": "b"}},
        "spec": {
            "volumes": [
                {"name": "tools", "image": {"reference": "example.test/tools:1"}},
                {"name": "gone", "image": {"reference": "example.test/gone:1", "pullPolicy": "Never"}}
            ],
            "containers": [
                {"name": "a", "image": "img", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "",
                 "volumeMounts": [{"name": "tools", "mountPath": "/opt/tools"},
                                  {"name": "tools", "mountPath": "/opt/bin", "subPath": "bin"}]},
                {"name": "b", "image": "img", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "",
                 "volumeMounts": [{"name": "gone", "mountPath": "/gone"}]}
            ]
        }
    }))
    .unwrap();
    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod(&p, &st).await;
    assert_eq!(
        r.errors(),
        ["ErrImageNeverPull: Container image \"example.test/gone:1\" is not present with pull policy of Never"]
    );

    // `a` runs with the pulled image mounted twice, read-only, the second at its sub path.
    let [a] = fake.containers_named("a").try_into().unwrap();
    let mounts = fake.container_config(&a).unwrap().mounts;
    let tools = api::ImageSpec {
        image: "sha256:example.test/tools:1".into(),
        user_specified_image: "example.test/tools:1".into(),
        annotations: [("a".to_owned(), "b".to_owned())].into(),
        ..Default::default()
    };
    assert_eq!(
        mounts[..2].iter().map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.readonly)).collect::<Vec<_>>(),
        [("/opt/tools", "", true), ("/opt/bin", "", true)]
    );
    assert!(mounts[..2].iter().all(|m| m.image.as_ref() == Some(&tools)), "{mounts:?}");
    assert_eq!(fake.image_sub_paths(&a), [(1, "bin".to_owned())]);

    // `b` never reached the runtime; its waiting reason is the pull's.
    assert!(fake.containers_named("b").is_empty());
    let (reason, message) = rm.start_failure("u1", "b").unwrap();
    assert_eq!(reason, "ErrImageNeverPull");
    assert_eq!(message, "Container image \"example.test/gone:1\" is not present with pull policy of Never");

    // Pull events are the pod's; the start failure is the container's.
    let on = |reason: &str| {
        recorder
            .list()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| (e.involved_object.field_path, e.message.unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    assert_eq!(on("Pulling"), [(None, "Pulling image \"example.test/tools:1\"".to_owned())]);
    assert_eq!(
        on("ErrImageNeverPull"),
        [(None, "Container image \"example.test/gone:1\" is not present with pull policy of Never".to_owned())]
    );
    assert_eq!(on("Failed"), [(Some("spec.containers{b}".to_owned()), "Error: ErrImageNeverPull".to_owned())]);

    // Upstream's counters: both starts counted, `b`'s failure not among start errors;
    // one image volume requested by `a`, mounted twice.
    let started =
        rm.metrics.started_containers.get_or_create(&ContainerTypeLabels { container_type: "container".into() });
    assert_eq!(started.get(), 2);
    let errors = StartedContainerErrorLabels { code: "ErrImageNeverPull".into(), container_type: "container".into() };
    assert_eq!(rm.metrics.started_containers_errors.get_or_create(&errors).get(), 0);
    let m = &rm.metrics;
    assert_eq!(
        (m.image_volume_requested.get(), m.image_volume_mounted_succeeded.get(), m.image_volume_mounted_errors.get()),
        (1, 2, 0)
    );
}

/// A pod with resource claims on an agent without the API server: its claims cannot be
/// prepared, so its sandbox is never created, and the pod gets upstream's event. The
/// claims come before the sandbox's config, as upstream's `createPodSandbox` comes after
/// them: no DNS warning about a sandbox never made.
#[tokio::test]
async fn claims_that_cannot_be_prepared_hold_back_the_sandbox() {
    let (_dir, fake, recorder, rm) = setup();
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}],
            "containers": [{"name": "c", "image": "img", "imagePullPolicy": "IfNotPresent",
                            "resources": {"claims": [{"name": "gpu"}]}}]
        }
    }))
    .unwrap();
    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod(&p, &st).await;
    assert!(!r.touched_runtime, "{r:?}");
    assert!(!fake.calls().iter().any(|c| c == "run_podsandbox"), "{:?}", fake.calls());
    let events = recorder.list();
    let event = events.iter().find(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources")).unwrap();
    assert_eq!(
        event.message.as_deref(),
        Some("Failed to prepare dynamic resources: resource claims need the API server (standalone mode)")
    );
    let reasons: Vec<_> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
    assert_eq!(reasons, ["FailedPrepareDynamicResources"], "no sandbox config was made: {events:?}");
}

/// A pod's runtime class is its class's `handler` on the sandbox; a class that does not
/// exist fails the sandbox as upstream's (`FailedCreatePodSandBox`, no `RunPodSandbox`),
/// until it is created.
#[tokio::test]
async fn the_runtime_class_names_the_sandbox_handler_and_a_missing_class_fails_the_sandbox() {
    use crate::runtime::runtime_class::{RuntimeClassSource, RuntimeClasses};
    #[derive(Debug, Default)]
    struct Classes(std::sync::Mutex<std::collections::HashMap<String, String>>);
    #[async_trait::async_trait]
    impl RuntimeClassSource for Classes {
        async fn handler(&self, name: &str) -> Result<Option<String>, String> {
            Ok(self.0.lock().unwrap().get(name).cloned())
        }
    }
    let (_dir, fake, recorder, mut deps) = setup_deps();
    let classes = std::sync::Arc::new(Classes::default());
    deps.runtime_classes = RuntimeClasses::new(Some(classes.clone()));
    let rm = super::RuntimeManager::new(deps);
    let mut p = hooked(&json!({}));
    p.spec.as_mut().unwrap().runtime_class_name = Some("sandboxed".into());

    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod(&p, &st).await;
    assert!(!r.touched_runtime, "{r:?}");
    let [only] = r.results.as_slice() else { panic!("{r:?}") };
    assert_eq!(only.action, super::SyncAction::CreatePodSandbox);
    assert_eq!(
        only.message,
        r#"Failed to create sandbox for pod "web_default(u1)": runtimeclass.node.k8s.io "sandboxed" not found"#
    );
    assert!(fake.sandbox_handlers().is_empty(), "no sandbox without its class");
    assert_eq!(
        super::testing::events(&recorder, "FailedCreatePodSandBox"),
        [r#"Failed to create pod sandbox: runtimeclass.node.k8s.io "sandboxed" not found"#]
    );

    classes.0.lock().unwrap().insert("sandboxed".into(), "runsc".into());
    let st = rm.pod_status("u1").await.unwrap();
    let r = rm.sync_pod(&p, &st).await;
    assert!(r.errors().is_empty(), "{r:?}");
    assert_eq!(fake.sandbox_handlers(), ["runsc"]);
}
