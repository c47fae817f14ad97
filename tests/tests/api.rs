//! End-to-end tests of what the agent makes of API objects, on the real control plane of
//! the test bed (`cargo xtask testbed up --cluster`): admission of pods that do not fit,
//! DNS settings, and environment variables from `ConfigMaps`, `Secrets`, resource fields and
//! Services. Node registration, pod status, graceful deletion, mirror pods, volumes and
//! API-server outages are in `cluster.rs`.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use swiftlet_tests::cluster::{Cluster, ClusterNode, phase};
use swiftlet_tests::{AgentOptions, Cri, cri_endpoint, testbed_lock};

const BUSYBOX: &str = "localhost/busybox:latest";

/// A pod of one busybox container that idles (stopping at once on SIGTERM), with `spec`'s
/// fields laid over the default spec.
fn pod(name: &str, spec: &serde_json::Value) -> serde_json::Value {
    let mut s = json!({
        "terminationGracePeriodSeconds": 2,
        "containers": [{
            "name": "main",
            "image": BUSYBOX,
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
        }]
    });
    for (k, v) in spec.as_object().into_iter().flatten() {
        s[k] = v.clone();
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": s})
}

async fn join(test: &str, opts: AgentOptions) -> Result<(Cluster, ClusterNode, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let node = cluster.join(test, opts).await?;
    Ok((cluster, node, cri))
}

async fn running(node: &ClusterNode, ns: &str, name: &str) -> Result<Pod> {
    node.eventually_pod(ns, name, Duration::from_mins(1), &format!("{name} running"), |p| phase(p) == "Running").await
}

async fn running_container(cri: &Cri, pod: &Pod) -> Result<String> {
    let uid = pod.metadata.uid.as_deref().context("uid")?;
    cri.containers(uid)
        .await?
        .into_iter()
        .find(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32)
        .map(|c| c.id)
        .context("no running container")
}

async fn sh(cri: &Cri, id: &str, script: &str) -> Result<String> {
    let (code, out) = cri.exec(id, &["sh", "-c", script]).await?;
    ensure!(code == 0, "`{script}` exited {code}: {out}");
    Ok(out)
}

#[tokio::test]
async fn admission_rejects_a_pod_that_does_not_fit() -> Result<()> {
    let _g = testbed_lock().await;
    let (_cluster, mut node, cri) = join("admission", AgentOptions::default()).await?;
    let ns = node.namespace("admission").await?;
    let huge = pod(
        "huge",
        &json!({"containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                               "resources": {"requests": {"cpu": "1000"}}}]}),
    );
    // Bound by hand, as the scheduler never would: the kubelet's own admission refuses it.
    let uid = node.create_pod(&ns, huge).await?.metadata.uid.context("uid")?;
    let p = node.eventually_pod(&ns, "huge", Duration::from_secs(30), "pod failed", |p| phase(p) == "Failed").await?;
    let st = p.status.context("status")?;
    assert_eq!(st.reason.as_deref(), Some("OutOfcpu"));
    let message = st.message.unwrap_or_default();
    assert!(message.starts_with("Pod was rejected: Node didn't have enough resource: cpu"), "{message}");
    assert!(cri.sandboxes(&uid).await?.is_empty(), "a rejected pod never runs");
    node.leave(&cri).await
}

/// resolv.conf as the pod's dnsPolicy says (clusterDNS and clusterDomain configured), and
/// the pod's name in its /etc/hosts.
#[tokio::test]
async fn dns_policies() -> Result<()> {
    let _g = testbed_lock().await;
    let opts = AgentOptions {
        extra_config: "clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n".into(),
        ..AgentOptions::default()
    };
    let (_cluster, mut node, cri) = join("dns", opts).await?;
    let ns = node.namespace("dns").await?;
    node.create_pod(&ns, pod("dns-cluster", &json!({}))).await?;
    let explicit_dns = json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["192.0.2.53"], "searches": ["example.test"],
                      "options": [{"name": "ndots", "value": "2"}]}});
    node.create_pod(&ns, pod("dns-none", &explicit_dns)).await?;
    let cluster_first = running_container(&cri, &running(&node, &ns, "dns-cluster").await?).await?;
    let conf = sh(&cri, &cluster_first, "cat /etc/resolv.conf").await?;
    assert!(conf.contains("nameserver 10.96.0.10"), "{conf}");
    assert!(conf.contains(&format!("search {ns}.svc.cluster.local svc.cluster.local cluster.local")), "{conf}");
    assert!(conf.contains("ndots:5"), "{conf}");
    let hosts = sh(&cri, &cluster_first, "cat /etc/hosts").await?;
    assert!(hosts.contains("dns-cluster"), "{hosts}");
    let explicit = running_container(&cri, &running(&node, &ns, "dns-none").await?).await?;
    let conf = sh(&cri, &explicit, "cat /etc/resolv.conf").await?;
    assert!(
        conf.contains("nameserver 192.0.2.53") && conf.contains("search example.test") && conf.contains("ndots:2"),
        "{conf}"
    );
    node.leave(&cri).await
}

/// Environment variables from `ConfigMap` and `Secret` keys, `envFrom`, resource fields and
/// the Services of the namespace (service links, and without them only the `kubernetes`
/// Service's); a Secret volume's mode, an emptyDir, a projected token of another
/// audience.
#[tokio::test]
async fn env_from_configmaps_secrets_resource_fields_and_services() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("env", AgentOptions::default()).await?;
    let ns = node.namespace("env").await?;
    let client = cluster.client();
    let post = PostParams::default();
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "settings"}, "data": {"greeting": "hello", "color": "blue"}}),
    )?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns).create(&post, &cm).await?;
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "creds"}, "data": {"password": "czNjcmV0"}}))?;
    Api::<Secret>::namespaced(client.clone(), &ns).create(&post, &secret).await?;
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "backend"}, "spec": {"ports": [{"name": "http", "port": 8080}]}}),
    )?;
    let svc = Api::<Service>::namespaced(client.clone(), &ns).create(&post, &svc).await?;
    let backend_ip = svc.spec.and_then(|s| s.cluster_ip).context("the API server gave the Service no IP")?;
    let kubernetes_ip = Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("kubernetes Service IP")?;

    node.create_pod(&ns, pod("unlinked", &json!({"enableServiceLinks": false}))).await?;
    let spec = json!({
        "volumes": [
            {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 256}},
            {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "audience": "vault", "expirationSeconds": 3600}}]}},
            {"name": "scratch", "emptyDir": {}}
        ],
        "containers": [{
            "name": "main",
            "image": BUSYBOX,
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
            "env": [
                {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "MEM_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
            ],
            "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
            "resources": {"limits": {"memory": "64Mi"}},
            "volumeMounts": [
                {"name": "sec", "mountPath": "/etc/creds", "readOnly": true},
                {"name": "tok", "mountPath": "/var/run/tok"},
                {"name": "scratch", "mountPath": "/scratch"}
            ]
        }]
    });
    node.create_pod(&ns, pod("env", &spec)).await?;
    let id = running_container(&cri, &running(&node, &ns, "env").await?).await?;
    let env = sh(&cri, &id, "echo $GREETING $PASSWORD $CFG_color $MEM_LIMIT $POD_NAMESPACE").await?;
    assert_eq!(env.trim(), format!("hello s3cret blue 64 {ns}"));
    let links =
        sh(&cri, &id, "echo $BACKEND_SERVICE_HOST $BACKEND_SERVICE_PORT_HTTP $BACKEND_PORT $KUBERNETES_SERVICE_HOST")
            .await?;
    assert_eq!(links.trim(), format!("{backend_ip} 8080 tcp://{backend_ip}:8080 {kubernetes_ip}"));
    assert_eq!(sh(&cri, &id, "stat -L -c %a /etc/creds/password").await?.trim(), "400");
    assert_eq!(sh(&cri, &id, "cat /etc/creds/password").await?, "s3cret");
    // The token the API server issued for the audience asked for.
    let token = sh(&cri, &id, "cat /var/run/tok/token").await?;
    let claims = token.split('.').nth(1).context("not a JWT")?;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, claims.trim_end_matches('='))
            .context("JWT claims")?,
    )?;
    assert_eq!(claims["aud"], json!(["vault"]), "{claims}");
    assert_eq!(sh(&cri, &id, "echo x > /scratch/f && cat /scratch/f").await?.trim(), "x", "emptyDir is writable");

    let bare = running_container(&cri, &running(&node, &ns, "unlinked").await?).await?;
    let env = sh(&cri, &bare, "echo [$BACKEND_SERVICE_HOST] $KUBERNETES_SERVICE_PORT").await?;
    assert_eq!(env.trim(), "[] 443");
    Api::<Pod>::namespaced(client, &ns).delete("unlinked", &DeleteParams::default()).await?;
    node.leave(&cri).await
}
