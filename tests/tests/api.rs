//! End-to-end tests of API-server mode: a real `swiftlet` joined to the project's test
//! API server (a test double of kube-apiserver, see `swiftlet_tests::apiserver`) and
//! running pods in the real containerd of the test bed.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use swiftlet_tests::apiserver::{Options, TestApiServer};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, testbed_lock};

const NODE: &str = "e2e-node";

fn pod(name: &str, spec: &serde_json::Value) -> Pod {
    let mut s = json!({
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 2,
        "containers": [{
            "name": "main",
            "image": "localhost/busybox:latest",
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
        }]
    });
    for (k, v) in spec.as_object().unwrap() {
        s[k] = v.clone();
    }
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": s}),
    )
    .unwrap()
}

fn condition<'a>(p: &'a Pod, type_: &str) -> Option<&'a str> {
    p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_).map(|c| c.status.as_str())
}

async fn wait_pod(api: &TestApiServer, name: &str, secs: u64, pred: impl Fn(&Pod) -> bool) -> Result<Pod> {
    let p = api.wait_for::<Pod>(Some("default"), name, Duration::from_secs(secs), |p| p.is_some_and(&pred)).await?;
    Ok(p.expect("present"))
}

#[tokio::test]
async fn node_registers_stays_ready_and_renews_its_lease() -> Result<()> {
    let _g = testbed_lock().await;
    let (api, agent, cri) = swiftlet_tests::api_mode_agent().await?;
    let node = api
        .wait_for::<Node>(None, NODE, Duration::from_secs(30), |n| {
            n.and_then(|n| n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").cloned())
                .is_some_and(|c| c.status == "True")
        })
        .await
        .map_err(|e| anyhow::anyhow!("node not Ready: {e}\n{}", swiftlet_tests::tail(&agent.log(), 30)))?
        .unwrap();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("kubernetes.io/hostname").map(String::as_str), Some(NODE));
    assert_eq!(labels.get("kubernetes.io/os").map(String::as_str), Some("linux"));
    let status = node.status.clone().unwrap();
    let cap = status.capacity.clone().unwrap();
    assert!(cap.contains_key("cpu") && cap.contains_key("memory") && cap.contains_key("pods"));
    let alloc = status.allocatable.clone().unwrap();
    assert!(alloc.contains_key("ephemeral-storage"));
    let info = status.node_info.clone().unwrap();
    assert!(info.container_runtime_version.starts_with("containerd://"), "{}", info.container_runtime_version);
    assert!(info.kubelet_version.starts_with("v1.37"));
    for t in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        let c = status.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap();
        assert_eq!(c.status, "False", "{t}");
    }
    // The lease exists, is held by the node and gets renewed.
    let lease =
        api.wait_for::<Lease>(Some("kube-node-lease"), NODE, Duration::from_secs(30), |l| l.is_some()).await?.unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let first = spec.renew_time.clone().unwrap();
    let renewed = api
        .wait_for::<Lease>(Some("kube-node-lease"), NODE, Duration::from_secs(20), |l| {
            l.and_then(|l| l.spec.as_ref()?.renew_time.clone()).is_some_and(|t| t.0 > first.0)
        })
        .await?;
    assert!(renewed.is_some());
    // A deleted node object is registered again.
    api.delete::<Node>(None, NODE, Some(0))?;
    api.wait_for::<Node>(None, NODE, Duration::from_secs(30), |n| n.is_some())
        .await
        .map_err(|e| anyhow::anyhow!("node not registered again: {e}\n{}", swiftlet_tests::tail(&agent.log(), 30)))?;
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn api_pod_runs_reports_status_and_is_deleted_gracefully() -> Result<()> {
    let _g = testbed_lock().await;
    let (api, agent, cri) = swiftlet_tests::api_mode_agent().await?;
    api.wait_for::<Node>(None, NODE, Duration::from_secs(30), |n| n.is_some()).await?;
    let created = api.create(&pod("web", &json!({})))?;
    let uid = created.metadata.uid.clone().unwrap();
    let p = wait_pod(&api, "web", 60, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && condition(p, "Ready") == Some("True")
    })
    .await?;
    let st = p.status.clone().unwrap();
    assert!(st.pod_ip.is_some(), "podIP");
    assert!(st.host_ip.is_some(), "hostIP");
    assert!(st.start_time.is_some(), "startTime");
    assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
    for c in ["PodReadyToStartContainers", "Initialized", "ContainersReady", "PodScheduled"] {
        assert_eq!(condition(&p, c), Some("True"), "{c}");
    }
    let cs = &st.container_statuses.unwrap()[0];
    assert!(cs.container_id.as_deref().is_some_and(|c| c.starts_with("containerd://")));
    assert!(cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some());
    // The image as containerd names it in the container's status (its repo tag), the id
    // beside it, as upstream reports them.
    assert_eq!(cs.image, "localhost/busybox:latest");
    assert!(cs.image_id.starts_with("sha256:"), "{}", cs.image_id);
    assert_eq!(cri.containers(&uid).await?.len(), 1);
    // The pod startup SLI is observed once the running status comes back on the watch.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while agent.metric("kubelet_pod_start_sli_duration_seconds_count").await? < 1.0 {
        assert!(std::time::Instant::now() < deadline, "no pod start SLI observation");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(agent.metric("kubelet_pod_start_sli_duration_seconds_count").await? as u64, 1);
    assert_eq!(agent.metric("kubelet_pod_start_total_duration_seconds_count").await? as u64, 1);
    // Graceful deletion: the API sets deletionTimestamp; the kubelet stops the pod and
    // then deletes the object with grace 0.
    api.delete::<Pod>(Some("default"), "web", Some(5))?;
    api.wait_for::<Pod>(Some("default"), "web", Duration::from_mins(1), |p| p.is_none()).await?;
    assert!(cri.sandboxes(&uid).await?.iter().all(|s| s.state != 0), "sandbox stopped");
    let deletes: Vec<_> =
        api.requests().into_iter().filter(|r| r.method == "DELETE" && r.path.ends_with("/pods/web")).collect();
    assert!(!deletes.is_empty(), "the kubelet deleted the pod object");
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn admission_rejects_a_pod_that_does_not_fit() -> Result<()> {
    let _g = testbed_lock().await;
    let (api, agent, cri) = swiftlet_tests::api_mode_agent().await?;
    api.wait_for::<Node>(None, NODE, Duration::from_secs(30), |n| {
        n.is_some_and(|n| n.status.as_ref().and_then(|s| s.allocatable.as_ref()).is_some())
    })
    .await?;
    let big = pod(
        "huge",
        &json!({"containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                               "resources": {"requests": {"cpu": "1000"}}}]}),
    );
    let uid = api.create(&big)?.metadata.uid.unwrap();
    let p =
        wait_pod(&api, "huge", 30, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")).await?;
    let st = p.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("OutOfcpu"));
    assert!(st.message.unwrap_or_default().starts_with("Pod was rejected: Node didn't have enough resource: cpu"));
    assert!(cri.sandboxes(&uid).await?.is_empty(), "a rejected pod never runs");
    api.delete::<Pod>(Some("default"), "huge", Some(0))?;
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn static_pods_get_mirror_pods() -> Result<()> {
    let _g = testbed_lock().await;
    let (api, agent, cri) = swiftlet_tests::api_mode_agent().await?;
    agent.write_manifest(
        "static.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static\nspec:\n  containers:\n  - name: main\n    image: localhost/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n",
    )?;
    let name = format!("static-{NODE}");
    let mirror = wait_pod(&api, &name, 60, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .await
        .map_err(|e| {
            let seen: Option<Pod> = api.get(Some("default"), &name);
            anyhow::anyhow!(
                "mirror pod not Running: {e}\nmirror: {:?}\n{}",
                seen.map(|p| p.status),
                swiftlet_tests::tail(&agent.log(), 40)
            )
        })?;
    let ann = mirror.metadata.annotations.clone().unwrap_or_default();
    assert!(ann.contains_key("kubernetes.io/config.mirror"), "{ann:?}");
    assert_eq!(mirror.metadata.owner_references.unwrap()[0].kind, "Node");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while agent.metric("kubelet_mirror_pods").await? < 1.0 {
        assert!(std::time::Instant::now() < deadline, "kubelet_mirror_pods did not count the mirror pod");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Deleted by someone: recreated.
    api.delete::<Pod>(Some("default"), &name, Some(0))?;
    api.wait_for::<Pod>(Some("default"), &name, Duration::from_secs(30), |p| p.is_none()).await?;
    api.wait_for::<Pod>(Some("default"), &name, Duration::from_secs(30), |p| p.is_some()).await?;
    // Manifest removed: the mirror goes too.
    agent.remove_manifest("static.yaml")?;
    api.wait_for::<Pod>(Some("default"), &name, Duration::from_mins(1), |p| p.is_none()).await?;
    agent.shutdown(&cri).await
}

/// The API server goes away for 60 s: pods keep running (a container that dies meanwhile
/// is restarted), and once it is back the pod's status there converges.
#[tokio::test]
async fn api_server_outage_leaves_pods_running_and_status_converges() -> Result<()> {
    let _g = testbed_lock().await;
    let (api, agent, cri) = swiftlet_tests::api_mode_agent().await?;
    api.wait_for::<Node>(None, NODE, Duration::from_secs(30), |n| n.is_some()).await?;
    let uid = api.create(&pod("steady", &json!({})))?.metadata.uid.unwrap();
    wait_pod(&api, "steady", 60, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).await?;
    let sandbox = cri.sandboxes(&uid).await?[0].id.clone();
    api.stop().await;
    // During the outage a container dies; the node still restarts it.
    let cid = cri.containers(&uid).await?[0].id.clone();
    let st = cri.container_status(&cid).await?;
    let info: serde_json::Value = serde_json::from_str(st.info.get("info").map_or("{}", String::as_str))?;
    let pid = i32::try_from(info["pid"].as_i64().unwrap_or(0))?;
    // SAFETY: kill(2) on the container's init process, found through CRI.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cri.containers(&uid).await?.iter().filter(|c| c.state == 1).count() != 1 {
        assert!(std::time::Instant::now() < deadline, "container not restarted during the outage");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_mins(1)).await; // the outage itself, as specified
    api.restart().await?;
    let p = wait_pod(&api, "steady", 60, |p| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| cs[0].restart_count == 1 && cs[0].state.as_ref().is_some_and(|s| s.running.is_some()))
    })
    .await?;
    assert_eq!(p.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(cri.sandboxes(&uid).await?[0].id, sandbox, "the sandbox was never touched");
    api.delete::<Pod>(Some("default"), "steady", Some(0))?;
    agent.shutdown(&cri).await
}

async fn running_container(cri: &Cri, uid: &str) -> Result<String> {
    cri.containers(uid)
        .await?
        .into_iter()
        .find(|c| c.state == 1)
        .map(|c| c.id)
        .ok_or_else(|| anyhow::anyhow!("no running container"))
}

async fn cat(cri: &Cri, id: &str, path: &str) -> Result<String> {
    let (code, out) = cri.exec(id, &["cat", path]).await?;
    anyhow::ensure!(code == 0, "cat {path} exited {code}");
    Ok(out)
}

/// `ConfigMap`, `Secret` and projected token volumes, env from them, and an updated
/// `ConfigMap` reaching the mounted file on a later sync.
#[tokio::test]
async fn configmap_secret_and_token_volumes_and_env() -> Result<()> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let _g = testbed_lock().await;
    let (api, agent, cri) = swiftlet_tests::api_mode_agent().await?;
    api.wait_for::<Node>(None, NODE, Duration::from_secs(30), |n| n.is_some()).await?;
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings", "namespace": "default"},
        "data": {"greeting": "hello", "color": "blue"}
    }))?;
    api.create(&cm)?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds", "namespace": "default"},
        "data": {"password": "czNjcmV0"}
    }))?;
    api.create(&secret)?;
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "backend", "namespace": "default"},
        "spec": {"ports": [{"name": "http", "port": 8080}]}
    }))?;
    let backend_ip = api.create(&svc)?.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    // Service links off: only the kubernetes service's variables.
    let unlinked = json!({
        "enableServiceLinks": false,
        "containers": [{
            "name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
        }]
    });
    let unlinked_uid = api.create(&pod("unlinked", &unlinked))?.metadata.uid.unwrap();
    let spec = json!({
        "volumes": [
            {"name": "cfg", "configMap": {"name": "settings"}},
            {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 256}},
            {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "audience": "vault", "expirationSeconds": 3600}}]}},
            {"name": "scratch", "emptyDir": {}}
        ],
        "containers": [{
            "name": "main",
            "image": "localhost/busybox:latest",
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
            "env": [
                {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "MEM_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}
            ],
            "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
            "resources": {"limits": {"memory": "64Mi"}},
            "volumeMounts": [
                {"name": "cfg", "mountPath": "/etc/settings"},
                {"name": "sec", "mountPath": "/etc/creds", "readOnly": true},
                {"name": "tok", "mountPath": "/var/run/tok"},
                {"name": "scratch", "mountPath": "/scratch"}
            ]
        }]
    });
    let uid = api.create(&pod("volumes", &spec))?.metadata.uid.unwrap();
    wait_pod(&api, "volumes", 60, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", swiftlet_tests::tail(&agent.log(), 30)))?;
    let id = running_container(&cri, &uid).await?;
    assert_eq!(cat(&cri, &id, "/etc/settings/greeting").await?, "hello");
    assert_eq!(cat(&cri, &id, "/etc/creds/password").await?, "s3cret");
    assert!(cat(&cri, &id, "/var/run/tok/token").await?.split('.').count() == 3, "a JWT");
    let (_, env) = cri.exec(&id, &["sh", "-c", "echo $GREETING $PASSWORD $CFG_color $MEM_LIMIT"]).await?;
    assert_eq!(env.trim(), "hello s3cret blue 64");
    let (_, env) = cri
        .exec(
            &id,
            &[
                "sh",
                "-c",
                "echo $BACKEND_SERVICE_HOST $BACKEND_SERVICE_PORT_HTTP $BACKEND_PORT $KUBERNETES_SERVICE_HOST",
            ],
        )
        .await?;
    assert_eq!(env.trim(), format!("{backend_ip} 8080 tcp://{backend_ip}:8080 10.96.0.1"));
    wait_pod(&api, "unlinked", 60, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).await?;
    let bare_id = running_container(&cri, &unlinked_uid).await?;
    let (_, env) = cri.exec(&bare_id, &["sh", "-c", "echo [$BACKEND_SERVICE_HOST] $KUBERNETES_SERVICE_PORT"]).await?;
    assert_eq!(env.trim(), "[] 443");
    api.delete::<Pod>(Some("default"), "unlinked", Some(0))?;
    let (code, _) = cri.exec(&id, &["sh", "-c", "echo x > /scratch/f && cat /scratch/f"]).await?;
    assert_eq!(code, 0, "emptyDir is writable");
    // The ConfigMap changes: the file follows on a later pod sync.
    api.modify::<ConfigMap>(Some("default"), "settings", false, |c| {
        c.data.get_or_insert_with(Default::default).insert("greeting".into(), "bonjour".into());
    })?;
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    while cat(&cri, &id, "/etc/settings/greeting").await? != "bonjour" {
        assert!(std::time::Instant::now() < deadline, "ConfigMap update did not reach the volume");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    api.delete::<Pod>(Some("default"), "volumes", Some(0))?;
    agent.shutdown(&cri).await
}

/// resolv.conf as the pod's dnsPolicy says (clusterDNS and clusterDomain configured).
#[tokio::test]
async fn dns_policies() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let api = TestApiServer::start(Options::default()).await?;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        extra_config: "clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n".into(),
        ..AgentOptions::default()
    })
    .await?;
    api.wait_for::<Node>(None, NODE, Duration::from_secs(30), |n| n.is_some()).await?;
    let first = api.create(&pod("dns-cluster", &json!({})))?.metadata.uid.unwrap();
    let none = api
        .create(&pod(
            "dns-none",
            &json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["192.0.2.53"], "searches": ["example.test"], "options": [{"name": "ndots", "value": "2"}]}}),
        ))?
        .metadata
        .uid
        .unwrap();
    for name in ["dns-cluster", "dns-none"] {
        wait_pod(&api, name, 60, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).await?;
    }
    let conf = cat(&cri, &running_container(&cri, &first).await?, "/etc/resolv.conf").await?;
    assert!(conf.contains("nameserver 10.96.0.10"), "{conf}");
    assert!(conf.contains("search default.svc.cluster.local svc.cluster.local cluster.local"), "{conf}");
    assert!(conf.contains("ndots:5"), "{conf}");
    let conf = cat(&cri, &running_container(&cri, &none).await?, "/etc/resolv.conf").await?;
    assert!(
        conf.contains("nameserver 192.0.2.53") && conf.contains("search example.test") && conf.contains("ndots:2"),
        "{conf}"
    );
    let hosts = cat(&cri, &running_container(&cri, &first).await?, "/etc/hosts").await?;
    assert!(hosts.contains("dns-cluster"), "{hosts}");
    api.delete::<Pod>(Some("default"), "dns-cluster", Some(0))?;
    api.delete::<Pod>(Some("default"), "dns-none", Some(0))?;
    agent.shutdown(&cri).await
}
