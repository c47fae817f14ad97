//! End-to-end tests on the real control plane of the test bed (`cargo xtask testbed up
//! --cluster`: etcd, kube-apiserver, kube-controller-manager and kube-scheduler of the
//! upstream release, built from the Go modules): a real `swiftlet` joins by TLS
//! bootstrap, the scheduler places pods on it, the real `kubectl` reaches it through the
//! API server, and faults come from the real components.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use swiftlet_tests::cluster::{Cluster, ClusterNode, busybox_pod, node_condition, phase, pod_condition};
use swiftlet_tests::outage::api_server_outage;
use swiftlet_tests::pods::BUSYBOX;
use swiftlet_tests::tcp_proxy::TcpProxy;
use swiftlet_tests::{AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

async fn join(test: &str) -> Result<(Cluster, ClusterNode, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let node = cluster.join(test, AgentOptions::default()).await?;
    Ok((cluster, node, cri))
}

fn running(p: &Pod) -> bool {
    phase(p) == "Running" && pod_condition(p, "Ready") == Some("True")
}

#[tokio::test]
async fn node_joins_by_tls_bootstrap_and_is_ready_with_its_lease() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, node, cri) = join("bootstrap").await?;
    let client = cluster.client();

    // The controller-manager approved and signed the node's bootstrap CSR.
    let csrs = Api::<CertificateSigningRequest>::all(client.clone()).list(&ListParams::default()).await?;
    let ours: Vec<_> = csrs
        .items
        .iter()
        .filter(|c| {
            c.spec.signer_name == "kubernetes.io/kube-apiserver-client-kubelet"
                && c.spec.username.as_deref().is_some_and(|u| u.starts_with("system:bootstrap:"))
                && c.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some()
        })
        .collect();
    ensure!(!ours.is_empty(), "no signed bootstrap CSR: {csrs:#?}");
    let approved = ours.iter().any(|c| {
        c.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Approved" && c.reason.as_deref() == Some("AutoApproved")))
    });
    ensure!(approved, "the bootstrap CSR was not auto-approved: {ours:#?}");

    // Registered with the kubelet's labels and status, Ready.
    let n = node.wait_ready(Duration::from_secs(30)).await?;
    let labels = n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("kubernetes.io/hostname"), Some(&node.name));
    assert_eq!(labels.get("kubernetes.io/os").map(String::as_str), Some("linux"));
    let status = n.status.clone().context("node status")?;
    let addresses: Vec<_> = status.addresses.iter().flatten().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
    assert!(addresses.contains(&("InternalIP", node.agent.host())), "{addresses:?}");
    for t in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(node_condition(&n, t), Some("False"), "{t}");
    }
    // The node lifecycle controller took the not-ready taint off once it was Ready.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = node.node().await?.context("node gone")?;
        let taints = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        if !taints.iter().any(|t| t.key.starts_with("node.kubernetes.io/not-ready")) {
            break;
        }
        ensure!(Instant::now() < deadline, "not-ready taint still on the node: {taints:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The Lease is held by the node and renewed. CI once found it missing right after the
    // taint went: wait for it (its creation is retried with back-off) and show why.
    let leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease");
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        if let Some(l) = leases.get_opt(&node.name).await? {
            break l;
        }
        ensure!(Instant::now() < deadline, "no Lease 20 s after the node was Ready\n{}", tail(&node.agent.log(), 60));
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let spec = first.spec.clone().context("lease spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some(node.name.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = first.metadata.owner_references.clone().unwrap_or_default();
    assert!(owner.iter().any(|o| o.kind == "Node" && o.name == node.name), "{owner:?}");
    let deadline = Instant::now() + Duration::from_secs(25);
    loop {
        let renewed = leases.get(&node.name).await?.spec.and_then(|s| s.renew_time);
        if renewed.is_some() && renewed != spec.renew_time {
            break;
        }
        ensure!(Instant::now() < deadline, "lease not renewed in 25 s\n{}", tail(&node.agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    node.leave(&cri).await
}

#[tokio::test]
async fn a_deployments_pods_are_scheduled_to_the_node_and_run() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("deploy").await?;
    let ns = node.namespace("deploy").await?;
    let client = cluster.client();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "httpd",
                        "image": BUSYBOX,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["httpd", "-f", "-p", "8080"],
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}
                    }]
                }
            }
        }
    }))?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    deployments.create(&PostParams::default(), &deployment).await?;

    let deadline = Instant::now() + Duration::from_mins(2);
    loop {
        let d = deployments.get("web").await?;
        if d.status.as_ref().and_then(|s| s.available_replicas) == Some(3) {
            break;
        }
        if Instant::now() > deadline {
            let describe = cluster.kubectl(&["-n", &ns, "describe", "pods"])?;
            bail!(
                "deployment not available in 2 minutes: {:?}\n{}\n{}",
                d.status.and_then(|s| s.available_replicas),
                String::from_utf8_lossy(&describe.stdout),
                tail(&node.agent.log(), 60)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &ns).list(&ListParams::default()).await?;
    assert_eq!(pods.items.len(), 3);
    let mut ips = Vec::new();
    for p in &pods.items {
        let spec = p.spec.as_ref().context("spec")?;
        assert_eq!(spec.node_name.as_deref(), Some(node.name.as_str()), "scheduled elsewhere");
        let s = p.status.as_ref().context("status")?;
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.host_ip.as_deref(), Some(node.agent.host()));
        assert_eq!(s.host_ips.as_ref().map(|h| h[0].ip.as_str()), Some(node.agent.host()));
        assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
        let ip = s.pod_ip.clone().context("pod IP")?;
        assert_ne!(ip, "127.0.0.1", "a pod-network pod has an IP of its own");
        ips.push(ip);
        assert!(s.start_time.is_some());
        let types: Vec<_> = s.conditions.iter().flatten().map(|c| (c.type_.as_str(), c.status.as_str())).collect();
        for t in ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"] {
            assert!(types.contains(&(t, "True")), "{t} not True: {types:?}");
        }
        let cs = &s.container_statuses.as_ref().context("container statuses")?[0];
        assert_eq!(cs.name, "httpd");
        assert!(cs.ready);
        assert_eq!(cs.started, Some(true));
        assert_eq!(cs.restart_count, 0);
        assert_eq!(cs.image, BUSYBOX);
        assert!(cs.image_id.starts_with("sha256:") || cs.image_id.contains("@sha256:"), "{}", cs.image_id);
        assert!(cs.container_id.as_deref().is_some_and(|id| id.starts_with("containerd://")));
        assert!(cs.state.as_ref().and_then(|st| st.running.as_ref()).is_some());
        // The runtime runs it.
        let uid = p.metadata.uid.as_deref().context("uid")?;
        assert_eq!(cri.containers(uid).await?.len(), 1);
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3, "pod IPs not distinct: {ips:?}");

    // Scaling down: the replica set deletes pods gracefully; the agent stops them and
    // the API objects go.
    deployments.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await?;
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let pods = Api::<Pod>::namespaced(client.clone(), &ns).list(&ListParams::default()).await?;
        let ready = k8s_cri::v1::PodSandboxState::SandboxReady as i32;
        let sandboxes = cri.all_sandboxes().await?.into_iter().filter(|s| s.state == ready).count();
        if pods.items.len() == 1 && sandboxes == 1 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "scale-down not done in 1 minute: pods {:?}, {sandboxes} ready sandboxes\n{}",
            pods.items.iter().map(|p| (&p.metadata.name, p.metadata.deletion_timestamp.is_some())).collect::<Vec<_>>(),
            tail(&node.agent.log(), 80)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    node.leave(&cri).await
}

#[tokio::test]
async fn kubectl_logs_exec_attach_and_port_forward_reach_the_node_through_the_api_server() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("kubectl").await?;
    let ns = node.namespace("kubectl").await?;
    let mut pod = busybox_pod("tools", "echo hello-from-the-pod; httpd -f -p 8080 & while true; do sleep 1; done");
    pod["spec"]["containers"][0]["stdin"] = json!(true);
    node.create_pod(&ns, pod).await?;
    node.eventually_pod(&ns, "tools", Duration::from_mins(1), "pod running", running).await?;

    let logs = cluster.kubectl_ok(&["-n", &ns, "logs", "tools"])?;
    assert!(logs.contains("hello-from-the-pod"), "{logs:?}");

    let out = cluster.kubectl_ok(&["-n", &ns, "exec", "tools", "--", "sh", "-c", "echo exec-$((40+2)); hostname"])?;
    assert!(out.contains("exec-42"), "{out:?}");
    assert!(out.contains("tools"), "the pod's hostname: {out:?}");
    let failed = cluster.kubectl(&["-n", &ns, "exec", "tools", "--", "sh", "-c", "exit 3"])?;
    assert_eq!(failed.status.code(), Some(3), "exit code through exec: {failed:?}");

    // port-forward: a local port to the pod's httpd, through the API server.
    let local = swiftlet_tests::free_port()?;
    let mut forward = cluster
        .kubectl_command(&["-n", &ns, "port-forward", "pod/tools", &format!("{local}:8080")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let r = tokio::time::timeout(Duration::from_secs(5), async {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local)).await?;
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await?;
            anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
        })
        .await;
        if let Ok(Ok(a)) = &r
            && a.starts_with("HTTP/1.")
        {
            break a.clone();
        }
        if Instant::now() > deadline {
            let _ = forward.kill();
            let out = forward.wait_with_output()?;
            bail!("port-forward never answered: {r:?}\n{}", String::from_utf8_lossy(&out.stderr));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let _ = forward.kill();
    let _ = forward.wait();
    // httpd answers (404 for a directory without index: what matters is that it is httpd).
    let status_line = answer.lines().next().unwrap_or_default();
    assert!(status_line.ends_with("404 Not Found") || status_line.ends_with("200 OK"), "{answer:?}");

    // attach: what is written to the container's stdin reaches it (a cat in a second pod).
    let mut attach = busybox_pod("attached", "cat");
    attach["spec"]["containers"][0]["stdin"] = json!(true);
    attach["spec"]["containers"][0]["command"] = json!(["cat"]);
    node.create_pod(&ns, attach).await?;
    node.eventually_pod(&ns, "attached", Duration::from_mins(1), "pod running", running).await?;
    cluster.attach_and_expect(&["-n", &ns, "attached"], "through-attach", "through-attach").await?;
    node.leave(&cri).await
}

#[tokio::test]
async fn graceful_deletion_runs_the_grace_period_then_the_pod_is_removed() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("graceful").await?;
    let ns = node.namespace("graceful").await?;
    // SIGTERM ignored: the agent must wait the grace period out, then kill.
    let mut pod = busybox_pod("stubborn", "true");
    pod["spec"]["terminationGracePeriodSeconds"] = json!(3);
    pod["spec"]["containers"][0]["command"] = json!(["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]);
    let created = node.create_pod(&ns, pod).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    node.eventually_pod(&ns, "stubborn", Duration::from_mins(1), "pod running", running).await?;
    // The pod startup SLI is observed once the running status comes back on the watch.
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.agent.metric("kubelet_pod_start_sli_duration_seconds_count").await? < 1.0 {
        ensure!(Instant::now() < deadline, "no pod start SLI observation");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(node.agent.metric("kubelet_pod_start_sli_duration_seconds_count").await? as u64, 1);
    assert_eq!(node.agent.metric("kubelet_pod_start_total_duration_seconds_count").await? as u64, 1);

    let pods = Api::<Pod>::namespaced(cluster.client(), &ns);
    let started = Instant::now();
    pods.delete("stubborn", &DeleteParams::default()).await?;
    // Marked for deletion with the pod's grace period; the containers are still there.
    let p = pods.get("stubborn").await?;
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(3));
    let deadline = Instant::now() + Duration::from_secs(30);
    while pods.get_opt("stubborn").await?.is_some() {
        ensure!(Instant::now() < deadline, "pod not removed in 30 s\n{}", tail(&node.agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(3), "removed after {took:?}, before the grace period ended");
    // Removed from the API only once the runtime had stopped it.
    for c in cri.containers(&uid).await? {
        assert_ne!(c.state, k8s_cri::v1::ContainerState::ContainerRunning as i32, "{c:?}");
    }
    node.leave(&cri).await
}

#[tokio::test]
async fn configmap_secret_and_service_account_token_volumes_from_the_real_controllers() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("volumes").await?;
    let ns = node.namespace("volumes").await?;
    let client = cluster.client();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "settings"}, "data": {"mode": "one"}}))?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns).create(&PostParams::default(), &cm).await?;
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "creds"}, "stringData": {"password": "s3cret"}}))?;
    Api::<Secret>::namespaced(client.clone(), &ns).create(&PostParams::default(), &secret).await?;
    let mut pod = busybox_pod("reader", "while true; do sleep 1; done");
    pod["spec"]["volumes"] = json!([
        {"name": "settings", "configMap": {"name": "settings"}},
        {"name": "creds", "secret": {"secretName": "creds"}},
    ]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "settings", "mountPath": "/etc/settings"},
        {"name": "creds", "mountPath": "/etc/creds"},
    ]);
    node.create_pod(&ns, pod).await?;
    let p = node.eventually_pod(&ns, "reader", Duration::from_mins(1), "pod running", running).await?;
    // The ServiceAccount admission plugin added the projected kube-api-access volume.
    let volumes = p.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
    assert!(volumes.iter().any(|v| v.name.starts_with("kube-api-access-") && v.projected.is_some()), "{volumes:?}");

    let read = |path: &str| cluster.kubectl_ok(&["-n", &ns, "exec", "reader", "--", "cat", path]);
    assert_eq!(read("/etc/settings/mode")?, "one");
    assert_eq!(read("/etc/creds/password")?, "s3cret");
    let sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(read(&format!("{sa_dir}/namespace"))?, ns);
    let ca = std::fs::read_to_string(&cluster.state.ca_cert)?;
    assert_eq!(read(&format!("{sa_dir}/ca.crt"))?, ca, "kube-root-ca.crt from the root CA publisher");
    // The token is one the API server issued for this pod's service account: it
    // authenticates as it.
    let token = read(&format!("{sa_dir}/token"))?;
    let mut child = cluster
        .kubectl_command(&["create", "-o", "json", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write as _;
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
        child.stdin.take().context("stdin")?.write_all(body.to_string().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let review: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(review["status"]["authenticated"], true, "{review}");
    assert_eq!(review["status"]["user"]["username"], format!("system:serviceaccount:{ns}:default"), "{review}");
    let bound_pod = &review["status"]["user"]["extra"]["authentication.kubernetes.io/pod-name"];
    assert_eq!(bound_pod, &json!(["reader"]), "{review}");

    // A ConfigMap update reaches the volume.
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .patch("settings", &PatchParams::default(), &Patch::Merge(json!({"data": {"mode": "two"}})))
        .await?;
    let deadline = Instant::now() + Duration::from_mins(2);
    while read("/etc/settings/mode")? != "two" {
        ensure!(Instant::now() < deadline, "configMap update not seen in the volume in 2 minutes");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    node.leave(&cri).await
}

#[tokio::test]
async fn static_pods_get_mirror_pods_owned_by_the_node() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, node, cri) = join("mirror").await?;
    node.agent.write_manifest(
        "static.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: static-web
  namespace: default
spec:
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1; done\"]
"
        ),
    )?;
    let name = format!("static-web-{}", node.name);
    let mirror = node.eventually_pod("default", &name, Duration::from_mins(1), "mirror pod running", running).await?;
    let annotations: BTreeMap<_, _> = mirror.metadata.annotations.clone().unwrap_or_default();
    assert!(annotations.contains_key("kubernetes.io/config.mirror"), "{annotations:?}");
    assert_eq!(annotations.get("kubernetes.io/config.source").map(String::as_str), Some("file"));
    let owners = mirror.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owners.iter().any(|o| o.kind == "Node" && o.name == node.name && o.controller == Some(true)),
        "NodeRestriction wants the node as the mirror pod's controller: {owners:?}"
    );
    // Deleting the mirror pod through the API does not stop the static pod: the agent
    // makes the mirror again.
    let pods = Api::<Pod>::namespaced(cluster.client(), "default");
    let old_uid = mirror.metadata.uid.clone();
    pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await?;
    let again = node
        .eventually_pod("default", &name, Duration::from_mins(1), "mirror pod recreated", |p| {
            p.metadata.uid != old_uid && running(p)
        })
        .await?;
    assert!(again.metadata.uid.is_some());
    // Removing the manifest removes the static pod and its mirror.
    node.agent.remove_manifest("static.yaml")?;
    let deadline = Instant::now() + Duration::from_mins(1);
    while pods.get_opt(&name).await?.is_some() {
        ensure!(Instant::now() < deadline, "mirror pod not removed\n{}", tail(&node.agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    node.leave(&cri).await
}

#[tokio::test]
async fn node_restriction_lets_the_node_change_only_itself() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("restricted").await?;
    let ns = node.namespace("restricted").await?;
    let client = cluster.client();
    let as_node = node.node_client().await?;
    // Another node, created by the admin.
    let other: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(json!({"metadata": {"name": "not-this-node", "labels": {"x": "y"}}}))?;
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    let _ = nodes.delete("not-this-node", &DeleteParams::default()).await;
    nodes.create(&PostParams::default(), &other).await?;
    let node_nodes = Api::<k8s_openapi::api::core::v1::Node>::all(as_node.clone());
    let patch = Patch::Merge(json!({"metadata": {"labels": {"x": "changed"}}}));
    let refused = node_nodes.patch("not-this-node", &PatchParams::default(), &patch).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "{refused:?}");
    // Its own node: yes, but not the labels NodeRestriction reserves.
    node_nodes
        .patch(&node.name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"mine": "ok"}}})))
        .await?;
    let reserved = Patch::Merge(json!({"metadata": {"labels": {"node-restriction.kubernetes.io/x": "y"}}}));
    let refused = node_nodes.patch(&node.name, &PatchParams::default(), &reserved).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "{refused:?}");
    nodes.delete("not-this-node", &DeleteParams::default()).await?;

    // Secrets: only those of pods bound to the node (the Node authorizer).
    for name in ["used", "unused"] {
        let s: Secret = serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}}))?;
        Api::<Secret>::namespaced(client.clone(), &ns).create(&PostParams::default(), &s).await?;
    }
    let mut pod = busybox_pod("uses-secret", "while true; do sleep 1; done");
    pod["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "used"}}]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "s", "mountPath": "/s"}]);
    node.create_pod(&ns, pod).await?;
    node.eventually_pod(&ns, "uses-secret", Duration::from_mins(1), "pod running", running).await?;
    let secrets = Api::<Secret>::namespaced(as_node.clone(), &ns);
    secrets.get("used").await.context("the node may read its pod's secret")?;
    let refused = secrets.get("unused").await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "{refused:?}");

    // Nothing the agent itself sent was refused.
    let log = node.agent.log();
    // (Not "403": timestamps hold it, e.g. "46.440351Z".)
    let forbidden: Vec<_> = log.lines().filter(|l| l.to_ascii_lowercase().contains("forbidden")).collect();
    assert!(forbidden.is_empty(), "the API server refused the agent:\n{}", forbidden.join("\n"));
    node.leave(&cri).await
}

/// The Node object deleted under a running agent is registered again within a status
/// period: the agent's watch on its node shows it gone, the API confirms, and the agent
/// registers a new one (with a new UID), Ready, and renews its Lease for it.
#[tokio::test]
async fn a_deleted_node_object_is_registered_again() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, node, cri) = join("re-register").await?;
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(cluster.client());
    let first = node.wait_ready(Duration::from_secs(30)).await?.metadata.uid;
    nodes.delete(&node.name, &DeleteParams::default()).await?;
    let leases = Api::<Lease>::namespaced(cluster.client(), "kube-node-lease");
    let owner = async || -> Result<Option<String>> {
        let lease = leases.get_opt(&node.name).await?;
        Ok(lease.and_then(|l| l.metadata.owner_references).and_then(|o| o.first().map(|o| o.uid.clone())))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        let uid = nodes.get_opt(&node.name).await?.and_then(|n| n.metadata.uid);
        if uid.is_some() && uid != first {
            break uid;
        }
        ensure!(
            Instant::now() < deadline,
            "the deleted node was not registered again within 30 s\n{}",
            tail(&node.agent.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    node.wait_ready(Duration::from_secs(30)).await?;
    // The Lease is renewed for the new node (the old one's was owned by the old node).
    let deadline = Instant::now() + Duration::from_secs(30);
    while owner().await? != second {
        ensure!(
            Instant::now() < deadline,
            "the Lease is not owned by the new node within 30 s: {:?}\n{}",
            owner().await?,
            tail(&node.agent.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    node.leave(&cri).await
}

/// The node lifecycle controller marks a node whose heartbeats it missed `Ready: Unknown`
/// and its pods `Ready: False` (a partition between node and API server, say; found by a
/// 5-minute API server outage). As upstream's kubelet (which compares its new status with
/// the node it just read, and its pods' statuses with the API's every 10 s), the agent
/// must report both again at once, not at the next periodic node report five minutes
/// later (until then the node keeps the `unreachable` `NoExecute` taint and its pods are
/// evicted after 300 s) or never (the pod).
#[tokio::test]
async fn ready_conditions_changed_by_another_writer_are_reported_again_at_once() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("unknown").await?;
    node.wait_ready(Duration::from_secs(30)).await?;
    let ns = node.namespace("unknown").await?;
    node.create_pod(&ns, busybox_pod("marked", "while true; do sleep 1; done")).await?;
    node.eventually_pod(&ns, "marked", Duration::from_mins(1), "pod running", running).await?;
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    Api::<Pod>::namespaced(cluster.client(), &ns)
        .patch_status("marked", &PatchParams::default(), &Patch::Strategic(&not_ready))
        .await?;
    let pod_marked = Instant::now();
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(cluster.client());
    let now = jiff::Timestamp::now().to_string();
    let unknown = json!({"status": {"conditions": [{
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }]}});
    nodes.patch_status(&node.name, &PatchParams::default(), &Patch::Strategic(&unknown)).await?;
    let marked = Instant::now();
    // nodeStatusUpdateFrequency is 10 s: one update, and some slack.
    let deadline = marked + Duration::from_secs(25);
    loop {
        let n = nodes.get(&node.name).await?;
        if node_condition(&n, "Ready") == Some("True") {
            println!(
                "figures: Ready again {:.1} s after another writer set it Unknown",
                marked.elapsed().as_secs_f64()
            );
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the agent left Ready {:?} for more than 25 s\n{}",
            node_condition(&n, "Ready"),
            tail(&node.agent.log(), 40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The pod's status is written again at the status manager's next reconciliation.
    node.eventually_pod(&ns, "marked", Duration::from_secs(25), "pod Ready again", running).await?;
    println!("figures: pod Ready again {:.1} s after another writer set it False", pod_marked.elapsed().as_secs_f64());
    node.leave(&cri).await
}

/// The API server away for 60 s (`swiftlet_tests::outage`; `cargo xtask chaos api-outage`
/// runs the same for 5 minutes): pods run and are probed, a dead container and one failing
/// its liveness probe are restarted by the agent alone, and everything shows once the API
/// server is back.
#[tokio::test]
async fn pods_keep_running_through_a_60s_api_server_outage_and_status_converges_after() -> Result<()> {
    let _g = testbed_lock().await;
    let figures = api_server_outage("outage", Duration::from_mins(1)).await?;
    println!("figures: {figures}");
    Ok(())
}

/// A node joined through a [`TcpProxy`] in front of the API server, in a namespace of
/// its own where the pod `before` runs.
async fn join_proxied_with_a_pod(test: &str) -> Result<(Cluster, TcpProxy, ClusterNode, String, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let target = cluster.state.server.trim_start_matches("https://").parse()?;
    let proxy = TcpProxy::start(target).await?;
    let via = format!("https://127.0.0.1:{}", proxy.addr.port());
    let mut node = cluster.join_via(test, AgentOptions::default(), Some(&via)).await?;
    let ns = node.namespace(test).await?;
    node.create_pod(&ns, busybox_pod("before", "while true; do sleep 1; done")).await?;
    node.eventually_pod(&ns, "before", Duration::from_mins(1), "pod running", running).await?;
    Ok((cluster, proxy, node, ns, cri))
}

#[tokio::test]
async fn the_agent_recovers_from_cut_and_refused_api_server_connections() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, proxy, node, ns, cri) = join_proxied_with_a_pod("proxied").await?;

    // Every connection cut at once (an API server restart, a load balancer): the agent
    // reconnects, its pod watch included: a pod bound after the cut runs.
    let accepted = proxy.accepted();
    proxy.cut();
    node.create_pod(&ns, busybox_pod("after-cut", "while true; do sleep 1; done")).await?;
    node.eventually_pod(&ns, "after-cut", Duration::from_mins(1), "pod bound after the cut running", running).await?;
    assert!(proxy.accepted() > accepted, "the agent did not reconnect");

    // The API server unreachable for 30 s (connections closed as they open): pods keep
    // running; a pod deleted meanwhile is stopped once the agent hears of it, and a new
    // one runs.
    proxy.refuse(true);
    proxy.cut();
    let uid = Api::<Pod>::namespaced(cluster.client(), &ns).get("before").await?.metadata.uid.context("uid")?;
    let running_before = cri.containers(&uid).await?;
    Api::<Pod>::namespaced(cluster.client(), &ns).delete("before", &DeleteParams::default()).await?;
    node.create_pod(&ns, busybox_pod("during", "while true; do sleep 1; done")).await?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (code, _) = node.agent.healthz().await?;
    assert_eq!(code, 200);
    assert_eq!(cri.containers(&uid).await?.len(), running_before.len(), "nothing changed without the API server");
    proxy.refuse(false);
    node.eventually_pod(&ns, "during", Duration::from_mins(1), "pod bound during the outage running", running).await?;
    let pods = Api::<Pod>::namespaced(cluster.client(), &ns);
    let deadline = Instant::now() + Duration::from_mins(1);
    while pods.get_opt("before").await?.is_some() {
        ensure!(
            Instant::now() < deadline,
            "pod deleted during the outage not removed\n{}",
            tail(&node.agent.log(), 40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    node.wait_ready(Duration::from_secs(30)).await?;
    node.leave(&cri).await
}

/// The network black-holes the agent's open connections to the API server (half-open:
/// nothing moves, nothing closes; a failed-over load balancer, a dropped NAT entry). As
/// upstream's kubelet does (it closes its connections after a failed heartbeat), the agent
/// must notice and open new ones: its Lease is renewed before it expires, and a pod bound
/// afterwards runs.
#[tokio::test]
async fn the_agent_leaves_black_holed_api_server_connections() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, proxy, node, ns, cri) = join_proxied_with_a_pod("black-hole").await?;
    let leases = Api::<Lease>::namespaced(cluster.client(), "kube-node-lease");
    let renewed = async || -> Result<Option<String>> {
        Ok(leases.get(&node.name).await?.spec.and_then(|s| s.renew_time).map(|t| t.0.to_string()))
    };

    let accepted = proxy.accepted();
    proxy.black_hole();
    let since = renewed().await?;
    // The Lease lasts 40 s: renewed well before, over a new connection.
    let deadline = Instant::now() + Duration::from_secs(30);
    while renewed().await? == since {
        ensure!(
            Instant::now() < deadline,
            "the Lease was not renewed within 30 s of the black hole\n{}",
            tail(&node.agent.log(), 40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(proxy.accepted() > accepted, "renewed without a new connection?");
    // The pod watch came back too: a pod bound now runs.
    node.create_pod(&ns, busybox_pod("after", "while true; do sleep 1; done")).await?;
    node.eventually_pod(&ns, "after", Duration::from_mins(1), "pod bound after the black hole running", running)
        .await?;
    node.wait_ready(Duration::from_secs(10)).await?;
    node.leave(&cri).await
}

/// etcd goes away for 30 s (the API server answers errors, its watches end) and comes back:
/// the pods run on untouched, the agent's watch resumes (a pod bound after runs, a pod
/// deleted after is stopped) and the node is Ready.
#[tokio::test]
async fn pods_run_on_through_an_etcd_restart() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("etcd").await?;
    let ns = node.namespace("etcd").await?;
    let before = node.create_pod(&ns, busybox_pod("before", "while true; do sleep 1; done")).await?;
    node.eventually_pod(&ns, "before", Duration::from_mins(1), "pod running", running).await?;
    let uid = before.metadata.uid.clone().context("uid")?;
    let containers = cri.containers(&uid).await?;

    cluster.stop_component("etcd")?;
    let outage = Instant::now();
    // Nothing to assert on meanwhile but that nothing changes: the outage lasts 30 s.
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(outage.elapsed())).await;
    let (code, _) = node.agent.healthz().await?;
    assert_eq!(code, 200);
    cluster.start_component("etcd").await?;
    let after = cri.containers(&uid).await?;
    assert_eq!(after.len(), containers.len());
    assert_eq!(after[0].id, containers[0].id, "the pod was restarted during the outage");

    node.create_pod(&ns, busybox_pod("after", "while true; do sleep 1; done")).await?;
    node.eventually_pod(&ns, "after", Duration::from_mins(1), "pod bound after etcd came back running", running)
        .await?;
    let pods = Api::<Pod>::namespaced(cluster.client(), &ns);
    pods.delete("before", &DeleteParams::default()).await?;
    let deadline = Instant::now() + Duration::from_mins(1);
    while pods.get_opt("before").await?.is_some() {
        ensure!(Instant::now() < deadline, "pod deleted after the outage not removed\n{}", tail(&node.agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    node.wait_ready(Duration::from_mins(1)).await?;
    node.leave(&cri).await
}

/// A pod's `runtimeClassName` is looked up in the API as upstream's kubelet does: while the
/// class does not exist the sandbox fails with upstream's event and nothing reaches the
/// runtime; once it exists, the sandbox runs on the class's handler. (The API server's
/// `RuntimeClass` admission refuses a pod whose class is missing, so the class goes after
/// the pod is admitted, while the agent is down.)
#[tokio::test]
async fn a_pod_waits_for_its_runtime_class_and_then_runs_on_its_handler() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("rtclass").await?;
    let ns = node.namespace("rtclass").await?;
    let class = format!("e2e-{}", node.name);
    let runtime_class = json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": class}, "handler": "runc",
    })
    .to_string();
    node.agent.kill9()?;
    cluster.kubectl_apply(&runtime_class)?;
    let mut pod = busybox_pod("classy", "sleep 3600");
    pod["spec"]["runtimeClassName"] = json!(class);
    let uid = node.create_pod(&ns, pod).await?.metadata.uid.context("uid")?;
    cluster.kubectl_ok(&["delete", "runtimeclass", &class])?;
    node.agent.spawn().await?;

    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(cluster.client(), &ns);
    let want = format!(r#"Failed to create pod sandbox: runtimeclass.node.k8s.io "{class}" not found"#);
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let list = events.list(&ListParams::default()).await?;
        if list.items.iter().any(|e| {
            e.reason.as_deref() == Some("FailedCreatePodSandBox") && e.message.as_deref() == Some(want.as_str())
        }) {
            break;
        }
        ensure!(Instant::now() < deadline, "no FailedCreatePodSandBox event\n{}", tail(&node.agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(cri.sandboxes(&uid).await?.is_empty(), "a sandbox without its runtime class");

    cluster.kubectl_apply(&runtime_class)?;
    let ran = node.eventually_pod(&ns, "classy", Duration::from_mins(2), "pod running", running).await;
    let sandboxes = cri.sandboxes(&uid).await;
    cluster.kubectl_ok(&["delete", "runtimeclass", &class, "--ignore-not-found"])?;
    ran?;
    let handlers: Vec<String> = sandboxes?.into_iter().map(|s| s.runtime_handler).collect();
    assert_eq!(handlers, ["runc"]);
    node.leave(&cri).await
}
