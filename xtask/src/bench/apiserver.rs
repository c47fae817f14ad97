//! The test bed's real kube-apiserver ([`crate::cluster`], `testbed up --cluster`) as the
//! benches use it: as the cluster admin, over HTTPS with the admin kubeconfig's client
//! certificate, verified against the cluster CA.
//!
//! xtask must not depend on the agent's crates nor have a TLS stack of its own (see its
//! `Cargo.toml`), so [`ApiClient`] speaks HTTP/1.1 through an `openssl s_client` tunnel
//! ([`https::Tunnel`]) on one kept-alive connection, as a controller's client keeps its
//! connection. Pods created here are API pods, not static ones: the agent treats them as a
//! cluster's (not critical, so evictable; status written back to the API).
//!
//! What the benches make in the cluster is theirs by name or label, so that what a bench
//! killed half-way left is found again ([`ApiClient::remove_stale`]): nodes named
//! [`NODE_PREFIX`]`...`, namespaces labelled [`BENCH_LABEL`]. Bench nodes register with
//! the taint [`BENCH_TAINT`] (`NoSchedule`), which only the bench's pods tolerate: the
//! scheduler places nothing else on them (a Deployment or `DaemonSet` an end-to-end test
//! left behind), so the agent runs the bench's pods alone.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};

use crate::{
    Ctx,
    bench::https::{self, ClientTls, Tunnel},
    cluster, containerd,
    testbed::Layout,
    upstream::Upstream,
};

/// The longest one API request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The label of every namespace a bench makes.
pub const BENCH_LABEL: &str = "swiftlet.dev/bench";
/// The taint bench nodes register with (`NoSchedule`); bench pods tolerate it.
pub const BENCH_TAINT: &str = "swiftlet.dev/bench";
/// The prefix of every node a bench joins.
pub const NODE_PREFIX: &str = "swiftlet-bench-";

/// The test bed's control plane, as the benches reach it.
#[derive(Debug, Clone)]
pub struct ApiServer {
    /// kube-apiserver's `ip:port` (`127.0.0.1:6443`).
    pub host: String,
    /// The cluster admin's credentials (`system:masters`).
    pub tls: ClientTls,
    /// `v1.37.2`.
    pub version: String,
    /// The kubeconfig with the bootstrap token: a node's `--bootstrap-kubeconfig`.
    pub bootstrap_kubeconfig: PathBuf,
}

impl ApiServer {
    /// The test bed's control plane: the recorded one when each of its components runs
    /// and kube-apiserver is ready, else brought up by what `cargo xtask testbed up
    /// --cluster` does (building the upstream binaries if they are missing). A control
    /// plane an end-to-end test has restarted a component of is used as it is: its record
    /// holds the old pid, which would make `testbed up --cluster` start it all again.
    pub fn up(ctx: &Ctx, layout: &Layout) -> Result<Self> {
        if let Some(state) = cluster::State::load(layout)?
            && running(&state)
        {
            eprintln!("bench: using the test bed's {} control plane at {}", state.version, state.server);
            return Self::of(&state);
        }
        let state = cluster::up(&Upstream::new(ctx), layout).context("bringing the control plane up")?;
        Self::of(&state)
    }

    /// The control plane of a `cluster.json` record.
    pub fn of(state: &cluster::State) -> Result<Self> {
        let host = state
            .server
            .strip_prefix("https://")
            .with_context(|| format!("the API server {} is not https://", state.server))?
            .trim_end_matches('/')
            .to_owned();
        let text = fs::read_to_string(&state.admin_kubeconfig)
            .with_context(|| format!("reading {}", state.admin_kubeconfig.display()))?;
        let tls = kubeconfig_tls(&text).with_context(|| {
            format!(
                "{}: no certificate-authority, client-certificate and client-key files",
                state.admin_kubeconfig.display()
            )
        })?;
        Ok(Self { host, tls, version: state.version.clone(), bootstrap_kubeconfig: state.bootstrap_kubeconfig.clone() })
    }

    /// A client as the cluster admin (the connection opens with the first request).
    pub fn client(&self) -> ApiClient {
        ApiClient { host: self.host.clone(), tls: self.tls.clone(), tunnel: None }
    }
}

/// Whether every component of the recorded control plane runs (found by its command line,
/// as `testbed down` finds them) and kube-apiserver answers `/readyz`.
fn running(state: &cluster::State) -> bool {
    let all_run = cluster::COMPONENTS.iter().all(|name| {
        let bin = state.bin_dir.join(name).display().to_string();
        !containerd::find_processes(|a| a.first() == Some(&bin) && cluster::is_ours(a, &state.bin_dir, &state.dir))
            .is_empty()
    });
    all_run
        && Command::new(&state.kubectl)
            .arg("--kubeconfig")
            .arg(&state.admin_kubeconfig)
            .args(["--request-timeout=5s", "get", "--raw", "/readyz"])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
}

/// The CA, client certificate and key files a kubeconfig names (the first of each: the
/// test bed's kubeconfigs have one cluster and one user).
pub fn kubeconfig_tls(text: &str) -> Option<ClientTls> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let value = l.trim().strip_prefix(name)?.strip_prefix(':')?.trim();
            (!value.is_empty()).then(|| PathBuf::from(value))
        })
    };
    Some(ClientTls {
        ca: field("certificate-authority")?,
        cert: field("client-certificate")?,
        key: field("client-key")?,
    })
}

/// `s` as a DNS-1123 label part: lower case, `[a-z0-9-]`, no dash at either end.
pub fn dns_label(s: &str) -> String {
    let mapped: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    mapped.trim_matches('-').to_owned()
}

/// The node name of the bench agent labelled `label`.
pub fn node_name(label: &str) -> String {
    format!("{NODE_PREFIX}{}", dns_label(label))
}

/// A request's bytes (no credentials in them: the client certificate is the TLS
/// connection's).
pub fn request_bytes(host: &str, method: &str, path: &str, body: Option<&Value>) -> Vec<u8> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nUser-Agent: \
         swiftlet-xtask-bench\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        out.push_str("Content-Type: application/json\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

/// An HTTP/1.1 client of the API server on one kept-alive TLS connection.
#[derive(Debug)]
pub struct ApiClient {
    host: String,
    tls: ClientTls,
    tunnel: Option<Tunnel>,
}

impl ApiClient {
    /// One exchange on the open connection (opening it first if there is none); `None`
    /// when the connection was closed before the answer, and then `why` has what openssl
    /// said.
    async fn once(&mut self, bytes: &[u8], why: &mut String) -> Result<Option<https::Response>> {
        if self.tunnel.is_none() {
            self.tunnel = Some(Tunnel::connect(&self.host, Some(&self.tls))?);
        }
        let tunnel = self.tunnel.as_mut().context("no connection")?;
        let response = tunnel.exchange(bytes).await;
        if !matches!(&response, Ok(Some(r)) if !r.closes)
            && let Some(t) = self.tunnel.take()
        {
            *why = t.close().await;
        }
        response
    }

    /// `method path` with a JSON body: (status, JSON body or `null`). A connection the
    /// server had closed is reopened once.
    pub async fn request(&mut self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let r = self.raw(method, path, body).await?;
        let value =
            if r.body.is_empty() { Value::Null } else { serde_json::from_slice(&r.body).unwrap_or(Value::Null) };
        Ok((r.status, value))
    }

    /// `GET path` of a text document (the server's own `/metrics`): (status, body).
    pub async fn get_text(&mut self, path: &str) -> Result<(u16, String)> {
        let r = self.raw("GET", path, None).await?;
        Ok((r.status, String::from_utf8_lossy(&r.body).into_owned()))
    }

    /// One request and its whole response; a connection the server had closed is
    /// reopened once.
    async fn raw(&mut self, method: &str, path: &str, body: Option<&Value>) -> Result<https::Response> {
        let bytes = request_bytes(&self.host, method, path, body);
        let call = async {
            let mut why = String::new();
            if let Some(r) = self.once(&bytes, &mut why).await? {
                return Ok(r);
            }
            match self.once(&bytes, &mut why).await? {
                Some(r) => Ok(r),
                None => bail!("the API server {} closed the connection twice; openssl: {why}", self.host),
            }
        };
        tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .map_err(|_| anyhow::anyhow!("{method} {path}: no answer within {REQUEST_TIMEOUT:?}"))?
            .with_context(|| format!("{method} {path}"))
    }

    /// Creates the bench namespace `name` (labelled [`BENCH_LABEL`]) and waits for its
    /// default service account, without which the API server refuses pods.
    pub async fn create_namespace(&mut self, name: &str) -> Result<()> {
        let ns = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {BENCH_LABEL: "true"}},
        });
        let (code, body) = self.request("POST", "/api/v1/namespaces", Some(&ns)).await?;
        ensure!(code == 201, "creating namespace {name}: {code}: {body}");
        let path = format!("/api/v1/namespaces/{name}/serviceaccounts/default");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (code, _) = self.request("GET", &path, None).await?;
            if code == 200 {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "namespace {name}: no default service account after 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes namespace `name` (the namespace controller removes what is left in it); an
    /// absent one is fine.
    pub async fn delete_namespace(&mut self, name: &str) -> Result<()> {
        let (code, body) = self.request("DELETE", &format!("/api/v1/namespaces/{name}"), None).await?;
        ensure!(code == 200 || code == 202 || code == 404, "deleting namespace {name}: {code}: {body}");
        Ok(())
    }

    /// Deletes node `name`; an absent one is fine.
    pub async fn delete_node(&mut self, name: &str) -> Result<()> {
        let (code, body) = self.request("DELETE", &format!("/api/v1/nodes/{name}"), None).await?;
        ensure!(code == 200 || code == 202 || code == 404, "deleting node {name}: {code}: {body}");
        Ok(())
    }

    /// Deletes what benches that could not clean up left: their nodes and namespaces.
    /// Returns how many objects were deleted.
    pub async fn remove_stale(&mut self) -> Result<usize> {
        let mut deleted = 0;
        let (code, nodes) = self.request("GET", "/api/v1/nodes", None).await?;
        ensure!(code == 200, "listing nodes: {code}: {nodes}");
        for name in item_names(&nodes).into_iter().filter(|n| n.starts_with(NODE_PREFIX)) {
            self.delete_node(&name).await?;
            deleted += 1;
        }
        let (code, namespaces) =
            self.request("GET", &format!("/api/v1/namespaces?labelSelector={BENCH_LABEL}"), None).await?;
        ensure!(code == 200, "listing namespaces: {code}: {namespaces}");
        for ns in namespaces["items"].as_array().into_iter().flatten() {
            if ns["metadata"]["deletionTimestamp"].is_null()
                && let Some(name) = ns["metadata"]["name"].as_str()
            {
                self.delete_namespace(name).await?;
                deleted += 1;
            }
        }
        if deleted > 0 {
            eprintln!("bench: deleted {deleted} node(s) and namespace(s) an earlier bench left in the cluster");
        }
        Ok(deleted)
    }

    /// Creates a pod in `namespace`; returns its uid.
    pub async fn create_pod(&mut self, namespace: &str, pod: &Value) -> Result<String> {
        let path = format!("/api/v1/namespaces/{namespace}/pods");
        let (code, body) = self.request("POST", &path, Some(pod)).await?;
        ensure!(code == 201, "creating pod {}: {code}: {body}", pod["metadata"]["name"]);
        Ok(body["metadata"]["uid"].as_str().unwrap_or_default().to_owned())
    }

    /// Deletes a pod at once (`gracePeriodSeconds=0`: gone from the API; the agent stops
    /// it when it sees the deletion). An absent pod is fine.
    pub async fn delete_pod(&mut self, namespace: &str, name: &str) -> Result<()> {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        let options = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0});
        let (code, body) = self.request("DELETE", &path, Some(&options)).await?;
        ensure!(code == 200 || code == 202 || code == 404, "deleting pod {name}: {code}: {body}");
        Ok(())
    }

    /// The names of the pods of `namespace` and the list's resourceVersion.
    pub async fn list_pods(&mut self, namespace: &str) -> Result<(Vec<String>, String)> {
        let path = format!("/api/v1/namespaces/{namespace}/pods");
        let (code, body) = self.request("GET", &path, None).await?;
        ensure!(code == 200, "listing pods: {code}: {body}");
        Ok((item_names(&body), body["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_owned()))
    }

    /// Deletes every pod of `namespace`; returns how many there were.
    pub async fn delete_all_pods(&mut self, namespace: &str) -> Result<usize> {
        let (names, _) = self.list_pods(namespace).await?;
        for name in &names {
            self.delete_pod(namespace, name).await?;
        }
        Ok(names.len())
    }

    /// Waits until node `name` is registered and its `Ready` condition is `True`.
    pub async fn wait_node_ready(&mut self, name: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let (code, node) = self.request("GET", &format!("/api/v1/nodes/{name}"), None).await?;
            if code == 200 && node_ready(&node) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let conditions = node["status"]["conditions"].to_string();
                bail!("node {name} not Ready within {timeout:?} (GET: {code}; conditions {conditions:.600})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The `metadata.name`s of a list's items.
fn item_names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// Whether a Node's `Ready` condition is `True`.
pub fn node_ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// An API pod in `namespace` bound to node `node`: one busybox container `c0` running
/// `script`, `BestEffort`, with optional memory-backed emptyDir at `/mem` (what is written
/// there is charged to the pod's memory cgroup). No service-account token is mounted (the
/// pod has no use for one, and the figures measure starting a container, not a token
/// request), and it tolerates the bench nodes' taint.
pub fn pod(name: &str, namespace: &str, node: &str, script: &str, memory_volume: bool) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": false,
            "tolerations": [{ "key": BENCH_TAINT, "operator": "Exists" }],
            "containers": [{
                "name": "c0",
                "image": crate::images::BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
            }],
        },
    });
    if memory_volume {
        pod["spec"]["volumes"] = json!([{ "name": "mem", "emptyDir": { "medium": "Memory" } }]);
        pod["spec"]["containers"][0]["volumeMounts"] = json!([{ "name": "mem", "mountPath": "/mem" }]);
    }
    pod
}

/// The `registerWithTaints` lines (`KubeletConfiguration` YAML) of a bench node.
pub fn register_with_taint() -> String {
    format!("registerWithTaints:\n- key: {BENCH_TAINT}\n  value: \"true\"\n  effect: NoSchedule\n")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn requests_carry_host_length_and_type_but_no_token() {
        let body = json!({"a": 1});
        let r = String::from_utf8(request_bytes("127.0.0.1:6443", "POST", "/api/v1/x", Some(&body))).unwrap();
        assert!(
            r.starts_with("POST /api/v1/x HTTP/1.1\r\nHost: 127.0.0.1:6443\r\nAccept: application/json\r\n"),
            "{r}"
        );
        assert!(r.contains("\r\nContent-Length: 7\r\nContent-Type: application/json\r\n\r\n{\"a\":1}"), "{r}");
        assert!(!r.contains("Authorization"), "{r}");
        let get = String::from_utf8(request_bytes("h", "GET", "/", None)).unwrap();
        assert!(get.ends_with("Content-Length: 0\r\n\r\n") && !get.contains("Content-Type"), "{get}");
    }

    #[test]
    fn pods_are_api_pods_bound_to_the_node() {
        let p = pod("hog-00", "swiftlet-bench-1-x", "swiftlet-bench-x", "sleep 1", true);
        assert_eq!(p["metadata"]["namespace"], "swiftlet-bench-1-x");
        assert_eq!(p["spec"]["nodeName"], "swiftlet-bench-x");
        assert_eq!(p["spec"]["automountServiceAccountToken"], false);
        assert_eq!(p["spec"]["tolerations"][0]["key"], BENCH_TAINT);
        assert_eq!(p["spec"]["volumes"][0]["emptyDir"]["medium"], "Memory");
        assert_eq!(p["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], "/mem");
        assert!(p["spec"]["containers"][0]["resources"].is_null(), "BestEffort");
        assert!(pod("p", "ns", "n", "x", false)["spec"]["volumes"].is_null());
    }

    #[test]
    fn the_admin_kubeconfig_names_its_files() {
        let text = cluster::kubeconfig(
            "https://127.0.0.1:6443",
            Path::new("/c/pki/ca.crt"),
            "admin",
            "    client-certificate: /c/pki/admin.crt\n    client-key: /c/pki/admin.key\n",
        );
        assert_eq!(
            kubeconfig_tls(&text),
            Some(ClientTls {
                ca: "/c/pki/ca.crt".into(),
                cert: "/c/pki/admin.crt".into(),
                key: "/c/pki/admin.key".into()
            })
        );
        // The bootstrap kubeconfig has a token, no certificate.
        let bootstrap = cluster::kubeconfig("https://x", Path::new("/ca"), "b", "    token: abc.def\n");
        assert_eq!(kubeconfig_tls(&bootstrap), None);
    }

    #[test]
    fn node_names_are_dns_labels() {
        assert_eq!(node_name("swiftlet"), "swiftlet-bench-swiftlet");
        assert_eq!(node_name("Kubelet_1.28"), "swiftlet-bench-kubelet-1-28");
        assert_eq!(dns_label("-eviction-kernel-"), "eviction-kernel");
    }

    #[test]
    fn nodes_are_ready_on_their_ready_condition() {
        let ready = json!({"status": {"conditions": [
            {"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        assert!(node_ready(&ready));
        assert!(!node_ready(&json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})));
        assert!(!node_ready(&json!({"kind": "Status", "code": 404})));
        assert!(register_with_taint().contains(&format!("- key: {BENCH_TAINT}\n")));
    }
}
